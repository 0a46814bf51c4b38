#!/usr/bin/env python3
"""router_overhead.py — scenario 1: what a proxy in the path costs.

The same zero-cost regular baton-worker is loaded directly, through Baton in regular mode,
and through nginx (reverse proxy with upstream keep-alive; skipped when nginx is not
installed); Baton in PD mode fronts a zero-cost prefill + decode pair (two upstream exchanges
per request). Non-streaming and streaming, at a fixed moderate Poisson rate, one user at a
time (closed loop, c=1) and at saturation (closed loop, c=32). Prints the latency a proxy adds
over the direct path (p50/p99, and as ratios), the most requests per second each path
sustained (as a ratio of the direct path), and each proxy's CPU time per request from /proc
(utime + stime of its whole process tree: nginx's master and workers, Baton's process with
its threads) — then the overhead goals, as ratios (Baton PD and regular against
nginx: CPU per request at c=32, added p50 at c=1 and c=32).
"""

import json
import sys

import scenlib


med = scenlib.med

# The overhead goals: (name, numerator path, denominator path, what, goal or None); {c} is the
# saturation concurrency.
GOALS = [("CPU/request at c={c}, Baton PD / nginx", "baton-pd", "nginx", "cpu", 1.5),
         ("CPU/request at c={c}, Baton regular / nginx", "baton", "nginx", "cpu", 1.0),
         ("added p50 at c=1, Baton PD / nginx", "baton-pd", "nginx", "add_c1", 1.0),
         ("added p50 at c=1, Baton regular / nginx", "baton", "nginx", "add_c1", None),
         ("added p50 at c={c}, Baton PD / nginx", "baton-pd", "nginx", "add_sat", 1.0),
         ("added p50 at c={c}, Baton regular / nginx", "baton", "nginx", "add_sat", None),
         # The same request rate for every path: PD's saturation is bounded by its workers' KV
         # hand-off, and fewer requests per wake-up cost more CPU each.
         ("CPU/request at {rate:g} req/s, Baton PD / nginx", "baton-pd", "nginx", "cpu_rate",
          None),
         ("CPU/request at {rate:g} req/s, Baton regular / nginx", "baton", "nginx", "cpu_rate",
          None)]


def cpu_us(runs):
    """Median proxy CPU µs per completed request over runs; None for the direct path."""
    return med(runs, "proxy_cpu_us_per_request")


def goal_rows(figs, concurrency, rate):
    """Rows of the goals table from {what: {path: value}}."""
    rows = []
    for name, num, den, what, goal in GOALS:
        a, b = figs[what].get(num), figs[what].get(den)
        # An added latency at or under zero is noise around nothing: no ratio from it.
        r = a / b if a is not None and b is not None and a > 0 and b > 0 else None
        name = name.format(c=concurrency, rate=rate)
        verdict = "-" if r is None or goal is None else ("met" if r <= goal else "not met")
        rows.append([name, a, b, f"{r:.2f}x" if r is not None else "-",
                     f"<= {goal:.1f}x" if goal else "-", verdict])
    return rows


