#!/usr/bin/env python3
"""cache_routing.py — issue 13: cache- and session-aware routing on multi-turn chat.

4 prefill + 4 decode baton-workers whose prefix caches hold less than the workload's working set,
behind Baton with each policy in turn (round_robin, power_of_two, least_load, consistent_hash,
cache_aware) on the same seeded workload at the same offered load: open-loop sessions of K turns,
each opening with one of G shared system prompts, each turn repeating the history. Per policy:
the prefill workers' own cache hit ratio (hit / prompt tokens, from their metrics), TTFT p50/p99,
throughput, load imbalance (max / mean prompt tokens per prefill worker) and the router's CPU per
request. An "ideal" pass (one prefill worker with an unbounded cache: every reusable prefix is
reused) bounds what any oracle could reach. A last pass kills one prefill worker mid-run and
restarts it empty on the same ports: the router must drop its tree for it, not trust it.
"""

import re
import sys
import threading
import time
import urllib.request

import scenlib

POLICIES = ["round_robin", "power_of_two", "least_load", "consistent_hash", "cache_aware"]


def metrics(url):
    with urllib.request.urlopen(url + "/metrics", timeout=10) as r:
        text = r.read().decode()
    out = {}
    for line in text.splitlines():
        m = re.match(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)$", line)
        if m:
            key = m.group(1) + (m.group(2) or "")
            out[key] = float(m.group(3))
    return out


def msum(ms, name):
    return sum(v for k, v in ms.items() if k == name or k.startswith(name + "{"))


def worker_figures(prefills):
    """Hit / miss / prompt tokens per prefill worker (their own counters)."""
    rows = []
    for w in prefills:
        m = metrics(w.url)
        rows.append({"hit": msum(m, "baton_worker_cache_hit_tokens_total"),
                     "miss": msum(m, "baton_worker_cache_miss_tokens_total"),
                     "prompt": msum(m, "baton_worker_prompt_tokens_total")})
    return rows


def start_cluster(lab, args, n_p, n_d, cache_tokens, timing, ports=None):
    prefills, decodes, router_args = [], [], []
    for i in range(n_p):
        extra = list(timing) + ["--cache-tokens", cache_tokens]
        if ports:
            extra += ["--port", ports[i][0], "--bootstrap-port", ports[i][1]]
        w = lab.worker("prefill", *extra, name=f"prefill-{i}")
        prefills.append(w)
        router_args += ["--prefill", w.url, w.ports["bootstrap"]]
    for i in range(n_d):
        w = lab.worker("decode", *timing, "--cache-tokens", cache_tokens, name=f"decode-{i}")
        decodes.append(w)
        router_args += ["--decode", w.url]
    return prefills, decodes, router_args


def bench_args(args, duration):
    return ["--endpoint", "completions", "--stream", "--request-rate", args.session_rate,
            "--duration", duration, "--warmup", args.warmup, "--multi-turn", args.turns,
            "--input-len", args.input_len, "--output-len", args.output_len, "--shared-prefix",
            f"{args.shared_prefix}:{args.groups}", "--seed", 7, "--timeout", 60]


def run_policy(args, policy, timing):
    with scenlib.Lab(args, f"cache-{policy}") as lab:
        prefills, decodes, ra = start_cluster(lab, args, 4, 4, args.cache_tokens, timing)
        r = lab.router(*ra, "--prefill-policy", policy, "--decode-policy", policy,
                       "--max-retries", 2)
        cpu0 = scenlib.cpu_seconds(r.p.pid)
        res = lab.bench(r.url, *bench_args(args, args.duration), label=policy)
        cpu = scenlib.cpu_seconds(r.p.pid) - cpu0
        wf = worker_figures(prefills)
        rm = metrics(r.url)
        return res, wf, cpu, rm


def summarize(policy, res, wf, cpu):
    hit = sum(w["hit"] for w in wf)
    prompt = sum(w["hit"] + w["miss"] for w in wf)
    per = [w["prompt"] for w in wf]
    mean = sum(per) / len(per) if per else 0
    n = res["completed"] + res["failed"] + res.get("warmup_requests", 0)
    return {
        "policy": policy,
        "hit_ratio": hit / prompt if prompt else 0.0,
        "ttft_p50": res["ttft_ms"].get("p50"),
        "ttft_p99": res["ttft_ms"].get("p99"),
        "req_s": res["request_throughput"],
        "imbalance": max(per) / mean if mean else None,
        "router_cpu_us_per_req": cpu / n * 1e6 if n else None,
        "failed": res["failed"],
        "completed": res["completed"],
        "client_cached_ratio": res.get("cache", {}).get("hit_ratio"),
    }


