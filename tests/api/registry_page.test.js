// The registry's live page (`meshnet registry --http-listen`, GET /) in
// Debian's chromium (headless, playwright-core): it draws the nodes of a
// running mesh as segments over their layer ranges (replicas stacked) and
// drops a node killed with SIGKILL once its lease expires.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { chromium } from "playwright-core";
import { meshnetBin, model } from "./helpers.js";

const CHROMIUM = process.env.CHROMIUM || "/usr/bin/chromium";
const procs = [];
let registry;
let page_url;
let browser;

// Spawns `meshnet args...` and resolves to { proc, out } once `ready` matches stdout.
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
  return { proc, out };
}

async function startNode(layers) {
  const n = await start(["serve", "--model", model, "--layers", layers, "--listen", "127.0.0.1:0",
    "--threads", "1", "--log-level", "warn", "--registry", registry, "--lease-ttl", "2"],
    /listening on \S+\n/);
  return { proc: n.proc, addr: /listening on (\S+)/.exec(n.out)[1] };
}

const nodes = [];

before(async () => {
  const r = await start(["registry", "--listen", "127.0.0.1:0", "--http-listen", "127.0.0.1:0"],
    /registry page on \S+\n/);
  registry = /registry on (\S+)/.exec(r.out)[1];
  page_url = "http://" + /registry page on (\S+)/.exec(r.out)[1] + "/";
  for (const layers of ["0-1", "2-3", "2-3", "4-4"]) nodes.push(await startNode(layers));
  browser = await chromium.launch({ executablePath: CHROMIUM, headless: true,
    args: ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"] });
});

after(async () => {
  if (browser) await browser.close();
  for (const p of procs) if (p.exitCode === null) p.kill("SIGKILL");
});

test("the page shows every node over its range and drops a killed one", async () => {
  const page = await browser.newPage();
  await page.goto(page_url);
  await page.waitForFunction((n) => document.querySelectorAll(".node").length === n,
    nodes.length, { timeout: 30000 });
  for (const n of nodes) {
    assert.equal(await page.locator(`.node[data-address="${n.addr}"]`).count(), 1, n.addr);
  }
  // Replicas of 2-3 are stacked: same left edge and width, different rows.
  const boxes = await page.$$eval('.node[data-layers="2-3"]', (els) =>
    els.map((e) => ({ left: e.style.left, width: e.style.width, top: e.style.top })));
  assert.equal(boxes.length, 2);
  assert.equal(boxes[0].left, boxes[1].left);
  assert.equal(boxes[0].width, boxes[1].width);
  assert.notEqual(boxes[0].top, boxes[1].top);
  assert.equal(boxes[0].left, "40%");  // layer 2 of 5
  assert.match(await page.textContent(".routes"), /routes: 2/);

  const victim = nodes[1];
  victim.proc.kill("SIGKILL");
  // Lease TTL 2 s, page refresh 1 s: gone well within 10 s.
  await page.waitForFunction((addr) => !document.querySelector(`.node[data-address="${addr}"]`),
    victim.addr, { timeout: 10000 });
  assert.equal(await page.locator(".node").count(), nodes.length - 1);
  assert.match(await page.textContent(".routes"), /routes: 1/);
  await page.close();
});

test("status.json and /metrics say the same", async () => {
  const base = page_url.replace(/\/$/, "");
  const s = await (await fetch(base + "/status.json")).json();
  assert.equal(s.models.length, 1);
  assert.equal(s.models[0].total_layers, 5);
  const metrics = await (await fetch(base + "/metrics")).text();
  const m = /^meshnet_registry_nodes\{[^}]*\} (\d+)/m.exec(metrics);
  assert.ok(m, metrics);
  assert.equal(Number(m[1]), s.models[0].nodes.length);
});
