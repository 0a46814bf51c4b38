#!/usr/bin/env python3
"""router_overhead.py — scenario 1: what a proxy in the path costs.

The same zero-cost regular baton-worker is loaded directly, through Baton, and through nginx
(reverse proxy with upstream keep-alive; skipped when nginx is not installed), non-streaming
and streaming, at a fixed moderate Poisson rate and at saturation (closed loop). Prints the
latency a proxy adds over the direct path (p50/p99, and as ratios) and the most requests per
second each path sustained (as a ratio of the direct path).
"""

import sys

import scenlib


def main():
    ap = scenlib.arg_parser(__doc__.split("\n")[0])
    ap.add_argument("--rate", type=float, default=500.0, help="moderate rate, req/s (500)")
    ap.add_argument("--concurrency", type=int, default=32, help="saturation: closed-loop users (32)")
    ap.add_argument("--duration", type=float, default=10.0, help="seconds per run (10)")
    ap.add_argument("--warmup", type=float, default=1.0, help="warm-up seconds per run (1)")
    ap.add_argument("--endpoint", default="chat", choices=["chat", "completions", "generate"])
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=16)
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
        targets = [("direct", w.url), ("baton", r.url)]
        ngx = lab.nginx([w.port])
        if ngx:
            targets.append(("nginx", ngx.url))
        else:
            scenlib.skip_note("nginx is not installed: no nginx column "
                              "(scripts/install-bench-deps.sh installs it)")
        print(f"worker {w.url}, baton {r.url}" + (f", nginx {ngx.url}" if ngx else ""))
        print(f"load: {args.endpoint}, {args.input_len} prompt words, {args.output_len} output "
              f"tokens; {args.duration}s per run after {args.warmup}s warm-up")

        for stream in (False, True):
            mode = "streaming" if stream else "non-streaming"
            metric = "ttft_ms" if stream else "e2e_ms"
            extra = ["--stream"] if stream else []
            moderate, sat = {}, {}
            for name, url in targets:
                moderate[name] = lab.bench(url, *common, *extra, "--request-rate", args.rate,
                                           label=f"{mode}-{name}-rate")
                sat[name] = lab.bench(url, *common, *extra, "--concurrency", args.concurrency,
                                      label=f"{mode}-{name}-sat")
            figures["runs"][mode] = {"moderate": moderate, "saturation": sat}

            d = moderate["direct"][metric]
            rows = []
            for name, _ in targets:
                m = moderate[name][metric]
                p50, p99 = m.get("p50"), m.get("p99")
                add50 = None if name == "direct" else (p50 - d["p50"]) * 1000
                add99 = None if name == "direct" else (p99 - d["p99"]) * 1000
                rows.append([name, p50, p99, add50, scenlib.ratio(p50, d["p50"]), add99,
                             scenlib.ratio(p99, d["p99"]),
                             moderate[name]["request_throughput"],
                             moderate[name]["e2e_ms"].get("p50") if stream else None,
                             moderate[name]["failed"]])
            scenlib.print_table(
                f"{mode}: {'TTFT' if stream else 'E2E latency'} at {args.rate:g} req/s (Poisson)",
                ["path", "p50 ms", "p99 ms", "+p50 us", "p50 x", "+p99 us", "p99 x", "req/s",
                 "E2E p50 ms", "errors"], rows)

            base = sat["direct"]["request_throughput"]
            rows = []
            for name, _ in targets:
                s = sat[name]
                rows.append([name, s["request_throughput"], scenlib.ratio(s["request_throughput"], base),
                             s[metric].get("p50"), s[metric].get("p99"), s["failed"],
                             f"{100 * s['bench_cpu_util']:.0f}%"])
            scenlib.print_table(
                f"{mode}: saturation, closed loop, concurrency {args.concurrency}",
                ["path", "max req/s", "x direct", f"{'TTFT' if stream else 'E2E'} p50 ms",
                 "p99 ms", "errors", "bench CPU"], rows)
        scenlib.write_json(args.json, figures)
    bad = sum(run["failed"] for m in figures["runs"].values() for part in m.values()
              for run in part.values())
    print(f"\nscenario 1 done: {bad} failed requests")
    return 0


if __name__ == "__main__":
    sys.exit(main())
