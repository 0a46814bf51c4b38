#!/usr/bin/env python3
"""kv_routing.py — precise routing on the workers' KV events against the other policies.

4 prefill + 4 decode baton-workers whose prefix caches hold less than the working set, each
publishing its cache as KV events (--kv-events-endpoint), registered with the router with their
endpoints; the same seeded multi-turn workload (cache_routing.py's, sent as token ids: the
router needs no tokenizer) through Baton with precise, cache_aware, consistent_hash and
round_robin in turn, a fresh set of processes per policy. Per policy: the prefill workers' own
hit ratio, TTFT p50/p90, load imbalance (max / mean prompt tokens per prefill worker), the
router's CPU per request; for precise also its index (blocks, bytes) and the PD decode-alone
count. "ideal": one prefill worker with an unbounded cache (what an oracle could reach). Last,
kvev_probe's one-thread figures (events absorbed per second, index bytes per 1 M blocks).

With --l3 every run's prefill workers also have HiCache tiers (--l2-bytes, and a baton-store
master + 2 nodes of the run's own as L3, the master publishing the pages' blocks as KV events);
precise's router follows the store's events (--store-kv-events: L3 credit on every worker), and
one more run, "precise, no L3 credit", has the same workers without it. Hit ratios then count
the L2 and L3 hits too (the "L3 share" column: the part of the hits fetched from the store).
"""

import json
import os
import subprocess
import sys
import urllib.request

import scenlib
import cache_routing
from cache_routing import metrics, msum, worker_figures

POLICIES = ["round_robin", "consistent_hash", "cache_aware", "precise"]


def post(url, path, obj):
    req = urllib.request.Request(url + path, data=json.dumps(obj).encode(),
                                 headers={"Content-Type": "application/json"}, method="POST")
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.loads(r.read() or b"{}")


def kv_worker(lab, mode, extra, name):
    pub, rep = scenlib.free_port(), scenlib.free_port()
    w = lab.worker(mode, *extra, "--kv-events-endpoint", f"tcp://127.0.0.1:{pub}",
                   "--kv-events-replay-endpoint", f"tcp://127.0.0.1:{rep}", name=name)
    w.kv = (pub, rep)
    w.vllm = "--protocol" in [str(x) for x in extra]
    return w


def register(r, w, role):
    body = {"url": w.url, "worker_type": role,
            "kv_events_endpoint": f"tcp://127.0.0.1:{w.kv[0]}",
            "kv_events_replay_endpoint": f"tcp://127.0.0.1:{w.kv[1]}"}
    if role == "prefill" and "bootstrap" in w.ports and not w.vllm:
        body["bootstrap_port"] = w.ports["bootstrap"]
    post(r.url, "/workers", body)


def bench_args(args, duration):
    return ["--endpoint", "completions", "--token-ids", "--stream", "--request-rate",
            args.session_rate, "--duration", duration, "--warmup", args.warmup, "--multi-turn",
            args.turns, "--input-len", args.input_len, "--output-len", args.output_len,
            "--shared-prefix", f"{args.shared_prefix}:{args.groups}", "--think-time",
            args.think_time, "--seed", 7, "--timeout", 60]


def start_store(lab, secret):
    """A master publishing its blocks' KV events and 2 nodes: (master addr, events, replay)."""
    m = lab.start("store-master", [lab.bin("baton-store"), "master", "--host", scenlib.HOST,
                                   "--port", "0", "--http-port", "0", "--kv-secret-file", secret,
                                   "--kv-events-endpoint", f"tcp://{scenlib.HOST}:*",
                                   "--kv-events-replay-endpoint", f"tcp://{scenlib.HOST}:*"],
                  keys=("master", "http", "kvevents", "kvreplay"))
    addr = f"{scenlib.HOST}:{m.ports['master']}"
    for i in range(2):
        lab.start(f"store-node-{i}", [lab.bin("baton-store"), "node", "--master", addr,
                                      "--segment-bytes", "256M", "--id", f"n{i}", "--host",
                                      scenlib.HOST, "--kv-secret-file", secret],
                  keys=("node", "bootstrap"))
    return (addr, f"tcp://{scenlib.HOST}:{m.ports['kvevents']}",
            f"tcp://{scenlib.HOST}:{m.ports['kvreplay']}")