def main():
    ap = scenlib.arg_parser(__doc__.split("\n")[0])
    ap.add_argument("--rate", type=float, default=500.0, help="moderate rate, req/s (500)")
    ap.add_argument("--concurrency", type=int, default=32, help="saturation: closed-loop users (32)")
    ap.add_argument("--duration", type=float, default=10.0, help="seconds per run (10)")
    ap.add_argument("--warmup", type=float, default=1.0, help="warm-up seconds per run (1)")
    ap.add_argument("--endpoint", default="chat", choices=["chat", "completions", "generate"])
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=16)
    ap.add_argument("--repeat", type=int, default=1,
                    help="runs per path, interleaved across paths; tables show medians (1)")
    args = ap.parse_args()
    if args.smoke:
        args.rate, args.concurrency, args.duration, args.warmup = 100.0, 8, 1.0, 0.2

    print("== Scenario 1: router overhead (direct vs Baton vs nginx) ==")
    print(scenlib.machine_line())
    common = ["--endpoint", args.endpoint, "--input-len", args.input_len, "--output-len",
              args.output_len, "--duration", args.duration, "--warmup", args.warmup]
    figures = {"config": vars(args), "runs": {}}
    with scenlib.Lab(args, "overhead") as lab:
        w = lab.worker("regular", "--prefill-us-per-token", 0, "--decode-us-per-token", 0,
                       "--max-batch", 4096, "--max-queue", 100000)
        r = lab.router("--worker", w.url)
        zero = ["--prefill-us-per-token", 0, "--decode-us-per-token", 0, "--max-queue", 100000]
        p = lab.worker("prefill", *zero, name="prefill")
        d = lab.worker("decode", *zero, name="decode")
        rpd = lab.router("--prefill", p.url, p.ports["bootstrap"], "--decode", d.url,
                         name="baton-pd")
        # (name, url, the process tree whose CPU is the proxy's; None: not a proxy)
        targets = [("direct", w.url, None), ("baton", r.url, r), ("baton-pd", rpd.url, rpd)]
        ngx = lab.nginx([w.port])
        if ngx:
            targets.append(("nginx", ngx.url, ngx))
        else:
            scenlib.skip_note("nginx is not installed: no nginx column "
                              "(scripts/install-bench-deps.sh installs it)")
        print(f"worker {w.url}, baton {r.url}, baton-pd {rpd.url} (prefill {p.url}, decode "
              f"{d.url})" + (f", nginx {ngx.url}" if ngx else ""))

        def run(proc, url, *load, label):
            """One baton-bench run; the proxy's CPU per completed request joins its result."""
            c0 = scenlib.tree_cpu_seconds(proc.pid) if proc else None
            res = lab.bench(url, *load, label=label)
            if proc:
                res["proxy_cpu_us_per_request"] = ((scenlib.tree_cpu_seconds(proc.pid) - c0)
                                                   * 1e6 / max(res["completed"], 1))
            return res
        print(f"load: {args.endpoint}, {args.input_len} prompt words, {args.output_len} output "
              f"tokens; {args.duration}s per run after {args.warmup}s warm-up")

        if args.repeat > 1:
            print(f"each figure is the median of {args.repeat} runs; runs alternate between "
                  "the paths so a load change on the machine hits all of them")
        for stream in (False, True):
            mode = "streaming" if stream else "non-streaming"
            metric = "ttft_ms" if stream else "e2e_ms"
            extra = ["--stream"] if stream else []
            loads = {"moderate": ["--request-rate", args.rate], "c1": ["--concurrency", 1],
                     "saturation": ["--concurrency", args.concurrency]}
            runs_of = {k: {name: [] for name, _, _ in targets} for k in loads}
            for key, load in loads.items():
                for rep in range(args.repeat):
                    for name, url, proc in targets:
                        runs_of[key][name].append(run(proc, url, *common, *extra, *load,
                                                      label=f"{mode}-{name}-{key}"))
            moderate, c1, sat = runs_of["moderate"], runs_of["c1"], runs_of["saturation"]
            figures["runs"][mode] = runs_of
            added = {}  # {load: {path: added p50 in µs}}

            def latency_rows(runs_by_path, key):
                d50 = med(runs_by_path["direct"], metric, "p50")
                d99 = med(runs_by_path["direct"], metric, "p99")
                rows = []
                for name, _, _ in targets:
                    runs = runs_by_path[name]
                    p50, p99 = med(runs, metric, "p50"), med(runs, metric, "p99")
                    add50 = None if name == "direct" else (p50 - d50) * 1000
                    add99 = None if name == "direct" else (p99 - d99) * 1000
                    if add50 is not None:
                        added.setdefault(key, {})[name] = add50
                    rows.append([name, p50, p99, add50, scenlib.ratio(p50, d50), add99,
                                 scenlib.ratio(p99, d99), med(runs, "request_throughput"),
                                 cpu_us(runs), med(runs, "e2e_ms", "p50") if stream else None,
                                 med(runs, "max_lag_ms"), sum(r["failed"] for r in runs)])
                return rows

            heads = ["path", "p50 ms", "p99 ms", "+p50 us", "p50 x", "+p99 us", "p99 x", "req/s",
                     "CPU us/req", "E2E p50 ms", "bench lag ms", "errors"]
            what = "TTFT" if stream else "E2E latency"
            scenlib.print_table(
                f"{mode}: {what} at {args.rate:g} req/s (Poisson)", heads,
                latency_rows(moderate, "moderate"),
                note="bench lag: the latest any request left after its scheduled arrival (max "
                     "per run); large values mean the machine was busy and the figures are noisy. "
                     "CPU us/req: the proxy's process tree, utime + stime from /proc.")
            scenlib.print_table(f"{mode}: {what}, closed loop, concurrency 1", heads,
                                latency_rows(c1, "add_c1"))

            base = med(sat["direct"], "request_throughput")
            d50 = med(sat["direct"], metric, "p50")
            rows = []
            for name, _, _ in targets:
                runs = sat[name]
                tput = med(runs, "request_throughput")
                lo = min(r["request_throughput"] for r in runs)
                hi = max(r["request_throughput"] for r in runs)
                p50 = med(runs, metric, "p50")
                if name != "direct":
                    added.setdefault("add_sat", {})[name] = (p50 - d50) * 1000
                rows.append([name, tput, scenlib.ratio(tput, base),
                             f"{lo:.0f}-{hi:.0f}" if len(runs) > 1 else "-", p50,
                             None if name == "direct" else (p50 - d50) * 1000,
                             med(runs, metric, "p99"), cpu_us(runs),
                             sum(r["failed"] for r in runs),
                             f"{100 * med(runs, 'bench_cpu_util'):.0f}%"])
            scenlib.print_table(
                f"{mode}: saturation, closed loop, concurrency {args.concurrency}",
                ["path", "max req/s", "x direct", "range", f"{'TTFT' if stream else 'E2E'} p50 ms",
                 "+p50 us", "p99 ms", "CPU us/req", "errors", "bench CPU"], rows)

            figs = {"cpu": {n: cpu_us(sat[n]) for n, _, p in targets if p},
                    "cpu_rate": {n: cpu_us(moderate[n]) for n, _, p in targets if p},
                    "add_c1": added.get("add_c1", {}), "add_sat": added.get("add_sat", {})}
            if ngx:
                rows = goal_rows(figs, args.concurrency, args.rate)
                figures.setdefault("goals", {})[mode] = rows
                scenlib.print_table(
                    f"{mode}: overhead ratios (one run, side by side)",
                    ["ratio", "Baton", "nginx", "ratio x", "goal", "verdict"], rows,
                    note=f"CPU in us per request (c={args.concurrency}), added p50 in us over "
                         "the direct path; an added latency at or under zero gives no ratio (-).")
            else:
                scenlib.skip_note("nginx is not installed: no overhead ratios")
        # baton-bench's own ceiling: the cheapest server at hand (nginx answering a fixed body,
        # one worker process) — the bench has to parse the same bytes as from baton-worker.
        words = " ".join(["w"] * args.output_len).split(" ")
        chat_body = json.dumps({"choices": [{"index": 0, "message": {
            "role": "assistant", "content": " ".join(words)}}],
            "usage": {"prompt_tokens": args.input_len, "completion_tokens": args.output_len}})
        events = [{"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}]
        events += [{"choices": [{"index": 0, "delta": {"content": (" " if i else "") + w}}]}
                   for i, w in enumerate(words)]
        events.append({"choices": [], "usage": {"prompt_tokens": args.input_len,
                                                "completion_tokens": args.output_len}})
        sse = "".join(f"data: {json.dumps(e)}\n\n" for e in events) + "data: [DONE]\n\n"
        canned = lab.nginx_canned({"/plain/v1/chat/completions": ("application/json", chat_body),
                                   "/sse/v1/chat/completions": ("text/event-stream", sse)})
        if canned:
            rows = []
            for stream in (False, True):
                prefix = "/sse" if stream else "/plain"
                runs = [lab.bench(canned.url + prefix, *common, *(["--stream"] if stream else []),
                                  "--concurrency", args.concurrency, label="ceiling")
                        for _ in range(args.repeat)]
                figures.setdefault("bench_ceiling", {})[
                    "streaming" if stream else "non-streaming"] = runs
                tput = med(runs, "request_throughput")
                rows.append(["streaming" if stream else "non-streaming", tput,
                             f"{100 * med(runs, 'bench_cpu_util'):.0f}%",
                             sum(r["failed"] for r in runs)])
            scenlib.print_table(
                f"baton-bench's own ceiling: canned answers from nginx (1 worker process), "
                f"closed loop, concurrency {args.concurrency}",
                ["answers", "req/s", "bench CPU", "errors"], rows,
                note="the same bytes as baton-worker sends (one body; streaming: "
                     f"{len(events) + 1} SSE events), from a server that does no work")
        else:
            scenlib.skip_note("nginx is not installed: no baton-bench ceiling table")
        scenlib.write_json(args.json, figures)
    bad = sum(run["failed"] for m in figures["runs"].values() for part in m.values()
              for runs in part.values() for run in runs)
    print(f"\nscenario 1 done: {bad} failed requests; {scenlib.load_now()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
