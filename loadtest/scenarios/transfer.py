#!/usr/bin/env python3
"""transfer.py — scenario 5: the KV transfer engine against the machine's own limits.

Runs baton-xfer-bench (a decode process and a prefill process on loopback: tcp, shm, rdma when
there is a device; block sizes 4 KiB..64 MiB and whole KV hand-offs of the preset shape; a
memcpy baseline in the same run) and, next to it, iperf3 on loopback with one stream and with
as many streams as the engine has tcp lanes. With --repeat N the whole set runs N times,
interleaved, and every figure is the median over the repeats (each bench figure is itself a
median over its runs). Targets: tcp >= 90% of iperf3, shm >= 80% of memcpy.

Then pull vs push (libbaton's pull mode; --pull-rounds 0 skips it): the same sizes in
both modes on tcp and shm. A holder process (baton-xfer-pull --hold) either EXPORTS its keys
(pull: its engine serves each pull on its own) or, with --push, has its application write each
offered key (the SGLang flow's write path); the same puller process fetches them and verifies
every byte after the clock stops. Rounds alternate pull and push; medians. Goal: pull within
10% of push.
"""

import json
import os
import shutil
import statistics
import subprocess
import sys
import time

import scenlib

TCP_TARGET = 0.90
SHM_TARGET = 0.80
PULL_TARGET = 0.90  # pull within 10% of push


def find_iperf3():
    for cand in (shutil.which("iperf3"), "/usr/bin/iperf3"):
        if cand and os.access(cand, os.X_OK):
            return cand
    return None


def iperf3_run(lab, exe, port, seconds, streams):
    """One iperf3 client run against the lab's server; returns a dict or raises."""
    argv = [exe, "-c", scenlib.HOST, "-p", str(port), "-t", str(seconds), "-J",
            "-P", str(streams)]
    if seconds >= 3:
        argv += ["-O", "1"]  # the first second (slow start, window growth) is not counted
    deadline = time.monotonic() + 10
    while True:
        r = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           timeout=seconds + 30)
        try:
            d = json.loads(r.stdout)
        except ValueError:
            d = {}
        if r.returncode == 0 and "sum_received" in d.get("end", {}):
            break
        if time.monotonic() > deadline:
            raise RuntimeError(f"iperf3 failed ({r.returncode}): {r.stdout[-400:]}{r.stderr}")
        time.sleep(0.2)  # the server may not listen yet
    e = d["end"]
    cpu = e.get("cpu_utilization_percent", {})
    return {"streams": streams, "seconds": seconds, "command": " ".join(argv),
            "gbps": e["sum_received"]["bits_per_second"] / 8e9,
            "cpu_pct_sender": cpu.get("host_total"), "cpu_pct_receiver": cpu.get("remote_total")}


def bench_argv(lab, args, json_path, transports, memcpy):
    argv = [lab.bin("baton-xfer-bench"), "--json", json_path, "--quiet",
            "--transports", transports]
    if args.smoke:
        argv.append("--smoke")
    if not memcpy:
        argv.append("--no-memcpy")
    for opt in ("sizes", "kv_tokens", "runs", "kv_runs", "slice", "lanes", "run_ms"):
        v = getattr(args, opt)
        if v is not None:
            argv += ["--" + opt.replace("_", "-"), str(v)]
    return argv


