// `meshnet api --chat-template FILE`: /apply-template renders every template
// in tests/data/templates byte for byte as Python jinja2 does (render.py, the
// transformers setup), including tools, unicode and templates that refuse a
// conversation (400). The shipped model's BOS/EOS texts are <s> and </s>, the
// reference's defaults; cases that set other special tokens are left out.
import { test } from "node:test";
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import fs from "node:fs";
import path from "node:path";
import { startApi, postJson, repoRoot } from "./helpers.js";

const dir = path.join(repoRoot, "tests", "data", "templates");
const casesFile = path.join(dir, "cases.json");
const cases = JSON.parse(fs.readFileSync(casesFile, "utf8"))
  .filter((c) => c.bos_token === undefined && c.eos_token === undefined);
const templates = fs.readdirSync(dir).filter((f) => f.endsWith(".jinja")).sort();

for (const name of templates) {
  test(`${name}: /apply-template equals jinja2`, async () => {
    const file = path.join(dir, name);
    const want = new Map(execFileSync("python3", [path.join(dir, "render.py"), file, casesFile])
      .toString().trim().split("\n").map((l) => JSON.parse(l)).map((o) => [o.name, o]));
    const api = await startApi(["--chat-template", file]);
    try {
      for (const c of cases) {
        const body = { messages: c.messages, add_generation_prompt: c.add_generation_prompt };
        if (c.tools) body.tools = c.tools;
        const got = await postJson(`${api.url}/apply-template`, body);
        const ref = want.get(c.name);
        if (ref.error !== undefined) {
          assert.equal(got.status, 400, `${c.name}: jinja2 refused (${ref.error})`);
          assert.equal(got.json.error.code, "template_error");
        } else {
          assert.equal(got.status, 200, `${c.name}: ${JSON.stringify(got.json)}`);
          assert.equal(got.json.prompt, ref.prompt, c.name);
        }
      }
      // A chat request runs through the template too.
      const chat = await postJson(`${api.url}/v1/chat/completions`, {
        messages: [{ role: "user", content: "Hello!" }], temperature: 0, max_tokens: 4,
      });
      assert.equal(chat.status, 200, JSON.stringify(chat.json));
    } finally {
      assert.equal(await api.stop(), 0);
    }
  });
}
