#!/usr/bin/env python3
"""pd_sweep.py — scenario 2: prefill/decode disaggregation end to end with simulated workers.

1P1D and 2P2D topologies of baton-worker (prefill and decode modes, with their timing model)
behind Baton; an open-loop Poisson rate sweep of streaming chat requests. Prints, per
topology and rate, the achieved throughput and TTFT / TPOT / ITL / E2E percentiles.
"""

import sys

import scenlib


def main():
    ap = scenlib.arg_parser(__doc__.split("\n")[0])
    ap.add_argument("--rates", default="10,25,50,75,100,150",
                    help="comma-separated request rates, req/s (10,25,50,75,100,150)")
    ap.add_argument("--topologies", default="1x1,2x2", help="PxD list (1x1,2x2)")
    ap.add_argument("--duration", type=float, default=10.0, help="seconds per rate (10)")
    ap.add_argument("--warmup", type=float, default=1.0, help="warm-up seconds per rate (1)")
    ap.add_argument("--input-len", type=int, default=512)
    ap.add_argument("--output-len", type=int, default=32)
    ap.add_argument("--prefill-us-per-token", type=int, default=20)
    ap.add_argument("--decode-us-per-token", type=int, default=2000)
    ap.add_argument("--max-batch", type=int, default=32)
    args = ap.parse_args()
    if args.smoke:
        args.rates, args.topologies, args.duration, args.warmup = "20", "1x1,2x2", 1.0, 0.2
    rates = [float(x) for x in args.rates.split(",") if x]
    topologies = []
    for t in args.topologies.split(","):
        p, d = t.lower().split("x")
        topologies.append((int(p), int(d)))

    print("== Scenario 2: PD end to end with simulated workers (rate sweep) ==")
    print(scenlib.machine_line())
    print(f"workers: prefill {args.prefill_us_per_token} us/prompt token, decode "
          f"{args.decode_us_per_token} us/step, max batch {args.max_batch}; requests: streaming "
          f"chat, {args.input_len} prompt words, {args.output_len} output tokens; "
          f"{args.duration}s per rate after {args.warmup}s warm-up")
    cap_p = 1e6 / (args.prefill_us_per_token * args.input_len) if args.prefill_us_per_token else 0
    if cap_p:
        print(f"model capacity: one prefill worker serves at most {cap_p:.0f} req/s "
              f"({args.input_len} x {args.prefill_us_per_token} us per prompt)")
    timing = ["--prefill-us-per-token", args.prefill_us_per_token, "--decode-us-per-token",
              args.decode_us_per_token, "--max-batch", args.max_batch, "--max-queue", 100000]
    figures = {"config": vars(args), "runs": {}}
    failed = 0
    for n_p, n_d in topologies:
        name = f"{n_p}P{n_d}D"
        with scenlib.Lab(args, f"pd-{name}") as lab:
            router_args = []
            for i in range(n_p):
                w = lab.worker("prefill", *timing, name=f"prefill-{i}")
                router_args += ["--prefill", w.url, w.ports["bootstrap"]]
            for i in range(n_d):
                w = lab.worker("decode", *timing, name=f"decode-{i}")
                router_args += ["--decode", w.url]
            r = lab.router(*router_args)
            rows = []
            for rate in rates:
                res = lab.bench(r.url, "--endpoint", "chat", "--stream", "--request-rate", rate,
                                "--duration", args.duration, "--warmup", args.warmup,
                                "--input-len", args.input_len, "--output-len", args.output_len,
                                label=f"{name}-{rate:g}")
                figures["runs"][f"{name}@{rate:g}"] = res
                failed += res["failed"]
                t, p, i, e = res["ttft_ms"], res["tpot_ms"], res["itl_ms"], res["e2e_ms"]
                rows.append([f"{rate:g}", res["request_throughput"], res["output_throughput"],
                             t.get("p50"), t.get("p99"), p.get("p50"), p.get("p99"),
                             i.get("p99"), e.get("p50"), e.get("p99"), res["failed"]])
            scenlib.print_table(
                f"{name}: streaming chat through Baton",
                ["rate", "req/s", "out tok/s", "TTFT p50", "TTFT p99", "TPOT p50", "TPOT p99",
                 "ITL p99", "E2E p50", "E2E p99", "errors"], rows,
                note="latencies in ms")
    scenlib.write_json(args.json, figures)
    print(f"\nscenario 2 done: {failed} failed requests; {scenlib.load_now()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
