#!/usr/bin/env python3
"""registry_convergence.py — several routers over one etcd registry: how fast a
change made through one router reaches the other, what a watching router costs etcd, and what
a router spends when 1,000 workers churn.

A 3-member etcd cluster (Debian etcd-server) and routers run on loopback. Measured:
  1. convergence: N changes (register through router A, then remove through router B,
     alternately), each timed from just before the HTTP call on one router to the other
     router's log line that applied it (both on this machine's clock, ms resolution);
     p50 / p99 / max;
  2. watch cost: etcd's CPU (all members, /proc) for the same changes with 2 routers watching
     and with 10;
  3. churn: W workers put straight into etcd, then a delete + re-put of random ones at a fixed
     rate for D seconds; each router's CPU over that time against an idle period of the same
     length, and whether both end with the same W workers.
Workers are registered with unreachable URLs and health checks off: nothing but the registry is
measured.
"""

import json
import os
import random
import re
import sys
import time
import urllib.request
from datetime import datetime, timezone

import scenlib

sys.path.insert(0, os.path.join(scenlib.REPO, "tests", "integration"))
from etcd_cluster import EtcdCluster, b64, etcd_binary  # noqa: E402

ROUTER_ARGS = ("--threads", "1", "--check-interval-ms", "0")
LOG_TS = re.compile(r"^(\S+Z) level=info comp=etcd worker_(added|removed) id=(\S+)")


def http(port, method, path, body=None, timeout=10):
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data, method=method,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read() or b"{}")
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def log_times(path):
    """(event, worker id) -> epoch seconds of the router's log line that applied it (last)."""
    out = {}
    with open(path) as f:
        for line in f:
            m = LOG_TS.match(line)
            if m:
                ts = datetime.strptime(m.group(1), "%Y-%m-%dT%H:%M:%S.%fZ").replace(
                    tzinfo=timezone.utc).timestamp()
                out[(m.group(2), m.group(3))] = ts
    return out


def wait(pred, timeout=10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.002)
    return False


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else None


def etcd_cpu(etcd):
    return sum(scenlib.cpu_seconds(m.p.pid) for m in etcd.members if m.alive())


