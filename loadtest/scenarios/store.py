#!/usr/bin/env python3
"""store.py — scenario: baton-store (the external KV cache) against this machine's own limits.

For each transport (tcp, shm) and node count (1, 2, 4), one master and N nodes on loopback, then
`baton-store bench` puts and gets batches of objects of each size (4 KiB .. 64 MiB; every byte
compared) and reports put and get GB/s. Ceilings measured in the same run: memcpy (the bench's
own line) and iperf3 on loopback with one stream and with four (libbaton's tcp lanes per peer),
when iperf3 is installed. Objects above 4 MiB are striped over the nodes (one slice per 4 MiB),
so the 16 and 64 MiB rows across 1/2/4 nodes are the striping scaling.

Then small-object latency (bench --latency: 4 KiB gets through the client's location cache, read
inline over the node's control port and through the engines alternately in one run, gets that ask
the master each time, exists alone, beside loopback TCP's round trip in one thread and across
two), and the master's metadata at scale: exists keys/s through the control protocol with
--exists-objects objects stored (and the master's resident memory per object), and the object
table itself in one process with --meta-objects objects (heap per object, exists/s on one core).
"""

import json
import os
import subprocess
import sys
import time

import scenlib
import transfer  # iperf3 helpers

MIB = 1 << 20
SIZES = "4K,64K,1M,4M,16M,64M"
BATCH_BYTES = 256 * MIB  # a batch holds at most this much (at most 128 objects)


def parse_size(s):
    mul = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(s[-1].upper(), 1)
    return int(s[:-1] if mul > 1 else s) * mul


def label(n):
    for unit, div in (("M", MIB), ("K", 1 << 10)):
        if n >= div and n % div == 0:
            return f"{n // div}{unit}"
    return str(n)


class Store:
    """A master and n nodes of one transport."""

    def __init__(self, lab, name, n, transport, segment, master_args=()):
        self.lab = lab
        self.secret = os.path.join(lab.dir, "secret")
        if not os.path.exists(self.secret):
            with open(self.secret, "w") as f:
                f.write("store-scenario-secret-0123456789\n")
            os.chmod(self.secret, 0o600)
        exe = lab.bin("baton-store")
        self.master = lab.start(f"{name}-master", [exe, "master", "--host", scenlib.HOST,
                                                   "--port", "0", "--http-port", "0",
                                                   "--kv-secret-file", self.secret,
                                                   *master_args],
                                keys=("master",))
        self.addr = f"{scenlib.HOST}:{self.master.ports['master']}"
        self.nodes = [lab.start(f"{name}-node{i}", [exe, "node", "--master", self.addr,
                                                    "--segment-bytes", segment, "--id",
                                                    f"{name}-n{i}", "--transport", transport,
                                                    "--kv-secret-file", self.secret],
                                keys=("node",)) for i in range(n)]
        deadline = time.monotonic() + 30
        while self.stat().get("nodes") != n:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{n} nodes did not register:\n{self.master.tail()}")
            time.sleep(0.1)

    def stat(self):
        r = subprocess.run([self.lab.bin("baton-store"), "stat", "--master", self.addr,
                            "--kv-secret-file", self.secret], capture_output=True, text=True,
                           timeout=30)
        return json.loads(r.stdout) if r.returncode == 0 else {}

    def bench(self, *args, timeout=600):
        argv = [self.lab.bin("baton-store"), "bench", "--master", self.addr, "--kv-secret-file",
                self.secret, *[str(a) for a in args]]
        r = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
        lines = [json.loads(x) for x in r.stdout.splitlines() if x.startswith("{")]
        if r.returncode != 0 or not lines:
            raise RuntimeError(f"bench failed ({r.returncode}): {' '.join(argv)}\n"
                               f"{r.stdout[-800:]}{r.stderr[-800:]}")
        return lines, " ".join(["baton-store", "bench", "--master", "H:P"] +
                               [str(a) for a in args])

    def stop(self):
        for p in [*self.nodes, self.master]:
            p.stop()


def iperf3_ceilings(lab, args):
    exe = transfer.find_iperf3()
    if exe is None:
        scenlib.skip_note("iperf3 is not installed (scripts/install-deps.sh --test installs it): "
                          "no tcp ceiling")
        return {}
    port = scenlib.free_port()
    srv = lab.start("iperf3-server", [exe, "-s", "-p", str(port)], keys=())
    out = {}
    try:
        secs = 2 if args.smoke else 5
        for streams in (1, 4):
            out[streams] = transfer.iperf3_run(lab, exe, port, secs, streams)
    finally:
        srv.stop()
    return out


