#!/usr/bin/env python3
"""hicache.py — HiCache tiers on multi-turn long-context sessions, and the decode offload's cost.

2 prefill + 2 decode baton-workers (4 + 4 with --big) behind Baton, prefix caches (L1) smaller
than the sessions' working set, each configuration on the same seeded workload at the same
offered load: no tiers (L1 only), L1 + L2 (a host pool per worker), L1 + L2 + L3 (baton-store,
a master and two nodes, shared by every worker). Policies round_robin and cache_aware. Per run:
TTFT p50/p90, throughput, the prefills' hit ratio per tier (their own counters), bytes fetched
per tier and written to the store. Then the decode offload: 1 prefill + 1 decode with and
without --disaggregation-decode-enable-offload-kvcache, decode TPOT p50 of each.
"""

import os
import re
import sys
import urllib.request

import scenlib

SECRET = "hicache-loadtest-secret-0123456789"


def metrics(url):
    with urllib.request.urlopen(url + "/metrics", timeout=10) as r:
        text = r.read().decode()
    out = {}
    for line in text.splitlines():
        m = re.match(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)$", line)
        if m:
            out[m.group(1) + (m.group(2) or "")] = float(m.group(3))
    return out


def msum(ms, name, label=None):
    tot = 0.0
    for k, v in ms.items():
        if k == name or k.startswith(name + "{"):
            if label is None or label in k:
                tot += v
    return tot


def start_store(lab, secret):
    m = lab.start("store-master", [lab.bin("baton-store"), "master", "--host", scenlib.HOST,
                                   "--port", "0", "--http-port", "0", "--kv-secret-file", secret],
                  keys=("master", "http"))
    addr = f"{scenlib.HOST}:{m.ports['master']}"
    for i in range(2):
        lab.start(f"store-node-{i}", [lab.bin("baton-store"), "node", "--master", addr,
                                      "--segment-bytes", "256M", "--id", f"n{i}", "--host",
                                      scenlib.HOST, "--kv-secret-file", secret],
                  keys=("node", "bootstrap"))
    return addr


def bench_args(args):
    return ["--endpoint", "completions", "--stream", "--request-rate", args.session_rate,
            "--duration", args.duration, "--warmup", args.warmup, "--multi-turn", args.turns,
            "--input-len", args.input_len, "--output-len", args.output_len, "--think-time",
            args.think_time, "--seed", 11, "--timeout", 120]


def run(args, label, n, policy, tiers, timing, secret, router_extra=()):
    with scenlib.Lab(args, f"hicache-{n}") as lab:
        extra = list(timing) + ["--cache-tokens", args.cache_tokens, "--kv-secret-file", secret,
                                "--page-tokens", 16]
        if tiers >= 2:
            extra += ["--l2-bytes", args.l2_bytes, "--hicache-storage-prefetch-policy",
                      "timeout"]
        if tiers >= 3:
            extra += ["--store-master", start_store(lab, secret)]
        ra = []
        ps = []
        for i in range(n):
            w = lab.worker("prefill", *extra, name=f"prefill-{i}")
            ps.append(w)
            ra += ["--prefill", w.url, w.ports["bootstrap"]]
        for i in range(n):
            w = lab.worker("decode", *timing, "--kv-secret-file", secret, "--page-tokens", 16,
                           name=f"decode-{i}")
            ra += ["--decode", w.url]
        r = lab.router(*ra, "--prefill-policy", policy, "--decode-policy", "round_robin",
                       *router_extra)
        res = lab.bench(r.url, *bench_args(args), label=label.replace(" ", "_").replace("%", ""))
        ms = [metrics(w.url) for w in ps]
        hit = {t: sum(msum(m, "baton_worker_cache_hit_tokens_total", f'tier="{t}"') for m in ms)
               for t in ("l1", "l2", "l3")}
        miss = sum(msum(m, "baton_worker_cache_miss_tokens_total") for m in ms)
        prompt = sum(hit.values()) + miss
        per = [msum(m, "baton_worker_prompt_tokens_total") for m in ms]
        mean = sum(per) / len(per) if per else 0
        return {
            "imbalance": max(per) / mean if mean else None,
            "label": label, "policy": policy,
            "ttft_p50": res["ttft_ms"].get("p50"), "ttft_p90": res["ttft_ms"].get("p90"),
            "req_s": res["request_throughput"], "failed": res["failed"],
            "hit": {t: (hit[t] / prompt if prompt else 0.0) for t in hit},
            "hit_all": sum(hit.values()) / prompt if prompt else 0.0,
            "fetched_l2": sum(msum(m, "baton_worker_tier_fetched_bytes_total", 'tier="l2"')
                              for m in ms),
            "fetched_l3": sum(msum(m, "baton_worker_tier_fetched_bytes_total", 'tier="l3"')
                              for m in ms),
            "written_l3": sum(msum(m, "baton_worker_tier_written_bytes_total", 'tier="l3"')
                              for m in ms),
        }


