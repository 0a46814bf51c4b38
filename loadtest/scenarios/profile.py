#!/usr/bin/env python3
"""profile.py — where the router's CPU goes: profiles of Baton under load.

Zero-cost baton-workers (one regular; one prefill + one decode for PD) behind a router in
regular or PD mode, the same requests as router_cpu.py (chat, 128 prompt words, 16 output
tokens), streaming and not, and 100k-word prompts (non-streaming, concurrency 2).

--tool perf (default): `perf record -g` samples the router process while a fixed Poisson
rate runs for --duration seconds; prints the top symbols by self time (`perf report
--no-children`), the time by binary (kernel, libc, jansson, baton, libuv) and the router's
CPU time per request from /proc over the same run (perf's sampling adds a little to it).

--tool callgrind: the router runs under valgrind's callgrind; after a warm-up the counters
are zeroed, --requests requests run (closed loop, concurrency 2) and the instructions the
router executed in user space are printed per request, by function. Deterministic: the
figure to compare two trees on a busy machine, where CPU time drifts by 10-30 %; it does not
see the kernel (syscalls are counted by strace, not here).

With --baseline-dir the same cases also run on a second build (A), alternating, and each
table shows both side by side. Needs Debian's linux-perf or valgrind and a build with
symbols (RelWithDebInfo, or Release with -g; -fno-omit-frame-pointer gives whole call graphs).
"""

import glob
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import time
import types

import scenlib

ZERO = ["--prefill-us-per-token", 0, "--decode-us-per-token", 0, "--max-queue", 100000]
CASES = ("pd-stream", "pd-json", "regular-stream", "regular-json", "pd-long", "regular-long")
# callgrind_annotate: "  1,234 ( 0.56%)  file:function [object]"
_CG_LINE = re.compile(r"^\s*([\d,]+)\s+\(\s*[\d.]+%\)\s+(\S.*?)(?:\s+\[([^\]]*)\])?$")


def perf_report(data, sort, limit):
    r = subprocess.run(["perf", "report", "-i", data, "--stdio", "--no-children", "-g", "none",
                        "--sort", sort, "--percent-limit", str(limit)],
                       stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    return [ln.split() for ln in r.stdout.splitlines()
            if ln.strip() and not ln.startswith("#") and ln.split()[0].endswith("%")]


def perf_top(data, top):
    """[(symbol, self %)] of a perf.data file, highest first; symbols outside the baton binary
    carry their binary's name."""
    out = {}
    for parts in perf_report(data, "dso,sym", 0.1):
        # "12.34%  baton  [.] symbol"
        if len(parts) < 4 or parts[2] not in ("[.]", "[k]"):
            continue
        dso, sym = parts[1], " ".join(parts[3:])
        if sym.startswith("0x"):
            # A library without debug symbols (Debian's jansson): its static functions show
            # as addresses, summed here per library.
            sym = "(static functions)"
        name = sym if dso == "baton" else f"{sym} ({'kernel' if parts[2] == '[k]' else dso})"
        out[name] = out.get(name, 0.0) + float(parts[0].rstrip("%"))
    return sorted(out.items(), key=lambda kv: -kv[1])[:top]


def perf_dsos(data):
    """[(binary, self %)] of a perf.data file: where the time went, by binary."""
    return [("kernel" if p[1] == "[kernel.kallsyms]" else p[1].split(".so")[0],
             float(p[0].rstrip("%"))) for p in perf_report(data, "dso", 0.5) if len(p) == 2]


def callgrind_functions(path):
    """(total, {function: instructions (self)}) of a callgrind dump."""
    r = subprocess.run(["callgrind_annotate", "--inclusive=no", "--auto=no", "--threshold=100",
                        path], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    total, entries, obj_of = 0, [], {}
    for line in r.stdout.splitlines():
        m = _CG_LINE.match(line)
        if m and "PROGRAM TOTALS" in line:
            total = int(m.group(1).replace(",", ""))
        if not m or "PROGRAM TOTALS" in line:
            continue
        if total and int(m.group(1).replace(",", "")) >= total * 0.99:
            continue  # a thread's entry points are listed with the thread's whole cost
        fn = m.group(2).split(":")[-1].split("'")[0]  # "'2": a recursion level of the same fn
        if fn.startswith("0x"):
            fn = "(static functions)"
        obj = os.path.basename(m.group(3)).split(".so")[0] if m.group(3) else None
        if obj and fn != "(static functions)":
            obj_of.setdefault(fn, obj)
        entries.append((fn, obj, int(m.group(1).replace(",", ""))))
    out = {}
    for fn, obj, n in entries:
        # Code inlined from another source file (a header) comes without its object: it is
        # the object the same function was found in.
        obj = obj or obj_of.get(fn, "baton")
        name = fn if obj == "baton" else f"{fn} ({obj})"
        out[name] = out.get(name, 0) + n
    return total, out


def start_router(lab, args, topo, long_prompts, tool, out_prefix):
    pool = []
    if long_prompts and lab.worker_has_option("--kv-pool-tokens"):
        pool = ["--kv-pool-tokens", 4 * (args.long_input_len + 16) + 65536]
    if topo == "pd":
        p = lab.worker("prefill", *ZERO, *pool, name="prefill")
        d = lab.worker("decode", *ZERO, *pool, name="decode")
        upstream = ["--prefill", p.url, p.ports["bootstrap"], "--decode", d.url]
    else:
        g = lab.worker("regular", *ZERO, name="regular")
        upstream = ["--worker", g.url]
    if tool == "perf":
        return lab.router(*upstream, name=f"baton-{topo}")
    argv = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out_prefix}.cg",
            lab.bin("baton"), "--host", scenlib.HOST, "--port", "0", "--log-level", "info"]
    return lab.start(f"baton-{topo}", argv + [str(x) for x in upstream])


