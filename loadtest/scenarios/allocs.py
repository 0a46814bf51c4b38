#!/usr/bin/env python3
"""allocs.py — heap calls (and optionally syscalls) per request of the ROUTER process.

The router runs under libbaton_allocs.so (loadtest/allocs/, LD_PRELOAD), which counts malloc,
calloc, realloc, the aligned allocators and free of every thread into a shared file mapping; the
workers (zero-cost baton-workers: one regular, one prefill + one decode) run plainly. For each
topology (regular, pd) and mode (json, stream) with a short prompt: a warm-up (pools, buffers and
caches fill), then N requests with baton-bench at a fixed concurrency; the counter deltas over
the measured run divided by the completed requests are the figures. The router's idle work over
that time (its ticks) is counted too, so figures are slightly above the pure per-request cost.

A third router serves the regular topology over HTTPS on its client port (regular-tls; the
certificate is made with the openssl CLI as tls.py does; skipped without openssl).

--callgrind runs the routers under valgrind's callgrind instead (no shim) and reports the
router's user-space instructions per request (collection switched on for the measured run only
with callgrind_control): a count of the work done that, unlike CPU time, a loaded machine does
not blur; kernel time (syscalls) is not in it.

--syscalls also attaches `strace -c -f` to the router for the measured run and reports syscalls
per request (strace slows the router; counts, not times, are what it is good for here).
"""

import glob
import os
import shutil
import signal
import struct
import subprocess
import time

import scenlib
import tls as tls_scenario

FIELDS = ("magic", "malloc", "calloc", "realloc", "memalign", "free", "bytes")
MAGIC = 0x31434F4C4C41


def read_counters(path):
    with open(path, "rb") as f:
        vals = struct.unpack(f"={len(FIELDS)}Q", f.read(8 * len(FIELDS)))
    c = dict(zip(FIELDS, vals))
    if c["magic"] != MAGIC:
        raise RuntimeError(f"{path}: not a libbaton_allocs counter file")
    c["allocs"] = c["malloc"] + c["calloc"] + c["realloc"] + c["memalign"]
    return c