def convergence(a, b, n, tag):
    """n changes alternating add-through-a / remove-through-b; returns (add_ms, remove_ms)."""
    sent = []
    for i in range(n // 2):
        wurl = f"http://127.0.0.1:{20000 + i}/{tag}"
        t = time.time()
        st, body = http(a.port, "POST", "/workers", {"url": wurl})
        assert st == 202, (st, body)
        wid = body["id"]
        sent.append(("added", wid, t))
        assert wait(lambda: http(b.port, "GET", f"/workers/{wid}")[0] == 200), "B never saw it"
        t = time.time()
        st, body = http(b.port, "DELETE", f"/workers/{wid}")
        assert st == 202, (st, body)
        sent.append(("removed", wid, t))
        assert wait(lambda: http(a.port, "GET", f"/workers/{wid}")[0] == 404), "A kept it"
    # A router may answer from its new worker set a moment before its log line is written:
    # read the logs until every change is in them.
    logs = {}

    def logged():
        logs["a"], logs["b"] = log_times(a.log_path), log_times(b.log_path)
        return all((ev, w) in logs["b" if ev == "added" else "a"] for ev, w, _ in sent)
    assert wait(logged), "a change never reached a router's log"
    la, lb = logs["a"], logs["b"]
    add = [(lb[(ev, w)] - t) * 1000 for ev, w, t in sent if ev == "added"]
    rem = [(la[(ev, w)] - t) * 1000 for ev, w, t in sent if ev == "removed"]
    return add, rem


def main():
    p = scenlib.arg_parser(__doc__.split("\n")[0])
    p.add_argument("--changes", type=int, default=100)
    p.add_argument("--workers", type=int, default=1000)
    p.add_argument("--churn-rate", type=float, default=100.0, help="changes per second")
    p.add_argument("--churn-seconds", type=float, default=10.0)
    args = p.parse_args()
    if args.smoke:
        args.changes, args.workers, args.churn_seconds = 10, 50, 1.0
    if etcd_binary() is None:
        scenlib.skip_note("etcd not installed (scripts/install-deps.sh --test)")
        return
    print(scenlib.machine_line())
    figures = {}
    with EtcdCluster(size=3, name="conv-etcd") as etcd, scenlib.Lab(args, "registry") as lab:
        url = etcd.url("/bench")
        a = lab.router("--registry", url, *ROUTER_ARGS, name="router-a")
        b = lab.router("--registry", url, *ROUTER_ARGS, name="router-b")
        time.sleep(0.5)

        # 1 + 2: convergence with 2 watchers, then with 10.
        rows = []
        for watchers in (2, 10):
            for i in range(len(lab.procs), watchers):
                lab.router("--registry", url, *ROUTER_ARGS, name=f"router-x{i}")
            time.sleep(0.5)
            cpu0 = etcd_cpu(etcd)
            t0 = time.monotonic()
            add, rem = convergence(a, b, args.changes, f"w{watchers}")
            dt = time.monotonic() - t0
            cpu = etcd_cpu(etcd) - cpu0
            allc = add + rem
            rows.append([watchers, len(allc), pct(allc, 0.5), pct(allc, 0.99), max(allc),
                         pct(add, 0.5), pct(rem, 0.5), cpu * 1000 / len(allc), dt])
            figures[f"watchers_{watchers}"] = {
                "changes": len(allc), "p50_ms": pct(allc, 0.5), "p99_ms": pct(allc, 0.99),
                "max_ms": max(allc), "etcd_cpu_ms_per_change": cpu * 1000 / len(allc)}
        scenlib.print_table(
            "Convergence across routers (change through one router -> applied by the other)",
            ["routers watching", "changes", "p50 ms", "p99 ms", "max ms", "add p50 ms",
             "remove p50 ms", "etcd CPU ms/change (3 members)", "run s"], rows,
            note=scenlib.load_now())

        # 3: churn with W workers, 2 routers' CPU (the extra routers are stopped first).
        for proc in lab.procs[2:]:
            proc.stop()
        wids = [f"c{i}" for i in range(args.workers)]

        def put(i):
            v = json.dumps({"url": f"http://127.0.0.1:{30000 + i % 30000}/c{i}",
                            "worker_type": ["prefill", "decode", "regular"][i % 3],
                            "bootstrap_port": 8998 if i % 3 == 0 else None})
            etcd.call("/v3/kv/put", {"key": b64(f"/bench/workers/{wids[i]}"), "value": b64(v)})

        def delete(i):
            etcd.call("/v3/kv/deleterange", {"key": b64(f"/bench/workers/{wids[i]}")})

        t0 = time.monotonic()
        for i in range(args.workers):
            put(i)
        fill = time.monotonic() - t0
        ok = wait(lambda: all(len(http(r.port, "GET", "/list_workers")[1]["urls"]) ==
                              args.workers for r in (a, b)), timeout=60)
        assert ok, "routers did not reach the full worker set"
        idle = [scenlib.cpu_seconds(r.p.pid) for r in (a, b)]
        time.sleep(args.churn_seconds)
        idle = [scenlib.cpu_seconds(r.p.pid) - c for r, c in zip((a, b), idle)]
        rnd = random.Random(14)
        cpu0 = [scenlib.cpu_seconds(r.p.pid) for r in (a, b)]
        t0 = time.monotonic()
        n = 0
        while time.monotonic() - t0 < args.churn_seconds:
            i = rnd.randrange(args.workers)
            delete(i)
            put(i)
            n += 2
            ahead = n / args.churn_rate - (time.monotonic() - t0)
            if ahead > 0:
                time.sleep(ahead)
        dt = time.monotonic() - t0
        busy = [scenlib.cpu_seconds(r.p.pid) - c for r, c in zip((a, b), cpu0)]
        same = wait(lambda: all(len(http(r.port, "GET", "/list_workers")[1]["urls"]) ==
                                args.workers for r in (a, b)), timeout=30)
        rows = [[r.name, args.workers, f"{n / dt:.0f}", f"{100 * i / args.churn_seconds:.1f}%",
                 f"{100 * c / dt:.2f}%", f"{c * 1e6 / n:.0f}", "yes" if same else "NO"]
                for r, i, c in zip((a, b), idle, busy)]
        scenlib.print_table(
            f"Router CPU while {args.workers} workers churn (delete + re-put in etcd)",
            ["router", "workers", "changes/s", "CPU idle", "CPU churning", "CPU us/change",
             "same set at the end"], rows,
            note=f"initial fill: {args.workers} puts in {fill:.1f} s; {scenlib.load_now()}")
        figures["churn"] = {"workers": args.workers, "changes_per_s": n / dt,
                            "cpu_pct": [100 * c / dt for c in busy],
                            "idle_cpu_pct": [100 * i / args.churn_seconds for i in idle],
                            "converged": same}
    scenlib.write_json(args.json, figures)


if __name__ == "__main__":
    main()
