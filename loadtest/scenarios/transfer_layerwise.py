#!/usr/bin/env python3
"""transfer_layerwise.py — scenario 6: layer-wise KV hand-off on/off, TTFT through Baton.

1P1D baton-worker (prefill + decode, model preset `large`: 64 layers, 8 KV heads, head dim 128,
bf16, 64-token pages = 256 KiB of KV per token) behind the Baton router, KV over tcp, with
`--layerwise on` (each layer is written as soon as the prefill's timing model finishes it) and
`--layerwise off` (the whole KV is written after the prefill). Streaming chat requests with
3.5k and 16k prompt tokens and 1 output token, closed loop at concurrency 1 and 32. Fresh
workers per row, warmed up first (their KV pools are touched by warm-up requests).

Besides TTFT (baton-bench), the prefill worker's /metrics give, per room, the transfer time
(first write to DONE) and the transfer tail (end of compute to DONE: what was not hidden).

The target: TTFT(layer-wise) <= prefill time + the time to send one layer. Both terms are
measured in the same run, not assumed:
- prefill time: the same requests through the same router to one regular (not disaggregated)
  baton-worker with the same timing model, TTFT p50 at c=1: what the prefill costs a client
  with no hand-off at all (model time plus HTTP, JSON and tokenizing the prompt);
- one layer: a one-layer KV hand-off of the same prompt length (same page layout, same
  transport) sent alone by baton-xfer-bench, latency p50. The table also shows the older
  estimate, layer bytes at the layer-off transfer rate of the same row.
"""

import json
import os
import subprocess
import sys
import urllib.request

import scenlib

KV_PER_TOKEN = 64 * 2 * 8 * 128 * 2  # preset large: layers x (K,V) x heads x dim x bf16
LAYERS = 64


def metrics(proc):
    """{name: value} of the un-labelled and labelled sample lines of a worker's /metrics."""
    with urllib.request.urlopen(proc.url + "/metrics", timeout=10) as r:
        text = r.read().decode()
    out = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name, _, value = line.rpartition(" ")
        try:
            out[name] = float(value)
        except ValueError:
            pass
    return out


def delta(m0, m1, name):
    return m1.get(name, 0.0) - m0.get(name, 0.0)


def one_layer_alone_ms(lab, n_tok, transport, runs):
    """p50 latency (ms) of a one-layer KV hand-off of n_tok tokens sent alone, or None."""
    out = os.path.join(lab.dir, f"one-layer-{n_tok}.json")
    argv = [lab.bin("baton-xfer-bench"), "--transports", transport, "--sizes", "none",
            "--kv-tokens", str(n_tok), "--kv-shape", "1,8,128,2,64", "--kv-runs", str(runs),
            "--no-memcpy", "--quiet", "--json", out]
    r = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if r.returncode != 0 or not os.path.exists(out):
        print(f"baton-xfer-bench failed ({r.returncode}): {r.stdout[-500:]}", flush=True)
        return None
    with open(out) as f:
        cases = json.load(f)["transports"][0].get("cases", [])
    lat = cases[0].get("lat_us", {}).get("p50") if cases else None
    return lat / 1e3 if lat else None