def strace_start(pid, out):
    p = subprocess.Popen(["strace", "-c", "-f", "-p", str(pid), "-o", out],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(1.0)  # strace attaches to every thread before the run starts
    return p


def strace_stop(p, out):
    """{syscall: calls} from strace -c's table, 'total' included."""
    p.send_signal(signal.SIGINT)
    p.wait(timeout=30)
    calls = {}
    with open(out) as f:
        for line in f:
            fields = line.split()
            if len(fields) < 5 or not fields[0].replace(".", "").isdigit():
                continue
            # % time, seconds, usecs/call, calls, [errors], syscall
            calls[fields[-1]] = int(fields[3])
    return calls


def callgrind_run(pid, out_base, run):
    """Runs run() with callgrind collecting in the router; returns (run's result, instructions)."""
    def ctl(*a):
        subprocess.run(["callgrind_control", *a, str(pid)], check=True, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)
    ctl("-i", "on")
    ctl("-z")
    res = run()
    ctl("-d")
    ctl("-i", "off")
    dumps = sorted(glob.glob(out_base + ".*"), key=lambda f: int(f.rsplit(".", 1)[1]))
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:  # the dump is written by the router, asynchronously
        with open(dumps[-1]) as f:
            for line in f:
                if line.startswith("totals:"):
                    return res, int(line.split()[1])
        time.sleep(0.2)
    raise RuntimeError(f"no totals in {dumps[-1]}")


def main():
    ap = scenlib.arg_parser(__doc__.split("\n")[0])
    ap.add_argument("--requests", type=int, default=4000, help="measured requests per run")
    ap.add_argument("--warmup", type=int, default=500, help="warm-up requests per run")
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--input-len", type=int, default=16, help="prompt words (a short body)")
    ap.add_argument("--syscalls", action="store_true", help="also count syscalls with strace")
    ap.add_argument("--callgrind", action="store_true",
                    help="instead: user-space instructions per request (valgrind callgrind)")
    args = ap.parse_args()
    if args.smoke:
        args.requests, args.warmup = 200, 50
    if args.syscalls and not shutil.which("strace"):
        scenlib.skip_note("--syscalls: strace is not installed")
        args.syscalls = False
    print("== heap calls per request of the router ==")
    print(scenlib.machine_line())
    failed = 0
    rows = []
    zero = ["--prefill-us-per-token", 0, "--decode-us-per-token", 0, "--max-queue", 100000]
    if args.callgrind and not shutil.which("callgrind_control"):
        raise SystemExit("allocs: --callgrind needs valgrind (apt-get install valgrind)")
    if args.callgrind:
        args.syscalls = False
    with scenlib.Lab(args, "allocs") as lab:
        shim = os.path.join(lab.build, "libbaton_allocs.so")
        if not args.callgrind and not os.path.exists(shim):
            raise SystemExit(f"allocs: {shim} is not built (cmake --build {lab.build} "
                             "--target baton_allocs)")
        p = lab.worker("prefill", *zero, name="prefill")
        d = lab.worker("decode", *zero, name="decode")
        g = lab.worker("regular", *zero, name="regular")
        routers = {}
        topos = [("pd", ["--prefill", p.url, p.ports["bootstrap"], "--decode", d.url]),
                 ("regular", ["--worker", g.url])]
        ca = None
        if shutil.which("openssl"):
            ca, cert, key = tls_scenario.make_cert(lab.dir)
            topos.append(("regular-tls", ["--worker", g.url, "--tls-cert", cert, "--tls-key", key]))
        else:
            scenlib.skip_note("regular-tls: openssl is not installed")
        for topo, extra in topos:
            cfile = os.path.join(lab.dir, f"allocs-{topo}.bin")
            argv = [lab.bin("baton"), "--host", scenlib.HOST, "--port", "0", "--log-level",
                    "info"] + [str(x) for x in extra]
            if args.callgrind:
                cfile = os.path.join(lab.dir, f"callgrind-{topo}.out")
                argv = ["valgrind", "--tool=callgrind", "--instr-atstart=no",
                        f"--callgrind-out-file={cfile}"] + argv
                r = lab.start(f"baton-{topo}", argv)
            else:
                r = lab.start(f"baton-{topo}", argv,
                              env={"LD_PRELOAD": shim, "BATON_ALLOCS_FILE": cfile})
            routers[topo] = (r, cfile)
        for topo, (r, cfile) in routers.items():
            url = r.url
            tls_args = []
            if topo == "regular-tls":
                url, tls_args = f"https://{scenlib.HOST}:{r.port}", ["--ca", ca]
            for mode in ("json", "stream"):
                common = tls_args + ["--endpoint", "chat", "--concurrency", args.concurrency,
                                     "--input-len", args.input_len, "--output-len", 16]
                if mode == "stream":
                    common.append("--stream")
                w = lab.bench(url, *common, "--num-requests", args.warmup)
                failed += w["failed"]
                if args.callgrind:
                    out, ins = callgrind_run(r.pid, cfile, lambda: lab.bench(
                        url, *common, "--num-requests", args.requests))
                    failed += out["failed"]
                    rows.append([topo, mode, out["completed"], ins / max(out["completed"], 1)])
                    continue
                st = None
                if args.syscalls:
                    sfile = os.path.join(lab.dir, f"strace-{topo}-{mode}.txt")
                    st = strace_start(r.pid, sfile)
                c0, t0 = read_counters(cfile), scenlib.cpu_seconds(r.pid)
                out = lab.bench(url, *common, "--num-requests", args.requests)
                c1, t1 = read_counters(cfile), scenlib.cpu_seconds(r.pid)
                sc = strace_stop(st, sfile) if st else None
                failed += out["failed"]
                n = max(out["completed"], 1)
                per = {k: (c1[k] - c0[k]) / n for k in ("allocs", "malloc", "calloc", "realloc",
                                                        "free", "bytes")}
                row = [topo, mode, n, per["allocs"], per["malloc"], per["calloc"],
                       per["realloc"], per["free"], per["bytes"]]
                row.append((t1 - t0) * 1e6 / n if not st else "-")
                row.append(sc.get("total", 0) / n if sc else "-")
                rows.append(row)
                if sc:
                    top = sorted(((v, k) for k, v in sc.items() if k != "total"), reverse=True)
                    print(f"{topo} {mode} syscalls/request: " +
                          ", ".join(f"{k} {v / n:.2f}" for v, k in top[:8]))
    if args.callgrind:
        scenlib.print_table("router user-space instructions per request (callgrind)",
                            ["topology", "mode", "requests", "instructions/req"], rows,
                            note="callgrind counts the router's own instructions (all threads, "
                                 "libraries included, kernel excluded) during the measured run.")
        print(f"allocs done: {failed} failed requests")
        return 1 if failed else 0
    scenlib.print_table("router heap calls per request",
                        ["topology", "mode", "requests", "allocs/req", "malloc", "calloc",
                         "realloc", "free/req", "bytes/req", "cpu us/req", "syscalls/req"], rows,
                        note="allocs = malloc + calloc + realloc + aligned; cpu us/req under the "
                             "shim (and without strace) is indicative only; router_cpu.py is the "
                             "CPU benchmark. regular-tls includes the full TLS handshakes of the "
                             "measured run's own connections (baton-bench connects anew: "
                             "--concurrency handshakes of ~12k callocs each, mbedTLS bignums).")
    print(f"allocs done: {failed} failed requests")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
