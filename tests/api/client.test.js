// `meshnet api` driven by the official openai npm package.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import OpenAI from "openai";
import { startApi, postJson, meshnetBin, model, idleAndReleased, metric } from "./helpers.js";

const KEY = "sk-meshnet-test";
let api;
let client;

before(async () => {
  api = await startApi(["--api-key", KEY, "--max-concurrent", "32", "--queue", "64"]);
  client = new OpenAI({ apiKey: KEY, baseURL: `${api.url}/v1`, maxRetries: 0, timeout: 120000 });
});

after(async () => {
  const code = await api.stop();
  assert.equal(code, 0, `meshnet api exit code; stderr: ${api.stderr()}`);
});

const MODEL = "stories260K";
const auth = { Authorization: `Bearer ${KEY}` };

async function greedyChat(content, max_tokens = 24) {
  const r = await client.chat.completions.create({
    model: MODEL, messages: [{ role: "user", content }], temperature: 0, max_tokens,
  });
  return r.choices[0].message.content;
}

async function streamChat(content, max_tokens = 24) {
  const stream = await client.chat.completions.create({
    model: MODEL, messages: [{ role: "user", content }], temperature: 0, max_tokens, stream: true,
  });
  let text = "";
  for await (const chunk of stream) text += chunk.choices[0]?.delta?.content ?? "";
  return text;
}

test("models lists the served model", async () => {
  const list = await client.models.list();
  assert.deepEqual(list.data.map((m) => m.id), [MODEL]);
});

test("completion: the greedy text equals `meshnet generate` on the same model", async () => {
  const prompt = "Once upon a time";
  const r = await client.completions.create({ model: MODEL, prompt, temperature: 0, max_tokens: 32 });
  assert.equal(r.object, "text_completion");
  assert.equal(r.choices.length, 1);
  const out = JSON.parse(execFileSync(meshnetBin, [
    "generate", "--model", model, "--prompt", prompt, "--max-tokens", "32", "--output", "json",
    "--threads", "1",
  ]).toString());
  assert.equal(r.choices[0].text, out.text);
  assert.equal(r.usage.prompt_tokens, out.prompt_ids.length);
  assert.equal(r.usage.completion_tokens, out.generated_ids.length);
  assert.equal(r.choices[0].finish_reason, out.generated_ids.length === 32 ? "length" : "stop");
});

test("completion: a token-id prompt equals the same text prompt", async () => {
  const tok = await postJson(`${api.url}/tokenize`, { content: "The cat", add_special: true }, auth);
  assert.equal(tok.status, 200);
  const a = await client.completions.create({ model: MODEL, prompt: "The cat", temperature: 0, max_tokens: 16 });
  const b = await client.completions.create({ model: MODEL, prompt: tok.json.tokens, temperature: 0, max_tokens: 16 });
  assert.equal(b.choices[0].text, a.choices[0].text);
  const detok = await postJson(`${api.url}/detokenize`, { tokens: tok.json.tokens }, auth);
  assert.equal(detok.json.content, "The cat");
});

test("chat: response shape, roles and usage", async () => {
  const r = await client.chat.completions.create({
    model: MODEL,
    messages: [
      { role: "system", content: "You tell stories." },
      { role: "user", content: [{ type: "text", text: "Once upon" }, { type: "text", text: " a time" }] },
    ],
    temperature: 0, max_tokens: 20, user: "ignored",
  });
  assert.equal(r.object, "chat.completion");
  assert.match(r.id, /^chatcmpl-/);
  assert.equal(r.model, MODEL);
  assert.equal(r.choices[0].message.role, "assistant");
  assert.equal(typeof r.choices[0].message.content, "string");
  assert.ok(["stop", "length"].includes(r.choices[0].finish_reason));
  assert.equal(r.usage.total_tokens, r.usage.prompt_tokens + r.usage.completion_tokens);
  const rendered = await postJson(`${api.url}/apply-template`, {
    messages: [{ role: "system", content: "You tell stories." }, { role: "user", content: "Once upon a time" }],
  }, auth);
  const tok = await postJson(`${api.url}/tokenize`, { content: rendered.json.prompt, add_special: true }, auth);
  assert.equal(r.usage.prompt_tokens, tok.json.tokens.length);
});

test("streaming: deltas concatenate to the non-streamed greedy answer", async () => {
  const prompt = "Lily and Tom";
  assert.equal(await streamChat(prompt, 40), await greedyChat(prompt, 40));
});

test("stop sequences end the answer before the match, across token boundaries", async () => {
  const full = await greedyChat("Once upon a time", 48);
  assert.ok(full.length > 20, full);
  for (const stop of [full.slice(10, 13), full.slice(15, 22)]) {
    const r = await client.chat.completions.create({
      model: MODEL, messages: [{ role: "user", content: "Once upon a time" }],
      temperature: 0, max_tokens: 48, stop: [stop, "\u0001never"],
    });
    assert.equal(r.choices[0].message.content, full.slice(0, full.indexOf(stop)));
    assert.equal(r.choices[0].finish_reason, "stop");
    const stream = await client.chat.completions.create({
      model: MODEL, messages: [{ role: "user", content: "Once upon a time" }],
      temperature: 0, max_tokens: 48, stop, stream: true,
    });
    let text = "";
    let finish = null;
    for await (const c of stream) {
      text += c.choices[0]?.delta?.content ?? "";
      finish = c.choices[0]?.finish_reason ?? finish;
    }
    assert.equal(text, full.slice(0, full.indexOf(stop)));
    assert.equal(finish, "stop");
  }
});

