#!/usr/bin/env python3
"""cache_routing.py — cache- and session-aware routing on multi-turn chat.

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
            f"{args.shared_prefix}:{args.groups}", "--think-time", args.think_time, "--seed", 7,
            "--timeout", 60]


def run_policy(args, policy, timing, extra=()):
    with scenlib.Lab(args, f"cache-{policy}") as lab:
        prefills, decodes, ra = start_cluster(lab, args, 4, 4, args.cache_tokens, timing)
        r = lab.router(*ra, "--prefill-policy", policy, "--decode-policy", policy,
                       "--max-retries", 2, *extra)
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
        "ttft_p90": res["ttft_ms"].get("p90"),
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


def run_restart(args, timing, policy="cache_aware", extra=()):
    """Kills prefill-0 mid-run and restarts it on the same ports with an empty cache."""
    ports = [(scenlib.free_port(), scenlib.free_port()) for _ in range(4)]
    with scenlib.Lab(args, "cache-restart") as lab:
        prefills, decodes, ra = start_cluster(lab, args, 4, 4, args.cache_tokens, timing,
                                              ports=ports)
        r = lab.router(*ra, "--prefill-policy", policy, "--decode-policy", policy,
                       "--check-interval-ms", 200, "--check-fast-interval-ms", 100,
                       "--check-fall", 2, "--check-rise", 1, "--max-retries", 3, *extra)
        victim = prefills[0]
        events = {}

        def chaos():
            time.sleep(args.warmup + args.duration * 0.4)
            import os
            import signal
            events["before"] = worker_figures([victim])[0]  # its counters die with it
            events["others_before"] = sum(w["hit"] for w in worker_figures(prefills[1:]))
            events["predicted_before"] = metrics(r.url).get(
                'baton_routing_predicted_hit_tokens_total{role="prefill"}', 0.0)
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
        before = events.get("before", {"hit": 0})
        # from the kill on: what the router predicted vs what the workers found
        predicted = rm.get('baton_routing_predicted_hit_tokens_total{role="prefill"}', 0.0) - \
            events.get("predicted_before", 0.0)
        actual = sum(w["hit"] for w in others) + fresh["hit"] - events.get("others_before", 0.0)
        return res, fresh, others, predicted, actual, before


def main():
    ap = scenlib.arg_parser(__doc__.split("\n")[0])
    ap.add_argument("--session-rate", type=float, default=3.0,
                    help="new sessions per second (open loop) (3)")
    ap.add_argument("--turns", type=int, default=8, help="turns per session (8)")
    ap.add_argument("--input-len", type=int, default=80, help="new words per turn (80)")
    ap.add_argument("--output-len", type=int, default=32, help="reply tokens per turn (32)")
    ap.add_argument("--shared-prefix", type=int, default=150,
                    help="shared system prompt words (150)")
    ap.add_argument("--groups", type=int, default=8, help="distinct system prompts (8)")
    ap.add_argument("--cache-tokens", type=int, default=10240,
                    help="prefix cache per worker, tokens (10240)")
    ap.add_argument("--duration", type=float, default=40.0, help="measured seconds per run (40)")
    ap.add_argument("--warmup", type=float, default=16.0,
                    help="warm-up seconds per run, about one session's life (16)")
    ap.add_argument("--prefill-us-per-token", type=int, default=100)
    ap.add_argument("--decode-us-per-token", type=int, default=2000)
    ap.add_argument("--policies", default=",".join(POLICIES))
    ap.add_argument("--think-time", type=float, default=2.0,
                    help="seconds a session waits between an answer and its next turn (2)")
    ap.add_argument("--guard", default="2:150",
                    help="ABS:REL_PCT: also run cache_aware with this load guard ('' = no)")
    ap.add_argument("--no-restart", action="store_true", help="skip the kill-and-restart run")
    ap.add_argument("--variant", action="append", default=[], metavar="LABEL|POLICY|ROUTER ARGS",
                    help="also run POLICY with these router flags under LABEL (repeatable), e.g. "
                         "'cache_aware tie 20%%|cache_aware|--cache-tie-pct 20'")
    args = ap.parse_args()
    if args.smoke:
        args.duration, args.warmup, args.session_rate, args.turns = 2.0, 0.5, 4.0, 3
        args.think_time = 0.2
    timing = ["--prefill-us-per-token", args.prefill_us_per_token, "--decode-us-per-token",
              args.decode_us_per_token, "--max-batch", 32, "--max-queue", 100000]

    print("== cache_routing: multi-turn sessions, 4 prefill + 4 decode, every policy ==")
    print(scenlib.machine_line())
    words_last = args.shared_prefix + args.turns * args.input_len + (args.turns - 1) * args.output_len
    print(f"workload: {args.session_rate:g} sessions/s x {args.turns} turns (open loop, "
          f"{args.think_time:g}s think time), "
          f"{args.groups} shared prompts of {args.shared_prefix} words, {args.input_len} new "
          f"words + {args.output_len} reply tokens per turn (last turn ~{words_last} words); "
          f"{args.duration:g}s measured after {args.warmup:g}s; prefill "
          f"{args.prefill_us_per_token} us/token; cache {args.cache_tokens} tokens per worker")
    # sessions alive at once: arrivals x life (turns x (think + ~0.1 s per answer))
    live = args.session_rate * args.turns * (args.think_time + 0.1)
    words_avg = args.shared_prefix + (args.turns + 1) / 2 * args.input_len + \
        (args.turns - 1) / 2 * args.output_len
    print(f"working set: ~{live:.0f} live sessions x ~{words_avg:.0f} words on average + "
          f"{args.groups} x {args.shared_prefix} shared ≈ "
          f"{live * words_avg + args.groups * args.shared_prefix:.0f} tokens, against "
          f"{args.cache_tokens} per worker ({4 * args.cache_tokens} over 4): split by affinity it "
          f"fits, while round_robin needs all of it on every worker")
    figures = {"config": vars(args), "runs": {}}
    rows, failed = [], 0
    policies = [p for p in args.policies.split(",") if p]
    ideal = run_ideal(args) if policies else 0.0
    figures["ideal_hit_ratio"] = ideal
    base = None
    runs = [(p, p, ()) for p in policies]
    if args.guard and "cache_aware" in policies:
        # the same policy with a load guard scaled to this load (SGLang's 64 in flight never
        # trips at a few requests in flight per worker)
        a, rel = args.guard.split(":")
        runs.append((f"cache_aware guard {a}/{rel}%", "cache_aware",
                     ("--balance-abs-threshold", a, "--balance-rel-threshold-pct", rel)))
    for v in args.variant:
        label, policy, flags = v.split("|", 2)
        runs.append((label, policy, tuple(flags.split())))
    for label, policy, extra in runs:
        res, wf, cpu, rm = run_policy(args, policy, timing, extra)
        s = summarize(label, res, wf, cpu)
        s["router_tree_bytes"] = rm.get('baton_routing_tree_bytes{role="prefill"}', 0.0) + \
            rm.get('baton_routing_tree_bytes{role="decode"}', 0.0)
        pred = rm.get('baton_routing_predicted_hit_tokens_total{role="prefill"}', 0.0)
        hits = sum(w["hit"] for w in wf)
        s["predicted_over_reported"] = pred / hits if pred and hits else None
        figures["runs"][label] = {"summary": s, "bench": res, "workers": wf}
        failed += res["failed"]
        if label == "round_robin":
            base = s
        rows.append(s)
    table = []
    for s in rows if policies else []:
        table.append([s["policy"], s["hit_ratio"], s["hit_ratio"] / ideal if ideal else None,
                      s["ttft_p50"], s["ttft_p99"],
                      scenlib.ratio(s["ttft_p50"], base["ttft_p50"]) if base else "-",
                      s["req_s"], s["imbalance"], s["predicted_over_reported"],
                      s["router_cpu_us_per_req"],
                      scenlib.ratio(s["router_cpu_us_per_req"], base["router_cpu_us_per_req"])
                      if base else "-", s["failed"]])
    if policies:
        scenlib.print_table(
            "policies on the same multi-turn workload",
            ["policy", "hit ratio", "vs ideal", "TTFT p50", "TTFT p99", "p50 vs rr", "req/s",
             "imbalance", "pred/rep", "router CPU us/req", "CPU vs rr", "errors"], table,
            note=f"hit ratio: the prefill workers' own cached / prompt tokens; ideal = "
                 f"{ideal:.3f} (one worker, unbounded cache); TTFT in ms; imbalance: max / mean "
                 f"prompt tokens per prefill worker; pred/rep: the router's predicted hit tokens "
                 f"(cache_aware's trees) / the hits the prefill workers reported; router CPU: "
                 f"utime+stime of the router / requests")

    if not args.no_restart:
        guard = ()
        if args.guard:
            a, rel = args.guard.split(":")
            guard = ("--balance-abs-threshold", a, "--balance-rel-threshold-pct", rel)
        res, fresh, others, predicted, actual, before = run_restart(args, timing, extra=guard)
        failed_r = res["failed"]
        fr = fresh["hit"] / (fresh["hit"] + fresh["miss"]) if fresh["hit"] + fresh["miss"] else 0
        orr = sum(w["hit"] for w in others) / max(1, sum(w["hit"] + w["miss"] for w in others))
        figures["restart"] = {"bench": res, "restarted": fresh, "others": others,
                              "victim_before_kill": before,
                              "predicted_hit_tokens_after_kill": predicted,
                              "reported_hit_tokens_after_kill": actual}
        scenlib.print_table(
            f"cache_aware{' guard ' + args.guard.replace(':', '/') + '%' if args.guard else ''} "
            f"with prefill-0 killed and restarted empty mid-run",
            ["prompt tokens (restarted)", "hit ratio (restarted)", "hit ratio (others)",
             "predicted hits after kill", "reported hits after kill", "predicted / reported",
             "TTFT p50", "TTFT p99", "errors"],
            [[int(fresh["prompt"]), fr, orr, predicted, actual,
              predicted / actual if actual else None, res["ttft_ms"].get("p50"),
              res["ttft_ms"].get("p99"), failed_r]],
            note="from the kill on, the router's predicted hit tokens against the hits the "
                 "prefill workers reported: near 1 means it did not trust a tree the restarted "
                 "worker no longer has (dropped when the health layer sees it come back)")
    scenlib.write_json(args.json, figures)
    print(f"\ncache_routing done: {failed} failed requests in the policy runs; {scenlib.load_now()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
