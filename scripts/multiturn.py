#!/usr/bin/env python3
# A multi-turn chat client for `meshnet api` (or any OpenAI-compatible
# /v1/completions): CONVERSATIONS concurrent conversations of TURNS turns, each
# turn the conversation so far plus ~120 new words, 32 greedy tokens streamed.
# Prints each turn's time to first token, prompt tokens and cached tokens.
#   python3 scripts/multiturn.py PORT CONVERSATIONS [TURNS]
import json, sys, threading, time, urllib.request
port = int(sys.argv[1]); convs = int(sys.argv[2]); turns = int(sys.argv[3]) if len(sys.argv) > 3 else 10
words = "the little girl found a red ball in her garden and she ran to show mom it was".split()
def new_words(c, t):
    return "\nTurn %d of %d:" % (t, c) + "".join(" " + words[(i * 7 + t * 5 + c) % 18] for i in range(120))
def stream(prompt):
    body = json.dumps({"prompt": prompt, "temperature": 0, "max_tokens": 32, "stream": True,
                       "stream_options": {"include_usage": True}}).encode()
    req = urllib.request.Request("http://127.0.0.1:%d/v1/completions" % port, body, {"Content-Type": "application/json"})
    t0 = time.time(); ttft = None; text = ""; usage = None
    with urllib.request.urlopen(req, timeout=600) as r:
        for line in r:
            line = line.decode().strip()
            if not line.startswith("data: "): continue
            ev = line[6:]
            if ev == "[DONE]": break
            j = json.loads(ev)
            if "error" in j: raise RuntimeError(ev)
            if j.get("usage"): usage = j["usage"]; continue
            if j["choices"] and j["choices"][0].get("finish_reason") is None:
                if ttft is None: ttft = time.time() - t0
                text += j["choices"][0]["text"]
    return ttft, text, usage
res = {}
def conv(c):
    chat = ""
    for t in range(turns):
        chat += new_words(c, t) + "\nAnswer:"
        ttft, ans, usage = stream(chat)
        chat += ans
        print("conv %d turn %d ttft %.0f ms prompt %d cached %d" % (c, t + 1, ttft * 1e3, usage["prompt_tokens"], usage["prompt_tokens_details"]["cached_tokens"]), flush=True)
th = [threading.Thread(target=conv, args=(c,)) for c in range(convs)]
[x.start() for x in th]; [x.join() for x in th]
