// tmplref.mjs — the reference chat-template renderer: Hugging Face's JavaScript Jinja
// (@huggingface/jinja, the renderer transformers.js uses) over one template and a list of cases.
// usage: node tmplref.mjs NODE_MODULES CASES.json > out.json
// CASES = {"template": "...", "cases": [VARS, ...]}; out: per case {"text"} or {"error"}.
import { readFileSync } from "node:fs";
import { createRequire } from "node:module";
import path from "node:path";

const [nodeModules, casesPath] = process.argv.slice(2);
const require = createRequire(path.join(path.resolve(nodeModules), "noop.js"));
const { Template } = require("@huggingface/jinja");

const spec = JSON.parse(readFileSync(casesPath, "utf8"));
let template = null;
let compileError = null;
try {
  template = new Template(spec.template);
} catch (e) {
  compileError = String(e && e.message ? e.message : e);
}
const out = spec.cases.map((vars) => {
  if (compileError !== null) return { error: compileError };
  try {
    return { text: template.render(vars) };
  } catch (e) {
    return { error: String(e && e.message ? e.message : e) };
  }
});
process.stdout.write(JSON.stringify(out));