def run_restart(args, timing, secret):
    """round_robin with L2+L3; prefill-0 killed (SIGKILL) 40 % into the measured window and
    restarted empty (no L1, no L2) on the same ports 1 s later: what it finds in L3 after."""
    import signal
    import threading
    import time
    ports = [(scenlib.free_port(), scenlib.free_port()) for _ in range(2)]
    with scenlib.Lab(args, "hicache-restart") as lab:
        extra = list(timing) + ["--cache-tokens", args.cache_tokens, "--kv-secret-file", secret,
                                "--page-tokens", 16, "--l2-bytes", args.l2_bytes,
                                "--hicache-storage-prefetch-policy", "timeout",
                                "--store-master", start_store(lab, secret)]
        ra, ps = [], []
        for i in range(2):
            w = lab.worker("prefill", *extra, "--port", ports[i][0], "--bootstrap-port",
                           ports[i][1], name=f"prefill-{i}")
            ps.append(w)
            ra += ["--prefill", w.url, w.ports["bootstrap"]]
        for i in range(2):
            w = lab.worker("decode", *timing, "--kv-secret-file", secret, "--page-tokens", 16,
                           name=f"decode-{i}")
            ra += ["--decode", w.url]
        r = lab.router(*ra, "--prefill-policy", "round_robin", "--decode-policy", "round_robin",
                       "--check-interval-ms", 200, "--check-fast-interval-ms", 100,
                       "--check-fall", 2, "--check-rise", 1, "--max-retries", 3)
        ev = {}

        def chaos():
            time.sleep(args.warmup + args.duration * 0.4)
            os.killpg(ps[0].p.pid, signal.SIGKILL)
            ps[0].p.wait()
            time.sleep(1.0)
            ev["new"] = lab.worker("prefill", *extra, "--port", ports[0][0], "--bootstrap-port",
                                   ports[0][1], name="prefill-0-restarted")

        th = threading.Thread(target=chaos)
        th.start()
        res = lab.bench(r.url, *bench_args(args), label="restart")
        th.join()
        m = metrics(ev["new"].url) if "new" in ev else {}
        hit = {t: msum(m, "baton_worker_cache_hit_tokens_total", f'tier="{t}"')
               for t in ("l1", "l2", "l3")}
        prompt = sum(hit.values()) + msum(m, "baton_worker_cache_miss_tokens_total")
        mo = metrics(ps[1].url)
        hit_o = sum(msum(mo, "baton_worker_cache_hit_tokens_total", f'tier="{t}"')
                    for t in ("l1", "l2", "l3"))
        prompt_o = hit_o + msum(mo, "baton_worker_cache_miss_tokens_total")
        return {"failed": res["failed"], "ttft_p50": res["ttft_ms"].get("p50"),
                "prompt": prompt, "hit_l3": hit["l3"] / prompt if prompt else 0.0,
                "hit_all": sum(hit.values()) / prompt if prompt else 0.0,
                "hit_other": hit_o / prompt_o if prompt_o else 0.0}


def run_offload(args, on, timing, secret):
    with scenlib.Lab(args, "hicache-offload") as lab:
        ex = ["--kv-secret-file", secret, "--page-tokens", 16]
        p = lab.worker("prefill", *timing, *ex, name="prefill")
        dex = list(ex)
        if on:
            dex += ["--l2-bytes", args.l2_bytes, "--store-master", start_store(lab, secret),
                    "--disaggregation-decode-enable-offload-kvcache"]
        d = lab.worker("decode", *timing, *dex, name="decode")
        r = lab.router("--prefill", p.url, p.ports["bootstrap"], "--decode", d.url)
        res = lab.bench(r.url, *bench_args(args), label=f"offload_{int(on)}")
        m = metrics(d.url)
        return res["tpot_ms"].get("p50"), res["failed"], \
            msum(m, "baton_worker_tier_written_bytes_total", 'tier="l3"')


