// The chat page at `/` in Debian's chromium (headless, playwright-core, no
// browser download): the streamed reply equals the API's greedy answer, and
// the stop button aborts a reply mid-stream.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { chromium } from "playwright-core";
import { startApi, postJson, idleAndReleased } from "./helpers.js";

const CHROMIUM = process.env.CHROMIUM || "/usr/bin/chromium";
let api;
let browser;

before(async () => {
  api = await startApi();
  browser = await chromium.launch({ executablePath: CHROMIUM, headless: true,
    args: ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"] });
});

after(async () => {
  if (browser) await browser.close();
  assert.equal(await api.stop(), 0);
});

test("the page streams the greedy reply and shows TTFT and tokens/s", async () => {
  const prompt = "Once upon a time";
  const want = await postJson(`${api.url}/v1/chat/completions`, {
    messages: [{ role: "user", content: prompt }], temperature: 0, max_tokens: 48,
  });
  assert.equal(want.status, 200);
  const page = await browser.newPage();
  await page.goto(api.url + "/");
  await page.fill("#max", "48");
  await page.fill("#temp", "0");
  await page.fill("#prompt", prompt);
  await page.click("#send");
  await page.waitForSelector('#reply[data-done="complete"]', { timeout: 60000 });
  assert.equal(await page.textContent("#reply"), want.json.choices[0].message.content);
  assert.match(await page.textContent("#ttft"), /^\d+ ms$/);
  assert.match(await page.textContent("#tps"), /^\d+(\.\d+)?$/);
  await page.close();
});

test("the stop button aborts the reply mid-stream", async () => {
  const full = await postJson(`${api.url}/v1/chat/completions`, {
    messages: [{ role: "user", content: "Once upon a time" }], temperature: 0, max_tokens: 400,
  });
  const page = await browser.newPage();
  await page.goto(api.url + "/");
  // Throttle the page's downloads (DevTools network emulation) so the reply
  // arrives over many seconds and the stop button lands mid-reply.
  const cdp = await page.context().newCDPSession(page);
  await cdp.send("Network.enable");
  await cdp.send("Network.emulateNetworkConditions",
    { offline: false, latency: 0, downloadThroughput: 2000, uploadThroughput: -1 });
  await page.fill("#max", "400");
  await page.fill("#temp", "0");
  await page.fill("#prompt", "Once upon a time");
  await page.click("#send");
  await page.waitForFunction(() => {
    const r = document.getElementById("reply");
    return r && r.textContent.length > 0;
  }, null, { timeout: 60000, polling: "raf" });
  await page.click("#stop");
  await page.waitForSelector('#reply[data-done="aborted"]', { timeout: 30000 });
  const shown = await page.textContent("#reply");
  const answer = full.json.choices[0].message.content;
  assert.ok(shown.length > 0 && shown.length < answer.length, "stopped mid-reply");
  assert.ok(answer.startsWith(shown), "what was shown is a prefix of the greedy answer");
  assert.equal(await page.getAttribute("body", "data-state"), "idle");
  assert.ok(await idleAndReleased(api.url), "the aborted generation released its sessions");
  await page.close();
});