test("seed reproducibility: same seed, same sampled text", async () => {
  const ask = (seed) => client.completions.create({
    model: MODEL, prompt: "One day, a bird", temperature: 1.0, top_p: 0.95, max_tokens: 32, seed,
  }).then((r) => r.choices[0].text);
  const a = await ask(1234);
  assert.equal(await ask(1234), a);
  const others = await Promise.all([1, 2, 3, 4, 5].map(ask));
  assert.ok(others.some((t) => t !== a) || new Set(others).size > 1, "seeds change the samples");
});

test("usage counts: the streamed usage chunk equals the non-streamed usage", async () => {
  const req = { model: MODEL, messages: [{ role: "user", content: "The sun was" }], temperature: 0, max_tokens: 17 };
  const plain = await client.chat.completions.create(req);
  const stream = await client.chat.completions.create({ ...req, stream: true, stream_options: { include_usage: true } });
  let usage = null;
  let chunks = 0;
  for await (const c of stream) {
    if (c.usage) usage = c.usage;
    if (c.choices[0]?.delta?.content) chunks += 1;
  }
  assert.deepEqual(usage, plain.usage);
  assert.ok(chunks <= usage.completion_tokens);
});

test("abort: a stream cancelled mid-reply releases its session on every hop", async () => {
  const before = metric(await (await fetch(`${api.url}/metrics`)).text(), "meshnet_api_completion_tokens_total");
  const controller = new AbortController();
  const stream = await client.chat.completions.create({
    model: MODEL, messages: [{ role: "user", content: "Once upon a time" }],
    temperature: 0, max_tokens: 400, stream: true,
  }, { signal: controller.signal });
  let seen = 0;
  let finished = false;
  // openai's stream ends quietly (or with APIUserAbortError) once aborted.
  try {
    for await (const c of stream) {
      if (c.choices[0]?.delta?.content) seen += 1;
      if (c.choices[0]?.finish_reason) finished = true;
      if (seen === 3) {
        controller.abort();
        break;
      }
    }
  } catch (e) {
    assert.ok(e.name === "APIUserAbortError" || e.name === "AbortError", String(e));
  }
  assert.equal(seen, 3);
  assert.equal(finished, false, "the reply was cut off, not finished");
  assert.ok(await idleAndReleased(api.url), "in-flight and live sessions back to zero");
  const after = metric(await (await fetch(`${api.url}/metrics`)).text(), "meshnet_api_completion_tokens_total");
  assert.ok(after - before < 400, `generation stopped early (${after - before} tokens)`);
});

test("logprobs: the client library reads them; greedy takes the most likely token", async () => {
  const r = await client.chat.completions.create({
    model: MODEL, messages: [{ role: "user", content: "Once upon a time" }], temperature: 0,
    max_tokens: 12, logprobs: true, top_logprobs: 3,
  });
  const entries = r.choices[0].logprobs.content;
  assert.ok(entries.length > 0);
  assert.equal(entries.map((e) => e.token).join(""), r.choices[0].message.content);
  for (const e of entries) {
    assert.ok(e.logprob <= 0);
    assert.equal(e.top_logprobs.length, 3);
    assert.equal(e.top_logprobs[0].logprob, e.logprob);
  }
  const c = await client.completions.create({
    model: MODEL, prompt: "Once upon a time", temperature: 0, max_tokens: 8, logprobs: 2,
  });
  assert.equal(c.choices[0].logprobs.tokens.join(""), c.choices[0].text);
  assert.equal(c.choices[0].logprobs.token_logprobs.length, c.choices[0].logprobs.tokens.length);
});

test("unsupported parameters are a 400 naming them", async () => {
  for (const [param, extra] of [["best_of", { best_of: 2 }], ["echo", { echo: true }],
    ["suffix", { suffix: "end" }]]) {
    await assert.rejects(
      client.completions.create({ model: MODEL, prompt: "a", max_tokens: 2, ...extra }),
      (e) => e.status === 400 && e.param === param, param);
  }
  await assert.rejects(
    client.chat.completions.create({
      model: MODEL, messages: [{ role: "user", content: "a" }], max_tokens: 2,
      response_format: { type: "json_object" },
    }),
    (e) => e.status === 400 && e.param === "response_format");
});

test("auth: a wrong or missing key is 401 with an error object", async () => {
  const bad = new OpenAI({ apiKey: "wrong", baseURL: `${api.url}/v1`, maxRetries: 0 });
  await assert.rejects(bad.models.list(), (e) => e.status === 401 && e.code === "invalid_api_key");
  const res = await fetch(`${api.url}/v1/models`);
  assert.equal(res.status, 401);
  assert.equal((await res.json()).error.type, "invalid_request_error");
  assert.equal((await fetch(`${api.url}/health`)).status, 200);
});

test("32 concurrent streaming chats each equal their solo greedy run", async () => {
  const prompts = Array.from({ length: 32 }, (_, i) => `Story number ${i}: once there was`);
  const solo = [];
  for (const p of prompts) solo.push(await greedyChat(p, 24));
  const together = await Promise.all(prompts.map((p) => streamChat(p, 24)));
  together.forEach((t, i) => assert.equal(t, solo[i], `chat ${i}`));
  assert.ok(await idleAndReleased(api.url));
});
