#!/usr/bin/env python3
"""pd_protocols.py — TTFT of the PD protocols: the same baton-worker pair and load
through Baton with sglang (both legs at once), vllm-nixl (prefill answers first, then the decode
pulls; sequential by design) and vllm-mooncake (one transfer_id, both legs at once). Closed loop
at each concurrency, streaming chat; prints TTFT/E2E per protocol and NIXL's TTFT over SGLang's.
"""

import json
import os
import sys

import scenlib


def main():
    ap = scenlib.arg_parser(__doc__.split("\n")[0])
    ap.add_argument("--concurrency", default="1,8", help="closed-loop users, comma list (1,8)")
    ap.add_argument("--num-requests", type=int, default=300, help="measured requests per run")
    ap.add_argument("--input-len", type=int, default=512)
    ap.add_argument("--output-len", type=int, default=32)
    ap.add_argument("--prefill-us-per-token", type=int, default=20)
    ap.add_argument("--decode-us-per-token", type=int, default=2000)
    args = ap.parse_args()
    if args.smoke:
        args.concurrency, args.num_requests = "2", 20
    concs = [int(x) for x in args.concurrency.split(",") if x]
    print("== PD protocols: TTFT through Baton (sglang vs vllm-nixl vs vllm-mooncake) ==")
    print(scenlib.machine_line())
    print(f"workers: prefill {args.prefill_us_per_token} us/prompt token, decode "
          f"{args.decode_us_per_token} us/step; streaming chat, {args.input_len} prompt words, "
          f"{args.output_len} output tokens, {args.num_requests} requests per run")
    timing = ["--prefill-us-per-token", args.prefill_us_per_token, "--decode-us-per-token",
              args.decode_us_per_token]
    figures = {"config": vars(args), "runs": {}}
    failed = 0
    rows = []
    p50 = {}
    for proto in ("sglang", "vllm-nixl", "vllm-mooncake"):
        with scenlib.Lab(args, f"proto-{proto}") as lab:
            wargs = timing + (["--protocol", proto] if proto != "sglang" else [])
            p = lab.worker("prefill", *wargs, name="prefill")
            d = lab.worker("decode", *wargs, name="decode")
            if proto == "sglang":
                r = lab.router("--prefill", p.url, p.ports["bootstrap"], "--decode", d.url)
            elif proto == "vllm-nixl":
                r = lab.router("--pd-protocol", proto, "--prefill", p.url, "--decode", d.url)
            else:
                # the prefill's engine id and bootstrap address come with its registration
                cfg = os.path.join(lab.dir, "baton.json")
                with open(cfg, "w") as f:
                    json.dump({"pd_protocol": proto, "workers": [
                        {"url": p.url, "worker_type": "prefill", "engine_id": "prefill-0",
                         "bootstrap_addr": f"http://{scenlib.HOST}:{p.ports['bootstrap']}"},
                        {"url": d.url, "worker_type": "decode"}]}, f)
                r = lab.router("--config", cfg)
            for c in concs:
                res = lab.bench(r.url, "--endpoint", "chat", "--stream", "--concurrency", c,
                                "--num-requests", args.num_requests, "--input-len",
                                args.input_len, "--output-len", args.output_len,
                                label=f"{proto}-c{c}")
                figures["runs"][f"{proto}@c{c}"] = res
                failed += res["failed"]
                t, e = res["ttft_ms"], res["e2e_ms"]
                p50[(proto, c)] = t.get("p50")
                rows.append([proto, c, res["request_throughput"], t.get("mean"), t.get("p50"),
                             t.get("p99"), e.get("p50"), res["failed"]])
    scenlib.print_table("TTFT by protocol",
                        ["protocol", "conc", "req/s", "TTFT mean", "TTFT p50", "TTFT p99",
                         "E2E p50", "errors"], rows, note="latencies in ms")
    for c in concs:
        print(f"c={c}: vllm-nixl TTFT p50 / sglang TTFT p50 = "
              f"{scenlib.ratio(p50.get(('vllm-nixl', c)), p50.get(('sglang', c)))}")
    scenlib.write_json(args.json, figures)
    print(f"\npd_protocols done: {failed} failed requests; {scenlib.load_now()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
