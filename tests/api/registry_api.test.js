// `meshnet api --registry` over a `meshnet registry` and four `meshnet serve
// --registry` nodes (two replicas of 2-3): the API knows only the registry,
// answers equal the in-process route, its /metrics carries the route cost of
// every node, and completions spread over both replicas.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { spawn, execFileSync } from "node:child_process";
import { startApi, postJson, meshnetBin, model } from "./helpers.js";

const procs = [];
const nodes = [];
let registry;

// Spawns `meshnet args...`; resolves to its stdout once `ready` matches it.
async function start(args, ready) {
  const proc = spawn(meshnetBin, args, { stdio: ["ignore", "pipe", "pipe"] });
  procs.push(proc);
  let out = "";
  let err = "";
  proc.stderr.on("data", (d) => { err += d; });
  await new Promise((resolve, reject) => {
    proc.stdout.on("data", (d) => {
      out += d;
      if (ready.test(out)) resolve();
    });
    proc.on("exit", (c) => reject(new Error(`meshnet ${args[0]} exited ${c}: ${err}`)));
  });
  return out;
}

before(async () => {
  registry = /registry on (\S+)/.exec(
    await start(["registry", "--listen", "127.0.0.1:0"], /registry on \S+\n/))[1];
  for (const layers of ["0-1", "2-3", "2-3", "4-4"]) {
    const out = await start(["serve", "--model", model, "--layers", layers, "--listen",
      "127.0.0.1:0", "--threads", "1", "--log-level", "warn", "--registry", registry,
      "--lease-ttl", "2"], /listening on \S+\n/);
    nodes.push(/listening on (\S+)/.exec(out)[1]);
  }
});

after(async () => {
  for (const p of procs) if (p.exitCode === null) p.kill("SIGKILL");
});

// One series of the API's /metrics, by node address.
function seriesByNode(text, name) {
  const out = {};
  for (const m of text.matchAll(new RegExp(`^${name}\\{([^}]*)\\} ([0-9.e+-]+)$`, "gm"))) {
    const node = /node="([^"]+)"/.exec(m[1]);
    if (node) out[node[1]] = Number(m[2]);
  }
  return out;
}

test("completions over the registry's nodes equal the in-process route", async () => {
  const api = await startApi(["--registry", registry]);
  try {
    const local = JSON.parse(execFileSync(meshnetBin, ["generate", "--model", model,
      "--prompt", "The cat", "--max-tokens", "24", "--output", "json", "--threads", "1"]).toString());
    for (let i = 0; i < 4; ++i) {
      const r = await postJson(`${api.url}/v1/completions`,
        { model: "stories260K", prompt: "The cat", temperature: 0, max_tokens: 24 });
      assert.equal(r.status, 200, JSON.stringify(r.json));
      assert.equal(r.json.choices[0].text, local.text);
    }
    const metrics = await (await fetch(`${api.url}/metrics`)).text();
    const costs = seriesByNode(metrics, "meshnet_route_node_cost");
    for (const n of nodes) assert.ok(n in costs, `no route cost for ${n}:\n${metrics}`);
    const planned = seriesByNode(metrics, "meshnet_route_sessions_planned_total");
    assert.equal(planned[nodes[0]], 4);
    assert.equal(planned[nodes[3]], 4);
    // Both replicas of 2-3 served some of the four sessions.
    assert.ok(planned[nodes[1]] >= 1 && planned[nodes[2]] >= 1, JSON.stringify(planned));
    assert.equal(planned[nodes[1]] + planned[nodes[2]], 4);
  } finally {
    assert.equal(await api.stop(), 0);
  }
});
