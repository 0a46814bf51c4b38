#!/usr/bin/env python3
"""tier_stall.py — what a large model's HiCache page work costs the other requests on a prefill.

1 prefill + 1 decode baton-worker with the llama3-8b shape (8 MiB pages of 64 tokens) behind
Baton; the prefill has a 1 GiB L2 and an L1 of one page. A "big" client sends long prompts, each
twice (the first computes it and fills its pages into L2, the second hits L2 and copies those
pages into its room), while a "probe" client sends a short one-token request every 25 ms to the
same prefill. Per build: the probes' latency (p50, p99, max: with one output token, their TTFT;
a stall of the prefill's loop shows here), the big requests' latency, and the prefill's page work
by thread (baton_worker_tier_page_work_seconds_total, where the build has it). --old-build-dir
runs the same against another build first, for an A/B on the same machine.
"""

import json
import os
import re
import sys
import threading
import time
import urllib.request

import scenlib


def metric_sum(url, name, labels=""):
    with urllib.request.urlopen(url + "/metrics", timeout=10) as r:
        text = r.read().decode()
    tot = 0.0
    for line in text.splitlines():
        m = re.match(r"^" + re.escape(name) + r"(\{[^}]*\})?\s+(\S+)$", line)
        if m and all(lab in (m.group(1) or "") for lab in labels.split(",") if lab):
            tot += float(m.group(2))
    return tot


def post(url, text):
    body = json.dumps({"text": text, "sampling_params": {"max_new_tokens": 1}}).encode()
    req = urllib.request.Request(url + "/generate", data=body,
                                 headers={"Content-Type": "application/json"})
    t0 = time.monotonic()
    with urllib.request.urlopen(req, timeout=120) as r:
        r.read()
    return (time.monotonic() - t0) * 1000.0


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


def run(args, build_dir, label):
    args.build_dir = build_dir
    shape = ["--model-preset", "llama3-8b", "--kv-pool-tokens", 4096,
             "--prefill-us-per-token", 20, "--decode-us-per-token", 1000]
    with scenlib.Lab(args, f"tier-stall-{label}") as lab:
        p = lab.worker("prefill", *shape, "--cache-tokens", 64, "--l2-bytes", "1G",
                       name="prefill")
        d = lab.worker("decode", *shape, name="decode")
        r = lab.router("--prefill", p.url, p.ports["bootstrap"], "--decode", d.url)
        post(r.url, "warm up")
        stop = time.monotonic() + args.duration
        big, probe, errors = [], [], []

        def big_client():
            i = 0
            while time.monotonic() < stop:
                text = " ".join(f"b{i}w{k}" for k in range(args.big_words))
                try:
                    big.append(post(r.url, text))  # computed: its pages fill L2
                    big.append(post(r.url, text))  # L2 hit: its pages copied into the room
                except Exception as e:  # noqa: BLE001 — counted, the run goes on
                    errors.append(repr(e))
                i += 1

        def probe_client():
            i = 0
            while time.monotonic() < stop:
                try:
                    probe.append(post(r.url, " ".join(f"p{i}w{k}" for k in range(40))))
                except Exception as e:  # noqa: BLE001
                    errors.append(repr(e))
                i += 1
                time.sleep(0.025)
        ts = [threading.Thread(target=big_client), threading.Thread(target=probe_client)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        loop_s = metric_sum(p.url, "baton_worker_tier_page_work_seconds_total", 'thread="loop"')
        pool_s = metric_sum(p.url, "baton_worker_tier_page_work_seconds_total", 'thread="pool"')
        has = lab.worker_has_option("--l2-bytes") and pool_s + loop_s > 0
        return [label, len(probe), pct(probe, 0.5), pct(probe, 0.99), max(probe or [0]),
                len(big), pct(big, 0.5), loop_s if has else "n/a", pool_s if has else "n/a",
                len(errors)]


def main():
    ap = scenlib.arg_parser(__doc__.splitlines()[0])
    ap.add_argument("--old-build-dir", help="another build to run first (A/B)")
    ap.add_argument("--duration", type=float, default=20.0)
    ap.add_argument("--big-words", type=int, default=1600,
                    help="words of a big prompt (about one token each; 1,600: 25 pages)")
    args = ap.parse_args()
    if args.smoke:
        args.duration, args.big_words = 3.0, 400
    print(scenlib.machine_line())
    rows = []
    new = args.build_dir
    if args.old_build_dir:
        rows.append(run(args, args.old_build_dir, "old"))
    rows.append(run(args, new, "this"))
    scenlib.print_table(
        f"probe requests beside {args.big_words}-word prompts twice each (llama3-8b pages)",
        ["build", "probes", "probe p50 ms", "probe p99 ms", "probe max ms", "big reqs",
         "big p50 ms", "page work s (loop)", "page work s (pool)", "errors"], rows)
    return 1 if any(row[-1] for row in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