def request_args(args, kind):
    if kind == "long":
        return ["--endpoint", "chat", "--input-len", args.long_input_len, "--output-len", 16]
    return ["--endpoint", "chat", "--input-len", 128, "--output-len", 16] + (
        ["--stream"] if kind == "stream" else [])


class PerfRecord:
    """`perf record -g` on a process, its events off until enable() returns: perf acknowledges
    on its control pipe once it is attached and sampling, so the samples cover the whole load
    however long perf takes to start on a busy machine."""

    ACK_WAIT_S = 120  # a bound on a stuck perf, not a timing expectation

    def __init__(self, pid, freq, data):
        ctl_r, self.ctl = os.pipe()
        self.ack, ack_w = os.pipe()
        self.p = subprocess.Popen(["perf", "record", "-g", "-F", str(freq), "-p", str(pid),
                                   "-o", data, "--delay=-1", "--control", f"fd:{ctl_r},{ack_w}"],
                                  pass_fds=(ctl_r, ack_w), stdout=subprocess.DEVNULL,
                                  stderr=subprocess.PIPE)
        os.close(ctl_r)
        os.close(ack_w)

    def command(self, cmd):
        os.write(self.ctl, cmd.encode() + b"\n")
        got = b""
        while b"ack\n" not in got:
            ready, _, _ = select.select([self.ack], [], [], self.ACK_WAIT_S)
            chunk = os.read(self.ack, 64) if ready else b""
            if not chunk:
                self.p.kill()
                _, err = self.p.communicate()
                raise RuntimeError(f"perf record did not acknowledge '{cmd}': "
                                   f"{err.decode(errors='replace')}")
            got += chunk

    def stop(self):
        """Stops sampling and waits for perf to write its file; returns (returncode, stderr)."""
        self.command("disable")
        self.p.send_signal(signal.SIGINT)  # perf writes its file and exits
        _, err = self.p.communicate(timeout=self.ACK_WAIT_S)
        os.close(self.ctl)
        os.close(self.ack)
        return self.p.returncode, err


