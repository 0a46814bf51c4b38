#!/usr/bin/env python3
"""router_cpu.py — router CPU time per request, two builds side by side (A/B).

Zero-cost baton-workers (one prefill + one decode for PD, one regular worker), chat requests at a
fixed Poisson rate, streaming and not; the router's CPU time (utime + stime from /proc/PID/stat)
over the run divided by the completed requests. The two builds alternate round by round, so slow
drift of the machine's load hits both alike; the table shows each build's median over rounds and
the ratio. CPU time is far less sensitive to a busy machine than latency, but /proc counts in
clock ticks (10 ms): keep rate x duration large enough (the default gives ~2.5 us resolution).
A flag can be A/B-tested on one build: --baseline-dir build --build-dir build and
--baseline-router-args / --router-args.

With --tokenizer DIR the A/B is tokenization in one build instead: three routers in front of the
same zero-cost regular worker, taking turns — off (no tokenizer), on (--tokenizer DIR, prompt
prefix cache off) and cached (--tokenizer DIR, the cache on) — over chat prompts of 2,000 and
100,000 words and 8-turn sessions whose last turn is ~2,000 words; the router's CPU per request,
its tokenization time (baton_tokenize_seconds) and the cache's hit rate.
"""

import re
import shlex
import statistics
import types
import urllib.request

import scenlib


def metric_sum(url, name):
    """Sum of a metric's samples in the router's /metrics (0 when absent)."""
    text = urllib.request.urlopen(url + "/metrics", timeout=10).read().decode()
    pat = r"^" + re.escape(name) + r"(?:\{[^}]*\})? (\S+)$"
    return sum(float(m.group(1)) for m in re.finditer(pat, text, re.M))


def tokenize_ab(args):
    """Tokenization off / on / on with the prefix cache, side by side in one run."""
    print("== router CPU per request: tokenization off / on / cached ==")
    print(scenlib.machine_line())
    cases = [("chat 2k words", ["--input-len", 2000], 100.0),
             ("chat 100k words", ["--input-len", 100000], 3.0),
             ("chat 8 turns, ~2k words at the last", ["--input-len", 250, "--multi-turn", 8],
              100.0)]
    if args.smoke:
        cases = [(n, a, r / 4) for n, a, r in cases[:1] + cases[2:]]
    arms = {"off": [], "on": ["--tokenizer", args.tokenizer, "--tokenize-cache-entries", 0],
            "cached": ["--tokenizer", args.tokenizer]}
    res, tok, hits, failed = {}, {}, {}, 0
    zero = ["--prefill-us-per-token", 0, "--decode-us-per-token", 0, "--max-queue", 100000]
    for _ in range(args.rounds):
        with scenlib.Lab(args, "cpu-tok") as lab:
            g = lab.worker("regular", *zero, name="regular")
            routers = {a: lab.router("--worker", g.url, "--threads", 1, *extra, name=f"baton-{a}")
                       for a, extra in arms.items()}
            for case, cargs, rate in cases:
                for arm, r in routers.items():
                    c0 = scenlib.cpu_seconds(r.pid)
                    t0 = metric_sum(r.url, "baton_tokenize_seconds_sum")
                    h0 = [metric_sum(r.url, f"baton_tokenize_cache_{k}_total")
                          for k in ("hits", "misses")]
                    out = lab.bench(r.url, "--endpoint", "chat", "--request-rate", rate,
                                    "--duration", args.duration, *cargs, "--output-len", 4)
                    c1 = scenlib.cpu_seconds(r.pid)
                    n = max(out["completed"], 1)
                    failed += out["failed"]
                    res.setdefault((case, arm), []).append((c1 - c0) * 1e6 / n)
                    tok.setdefault((case, arm), []).append(
                        (metric_sum(r.url, "baton_tokenize_seconds_sum") - t0) * 1e6 / n)
                    h1 = [metric_sum(r.url, f"baton_tokenize_cache_{k}_total")
                          for k in ("hits", "misses")]
                    looked = (h1[0] - h0[0]) + (h1[1] - h0[1])
                    hits.setdefault((case, arm), []).append(
                        (h1[0] - h0[0]) / looked if looked else 0.0)
    print("\n| prompt | off us/req | on us/req | cached us/req | on - off | tokenize us/req on "
          "| cached | cache hit rate |")
    print("|---|--:|--:|--:|--:|--:|--:|--:|")
    for case, _, _ in cases:
        m = {a: statistics.median(res[(case, a)]) for a in arms}
        t = {a: statistics.median(tok[(case, a)]) for a in arms}
        print(f"| {case} | {m['off']:.1f} | {m['on']:.1f} | {m['cached']:.1f} | "
              f"{m['on'] - m['off']:.1f} | {t['on']:.1f} | {t['cached']:.1f} | "
              f"{statistics.median(hits[(case, 'cached')]) * 100:.0f} % |")
    for (case, arm), v in res.items():
        print(f"{arm} {case} rounds: " + " ".join(f"{x:.1f}" for x in v))
    print(f"failed requests: {failed}")
    return 1 if failed else 0