def throughput(lab, args, figures):
    sizes = [parse_size(s) for s in args.sizes.split(",")]
    node_counts = [int(x) for x in args.nodes.split(",")]
    rows, corrupted = [], 0
    for tp in args.transports.split(","):
        for n in node_counts:
            # short leases: the objects of the sizes before are evictable when a put needs room
            # the nodes share --segment-total (each prefaults its part at start)
            seg = f"{parse_size(args.segment_total) // n // MIB}M"
            st = Store(lab, f"{tp}{n}", n, tp, seg, ("--lease-ttl-ms", "2000"))
            try:
                for size in sizes:
                    batch = max(1, min(args.batch, BATCH_BYTES // size))
                    lines, cmd = st.bench("--size", label(size), "--batch", batch, "--rounds",
                                          args.rounds, "--transport", tp)
                    mc = next(x["memcpy_GBps"] for x in lines if "memcpy_GBps" in x)
                    last = [x for x in lines if "round" in x][-1]
                    summ = lines[-1]
                    corrupted += summ.get("corrupted", 0)
                    fig = {"transport": tp, "nodes": n, "size": size, "batch": batch,
                           "put_GBps": last["put_GBps"], "get_GBps": last["get_GBps"],
                           "memcpy_GBps": mc, "corrupted": summ.get("corrupted", 0),
                           "failed": summ.get("put_failed", 0) + summ.get("get_failed", 0),
                           "command": cmd + f" (nodes: --transport {tp})"}
                    figures["throughput"].append(fig)
                    rows.append([tp, n, label(size), batch, fig["put_GBps"], fig["get_GBps"], mc,
                                 fig["failed"], fig["corrupted"]])
            finally:
                st.stop()
    return rows, corrupted


def latency(lab, args, figures):
    rows = []
    for tp in args.transports.split(","):
        st = Store(lab, f"lat-{tp}", 3, tp, "256M")
        try:
            lines, cmd = st.bench("--size", "4K", "--latency", args.latency_gets, "--transport", tp)
        finally:
            st.stop()
        x = lines[-1]
        x["transport"], x["command"] = tp, cmd
        figures["latency"].append(x)
        rows.append([tp, x["get_p50_us"], x["get_p99_us"], x["get_engine_p50_us"],
                     x["get_engine_p99_us"], x["get_via_master_p50_us"],
                     x["get_via_master_p99_us"], x["exists_p50_us"], x["tcp_rtt_p50_us"],
                     x["tcp_rtt_2threads_p50_us"], f"{x['p50_over_rtt']:.1f}x",
                     f"{x['engine_p50_over_rtt']:.1f}x"])
    return rows


def metadata(lab, args, figures):
    st = Store(lab, "meta", 1, "tcp", "256M")  # 1 M objects of 64 bytes: 64 MiB
    try:
        rss0 = scenlib.rss_kib(st.master.pid)
        lines, cmd = st.bench("--size", "64", "--batch", 1024, "--exists", args.exists_objects,
                              "--duration-s", 1 if args.smoke else 3, timeout=1800)
        rss1 = scenlib.rss_kib(st.master.pid)
    finally:
        st.stop()
    x = lines[-1]
    x["command"] = cmd
    x["master_rss_bytes_per_object"] = ((rss1 - rss0) * 1024 / args.exists_objects
                                        if rss0 is not None and rss1 is not None else None)
    figures["exists"] = x
    r = subprocess.run([lab.bin("baton-store"), "bench", "--meta-objects",
                        str(args.meta_objects)], capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        raise RuntimeError(f"bench --meta-objects failed: {r.stdout}{r.stderr}")
    m = json.loads(r.stdout.splitlines()[-1])
    m["command"] = f"baton-store bench --meta-objects {args.meta_objects}"
    figures["meta"] = m
    return x, m


def main():
    p = scenlib.arg_parser(__doc__.split("\n")[0])
    p.add_argument("--transports", default="tcp,shm")
    p.add_argument("--nodes", default="1,2,4", help="node counts (default 1,2,4)")
    p.add_argument("--sizes", default=SIZES, help=f"object sizes (default {SIZES})")
    p.add_argument("--batch", type=int, default=128, help="objects per batch (at most; a batch "
                   "holds at most 256 MiB)")
    p.add_argument("--rounds", type=int, default=3, help="put+get rounds per size")
    p.add_argument("--segment-total", default="4G", help="segment bytes of all nodes together")
    p.add_argument("--latency-gets", type=int, default=2000)
    p.add_argument("--exists-objects", type=int, default=1000000)
    p.add_argument("--meta-objects", type=int, default=1000000)
    args = p.parse_args()
    if args.smoke:
        args.nodes, args.sizes, args.batch, args.rounds = "1,2", "64K,1M", 16, 1
        args.segment_total, args.latency_gets = "256M", 200
        args.exists_objects, args.meta_objects = 5000, 20000
    print("# baton-store: throughput, latency and metadata against this machine's limits")
    print(scenlib.machine_line())
    figures = {"throughput": [], "latency": [], "iperf3": {}}
    with scenlib.Lab(args, "store") as lab:
        ip = iperf3_ceilings(lab, args)
        figures["iperf3"] = {str(k): v for k, v in ip.items()}
        rows, corrupted = throughput(lab, args, figures)
        ip1 = ip.get(1, {}).get("gbps")
        ip4 = ip.get(4, {}).get("gbps")
        for r in rows:  # ratios against the ceiling of the row's transport
            base = (ip4 if r[0] == "tcp" else r[6])
            r.insert(7, scenlib.ratio(r[5], base))
        scenlib.print_table(
            "put / get throughput (GB/s) by transport, nodes and object size",
            ["transport", "nodes", "size", "batch", "put GB/s", "get GB/s", "memcpy GB/s",
             "get/ceiling", "failed", "corrupted"], rows,
            note=f"ceilings: memcpy (each run's own line); iperf3 loopback "
                 f"{scenlib.fmt(ip1)} GB/s (1 stream), {scenlib.fmt(ip4)} GB/s (4 streams). "
                 "get/ceiling: tcp against iperf3 with 4 streams, shm against memcpy. GB/s: the "
                 "last round's cumulative figure (bytes over the time of the batch calls). Objects "
                 "above 4 MiB are striped over the nodes. Every byte read back is compared.")
        lrows = latency(lab, args, figures)
        scenlib.print_table(
            "4 KiB get latency (us), 3 nodes",
            ["transport", "get p50 (inline)", "get p99 (inline)", "engine p50", "engine p99",
             "via master p50", "via master p99", "exists p50", "tcp rtt (1 thread)",
             "tcp rtt (2 threads)", "p50 / rtt", "engine p50 / rtt"], lrows,
            note="get: the object located within its lease (the client's location cache: no "
                 "master request), read inline over the node's control port; engine: the same "
                 "gets by a client with inline reads off (offered to the node's libbaton engine),"
                 " alternating with them; via master: a client without the cache (lease + locate,"
                 " then the data, inline); rtt: one-byte ping-pong on loopback TCP within one "
                 "thread (no wake-up) and across two threads (one wake-up each way). Goal: get "
                 "p50 <= 3x rtt.")
        ex, meta = metadata(lab, args, figures)
        scenlib.print_table(
            "master metadata",
            ["measure", "objects", "figure"],
            [["exists keys/s, control protocol, locating (one client, batches of 1024)",
              ex["objects"], ex["exists_locating_keys_per_s"]],
             ["exists keys/s, control protocol, plain", ex["objects"],
              ex["exists_plain_keys_per_s"]],
             ["master resident bytes per object (RSS growth / objects)", ex["objects"],
              ex["master_rss_bytes_per_object"]],
             ["exists/s, object table on one core (72-byte keys)", meta["meta_objects"],
              meta["exists_per_s"]],
             ["heap bytes per object, object table", meta["meta_objects"],
              meta["heap_bytes_per_object"]]],
            note=f"protocol: {ex['command']}; table: {meta['command']}. Goal: >= 500k exists "
                 "keys/s on one core at 1 M objects.")
    print(f"\nobjects corrupted: {corrupted}")
    print(scenlib.load_now())
    scenlib.write_json(args.json, figures)
    print("store scenario done")
    return 1 if corrupted else 0


if __name__ == "__main__":
    sys.exit(main())
