// curl checks the SSE framing of `meshnet api` byte for byte: headers, one
// `data: <json>\n\n` event per chunk (each JSON re-serializes to exactly the
// bytes sent), the role delta first, content deltas, the finish chunk, the
// usage chunk, then `data: [DONE]\n\n` and nothing else.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { startApi } from "./helpers.js";

let api;
before(async () => { api = await startApi(); });
after(async () => { assert.equal(await api.stop(), 0); });

function curl(path, body) {
  return execFileSync("curl", [
    "-sS", "-N", "-i", "--http1.1", "-H", "Content-Type: application/json",
    "--data-binary", JSON.stringify(body), `${api.url}${path}`,
  ], { maxBuffer: 1 << 24 });
}

function splitResponse(raw) {
  const text = raw.toString("utf8");
  const cut = text.indexOf("\r\n\r\n");
  return { head: text.slice(0, cut), body: text.slice(cut + 4) };
}

function events(body) {
  assert.ok(body.endsWith("data: [DONE]\n\n"), "ends with [DONE]");
  assert.match(body, /^(data: [^\n]+\n\n)+$/, "only data events, blank-line separated");
  const out = body.split("\n\n").slice(0, -1).map((e) => e.slice("data: ".length));
  for (const e of out.slice(0, -1)) assert.equal(JSON.stringify(JSON.parse(e)), e, "compact JSON");
  return out;
}

test("chat stream: headers and event sequence", () => {
  const { head, body } = splitResponse(curl("/v1/chat/completions", {
    messages: [{ role: "user", content: "Once upon a time" }], temperature: 0, max_tokens: 12,
    stream: true, stream_options: { include_usage: true },
  }));
  assert.match(head, /^HTTP\/1\.1 200 OK/);
  assert.match(head, /\r\nContent-Type: text\/event-stream\r\n/i);
  assert.match(head, /\r\nTransfer-Encoding: chunked\r\n/i);
  assert.match(head, /\r\nCache-Control: no-cache\r\n/i);
  const ev = events(body);
  const chunks = ev.slice(0, -1).map((e) => JSON.parse(e));
  assert.deepEqual(chunks[0].choices[0].delta, { role: "assistant", content: "" });
  const content = chunks.slice(1, -2);
  assert.ok(content.length >= 1);
  for (const c of content) {
    assert.equal(c.object, "chat.completion.chunk");
    assert.equal(c.id, chunks[0].id);
    assert.equal(c.choices[0].finish_reason, null);
    assert.equal(typeof c.choices[0].delta.content, "string");
    assert.ok(c.choices[0].delta.content.length > 0);
    assert.equal(c.usage, null);
  }
  const finish = chunks.at(-2);
  assert.deepEqual(finish.choices[0].delta, {});
  assert.ok(["stop", "length"].includes(finish.choices[0].finish_reason));
  const usage = chunks.at(-1);
  assert.deepEqual(usage.choices, []);
  assert.equal(usage.usage.completion_tokens, 12);
  assert.equal(ev.at(-1), "[DONE]");
});

test("completion stream: text chunks, finish chunk, [DONE]; no usage unless asked", () => {
  const { body } = splitResponse(curl("/v1/completions", {
    prompt: "The cat", temperature: 0, max_tokens: 8, stream: true,
  }));
  const chunks = events(body).slice(0, -1).map((e) => JSON.parse(e));
  for (const c of chunks) {
    assert.equal(c.object, "text_completion");
    assert.equal("usage" in c, false);
  }
  assert.equal(chunks.at(-1).choices[0].finish_reason, "length");
  assert.equal(chunks.at(-1).choices[0].text, "");
  const plain = JSON.parse(execFileSync("curl", ["-sS", "-H", "Content-Type: application/json",
    "--data-binary", JSON.stringify({ prompt: "The cat", temperature: 0, max_tokens: 8 }),
    `${api.url}/v1/completions`]).toString());
  assert.equal(chunks.map((c) => c.choices[0].text).join(""), plain.choices[0].text);
});