def main():
    ap = scenlib.arg_parser(__doc__.split("\n")[0])
    ap.add_argument("--baseline-dir", required=False,
                    help="build directory of the baseline (A); --build-dir is B")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--rate", type=float, default=800.0)
    ap.add_argument("--duration", type=float, default=5.0)
    ap.add_argument("--router-args", default="", help="extra router flags for B (one string)")
    ap.add_argument("--baseline-router-args", default="",
                    help="extra router flags for A (A/B of a flag: the same build twice)")
    ap.add_argument("--tokenizer", metavar="DIR",
                    help="instead of two builds: tokenization off / on / cached in this build, "
                         "with this model's tokenizer (a chat template is needed)")
    args = ap.parse_args()
    if args.smoke:
        args.rounds, args.rate, args.duration = 1, 100.0, 1.0
    if args.tokenizer:
        return tokenize_ab(args)
    builds = {"B": args.build_dir}
    if args.baseline_dir:
        builds = {"A": args.baseline_dir, "B": args.build_dir}
    print("== router CPU per request ==")
    print(scenlib.machine_line())
    res = {k: {} for k in builds}
    failed = 0
    zero = ["--prefill-us-per-token", 0, "--decode-us-per-token", 0, "--max-queue", 100000]
    flags = {"A": shlex.split(args.baseline_router_args), "B": shlex.split(args.router_args)}
    for _ in range(args.rounds):
        for name, bdir in builds.items():
            a = types.SimpleNamespace(**dict(vars(args), build_dir=bdir))
            with scenlib.Lab(a, "cpu") as lab:
                p = lab.worker("prefill", *zero, name="prefill")
                d = lab.worker("decode", *zero, name="decode")
                g = lab.worker("regular", *zero, name="regular")
                rpd = lab.router("--prefill", p.url, p.ports["bootstrap"], "--decode", d.url,
                                 *flags[name], name="baton-pd")
                rrg = lab.router("--worker", g.url, *flags[name], name="baton-regular")
                for topo, r in (("pd", rpd), ("regular", rrg)):
                    for mode in ("stream", "json"):
                        extra = ["--stream"] if mode == "stream" else []
                        c0 = scenlib.cpu_seconds(r.pid)
                        out = lab.bench(r.url, "--endpoint", "chat", *extra, "--request-rate",
                                        args.rate, "--duration", args.duration, "--input-len",
                                        128, "--output-len", 16)
                        c1 = scenlib.cpu_seconds(r.pid)
                        n = max(out["completed"], 1)
                        failed += out["failed"]
                        res[name].setdefault((topo, mode), []).append((c1 - c0) * 1e6 / n)
    names = list(builds)
    head = " | ".join(f"{n} us/req (median)" for n in names)
    print(f"\n| topology | mode | {head} |" + (" B/A |" if len(names) == 2 else ""))
    print("|---|---|" + "--:|" * len(names) + ("--:|" if len(names) == 2 else ""))
    for key in res[names[0]]:
        meds = [statistics.median(res[n][key]) for n in names]
        ratio = f" {meds[1] / meds[0]:.2f} |" if len(names) == 2 and meds[0] else ""
        print(f"| {key[0]} | {key[1]} | " + " | ".join(f"{m:.1f}" for m in meds) + " |" + ratio)
    for n in names:
        for key, v in res[n].items():
            print(f"{n} {key[0]} {key[1]} rounds: " + " ".join(f"{x:.1f}" for x in v))
    print(f"failed requests: {failed}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