def run_perf(lab, args, r, kind, out_prefix):
    req = request_args(args, kind)
    # A smoke run is a number of requests, a full run a duration: the router's work (and so
    # the samples) of a smoke does not shrink when a busy machine runs the load generator late.
    span = (["--num-requests", args.smoke_requests] if args.smoke else
            ["--duration", args.duration])
    if kind == "long":
        lab.bench(r.url, *req, "--num-requests", 1, label="warm")
        load = req + ["--concurrency", 2] + span
    else:
        load = req + ["--request-rate", args.rate] + span
    data = out_prefix + ".data"
    perf = PerfRecord(r.pid, args.freq, data)
    perf.command("enable")
    c0 = scenlib.cpu_seconds(r.pid)
    out = lab.bench(r.url, *load, label=os.path.basename(out_prefix))
    c1 = scenlib.cpu_seconds(r.pid)
    rc, err = perf.stop()
    if rc not in (0, -signal.SIGINT) or not os.path.exists(data):
        raise RuntimeError(f"perf record failed: {err.decode(errors='replace')}")
    n = max(out["completed"], 1)
    us = (c1 - c0) * 1e6 / n
    return {"completed": out["completed"], "failed": out["failed"],
            "top": perf_top(data, args.top), "file": data,
            "summary": f"{us:.1f} us router CPU/request under perf; by binary, % of samples "
                       "(us/request): " + ", ".join(f"{d} {pct:.1f}% ({pct * us / 100:.1f})"
                                                    for d, pct in perf_dsos(data))}


