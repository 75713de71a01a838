// `meshnet api --nodes` over three real `meshnet serve` processes: answers
// equal the in-process route, an aborted stream and a SIGTERM'd server leave
// no session on any node (read from each node's own Prometheus metrics).
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { spawn, execFileSync } from "node:child_process";
import { once } from "node:events";
import OpenAI from "openai";
import { startApi, meshnetBin, model, metric, until } from "./helpers.js";

const nodes = [];

// Starts a node; resolves to { addr, metrics, proc }.
async function startNode(layers) {
  const proc = spawn(meshnetBin, ["serve", "--model", model, "--layers", layers,
    "--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0", "--threads", "1",
    "--log-level", "warn"], { stdio: ["ignore", "pipe", "pipe"] });
  let out = "";
  const lines = await new Promise((resolve, reject) => {
    proc.stdout.on("data", (d) => {
      out += d;
      if (/metrics on \S+\n/.test(out)) resolve(out);
    });
    proc.on("exit", (c) => reject(new Error(`node ${layers} exited ${c}`)));
  });
  return { proc, addr: /listening on (\S+)/.exec(lines)[1], metrics: /metrics on (\S+)/.exec(lines)[1] };
}

async function liveSessions() {
  let total = 0;
  for (const n of nodes) {
    total += metric(await (await fetch(`http://${n.metrics}/metrics`)).text(), "meshnet_kv_live_sessions");
  }
  return total;
}

before(async () => {
  for (const layers of ["0-1", "2-3", "4-4"]) nodes.push(await startNode(layers));
});

after(async () => {
  for (const n of nodes) {
    const exited = once(n.proc, "exit");
    n.proc.kill("SIGTERM");
    await exited;
  }
});

const list = () => nodes.map((n) => n.addr).join(",");

test("completions over nodes equal `meshnet generate` in-process", async () => {
  const api = await startApi(["--nodes", list()]);
  try {
    const client = new OpenAI({ apiKey: "x", baseURL: `${api.url}/v1`, maxRetries: 0 });
    const r = await client.completions.create({ model: "stories260K", prompt: "The cat", temperature: 0, max_tokens: 24 });
    const local = JSON.parse(execFileSync(meshnetBin, ["generate", "--model", model,
      "--prompt", "The cat", "--max-tokens", "24", "--output", "json", "--threads", "1"]).toString());
    assert.equal(r.choices[0].text, local.text);
    const health = await (await fetch(`${api.url}/health`)).json();
    assert.deepEqual(health.hops.map((h) => h.name), nodes.map((n) => n.addr));
    assert.equal(await liveSessions(), 0);
  } finally {
    assert.equal(await api.stop(), 0);
  }
});

test("an aborted stream is released on every node", async () => {
  const api = await startApi(["--nodes", list()]);
  try {
    const controller = new AbortController();
    const res = await fetch(`${api.url}/v1/completions`, {
      method: "POST", headers: { "Content-Type": "application/json" }, signal: controller.signal,
      body: JSON.stringify({ prompt: "Once upon a time", temperature: 0, max_tokens: 400, stream: true }),
    });
    const reader = res.body.getReader();
    await reader.read();
    controller.abort();
    assert.ok(await until(async () => (await liveSessions()) === 0), "no session left on any node");
  } finally {
    assert.equal(await api.stop(), 0);
  }
});

test("SIGTERM: in-flight streams end within --grace and every node is released", async () => {
  const api = await startApi(["--nodes", list(), "--grace", "0.2"]);
  const res = await fetch(`${api.url}/v1/completions`, {
    method: "POST", headers: { "Content-Type": "application/json" },
    body: JSON.stringify({ prompt: "Once upon a time", temperature: 0, max_tokens: 400, stream: true }),
  });
  const reader = res.body.getReader();
  await reader.read();  // the stream is running
  const t0 = Date.now();
  const code = await api.stop();
  const waited = Date.now() - t0;
  assert.equal(code, 0);
  assert.ok(waited < 10000, `stopped in ${waited} ms`);
  let body = "";
  for (;;) {
    const { value, done } = await reader.read().catch(() => ({ done: true }));
    if (done) break;
    body += Buffer.from(value).toString();
  }
  assert.ok(!/"finish_reason":"length"/.test(body), "cut short, not run to max_tokens");
  assert.equal(await liveSessions(), 0, "no session left on any node");
});
