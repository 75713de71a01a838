#!/usr/bin/env python3
"""Qwen2 and Llama-with-RoPE-factors models made by `meshnet make-model`
(random F32 weights, a byte-level BPE tokenizer from a test vocab):

  1. every split of the 3 layers into 1-3 in-process shards generates the same
     greedy tokens;
  2. each step's logits (--dump-logits) match the independent numpy forward
     pass of ref_forward.py: max |meshnet - reference| / max |reference| < 1e-4,
     and the reference's argmax is the generated token.

usage: arch_reference_test.py MESHNET VOCAB.gguf WORKDIR
"""
import json
import os
import subprocess
import sys

try:
    import numpy as np
except ImportError:
    print("SKIP: numpy is not installed for", sys.executable)
    sys.exit(77)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ref_forward  # noqa: E402

SPLITS = ["0-2", "0-0,1-2", "0-1,2-2", "0-0,1-1,2-2"]
# Long enough (~100 tokens) that the RoPE factors move the logits well past the tolerance.
PROMPT = " ".join(["Hello world, 東京! It's 12345 o'clock."] * 8)
MODELS = {
    # name: make-model flags
    "qwen2-tied": ["--arch", "qwen2", "--tie-output", "--rope-base", "1000000"],
    "qwen2-untied": ["--arch", "qwen2"],
    "llama3-rope-freqs": ["--arch", "llama", "--rope-freqs", "--rope-base", "500000"],
}


def run(cmd):
    r = subprocess.run(cmd, capture_output=True, timeout=300)
    if r.returncode != 0:
        sys.exit(f"FAILED: {' '.join(cmd)}\n{r.stderr.decode(errors='replace')}")
    return r.stdout


def check_model(meshnet, vocab, workdir, name, flags):
    path = os.path.join(workdir, name + ".gguf")
    run([meshnet, "make-model", "--out", path, "--tokenizer-from", vocab, "--type", "f32",
         "--n-embd", "64", "--n-layers", "3", "--n-heads", "4", "--n-kv-heads", "2",
         "--n-ff", "96", "--seed", "7"] + flags)
    g = ref_forward.GgufFile(path)
    failures, tokens = [], None
    for split in SPLITS:
        dump = os.path.join(workdir, f"{name}-{split}.logits.jsonl")
        out = json.loads(run([meshnet, "generate", "--model", path, "--split", split,
                              "--prompt", PROMPT, "--max-tokens", "6", "--output", "json",
                              "--threads", "1", "--kv-dtype", "float32",
                              "--dump-logits", dump]))
        prompt, gen = out["prompt_ids"], out["generated_ids"]
        with open(dump) as f:
            got = np.array([json.loads(line) for line in f])
        if tokens is None:
            tokens = (prompt, gen)
            ref = ref_forward.forward(g, prompt + gen[:-1])[len(prompt) - 1:]
        elif (prompt, gen) != tokens:
            failures.append(f"{name} split {split}: tokens {gen} differ from {tokens[1]}")
        if got.shape != ref[:len(got)].shape or len(got) != len(gen):
            failures.append(f"{name} split {split}: logits shape {got.shape} vs {ref.shape}")
            continue
        for step in range(len(got)):
            rel = np.max(np.abs(got[step] - ref[step])) / np.max(np.abs(ref[step]))
            if rel >= 1e-4:
                failures.append(f"{name} split {split} step {step}: relative error {rel:.3g}")
            if int(np.argmax(ref[step])) != gen[step]:
                failures.append(f"{name} split {split} step {step}: reference argmax "
                                f"{int(np.argmax(ref[step]))} != generated {gen[step]}")
        print(f"{name} split {split}: tokens {gen}, max relative logit error "
              f"{max(np.max(np.abs(got[s] - ref[s])) / np.max(np.abs(ref[s])) for s in range(len(got))):.2e}")
    return failures


def main():
    meshnet, vocab, workdir = sys.argv[1:4]
    os.makedirs(workdir, exist_ok=True)
    failures = []
    for name, flags in MODELS.items():
        failures += check_model(meshnet, vocab, workdir, name, flags)
    for f in failures:
        print("FAIL:", f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