def run_policy(args, policy, timing, n_p=4, n_d=4, cache=None, proto="sglang", extra=(),
               l3=None):
    """l3: None (no tiers), or (secret, credit): tiers on a store, the router following its
    events when credit."""
    with scenlib.Lab(args, f"kv-{policy}") as lab:
        cache = cache or args.cache_tokens
        if proto != "sglang":
            timing = list(timing) + ["--protocol", proto]
        pextra = list(timing) + ["--cache-tokens", cache]
        if l3:
            addr, pub, rep = start_store(lab, l3[0])
            pextra += ["--l2-bytes", args.l2_bytes, "--kv-secret-file", l3[0], "--store-master",
                       addr, "--hicache-storage-prefetch-policy", "timeout",
                       "--prefetch-min-tokens", args.page_tokens]
            if l3[1] and policy == "precise":
                extra = tuple(extra) + ("--store-kv-events", pub, "--store-kv-events-replay", rep)
        ps = [kv_worker(lab, "prefill", pextra, f"prefill-{i}") for i in range(n_p)]
        dextra = list(timing) + ["--cache-tokens", cache]
        if l3:  # the hand-off is authenticated with the prefill's secret
            dextra += ["--kv-secret-file", l3[0]]
        ds = [kv_worker(lab, "decode", dextra, f"decode-{i}") for i in range(n_d)]
        r = lab.router("--prefill-policy", policy, "--decode-policy", policy, "--max-retries", 2,
                       "--pd-protocol", proto, *args.router_arg, *extra)
        for w in ps:
            register(r, w, "prefill")
        for w in ds:
            register(r, w, "decode")
        cpu0 = scenlib.cpu_seconds(r.p.pid)
        res = lab.bench(r.url, *bench_args(args, args.duration), label=policy)
        cpu = scenlib.cpu_seconds(r.p.pid) - cpu0
        wf = l3_hits(ps, worker_figures(ps))
        return res, wf, cpu, metrics(r.url)


def summarize(label, res, wf, cpu, rm):
    s = cache_routing.summarize(label, res, wf, cpu)
    s.update({"prefill_tokens": sum(w["prompt"] for w in wf),
              "index_blocks": msum(rm, "baton_kv_index_blocks"),
              "index_bytes": rm.get("baton_kv_index_bytes", 0.0),
              "decode_alone": msum(rm, "baton_pd_decode_alone_total"),
              "fallbacks": msum(rm, "baton_routing_precise_fallback_total"),
              "l3_credited": msum(rm, "baton_routing_precise_l3_credited_total"),
              "l3_index_blocks": sum(v for k, v in rm.items()
                                     if k.startswith("baton_kv_index_blocks{")
                                     and 'worker="@store"' in k),
              "l3_hit": sum(w.get("l3", 0) for w in wf),
              "hit_tokens": sum(w["hit"] for w in wf)})
    return s


def l3_hits(ps, wf):
    """Adds each prefill worker's L3 hit tokens to its figures."""
    for w, f in zip(ps, wf):
        m = metrics(w.url)
        f["l3"] = sum(v for k, v in m.items()
                      if k.startswith("baton_worker_cache_hit_tokens_total{") and 'tier="l3"' in k)
    return wf