def run_ideal(args):
    """One prefill worker with an unbounded cache and no timing cost: the workload's reusable
    share of prompt tokens (what an oracle with enough cache would reach)."""
    fast = ["--prefill-us-per-token", 1, "--decode-us-per-token", 100, "--max-batch", 256,
            "--max-queue", 100000]
    with scenlib.Lab(args, "cache-ideal") as lab:
        prefills, _, ra = start_cluster(lab, args, 1, 1, 1 << 30, fast)
        r = lab.router(*ra)
        lab.bench(r.url, *bench_args(args, args.duration), label="ideal")
        wf = worker_figures(prefills)
        return wf[0]["hit"] / (wf[0]["hit"] + wf[0]["miss"])


def run_restart(args, timing, policy="cache_aware"):
    """Kills prefill-0 mid-run and restarts it on the same ports with an empty cache."""
    ports = [(scenlib.free_port(), scenlib.free_port()) for _ in range(4)]
    with scenlib.Lab(args, "cache-restart") as lab:
        prefills, decodes, ra = start_cluster(lab, args, 4, 4, args.cache_tokens, timing,
                                              ports=ports)
        r = lab.router(*ra, "--prefill-policy", policy, "--decode-policy", policy,
                       "--check-interval-ms", 200, "--check-fast-interval-ms", 100,
                       "--check-fall", 2, "--check-rise", 1, "--max-retries", 3)
        victim = prefills[0]
        events = {}

        def chaos():
            time.sleep(args.warmup + args.duration * 0.4)
            import os
            import signal
            os.killpg(victim.p.pid, signal.SIGKILL)
            victim.p.wait()
            events["killed"] = time.monotonic()
            time.sleep(1.0)
            extra = list(timing) + ["--cache-tokens", args.cache_tokens, "--port", ports[0][0],
                                    "--bootstrap-port", ports[0][1]]
            events["new"] = lab.worker("prefill", *extra, name="prefill-0-restarted")

        th = threading.Thread(target=chaos)
        th.start()
        res = lab.bench(r.url, *bench_args(args, args.duration), label="restart")
        th.join()
        new = events.get("new")
        others = worker_figures(prefills[1:])
        fresh = worker_figures([new])[0] if new else {"hit": 0, "miss": 0, "prompt": 0}
        rm = metrics(r.url)
        predicted = rm.get('baton_routing_predicted_hit_tokens_total{role="prefill"}', 0.0)
        actual = sum(w["hit"] for w in others) + fresh["hit"]
        return res, fresh, others, predicted, actual