def main():
    ap = scenlib.arg_parser(__doc__.split("\n")[0])
    ap.add_argument("--prompt-tokens", default="3500,16000", help="prompt lengths (3500,16000)")
    ap.add_argument("--concurrency", default="1,32", help="closed-loop users (1,32)")
    ap.add_argument("--prefill-us-per-token", type=int, default=100,
                    help="prefill compute per prompt token (100: 10k tokens/s)")
    ap.add_argument("--requests-c1", type=int, default=5, help="measured requests at c=1 (5)")
    ap.add_argument("--rounds", type=int, default=1,
                    help="at concurrency C > 1, C x rounds measured requests (1)")
    ap.add_argument("--pool-tokens", type=int, default=16640,
                    help="KV pool per worker in tokens (16640 = 4.06 GiB with this preset)")
    ap.add_argument("--transport", default="tcp")
    args = ap.parse_args()
    lens = [int(x) for x in args.prompt_tokens.split(",") if x]
    concs = [int(x) for x in args.concurrency.split(",") if x]
    if args.smoke:
        lens, concs, args.requests_c1, args.pool_tokens = [512], [1, 4], 2, 4096
    print("== Scenario 6: layer-wise KV hand-off, TTFT on/off ==")
    print(scenlib.machine_line())
    print(f"workers: preset large ({KV_PER_TOKEN // 1024} KiB KV/token, {LAYERS} layers), "
          f"transport {args.transport}, prefill {args.prefill_us_per_token} us/token, "
          f"pool {args.pool_tokens} tokens ({args.pool_tokens * KV_PER_TOKEN / 2**30:.2f} GiB) "
          f"per worker; requests: streaming chat, 1 output token")
    timing = ["--prefill-us-per-token", args.prefill_us_per_token, "--decode-us-per-token", 2000,
              "--max-batch", 64, "--max-queue", 10000]
    common = ["--model-preset", "large", "--transport", args.transport, "--kv-pool-tokens",
              args.pool_tokens, *timing,
              # At 16k tokens and c=32 a request waits minutes for pool pages: no deadline
              # inside the measured run.
              "--bootstrap-timeout-ms", 1800000]
    figures = {"config": vars(args), "rows": []}
    rows = []
    failed = 0
    for n_tok in lens:
        per_pool = max(1, args.pool_tokens // n_tok)  # requests whose KV fits a pool at once
        base = ["--endpoint", "chat", "--stream", "--input-len", n_tok, "--output-len", 1]
        # The prefill as a client sees it without any hand-off: one regular worker, c=1.
        with scenlib.Lab(args, "lw-regular") as lab:
            w = lab.worker("regular", *timing, name="regular")
            r = lab.router("--worker", w.url)
            lab.bench(r.url, *base, "--concurrency", 1, "--num-requests", 2, label="warm-reg")
            reg = lab.bench(r.url, *base, "--concurrency", 1, "--num-requests",
                            args.requests_c1, label=f"{n_tok}-regular")
            # One layer of this prompt sent alone over the same transport.
            alone_ms = one_layer_alone_ms(lab, n_tok, args.transport, 3 if args.smoke else 11)
        failed += reg["failed"]
        reg_p50 = reg["ttft_ms"].get("p50")
        rows.append([f"{n_tok}", 1, "regular", reg_p50, reg["ttft_ms"].get("p99"),
                     n_tok * args.prefill_us_per_token / 1e3, None, None, None, alone_ms, "-",
                     reg["completed"], reg["failed"]])
        figures["rows"].append({"prompt_tokens": n_tok, "concurrency": 1, "layerwise": "regular",
                                "ttft_ms": reg["ttft_ms"], "one_layer_alone_ms": alone_ms,
                                "completed": reg["completed"], "failed": reg["failed"]})
        for conc in concs:
            res_by_mode = {}
            for mode in ("off", "on"):
                with scenlib.Lab(args, f"lw-{mode}") as lab:
                    p = lab.worker("prefill", *common, "--layerwise", mode, name="prefill")
                    d = lab.worker("decode", *common, name="decode")
                    r = lab.router("--prefill", p.url, p.ports["bootstrap"], "--decode", d.url)
                    # Warm-up: touches every pool page the measured run can use.
                    wc = min(conc, per_pool)
                    lab.bench(r.url, *base, "--concurrency", wc, "--num-requests", 2 * wc,
                              label=f"warm-{mode}")
                    n = args.requests_c1 if conc == 1 else conc * args.rounds
                    m0 = metrics(p)
                    res = lab.bench(r.url, *base, "--concurrency", conc, "--num-requests", n,
                                    label=f"{n_tok}-{conc}-{mode}")
                    m1 = metrics(p)
                    rooms = delta(m0, m1, "baton_kv_transfer_seconds_count")
                    res["xfer_s_mean"] = (delta(m0, m1, "baton_kv_transfer_seconds_sum") / rooms
                                          if rooms else None)
                    tails = delta(m0, m1, "baton_kv_transfer_tail_seconds_count")
                    res["tail_s_mean"] = (delta(m0, m1, "baton_kv_transfer_tail_seconds_sum")
                                          / tails if tails else None)
                    res["rooms"] = rooms
                    res_by_mode[mode] = res
                    failed += res["failed"]
                    if res["failed"]:
                        print(f"{n_tok} tokens, c={conc}, layerwise {mode}: {res['failed']} "
                              f"failed, first error: {res.get('first_error')}", flush=True)
            off, on = res_by_mode["off"], res_by_mode["on"]
            room_bytes = n_tok * KV_PER_TOKEN
            # The layer-off transfer moves the whole room after compute: its rate prices a layer.
            rate = room_bytes / off["xfer_s_mean"] if off.get("xfer_s_mean") else None
            layer_ms = (room_bytes / LAYERS) / rate * 1e3 if rate else None
            prefill_ms = n_tok * args.prefill_us_per_token / 1e3
            for mode, res in (("off", off), ("on", on)):
                t = res["ttft_ms"]
                tail_ms = res["tail_s_mean"] * 1e3 if res.get("tail_s_mean") is not None else None
                target = "-"
                over = None
                if mode == "on" and conc == 1 and reg_p50 and alone_ms and t.get("p50"):
                    over = t["p50"] - (reg_p50 + alone_ms)
                    target = f"{over:+.1f} ({'met' if over <= 0 else 'MISSED'})"
                row = [f"{n_tok}", conc, mode, t.get("p50"), t.get("p99"), prefill_ms,
                       res["xfer_s_mean"] * 1e3 if res.get("xfer_s_mean") else None, tail_ms,
                       layer_ms, alone_ms, target, res["completed"], res["failed"]]
                rows.append(row)
                figures["rows"].append({"prompt_tokens": n_tok, "concurrency": conc,
                                        "layerwise": mode, "ttft_ms": t,
                                        "prefill_model_ms": prefill_ms,
                                        "xfer_ms_mean": row[6], "tail_ms_mean": tail_ms,
                                        "one_layer_off_rate_ms": layer_ms,
                                        "one_layer_alone_ms": alone_ms,
                                        "regular_ttft_p50_ms": reg_p50,
                                        "ttft_over_target_ms": over, "off_rate_gbps":
                                        rate / 1e9 if rate else None,
                                        "completed": res["completed"], "failed": res["failed"],
                                        "first_error": res.get("first_error")})
            if off["ttft_ms"].get("p50") and on["ttft_ms"].get("p50"):
                ch = on["ttft_ms"]["p50"] / off["ttft_ms"]["p50"] - 1
                print(f"{n_tok} tokens, c={conc}: TTFT p50 {off['ttft_ms']['p50']:.0f} -> "
                      f"{on['ttft_ms']['p50']:.0f} ms ({ch * 100:+.0f}%); {scenlib.load_now()}",
                      flush=True)
    scenlib.print_table(
        "TTFT with layer-wise hand-off off / on (1P1D through Baton, KV over "
        f"{args.transport})",
        ["prompt", "conc", "layerwise", "TTFT p50", "TTFT p99", "prefill (model)", "transfer",
         "tail", "layer (off rate)", "layer (alone)", "TTFT - (regular + layer)", "ok", "errors"],
        rows,
        note="ms. regular: the same requests on one non-disaggregated worker (the prefill time "
             "a client sees). prefill (model): prompt tokens x prefill-us-per-token. transfer: "
             "prefill's mean first write -> DONE per room; tail: end of compute -> DONE (not "
             "hidden). layer (off rate): layer bytes at the layer-off transfer rate of the row; "
             "layer (alone): p50 of a one-layer hand-off sent alone (baton-xfer-bench). "
             "TTFT - (regular + layer): layer-wise TTFT p50 minus (regular TTFT p50 + layer "
             "alone), the target at c=1 (<= 0). TTFT also holds the decode's check of every "
             "received KV byte.")
    scenlib.write_json(args.json, figures)
    print(f"\nscenario 6 done: {failed} failed requests; {scenlib.load_now()}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