def probe(args):
    path = os.path.join(args.build_dir, "tests", "unit", "kvevents", "kvev_probe")
    if not os.access(path, os.X_OK):
        return None
    out = subprocess.run([path, "bench", str(args.probe_blocks)], stdout=subprocess.PIPE,
                         text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main():
    try:
        return run_main()
    finally:
        for f in SECRETS:
            if os.path.exists(f):
                os.unlink(f)


SECRETS = []


def run_main():
    ap = scenlib.arg_parser(__doc__.split("\n")[0])
    ap.add_argument("--session-rate", type=float, default=3.0)
    ap.add_argument("--turns", type=int, default=8)
    ap.add_argument("--input-len", type=int, default=80)
    ap.add_argument("--output-len", type=int, default=32)
    ap.add_argument("--shared-prefix", type=int, default=150)
    ap.add_argument("--groups", type=int, default=8)
    ap.add_argument("--cache-tokens", type=int, default=10240)
    ap.add_argument("--duration", type=float, default=40.0)
    ap.add_argument("--warmup", type=float, default=16.0)
    ap.add_argument("--prefill-us-per-token", type=int, default=100)
    ap.add_argument("--decode-us-per-token", type=int, default=2000)
    ap.add_argument("--page-tokens", type=int, default=16)
    ap.add_argument("--policies", default=",".join(POLICIES))
    ap.add_argument("--think-time", type=float, default=2.0)
    ap.add_argument("--probe-blocks", type=int, default=2000000)
    ap.add_argument("--vllm-precise", action="store_true",
                    help="also run precise with vllm-nixl workers, with PD's decode alone and "
                         "without it (--pd-uncached-token-threshold 0)")
    ap.add_argument("--variant", action="append", default=[], metavar="LABEL|POLICY|ROUTER ARGS",
                    help="also run POLICY with these router flags under LABEL (repeatable), e.g. "
                         "'precise load 50%%|precise|--precise-load-weight-pct 50'")
    ap.add_argument("--no-ideal", action="store_true", help="skip the ideal pass (hit ratios "
                    "are then not compared)")
    ap.add_argument("--l3", action="store_true",
                    help="prefill workers with L2 and a baton-store as L3; precise follows the "
                         "store's KV events, and once more without them")
    ap.add_argument("--l2-bytes", default="4M", help="L2 per prefill worker with --l3 (4M)")
    ap.add_argument("--workers", type=int, default=4, help="prefill and decode workers each (4)")
    ap.add_argument("--router-arg", action="append", default=[],
                    help="an extra router flag for every run (repeatable)")
    args = ap.parse_args()
    if args.smoke:
        args.duration, args.warmup, args.session_rate, args.turns = 2.0, 0.5, 4.0, 3
        args.think_time, args.probe_blocks = 0.2, 64000
    timing = ["--prefill-us-per-token", args.prefill_us_per_token, "--decode-us-per-token",
              args.decode_us_per_token, "--max-batch", 32, "--max-queue", 100000,
              "--page-tokens", args.page_tokens]
    n = args.workers
    secret = None
    if args.l3:
        secret = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"baton-kvl3-{os.getpid()}.key")
        with open(secret, "w") as f:
            f.write("kv-routing-loadtest-secret-0123456789\n")
        os.chmod(secret, 0o600)
        SECRETS.append(secret)
    print(f"== kv_routing: precise (KV events) vs the other policies, {n} prefill + {n} decode"
          f"{', L2 + L3 (baton-store)' if args.l3 else ''} ==")
    print(scenlib.machine_line())
    print(f"workload: {args.session_rate:g} sessions/s x {args.turns} turns, {args.groups} shared "
          f"prompts of {args.shared_prefix} words, {args.input_len} new + {args.output_len} reply "
          f"tokens per turn, token ids; {args.duration:g}s measured after {args.warmup:g}s; "
          f"cache {args.cache_tokens} tokens per worker, pages of {args.page_tokens}"
          f"{f', L2 {args.l2_bytes} per prefill worker + store' if args.l3 else ''}")
    figures = {"config": vars(args), "runs": {}}
    ideal = 0.0
    if not args.no_ideal:
        res, wf, _, _ = run_policy(args, "round_robin", timing, 1, 1, 1 << 30)
        ideal = wf[0]["hit"] / max(1, wf[0]["hit"] + wf[0]["miss"])
    figures["ideal_hit_ratio"] = ideal
    rows, base, failed = [], None, 0
    runs = [(p, p, "sglang", ()) for p in args.policies.split(",") if p]
    if args.l3 and "precise" in args.policies.split(","):
        runs.append(("precise, no L3 credit", "precise", "sglang", ()))
    if args.vllm_precise:
        runs.append(("precise vllm-nixl", "precise", "vllm-nixl", ()))
        runs.append(("precise vllm-nixl, both legs", "precise", "vllm-nixl",
                     ("--pd-uncached-token-threshold", "0")))
    for v in args.variant:
        label, policy, flags = v.split("|", 2)
        runs.append((label, policy, "sglang", tuple(flags.split())))
    for label, p, proto, extra in runs:
        l3 = (secret, label != "precise, no L3 credit") if args.l3 else None
        res, wf, cpu, rm = run_policy(args, p, timing, n, n, proto=proto, extra=extra, l3=l3)
        s = summarize(label, res, wf, cpu, rm)
        figures["runs"][label] = {"summary": s, "bench": res, "workers": wf}
        failed += s["failed"]
        if label == "round_robin":
            base = s
        rows.append(s)
    table = [[s["policy"], s["hit_ratio"], s["hit_ratio"] / ideal if ideal else None,
              s["ttft_p50"], s["ttft_p90"],
              scenlib.ratio(s["ttft_p90"], base["ttft_p90"]) if base else "-", s["imbalance"],
              s["l3_hit"] / s["hit_tokens"] if s["hit_tokens"] else 0.0,
              s["router_cpu_us_per_req"],
              scenlib.ratio(s["router_cpu_us_per_req"], base["router_cpu_us_per_req"])
              if base else "-", s["prefill_tokens"], s["decode_alone"], s["failed"]]
             for s in rows]
    scenlib.print_table(
        "policies on the same multi-turn workload (token ids)",
        ["policy", "hit ratio", "vs ideal", "TTFT p50", "TTFT p90", "p90 vs rr", "imbalance",
         "L3 share", "router CPU us/req", "CPU vs rr", "prefill tokens", "decode alone", "errors"], table,
        note=f"hit ratio: the prefill workers' cached / prompt tokens; ideal = {ideal:.3f} (one "
             f"worker, unbounded cache); TTFT in ms; imbalance: max / mean prompt tokens per "
             f"prefill worker; L3 share: the hits fetched from the store; prefill tokens: prompt tokens the prefill workers received (the "
             f"decode-alone requests never reach them); router CPU: utime+stime / requests")
    pr = figures["runs"].get("precise", {}).get("summary")
    if pr and pr["index_blocks"]:
        print(f"precise's index at the end: {pr['index_blocks']:.0f} blocks (all sources and "
              f"tiers), {pr['index_bytes'] / 1024:.0f} KiB; fallbacks {pr['fallbacks']:.0f}; "
              f"the store's (L3) {pr['l3_index_blocks']:.0f} blocks, "
              f"{pr['l3_credited']:.0f} choices credited L3")
    pb = probe(args)
    if pb:
        figures["probe"] = pb
        print(f"kvev_probe bench {args.probe_blocks}: stored {pb['stored_blocks_per_s']:.0f} "
              f"blocks/s, removed {pb['removed_blocks_per_s']:.0f} blocks/s (decode + apply, one "
              f"thread), index {pb['bytes_per_1M_blocks'] / 1048576:.1f} MiB per 1 M blocks")
    scenlib.write_json(args.json, figures)
    print(f"\nkv_routing done: {failed} failed requests; {scenlib.load_now()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
