#!/usr/bin/env python3
"""router_overhead.py — scenario 1: what a proxy in the path costs.

The same zero-cost regular baton-worker is loaded directly, through Baton, and through nginx
(reverse proxy with upstream keep-alive; skipped when nginx is not installed), non-streaming
and streaming, at a fixed moderate Poisson rate and at saturation (closed loop). Prints the
latency a proxy adds over the direct path (p50/p99, and as ratios) and the most requests per
second each path sustained (as a ratio of the direct path).
"""

import json
import sys

import scenlib


med = scenlib.med


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

        if args.repeat > 1:
            print(f"each figure is the median of {args.repeat} runs; runs alternate between "
                  "the paths so a load change on the machine hits all of them")
        for stream in (False, True):
            mode = "streaming" if stream else "non-streaming"
            metric = "ttft_ms" if stream else "e2e_ms"
            extra = ["--stream"] if stream else []
            moderate = {name: [] for name, _ in targets}
            sat = {name: [] for name, _ in targets}
            for rep in range(args.repeat):
                for name, url in targets:
                    moderate[name].append(lab.bench(url, *common, *extra, "--request-rate",
                                                    args.rate, label=f"{mode}-{name}-rate"))
            for rep in range(args.repeat):
                for name, url in targets:
                    sat[name].append(lab.bench(url, *common, *extra, "--concurrency",
                                               args.concurrency, label=f"{mode}-{name}-sat"))
            figures["runs"][mode] = {"moderate": moderate, "saturation": sat}

            d50, d99 = med(moderate["direct"], metric, "p50"), med(moderate["direct"], metric, "p99")
            rows = []
            for name, _ in targets:
                runs = moderate[name]
                p50, p99 = med(runs, metric, "p50"), med(runs, metric, "p99")
                add50 = None if name == "direct" else (p50 - d50) * 1000
                add99 = None if name == "direct" else (p99 - d99) * 1000
                rows.append([name, p50, p99, add50, scenlib.ratio(p50, d50), add99,
                             scenlib.ratio(p99, d99), med(runs, "request_throughput"),
                             med(runs, "e2e_ms", "p50") if stream else None,
                             med(runs, "max_lag_ms"), sum(r["failed"] for r in runs)])
            scenlib.print_table(
                f"{mode}: {'TTFT' if stream else 'E2E latency'} at {args.rate:g} req/s (Poisson)",
                ["path", "p50 ms", "p99 ms", "+p50 us", "p50 x", "+p99 us", "p99 x", "req/s",
                 "E2E p50 ms", "bench lag ms", "errors"], rows,
                note="bench lag: the latest any request left after its scheduled arrival (max "
                     "per run); large values mean the machine was busy and the figures are noisy.")

            base = med(sat["direct"], "request_throughput")
            rows = []
            for name, _ in targets:
                runs = sat[name]
                tput = med(runs, "request_throughput")
                lo = min(r["request_throughput"] for r in runs)
                hi = max(r["request_throughput"] for r in runs)
                rows.append([name, tput, scenlib.ratio(tput, base),
                             f"{lo:.0f}-{hi:.0f}" if len(runs) > 1 else "-",
                             med(runs, metric, "p50"), med(runs, metric, "p99"),
                             sum(r["failed"] for r in runs),
                             f"{100 * med(runs, 'bench_cpu_util'):.0f}%"])
            scenlib.print_table(
                f"{mode}: saturation, closed loop, concurrency {args.concurrency}",
                ["path", "max req/s", "x direct", "range", f"{'TTFT' if stream else 'E2E'} p50 ms",
                 "p99 ms", "errors", "bench CPU"], rows)
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