def med(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def run_bench(lab, args, rep, transports, memcpy):
    out = os.path.join(lab.dir, f"xfer-{rep}-{transports.replace(',', '-')}.json")
    argv = bench_argv(lab, args, out, transports, memcpy)
    r = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if not os.path.exists(out):
        raise RuntimeError(f"baton-xfer-bench failed ({r.returncode}): "
                           f"{' '.join(argv)}\n{r.stdout}{r.stderr[-3000:]}")
    with open(out) as f:
        res = json.load(f)
    if r.returncode != 0:
        sys.stderr.write(r.stderr[-3000:])
    return res, r.returncode


def iperf_cpu_per_gb(x):
    """CPU seconds of both iperf3 processes per GB (their utilisation is % of one CPU)."""
    if x.get("cpu_pct_sender") is None or x.get("cpu_pct_receiver") is None or not x["gbps"]:
        return None
    return (x["cpu_pct_sender"] + x["cpu_pct_receiver"]) / 100 / x["gbps"]


def pull_one(lab, args, tp, mode):
    """One holder/puller pair moving --pull-keys keys; returns the puller's Gbit/s."""
    shape = ["--keys", args.pull_keys, "--layers", args.pull_layers, "--ppl", args.pull_ppl,
             "--page", args.pull_page, "--transport", tp]
    shape = [str(x) for x in shape]
    extra = ["--push"] if mode == "push" else []
    # libbaton logs "bootstrap_listening addr=H:P" once the holder listens
    h = lab.start(f"hold-{tp}-{mode}", [lab.bin("baton-xfer-pull"), "--hold", *extra, *shape],
                  keys=("bootstrap",))
    argv = [lab.bin("baton-xfer-pull"), "--pull", f"{scenlib.HOST}:{h.ports['bootstrap']}",
            *shape]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    h.stop()
    done = [ln for ln in r.stdout.splitlines() if ln.startswith("done ")]
    if r.returncode != 0 or not done or "failures=0" not in done[0]:
        raise RuntimeError(f"puller failed ({r.returncode}): {' '.join(argv)}\n"
                           f"{r.stdout[-400:]}{r.stderr[-400:]}")
    return float(done[0].split("gbps=")[1].split()[0]), " ".join(argv)


def pull_vs_push(lab, args, tps, figures):
    """Pull and push, the same sizes, alternating rounds; returns a printer of its table and the
    verdicts."""
    size = args.pull_keys * args.pull_layers * args.pull_ppl * args.pull_page
    got, rows, verdicts, command = {}, [], [], None
    for tp in tps:
        got[tp] = {"pull": [], "push": []}
        for _ in range(args.pull_rounds):
            for mode in ("pull", "push"):
                gbps, command = pull_one(lab, args, tp, mode)
                got[tp][mode].append(gbps)
        pl, pu = statistics.median(got[tp]["pull"]), statistics.median(got[tp]["push"])
        ok = pl >= PULL_TARGET * pu
        verdicts.append((tp, ok))
        rows.append([tp, pl, min(got[tp]["pull"]), max(got[tp]["pull"]), pu,
                     min(got[tp]["push"]), max(got[tp]["push"]), scenlib.ratio(pl, pu),
                     "met" if ok else "BELOW"])
    figures["pull_vs_push"] = {"gbps": got, "bytes_per_run": size, "command": command}

    def show():
        scenlib.print_table(
            "pull vs push (libbaton pull mode), the same sizes",
            ["transport", "pull Gbit/s", "min", "max", "push Gbit/s", "min", "max", "pull/push",
             "goal"], rows,
            note=f"{args.pull_keys} keys of {args.pull_layers} layers x {args.pull_ppl} pages x "
                 f"{args.pull_page} B ({size >> 20} MiB) per run, {args.pull_rounds} rounds, "
                 f"pull and push alternating; medians over the rounds; every byte verified by "
                 f"the puller after the clock stops; goal: pull >= {PULL_TARGET:.0%} of push. "
                 f"Puller: {command} (the holder: baton-xfer-pull --hold [--push], same shape)")
    return show, verdicts


def main():
    ap = scenlib.arg_parser(__doc__.split("\n")[0])
    ap.add_argument("--repeat", type=int, default=1,
                    help="interleaved repeats of (iperf3, tcp, memcpy + shm); paired ratios "
                         "and medians over them")
    ap.add_argument("--transports", default="tcp,shm,rdma",
                    help="measured by baton-xfer-bench (tcp,shm,rdma)")
    ap.add_argument("--sizes", help="passed to baton-xfer-bench (default 4K..64M, x4)")
    ap.add_argument("--kv-tokens", dest="kv_tokens", help="passed on (default 4k,16k)")
    ap.add_argument("--runs", type=int, help="passed on (default 5)")
    ap.add_argument("--kv-runs", dest="kv_runs", type=int, help="passed on (default 5)")
    ap.add_argument("--run-ms", dest="run_ms", type=int, help="passed on (default 600)")
    ap.add_argument("--slice", help="engine slice size, passed on (default 64K)")
    ap.add_argument("--lanes", type=int, help="tcp lanes, passed on (default 4)")
    ap.add_argument("--iperf-seconds", type=int, default=5, help="per iperf3 run (5)")
    ap.add_argument("--pull-rounds", type=int, default=6,
                    help="pull vs push: alternating rounds per transport (0: skip; 6)")
    ap.add_argument("--pull-keys", type=int, default=16, help="pull vs push: keys per run (16)")
    ap.add_argument("--pull-layers", type=int, default=16, help="... layers per key (16)")
    ap.add_argument("--pull-ppl", type=int, default=16, help="... pages per layer (16)")
    ap.add_argument("--pull-page", type=int, default=65536, help="... bytes per page (64 KiB)")
    args = ap.parse_args()
    if args.smoke:
        args.iperf_seconds = 1
        args.repeat = 1
        args.pull_rounds = min(args.pull_rounds, 1)
        args.pull_keys, args.pull_layers, args.pull_ppl = 2, 4, 4
    lanes = args.lanes or 4
    tps = [t for t in args.transports.split(",") if t]
    others = ",".join(t for t in tps if t != "tcp")
    print("== Scenario 5: transfer engine vs the machine's limits ==")
    print(scenlib.machine_line())
    iperf = find_iperf3()
    figures = {"config": vars(args), "repeats": []}
    with scenlib.Lab(args, "xfer") as lab:
        ip_port = None
        if iperf and "tcp" in tps:
            ip_port = scenlib.free_port()
            lab.start("iperf3-server", [iperf, "-s", "-p", str(ip_port)], keys=())
        elif "tcp" in tps:
            scenlib.skip_note("iperf3 is not installed: no iperf3 baseline "
                              "(scripts/install-bench-deps.sh)")
        for rep in range(args.repeat):
            # Each baseline runs right before what it is compared with, and ratios are taken
            # within a repeat: load from other processes drifts less between the two.
            one = {"iperf3": [], "load_start": os.getloadavg()[0], "transports": [],
                   "memcpy": [], "exit": 0}
            if ip_port:
                for streams in sorted({1, lanes}):
                    one["iperf3"].append(iperf3_run(lab, iperf, ip_port, args.iperf_seconds,
                                                    streams))
            for group, memcpy in (("tcp", False), (others, True)):
                if not group or (group == "tcp" and "tcp" not in tps):
                    continue
                res, code = run_bench(lab, args, rep, group, memcpy)
                one["transports"] += res["transports"]
                one["memcpy"] += res["memcpy"]
                one["machine"] = res["machine"]
                one["command"] = res["command"]
                one["corrupt_rooms"] = one.get("corrupt_rooms", 0) + res.get("corrupt_rooms", 0)
                one["verified_bytes"] = one.get("verified_bytes", 0) + res.get("verified_bytes", 0)
                one["exit"] = max(one["exit"], code)
            one["load_end"] = os.getloadavg()[0]
            figures["repeats"].append(one)
            print(f"repeat {rep + 1}/{args.repeat} done (load average {one['load_start']:.2f} "
                  f"-> {one['load_end']:.2f})", flush=True)
            if one["exit"] != 0:
                break
        # pull vs push: tcp and shm (rdma has no pull figure of its own: a pull is served with
        # RDMA WRITE, the push path)
        pull_tps = [t for t in tps if t in ("tcp", "shm")]
        pull_show, pull_verdicts = pull_vs_push(lab, args, pull_tps, figures) \
            if args.pull_rounds > 0 and pull_tps else (None, [])

    reps = figures["repeats"]
    print(f"commands: {reps[0].get('command')} (per group of transports; x{len(reps)}, "
          f"interleaved with the baselines)")
    print("load average per repeat: " + ", ".join(f"{r['load_start']:.2f}->{r['load_end']:.2f}"
                                                  for r in reps))

    # ---- baselines ----
    ip_best = {}  # repeat index -> (GB/s, CPU s/GB) of the faster iperf3 run
    if ip_port:
        rows = []
        for streams in sorted({1, lanes}):
            runs = [x for rp in reps for x in rp["iperf3"] if x["streams"] == streams]
            rows.append([f"iperf3 -P {streams}", med([x["gbps"] for x in runs]),
                         min(x["gbps"] for x in runs), max(x["gbps"] for x in runs),
                         med([x["cpu_pct_sender"] for x in runs]),
                         med([x["cpu_pct_receiver"] for x in runs]),
                         med([iperf_cpu_per_gb(x) for x in runs])])
        for i, rp in enumerate(reps):
            best = max(rp["iperf3"], key=lambda x: x["gbps"])
            ip_best[i] = (best["gbps"], iperf_cpu_per_gb(best))
        scenlib.print_table("iperf3 on loopback (the same two CPUs)",
                            ["run", "GB/s (median)", "min", "max", "CPU % sender",
                             "CPU % receiver", "CPU s/GB"], rows,
                            note=f"each run: {reps[0]['iperf3'][0]['command']} (and -P {lanes}); "
                                 "-O 1: the first second is not counted")

    mc = {}  # case -> list over repeats
    for i, rp in enumerate(reps):
        for c in rp["memcpy"]:
            mc.setdefault(c["case"], {})[i] = c
    if mc:
        scenlib.print_table(
            "memcpy baseline (one thread, same pages, pool touched before)",
            ["case", "GB/s (median)", "whole pages", "in steps", "CPU s/GB",
             "first touch GB/s"],
            [[k, med([c.get("gbps") for c in v.values()]),
              med([c.get("gbps_whole") for c in v.values()]),
              med([c.get("gbps_steps") for c in v.values()]),
              med([c.get("cpu_s_per_gb") for c in v.values()]),
              med([c.get("first_touch_gbps") for c in v.values()])] for k, v in mc.items()],
            note="GB/s: the faster of one memcpy per page and the page in slice-sized steps; "
                 "first touch: the same copies into a fresh memfd (page faults + zeroing)")

    cases = {}  # (transport, case) -> {repeat: case dict}
    status = {}
    for i, rp in enumerate(reps):
        for t in rp["transports"]:
            status[t["transport"]] = t
            for c in t.get("cases", []):
                cases.setdefault((t["transport"], c["case"]), {})[i] = c
    verdicts = []
    for name in tps:
        t = status.get(name)
        if t is None:
            continue
        if t.get("status") == "unavailable":
            print(f"\n### {name}: not measurable here — {t.get('error')}")
            continue
        target = TCP_TARGET if name == "tcp" else SHM_TARGET if name == "shm" else None
        rows = []
        for c in t.get("cases", []):
            rs = cases.get((name, c["case"]), {})
            ratios, cpu_ratios, bases, base_cpus = [], [], [], []
            for i, x in rs.items():
                if name == "tcp" and i in ip_best:
                    base, base_cpu = ip_best[i]
                elif name == "shm" and i in mc.get(c["case"], {}):
                    b = mc[c["case"]][i]
                    base, base_cpu = b.get("gbps"), b.get("cpu_s_per_gb")
                else:
                    continue
                bases.append(base)
                base_cpus.append(base_cpu)
                if x.get("gbps") and base:
                    ratios.append(x["gbps"] / base)
                if x.get("cpu_s_per_gb") and base_cpu:
                    cpu_ratios.append(base_cpu / x["cpu_s_per_gb"])
            ratio, cpu_ratio = med(ratios), med(cpu_ratios)
            bandwidth_case = c["kind"] == "kv" or c["room_bytes"] >= (1 << 20)
            verdict = "-"
            if ratio is not None and target is not None:
                ok = ratio >= target
                verdict = ("met" if ok else "BELOW") if bandwidth_case else "per-room bound"
                if bandwidth_case:
                    verdicts.append((name, c["case"], ok))
            xs = list(rs.values())
            lat = [x.get("lat_us") or {} for x in xs]
            rows.append([c["case"], med([x.get("gbps") for x in xs]),
                         min(x.get("gbps") or 0 for x in xs), max(x.get("gbps") or 0 for x in xs),
                         med([l.get("p50") for l in lat]), med([l.get("p99") for l in lat]),
                         med([(x.get("cpu_pct") or {}).get("driver") for x in xs]),
                         med([(x.get("cpu_pct") or {}).get("server") for x in xs]),
                         med([x.get("cpu_s_per_gb") for x in xs]),
                         med(bases), f"{ratio * 100:.0f}%" if ratio is not None else "-",
                         f"{cpu_ratio * 100:.0f}%" if cpu_ratio is not None else "-", verdict])
        base_name = "iperf3" if name == "tcp" else "memcpy" if name == "shm" else "baseline"
        scenlib.print_table(
            f"{name}: throughput and latency per room",
            ["case", "GB/s", "min", "max", "lat p50 us", "lat p99 us", "CPU % decode",
             "CPU % prefill", "CPU s/GB", f"{base_name} GB/s", "GB/s ratio", "CPU ratio",
             "target"], rows,
            note="GB/s: median over repeats of each run set's median (a window of rooms in flight;"
                 " kv: one hand-off at a time); min/max over repeats; latency: one room at a time "
                 "(kv: the hand-off itself), offer to completion on the decode side. GB/s ratio: "
                 "median over repeats of engine / baseline of the same repeat. CPU ratio: "
                 "baseline CPU s/GB / engine CPU s/GB (both processes), 100% = same CPU per byte.")
    if pull_show:
        pull_show()
    bad = sum(rp.get("corrupt_rooms", 0) for rp in reps)
    vbytes = sum(rp.get("verified_bytes", 0) for rp in reps)
    print(f"\nbytes verified: {vbytes / 2**20:.1f} MiB, corrupt rooms: {bad}")
    missed = [f"{t}/{c}" for t, c, ok in verdicts if not ok]
    if verdicts:
        print(f"targets (tcp >= {TCP_TARGET:.0%} of iperf3, shm >= {SHM_TARGET:.0%} of memcpy, "
              f"rooms >= 1 MiB and KV hand-offs): {len(verdicts) - len(missed)}/{len(verdicts)} "
              f"met" + (f"; below: {', '.join(missed)}" if missed else ""))
    if pull_verdicts:
        below = [t for t, ok in pull_verdicts if not ok]
        print(f"pull vs push (pull >= {PULL_TARGET:.0%} of push): "
              f"{len(pull_verdicts) - len(below)}/{len(pull_verdicts)} met"
              + (f"; below: {', '.join(below)}" if below else ""))
    print(scenlib.load_now())
    scenlib.write_json(args.json, figures)
    worst = max(rp["exit"] for rp in reps)
    print(f"scenario 5 done: bench exit {worst}, {bad} corrupt rooms")
    return 1 if bad or worst else 0


if __name__ == "__main__":
    sys.exit(main())
