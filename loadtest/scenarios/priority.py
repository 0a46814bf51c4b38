#!/usr/bin/env python3
"""priority.py — priority classes under a flood: a bulk flood at 5x the router's capacity and
interactive requests at 10% of it, side by side in one run, against interactive alone
(unloaded). Target: interactive TTFT p99 within 1.5x of its unloaded value and no interactive
request shed. The same flood with every request in the default class shows what the classes
change; runs with --priority-reserve-pct 50 (the default) and 25 show what the
interactive reserve does (--reserves sets them and their order).

Capacity is measured first: a closed loop of --max-concurrent-requests users (the router's
admission cap) through the router; its request rate is "capacity". Streaming chat everywhere,
through one regular baton-worker whose batch is larger than the cap, so the router's admission
queue is where requests wait.
"""

import json
import os
import subprocess
import sys
import time

import scenlib


def bench_async(lab, base_url, label, *args):
    """Starts baton-bench (like Lab.bench) without waiting; returns (popen, result path)."""
    lab.bench_runs += 1
    out = os.path.join(lab.dir, f"bench-{lab.bench_runs:03d}-{label}.json")
    argv = [lab.bin("baton-bench"), "--base-url", base_url, "--result-json", out,
            "--no-progress", "--quiet"] + [str(a) for a in args]
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return p, out, argv


def bench_wait(started):
    p, out, argv = started
    text, _ = p.communicate()
    if p.returncode != 0 or not os.path.exists(out):
        raise RuntimeError(f"baton-bench failed ({p.returncode}): {' '.join(argv)}\n{text}")
    with open(out) as f:
        return json.load(f)


def shed(res):
    """Requests refused by the router's admission (429 queue_full, 408 queue_timeout)."""
    st = res.get("http_status", {})
    return int(st.get("429", 0)) + int(st.get("408", 0))


def main():
    ap = scenlib.arg_parser(__doc__.split("\n")[0])
    ap.add_argument("--max-concurrent-requests", type=int, default=8,
                    help="the router's admission cap (default 8)")
    ap.add_argument("--duration", type=float, default=30.0,
                    help="seconds of interactive load per run (default 30)")
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=32)
    ap.add_argument("--decode-us-per-token", type=int, default=2000)
    ap.add_argument("--queue-size", type=int, default=1024,
                    help="the router's --queue-size (default 1024, the router's own default)")
    ap.add_argument("--reserves", default="50,25",
                    help="--priority-reserve-pct of each run with classes, in run order (50,25)")
    ap.add_argument("--flood", type=float, default=5.0, help="bulk rate / capacity (5)")
    ap.add_argument("--interactive", type=float, default=0.1,
                    help="interactive rate / capacity (0.1)")
    args = ap.parse_args()
    if args.smoke:
        # a short queue: what the flood leaves queued drains in a moment
        args.duration, args.max_concurrent_requests, args.queue_size = 3.0, 4, 64
    cap = args.max_concurrent_requests
    print("== Priority classes: interactive TTFT under a bulk flood ==")
    print(scenlib.machine_line())
    common = ["--endpoint", "chat", "--stream", "--input-len", args.input_len, "--output-len",
              args.output_len, "--timeout", 120]
    figures = {"config": vars(args), "runs": {}}
    with scenlib.Lab(args, "priority") as lab:
        w = lab.worker("regular", "--decode-us-per-token", args.decode_us_per_token,
                       "--max-batch", 4 * cap, "--max-queue", 100000, name="worker")
        def router(*extra):
            return lab.router("--worker", w.url, "--max-concurrent-requests", cap,
                              "--queue-size", args.queue_size, "--queue-timeout-ms", 20000,
                              "--check-interval-ms", 0, *extra,
                              name=f"baton-{lab.bench_runs}")

        r = router()
        sat = lab.bench(r.url, *common, "--concurrency", cap, "--duration",
                        max(2.0, args.duration / 3), label="capacity")
        capacity = sat["request_throughput"]
        figures["runs"]["capacity"] = sat
        print(f"router cap {cap} in flight; capacity (closed loop, {cap} users): "
              f"{capacity:.1f} req/s; E2E p50 {scenlib.fmt(sat['e2e_ms'].get('p50'))} ms")
        i_rate, b_rate = args.interactive * capacity, args.flood * capacity
        print(f"interactive {i_rate:.2f} req/s ({args.interactive:g}x), bulk flood "
              f"{b_rate:.1f} req/s ({args.flood:g}x), {args.duration:g} s each")
        i_args = [*common, "--request-rate", f"{i_rate:.3f}", "--duration", args.duration,
                  "--seed", 7]
        alone = lab.bench(r.url, *i_args, "--header", "x-priority: interactive",
                          label="interactive-alone")
        figures["runs"]["interactive_alone"] = alone
        rows = [["interactive alone", "-", scenlib.fmt(alone["ttft_ms"].get("p50")),
                 scenlib.fmt(alone["ttft_ms"].get("p99")), "1.00", alone["completed"],
                 alone["failed"], shed(alone), "-", "-"]]
        base = alone["ttft_ms"].get("p99")
        verdict = {}
        runs = [(f"classes, reserve {pct}%", "interactive", "bulk",
                 ("--priority-reserve-pct", pct))
                for pct in (int(x) for x in args.reserves.split(",") if x)]
        runs.append(("no classes", "default", "default", ()))
        for name, i_hdr, b_hdr, extra in runs:
            r = router(*extra)  # a fresh router: no queue left over from the previous run
            # the flood starts first and runs a second past the interactive load at both ends
            flood = bench_async(lab, r.url, f"flood-{i_hdr}", *common, "--request-rate",
                                f"{b_rate:.3f}", "--duration", args.duration + 2, "--seed", 3,
                                "--header", f"x-priority: {b_hdr}")
            time.sleep(1.0)
            inter = lab.bench(r.url, *i_args, "--header", f"x-priority: {i_hdr}",
                              label=f"interactive-{i_hdr}")
            bulk = bench_wait(flood)
            figures["runs"][name] = {"interactive": inter, "flood": bulk}
            p99 = inter["ttft_ms"].get("p99")
            ratio = scenlib.ratio(p99, base)
            verdict[name] = (p99 / base if p99 and base else None, inter["failed"])
            rows.append([f"interactive, {name}", f"{args.flood:g}x " + b_hdr,
                         scenlib.fmt(inter["ttft_ms"].get("p50")), scenlib.fmt(p99), ratio,
                         inter["completed"], inter["failed"], shed(inter), bulk["completed"],
                         shed(bulk)])
        scenlib.print_table(
            "interactive TTFT under a bulk flood",
            ["run", "flood", "TTFT p50", "TTFT p99", "p99 / alone", "completed", "failed",
             "shed", "flood done", "flood shed"], rows,
            note="TTFT in ms; 'shed': 429 queue_full + 408 queue_timeout")
    ratio, failed = verdict["classes, reserve 50%"] if "classes, reserve 50%" in verdict \
        else next(iter(verdict.values()))
    met = ratio is not None and ratio <= 1.5 and failed == 0
    print(f"target, default reserve (interactive TTFT p99 <= 1.5x alone, none shed): "
          f"{'met' if met else 'MISSED'} (ratio {scenlib.fmt(ratio)}, {failed} interactive "
          f"failed)")
    scenlib.write_json(args.json, figures)
    print(f"\npriority done: {failed} failed interactive requests; {scenlib.load_now()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
