// Shared helpers of the `meshnet api` client and browser tests: each test
// file starts its own server on 127.0.0.1:0 and kills it at the end.
import { spawn } from "node:child_process";
import { once } from "node:events";
import path from "node:path";
import { fileURLToPath } from "node:url";

const here = path.dirname(fileURLToPath(import.meta.url));
export const repoRoot = path.resolve(here, "..", "..");
export const meshnetBin =
  process.env.MESHNET_BIN || path.join(repoRoot, "build", "src", "cli", "meshnet");
export const model = path.join(repoRoot, "models", "stories260K.gguf");

// Starts `meshnet api` with `args`; resolves to { url, port, proc, stop }.
export async function startApi(args = []) {
  const proc = spawn(
    meshnetBin,
    ["api", "--listen", "127.0.0.1:0", "--model", model, "--threads", "1", ...args],
    { stdio: ["ignore", "pipe", "pipe"] },
  );
  let stderr = "";
  proc.stderr.on("data", (d) => { stderr += d; });
  let stdout = "";
  const line = await new Promise((resolve, reject) => {
    proc.stdout.on("data", (d) => {
      stdout += d;
      const nl = stdout.indexOf("\n");
      if (nl >= 0) resolve(stdout.slice(0, nl));
    });
    proc.on("exit", (code) => reject(new Error(`meshnet api exited ${code}: ${stderr}`)));
  });
  const m = /^listening on (127\.0\.0\.1):(\d+)$/.exec(line);
  if (!m) throw new Error(`unexpected first line: ${line}`);
  const port = Number(m[2]);
  const url = `http://127.0.0.1:${port}`;
  return {
    url,
    port,
    proc,
    stderr: () => stderr,
    // SIGTERM, then wait for a clean exit.
    async stop() {
      if (proc.exitCode !== null) return proc.exitCode;
      const exited = once(proc, "exit");
      proc.kill("SIGTERM");
      const [code] = await exited;
      return code;
    },
  };
}

export async function postJson(url, body, headers = {}) {
  const res = await fetch(url, {
    method: "POST",
    headers: { "Content-Type": "application/json", ...headers },
    body: JSON.stringify(body),
  });
  return { status: res.status, headers: res.headers, json: await res.json() };
}

// Reads one numeric sample of a Prometheus text exposition.
export function metric(text, name) {
  const m = new RegExp(`^${name} ([0-9.e+-]+)$`, "m").exec(text);
  return m ? Number(m[1]) : NaN;
}

// Polls `probe` until it returns true (bounded by `ms`).
export async function until(probe, ms = 30000) {
  const deadline = Date.now() + ms;
  while (Date.now() < deadline) {
    if (await probe()) return true;
    await new Promise((r) => setTimeout(r, 20));  // poll interval, bounded by ms
  }
  return false;
}

// Every hop's live sessions and the in-flight gauge are back to zero.
export async function idleAndReleased(url) {
  return until(async () => {
    const metrics = await (await fetch(`${url}/metrics`)).text();
    if (metric(metrics, "meshnet_api_requests_in_flight") !== 0) return false;
    const health = await (await fetch(`${url}/health`)).json();
    return health.hops.every((h) => h.live_sessions === 0);
  });
}