def main():
    ap = scenlib.arg_parser(__doc__.split("\n")[0])
    ap.add_argument("--session-rate", type=float, default=2.0, help="new sessions/s (2)")
    ap.add_argument("--turns", type=int, default=6, help="turns per session (6)")
    ap.add_argument("--input-len", type=int, default=600, help="new words per turn (600)")
    ap.add_argument("--output-len", type=int, default=64, help="reply tokens per turn (64)")
    ap.add_argument("--think-time", type=float, default=3.0, help="seconds between turns (3)")
    ap.add_argument("--cache-tokens", type=int, default=8192, help="L1 per worker (8192)")
    ap.add_argument("--l2-bytes", default="64M", help="L2 per worker (64M)")
    ap.add_argument("--duration", type=float, default=40.0)
    ap.add_argument("--warmup", type=float, default=10.0)
    ap.add_argument("--prefill-us-per-token", type=int, default=100)
    ap.add_argument("--decode-us-per-token", type=int, default=2000)
    ap.add_argument("--big", action="store_true", help="also 4 prefill + 4 decode")
    ap.add_argument("--sizes", default="", help="prefill (= decode) counts to run, e.g. 4 "
                    "(default 2, and 4 with --big)")
    ap.add_argument("--only-restart", action="store_true",
                    help="only the kill-and-restart pass")
    ap.add_argument("--l3-pct", type=int, default=20,
                    help="also run cache_aware with L2+L3 and the router's --cache-l3-pct P "
                         "(0 = not)")
    ap.add_argument("--only-router", action="store_true",
                    help="only the L2+L3 runs (the router policies with a shared store)")
    args = ap.parse_args()
    if args.smoke:
        args.duration, args.warmup, args.session_rate, args.turns = 2.0, 0.5, 3.0, 3
        args.think_time, args.input_len = 0.2, 200
    timing = ["--prefill-us-per-token", args.prefill_us_per_token, "--decode-us-per-token",
              args.decode_us_per_token, "--max-batch", 32, "--max-queue", 100000]
    secret = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"baton-hicache-{os.getpid()}.key")
    with open(secret, "w") as f:
        f.write(SECRET)
    os.chmod(secret, 0o600)
    print("== hicache: multi-turn long context, no tiers vs L2 vs L2+L3 ==")
    print(scenlib.machine_line())
    last = args.turns * (args.input_len + args.output_len)
    print(f"workload: {args.session_rate:g} sessions/s x {args.turns} turns, {args.input_len} "
          f"new words + {args.output_len} reply tokens per turn (last turn ~{last} tokens), "
          f"{args.think_time:g}s think time; L1 {args.cache_tokens} tokens, L2 {args.l2_bytes} "
          f"per prefill; prefill {args.prefill_us_per_token} us/token")
    rows, figs = [], {"config": vars(args), "runs": [], "offload": {}}
    sizes = [int(x) for x in args.sizes.split(",") if x] or [2] + ([4] if args.big else [])
    try:
        if args.only_restart:
            sizes = []
        for n in sizes:
            for policy in ("round_robin", "cache_aware"):
                base = None
                confs = [(1, "no tiers", ()), (2, "L2", ()), (3, "L2+L3", ())]
                if policy == "cache_aware" and args.l3_pct:
                    confs.append((3, f"L2+L3 l3-cost {args.l3_pct}%",
                                  ("--cache-l3-pct", args.l3_pct)))
                if args.only_router:
                    confs = [c for c in confs if c[0] == 3]
                for tiers, name, rx in confs:
                    s = run(args, f"{n}P{n}D {policy} {name}", n, policy, tiers, timing, secret,
                            rx)
                    figs["runs"].append(s)
                    base = base or s
                    rows.append([s["label"], s["ttft_p50"], s["ttft_p90"],
                                 scenlib.ratio(s["ttft_p50"], base["ttft_p50"]), s["req_s"],
                                 s["imbalance"],
                                 s["hit"]["l1"], s["hit"]["l2"], s["hit"]["l3"], s["hit_all"],
                                 s["fetched_l2"] / 2**20, s["fetched_l3"] / 2**20,
                                 s["written_l3"] / 2**20, s["failed"]])
        if rows:
            scenlib.print_table("tiers on the same multi-turn workload",
                                ["run", "TTFT p50", "TTFT p90", "p50 vs none", "req/s",
                                 "imbalance", "hit L1", "hit L2", "hit L3", "hit all",
                                 "L2 MiB in",
                                 "L3 MiB in", "L3 MiB out", "errors"], rows)
        if args.only_router:
            return 0
        rs = run_restart(args, timing, secret)
        figs["restart"] = rs
        scenlib.print_table(
            "prefill-0 killed and restarted empty (round_robin, L2+L3)",
            ["prompt tokens (restarted)", "hit L3 (restarted)", "hit all (restarted)",
             "hit all (other)", "TTFT p50", "errors"],
            [[int(rs["prompt"]), rs["hit_l3"], rs["hit_all"], rs["hit_other"], rs["ttft_p50"],
              rs["failed"]]])
        if args.only_restart:
            return 1 if rs["failed"] else 0
        off_p50, off_failed, off_bytes = run_offload(args, False, timing, secret)
        on_p50, on_failed, on_bytes = run_offload(args, True, timing, secret)
        figs["offload"] = {"tpot_p50_off": off_p50, "tpot_p50_on": on_p50,
                           "l3_bytes_on": on_bytes}
        scenlib.print_table("decode offload (1P1D)", ["offload", "TPOT p50", "vs off",
                                                      "L3 MiB out", "errors"],
                            [["off", off_p50, "1.00x", 0, off_failed],
                             ["on", on_p50, scenlib.ratio(on_p50, off_p50), on_bytes / 2**20,
                              on_failed]])
    finally:
        os.unlink(secret)
    if args.json:
        scenlib.write_json(args.json, figs)
    failed = sum(s["failed"] for s in figs["runs"])
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