test("content deltas never split a UTF-8 character", () => {
  // The vocabulary has no multi-byte characters: every non-ASCII character
  // arrives as 2-4 byte-fallback tokens. Find a seed whose sampled answer has
  // one, then check the stream: no chunk holds a broken character (it would
  // show as U+FFFD there but not in the whole answer) and the chunks
  // concatenate to the non-streamed answer.
  const req = (seed, stream) => ({ prompt: "Zoë said «héllo» — ☃", temperature: 1.8, seed,
    max_tokens: 96, stream });
  let seed = 0;
  let whole = "";
  for (seed = 1; seed <= 64; seed++) {
    whole = JSON.parse(execFileSync("curl", ["-sS", "-H", "Content-Type: application/json",
      "--data-binary", JSON.stringify(req(seed, false)), `${api.url}/v1/completions`]))
      .choices[0].text;
    if (/[^\x00-\x7F\uFFFD]/.test(whole)) break;
  }
  assert.ok(seed <= 64, "some seed samples a multi-byte character");
  const { body } = splitResponse(curl("/v1/completions", req(seed, true)));
  const texts = events(body).slice(0, -1).map((e) => JSON.parse(e).choices[0].text);
  assert.equal(texts.join(""), whole);
  const multi = texts.filter((t) => /[^\x00-\x7F\uFFFD]/.test(t));
  assert.ok(multi.length > 0);
  const replacements = (t) => (t.match(/\uFFFD/g) || []).length;
  assert.equal(texts.reduce((n, t) => n + replacements(t), 0), replacements(whole));
});

test("health and metrics answer", () => {
  const health = JSON.parse(execFileSync("curl", ["-sS", `${api.url}/health`]).toString());
  assert.equal(health.status, "ok");
  assert.equal(health.hops.length, 3);
  const metrics = execFileSync("curl", ["-sS", `${api.url}/metrics`]).toString();
  for (const name of ["meshnet_api_requests_total", "meshnet_api_prompt_tokens_total",
    "meshnet_api_completion_tokens_total", "meshnet_api_time_to_first_token_seconds_bucket",
    "meshnet_api_inter_token_latency_seconds_bucket", "meshnet_api_requests_in_flight",
    "meshnet_api_requests_queued"]) {
    assert.ok(metrics.includes(name), name);
  }
  assert.match(metrics, /meshnet_api_requests_total\{endpoint="\/v1\/chat\/completions",status="200"\} [1-9]/);
});

test("HTTPS with --tls-cert/--tls-key streams the same framing", async () => {
  const fs = await import("node:fs");
  const os = await import("node:os");
  const path = await import("node:path");
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "meshnet-api-tls-"));
  const cert = path.join(dir, "cert.pem");
  const key = path.join(dir, "key.pem");
  execFileSync("openssl", ["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
    "-subj", "/CN=127.0.0.1", "-keyout", key, "-out", cert], { stdio: "ignore" });
  const tls = await startApi(["--tls-cert", cert, "--tls-key", key, "--api-key", "k"]);
  try {
    const out = execFileSync("curl", ["-sS", "-N", "--cacert", cert, "-H", "Authorization: Bearer k",
      "-H", "Content-Type: application/json", "--data-binary",
      JSON.stringify({ prompt: "The cat", temperature: 0, max_tokens: 4, stream: true }),
      `https://127.0.0.1:${tls.port}/v1/completions`]).toString();
    const chunks = events(out).slice(0, -1).map((e) => JSON.parse(e));
    assert.equal(chunks.at(-1).choices[0].finish_reason, "length");
    const { spawnSync } = await import("node:child_process");
    const plainRun = spawnSync("curl", ["-sS", "-o", "/dev/null", "-w", "%{http_code}",
      `http://127.0.0.1:${tls.port}/v1/models`]);
    const plain = plainRun.stdout.toString();
    assert.notEqual(plain, "200", "plain HTTP is not served on the HTTPS port");
  } finally {
    assert.equal(await tls.stop(), 0);
    fs.rmSync(dir, { recursive: true, force: true });
  }
});
