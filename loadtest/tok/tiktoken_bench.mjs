// tiktoken_bench.mjs — OpenAI's tiktoken (npm "tiktoken": the Rust core compiled to WASM) on
// o200k_base over a text file: tokens and the median time of one encode of the whole file, as
// wall time and as the process's CPU time (user + system).
// usage: node tiktoken_bench.mjs NODE_MODULES TEXTFILE [RUNS]   (loadtest/scenarios/tokenizer.py)
import { readFileSync } from "node:fs";
import { createRequire } from "node:module";
import path from "node:path";

const [nodeModules, file, runsArg] = process.argv.slice(2);
const require = createRequire(path.join(nodeModules, "noop.js"));
const { get_encoding } = require("tiktoken");
const enc = get_encoding("o200k_base");
const text = readFileSync(file, "utf8");
const runs = Number(runsArg || 9);
enc.encode_ordinary(text); // load and warm the WASM module once
const times = [];
const cpu = [];
let tokens = 0;
for (let i = 0; i < runs; i++) {
  const c0 = process.cpuUsage();
  const t0 = process.hrtime.bigint();
  tokens = enc.encode_ordinary(text).length;
  times.push(Number(process.hrtime.bigint() - t0) / 1e6);
  const c = process.cpuUsage(c0);
  cpu.push((c.user + c.system) / 1e3);
}
times.sort((a, b) => a - b);
cpu.sort((a, b) => a - b);
const ms = times[Math.floor(runs / 2)];
const cpu_ms = cpu[Math.floor(runs / 2)];
process.stdout.write(
  JSON.stringify({ tokens, runs, ms, cpu_ms, tok_per_s: Math.round(tokens / (ms / 1e3)) }) + "\n",
);
enc.free();