def main():
    ap = scenlib.arg_parser(__doc__.split("\n")[0])
    ap.add_argument("--session-rate", type=float, default=6.0,
                    help="new sessions per second (open loop) (6)")
    ap.add_argument("--turns", type=int, default=6, help="turns per session (6)")
    ap.add_argument("--input-len", type=int, default=40, help="new words per turn (40)")
    ap.add_argument("--output-len", type=int, default=24, help="reply tokens per turn (24)")
    ap.add_argument("--shared-prefix", type=int, default=300, help="shared system prompt words")
    ap.add_argument("--groups", type=int, default=8, help="distinct system prompts (8)")
    ap.add_argument("--cache-tokens", type=int, default=12288,
                    help="prefix cache per worker, tokens (12288)")
    ap.add_argument("--duration", type=float, default=30.0, help="measured seconds per run (30)")
    ap.add_argument("--warmup", type=float, default=5.0, help="warm-up seconds per run (5)")
    ap.add_argument("--prefill-us-per-token", type=int, default=100)
    ap.add_argument("--decode-us-per-token", type=int, default=2000)
    ap.add_argument("--policies", default=",".join(POLICIES))
    ap.add_argument("--no-restart", action="store_true", help="skip the kill-and-restart run")
    args = ap.parse_args()
    if args.smoke:
        args.duration, args.warmup, args.session_rate, args.turns = 2.0, 0.5, 4.0, 3
    timing = ["--prefill-us-per-token", args.prefill_us_per_token, "--decode-us-per-token",
              args.decode_us_per_token, "--max-batch", 32, "--max-queue", 100000]

    print("== cache_routing: multi-turn sessions, 4 prefill + 4 decode, every policy ==")
    print(scenlib.machine_line())
    words_last = args.shared_prefix + args.turns * args.input_len + (args.turns - 1) * args.output_len
    print(f"workload: {args.session_rate:g} sessions/s x {args.turns} turns (open loop), "
          f"{args.groups} shared prompts of {args.shared_prefix} words, {args.input_len} new "
          f"words + {args.output_len} reply tokens per turn (last turn ~{words_last} words); "
          f"{args.duration:g}s measured after {args.warmup:g}s; prefill "
          f"{args.prefill_us_per_token} us/token; cache {args.cache_tokens} tokens per worker")
    live = args.session_rate * (args.turns * 1.0)  # rough sessions alive (about 1 s per turn)
    print(f"working set: ~{live:.0f} live sessions x ~{words_last} words + {args.groups} x "
          f"{args.shared_prefix} shared ≈ {live * words_last + args.groups * args.shared_prefix:.0f}"
          f" tokens vs {4 * args.cache_tokens} cached over 4 workers (round_robin needs it all on "
          f"every worker)")
    figures = {"config": vars(args), "runs": {}}
    rows, failed = [], 0
    ideal = run_ideal(args)
    figures["ideal_hit_ratio"] = ideal
    base = None
    for policy in [p for p in args.policies.split(",") if p]:
        res, wf, cpu, rm = run_policy(args, policy, timing)
        s = summarize(policy, res, wf, cpu)
        s["router_tree_bytes"] = rm.get('baton_routing_tree_bytes{role="prefill"}', 0.0) + \
            rm.get('baton_routing_tree_bytes{role="decode"}', 0.0)
        figures["runs"][policy] = {"summary": s, "bench": res, "workers": wf}
        failed += res["failed"]
        if policy == "round_robin":
            base = s
        rows.append(s)
    table = []
    for s in rows:
        table.append([s["policy"], s["hit_ratio"], s["hit_ratio"] / ideal if ideal else None,
                      s["ttft_p50"], s["ttft_p99"],
                      scenlib.ratio(s["ttft_p50"], base["ttft_p50"]) if base else "-",
                      s["req_s"], s["imbalance"], s["router_cpu_us_per_req"],
                      scenlib.ratio(s["router_cpu_us_per_req"], base["router_cpu_us_per_req"])
                      if base else "-", s["failed"]])
    scenlib.print_table(
        "policies on the same multi-turn workload",
        ["policy", "hit ratio", "vs ideal", "TTFT p50", "TTFT p99", "p50 vs rr", "req/s",
         "imbalance", "router CPU us/req", "CPU vs rr", "errors"], table,
        note=f"hit ratio: the prefill workers' own cached / prompt tokens; ideal = "
             f"{ideal:.3f} (one worker, unbounded cache); TTFT in ms; imbalance: max / mean prompt "
             f"tokens per prefill worker; router CPU: utime+stime of the router / requests")

    if not args.no_restart:
        res, fresh, others, predicted, actual = run_restart(args, timing)
        failed_r = res["failed"]
        fr = fresh["hit"] / (fresh["hit"] + fresh["miss"]) if fresh["hit"] + fresh["miss"] else 0
        orr = sum(w["hit"] for w in others) / max(1, sum(w["hit"] + w["miss"] for w in others))
        figures["restart"] = {"bench": res, "restarted": fresh, "others": others,
                              "predicted_hit_tokens": predicted, "actual_hit_tokens": actual}
        scenlib.print_table(
            "cache_aware with prefill-0 killed and restarted empty mid-run",
            ["hit ratio (restarted)", "hit ratio (others)", "router predicted hits",
             "worker-reported hits", "predicted / reported", "TTFT p50", "TTFT p99", "errors"],
            [[fr, orr, predicted, actual, predicted / actual if actual else None,
              res["ttft_ms"].get("p50"), res["ttft_ms"].get("p99"), failed_r]],
            note="predicted / reported near 1: the router did not keep routing to a tree the "
                 "restarted worker no longer has (its tree is dropped when the health layer sees "
                 "the worker come back)")
    scenlib.write_json(args.json, figures)
    print(f"\ncache_routing done: {failed} failed requests in the policy runs; {scenlib.load_now()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