def run_callgrind(lab, args, r, kind, out_prefix):
    req = request_args(args, kind)
    n_req = max(4, args.requests // 20) if kind == "long" else args.requests
    lab.bench(r.url, *req, "--num-requests", 20, "--concurrency", 2, label="warm")
    subprocess.run(["callgrind_control", "-z", str(r.pid)], stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL, check=True)
    out = lab.bench(r.url, *req, "--num-requests", n_req, "--concurrency", 2,
                    label=os.path.basename(out_prefix))
    before = set(glob.glob(out_prefix + ".cg*"))
    subprocess.run(["callgrind_control", "-d", str(r.pid)], stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL, check=True)
    dump = None
    # The dump is written by the router's own thread: it is complete once its last line,
    # "totals:", is there (a bound on a stuck router, not a timing expectation).
    deadline = time.monotonic() + 120
    while dump is None and time.monotonic() < deadline:
        for path in set(glob.glob(out_prefix + ".cg*")) - before:
            with open(path, "rb") as f:
                f.seek(max(0, os.path.getsize(path) - 256))
                if re.search(rb"^totals: \d+\s*$", f.read(), re.M):
                    dump = path
        time.sleep(0.05)
    if dump is None:
        raise RuntimeError("callgrind wrote no complete dump")
    n = max(out["completed"] + out["failed"], 1)
    total, fns = callgrind_functions(dump)
    total /= n
    fns = {k: v / n for k, v in fns.items()}
    top = sorted(fns.items(), key=lambda kv: -kv[1])[:args.top]
    return {"completed": out["completed"], "failed": out["failed"], "top": top, "file": dump,
            "all": fns, "total": total,
            "summary": f"{total:,.0f} instructions/request in user space over {n} requests"}


def print_case(case, builds, per, tool, top):
    last = list(builds)[-1]
    order = [s for s, _ in per[last]["top"]]
    for n in builds:
        order += [s for s, _ in per[n]["top"] if s not in order]
    if tool == "callgrind" and len(builds) > 1:
        # The functions that changed most first: that is what an A/B is for.
        a, b = per["A"]["all"], per["B"]["all"]
        changed = sorted(set(a) | set(b), key=lambda k: -abs(b.get(k, 0) - a.get(k, 0)))
        order = changed[:top]
    rows = []
    for sym in order[:top + (top // 2 if len(builds) > 1 and tool == "perf" else 0)]:
        if tool == "perf":
            rows.append([sym] + [dict(per[n]["top"]).get(sym) for n in builds])
        else:
            vals = [per[n]["all"].get(sym, 0.0) for n in builds]
            rows.append([sym] + [f"{v:,.0f}" for v in vals]
                        + ([f"{vals[1] - vals[0]:+,.0f}"] if len(vals) == 2 else []))
    unit = "self %" if tool == "perf" else "instr/req"
    heads = ["symbol"] + [f"{n} {unit}" for n in builds] + (
        ["B-A"] if tool == "callgrind" and len(builds) > 1 else [])
    title = (f"{case}: router self time by symbol" if tool == "perf" else
             f"{case}: router instructions per request by function (callgrind, self)")
    if len(builds) > 1:
        title += " (A: --baseline-dir, B: --build-dir)" + (
            ", largest changes first" if tool == "callgrind" else "")
    scenlib.print_table(title, heads, rows, note="\n".join(
        f"{n}: {per[n]['summary']}; {per[n]['completed']} requests; {per[n]['file']}"
        for n in builds) + ("\n'-': under the cut in that build." if tool == "perf" else ""))


def main():
    ap = scenlib.arg_parser(__doc__.split("\n")[0])
    ap.add_argument("--baseline-dir", help="a second build to profile the same way (A); "
                    "--build-dir is B")
    ap.add_argument("--tool", choices=["perf", "callgrind"], default="perf")
    ap.add_argument("--cases", default=",".join(CASES),
                    help=f"comma-separated, of {','.join(CASES)} (all)")
    ap.add_argument("--rate", type=float, default=800.0,
                    help="perf: req/s of the short cases (800)")
    ap.add_argument("--duration", type=float, default=10.0, help="perf: seconds per case (10)")
    ap.add_argument("--freq", type=int, default=2999, help="perf: samples per second (2999)")
    ap.add_argument("--requests", type=int, default=500,
                    help="callgrind: requests per case (500; long cases: 1/20 of it)")
    ap.add_argument("--long-input-len", type=int, default=100000,
                    help="prompt words of the long cases (100000)")
    ap.add_argument("--top", type=int, default=15, help="symbols per table (15)")
    ap.add_argument("--out-dir", help="keep the perf.data / callgrind files here (default: the "
                    "lab's temporary directory, removed unless --keep)")
    args = ap.parse_args()
    args.smoke_requests = 300  # perf: a smoke's requests per case (see run_perf)
    if args.smoke:
        args.cases, args.rate, args.duration = "pd-stream,regular-long", 300.0, 1.0
        args.long_input_len, args.requests = 20000, 40
    cases = [c for c in args.cases.split(",") if c]
    for c in cases:
        if c not in CASES:
            sys.exit(f"profile: unknown case {c} (of {','.join(CASES)})")
    need = ["perf"] if args.tool == "perf" else ["valgrind", "callgrind_control",
                                                 "callgrind_annotate"]
    for prog in need:
        if not shutil.which(prog):
            sys.exit(f"profile: {prog} is not installed (apt-get install "
                     f"{'linux-perf' if prog == 'perf' else 'valgrind'})")
    builds = {"B": args.build_dir}
    if args.baseline_dir:
        builds = {"A": args.baseline_dir, "B": args.build_dir}
    what = ("perf record -g, self time by symbol" if args.tool == "perf"
            else "callgrind, instructions per request")
    print(f"== router profile ({what}) ==")
    print(scenlib.machine_line())
    if args.tool == "perf":
        each = f"{args.smoke_requests} requests" if args.smoke else f"{args.duration:g}s"
        print(f"short cases: chat, 128 prompt words, 16 output tokens, {args.rate:g} req/s "
              f"Poisson; long cases: {args.long_input_len} prompt words, non-streaming, "
              f"concurrency 2; {each} each, perf at {args.freq} Hz")
    else:
        print(f"short cases: chat, 128 prompt words, 16 output tokens, {args.requests} "
              f"requests; long cases: {args.long_input_len} prompt words, non-streaming, "
              f"{max(4, args.requests // 20)} requests; closed loop, concurrency 2")
    failed = 0
    for i, case in enumerate(cases):
        topo, kind = case.split("-")
        per = {}
        for name, bdir in builds.items():
            a = types.SimpleNamespace(**dict(vars(args), build_dir=bdir))
            with scenlib.Lab(a, "profile") as lab:
                out_dir = args.out_dir or lab.dir
                os.makedirs(out_dir, exist_ok=True)
                prefix = os.path.join(out_dir, f"{i:02d}-{case}-{name}")
                r = start_router(lab, args, topo, kind == "long", args.tool, prefix)
                run = run_perf if args.tool == "perf" else run_callgrind
                per[name] = run(lab, args, r, kind, prefix)
                failed += per[name]["failed"]
        print_case(case, builds, per, args.tool, args.top)
    print(f"\nprofile done: {failed} failed requests; {scenlib.load_now()}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
