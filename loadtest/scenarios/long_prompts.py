#!/usr/bin/env python3
"""long_prompts.py — scenario 4: very long prompts (100k-token bodies) through the router.

Non-streaming chat requests with a 100,000-word prompt (baton-worker counts one token per
word; the body is about 0.6 MB) to zero-cost workers: directly, through Baton in front of a
regular worker, through Baton in PD mode (1P1D: the router parses the body, injects the
bootstrap fields and sends it to both workers), and through nginx when installed. The proxy's
CPU time per request comes from /proc/PID/stat (utime + stime) before and after the run.
"""

import sys

import scenlib


def cpu_of(proc, with_children):
    pids = [proc.pid] + (scenlib.children(proc.pid) if with_children else [])
    return sum(scenlib.cpu_seconds(p) for p in pids)


def main():
    ap = scenlib.arg_parser(__doc__.split("\n")[0])
    ap.add_argument("--input-len", type=int, default=100000, help="prompt words (100000)")
    ap.add_argument("--output-len", type=int, default=16)
    ap.add_argument("--num-requests", type=int, default=200)
    ap.add_argument("--concurrency", type=int, default=2)
    args = ap.parse_args()
    if args.smoke:
        args.num_requests, args.input_len = 4, 20000
    print("== Scenario 4: long prompts, proxy CPU per request ==")
    print(scenlib.machine_line())
    zero = ["--prefill-us-per-token", 0, "--decode-us-per-token", 0]
    figures = {"config": vars(args), "runs": {}}
    rows = []
    failed = 0
    with scenlib.Lab(args, "long") as lab:
        w = lab.worker("regular", *zero, name="regular")
        pd_extra = []
        if lab.worker_has_option("--kv-pool-tokens"):
            # The KV pool must hold every prompt in flight (plus their outputs), with room.
            pool = 2 * args.concurrency * (args.input_len + args.output_len) + 65536
            pd_extra = ["--kv-pool-tokens", pool]
        p = lab.worker("prefill", *zero, *pd_extra, name="prefill")
        d = lab.worker("decode", *zero, *pd_extra, name="decode")
        r_reg = lab.router("--worker", w.url, name="baton-regular")
        r_pd = lab.router("--prefill", p.url, p.ports["bootstrap"], "--decode", d.url,
                          name="baton-pd")
        paths = [("direct", w.url, None, False), ("baton (regular)", r_reg.url, r_reg, False),
                 ("baton (PD 1P1D)", r_pd.url, r_pd, False)]
        ngx = lab.nginx([w.port])
        if ngx:
            paths.append(("nginx", ngx.url, ngx, True))
        else:
            scenlib.skip_note("nginx is not installed: no nginx row")
        print(f"requests: non-streaming chat, {args.input_len} prompt words, {args.output_len} "
              f"output tokens, {args.num_requests} requests, closed loop concurrency "
              f"{args.concurrency}")
        for name, url, proc, kids in paths:
            # One request first so connection set-up is not in the figure.
            lab.bench(url, "--input-len", args.input_len, "--output-len", args.output_len,
                      "--num-requests", 1, label="warm")
            c0 = cpu_of(proc, kids) if proc else None
            res = lab.bench(url, "--endpoint", "chat", "--input-len", args.input_len,
                            "--output-len", args.output_len, "--num-requests", args.num_requests,
                            "--concurrency", args.concurrency, label=name.split()[0])
            c1 = cpu_of(proc, kids) if proc else None
            figures["runs"][name] = res
            failed += res["failed"]
            n = res["completed"] + res["failed"]
            cpu_ms = (c1 - c0) * 1000 / n if proc and n else None
            rows.append([name, res["completed"], res["e2e_ms"].get("p50"), res["e2e_ms"].get("p99"),
                         res["request_throughput"], cpu_ms,
                         (c1 - c0) if proc else None, res["failed"]])
            figures["runs"][name]["proxy_cpu_ms_per_request"] = cpu_ms
        scenlib.print_table(
            f"{args.input_len}-word prompts, non-streaming chat, concurrency {args.concurrency}",
            ["path", "requests", "E2E p50 ms", "E2E p99 ms", "req/s", "proxy CPU ms/req",
             "proxy CPU s total", "errors"], rows,
            note=f"CPU from /proc/PID/stat in {scenlib.CLK_TCK} Hz ticks (10 ms resolution "
                 "over the whole run); nginx: master + workers.")
    scenlib.write_json(args.json, figures)
    print(f"\nscenario 4 done: {failed} failed requests; {scenlib.load_now()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
