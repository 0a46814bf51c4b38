#!/usr/bin/env python3
"""store_failover.py — baton-store's masters through etcd: how long a failover takes and what
the operation log costs.

A 3-member etcd cluster (Debian etcd-server), two masters on one etcd:// registry and three nodes
run on loopback. Measured:
  1. kill -9 of the leading master, K times: seconds from the kill to the first `baton-store put`
     accepted through the registry (a fresh CLI process per try, as an operator's script would),
     the new leader's own restore time (baton_store_failover_seconds) and the objects it restored;
     after each kill every object committed so far is read back and byte-compared, and the killed
     master is started again as the standby of the next round;
  2. SIGSTOP of the leader (a leader that does not answer, as when partitioned): the standby can
     only wait for the lease's TTL; seconds to the first put, then SIGCONT: the old leader finds
     its lease gone and exits;
  3. the operation log's cost: `baton-store bench` puts and gets with and without --registry
     (one master, one node), 4 KiB and 1 MiB objects: GB/s and the log's transactions;
  4. a takeover at scale: N objects (4 KiB, put by `baton-store bench` through the registry),
     the leader killed, the new leader's restore time (baton_store_failover_seconds).
"""

import json
import os
import random
import signal
import subprocess
import sys
import time
import urllib.request

import scenlib

sys.path.insert(0, os.path.join(scenlib.REPO, "tests", "integration"))
from etcd_cluster import EtcdCluster, etcd_binary  # noqa: E402

HOST = scenlib.HOST


def metric(port, name):
    with urllib.request.urlopen(f"http://{HOST}:{port}/metrics", timeout=5) as r:
        for line in r.read().decode().splitlines():
            if line.startswith(f"baton_store_{name} "):
                return float(line.split()[1])
    return None


def is_leader(port):
    try:
        with urllib.request.urlopen(f"http://{HOST}:{port}/health", timeout=2) as r:
            return json.loads(r.read())["leader"]
    except OSError:
        return False


class Ha:
    def __init__(self, lab, registry):
        self.lab = lab
        self.registry = registry
        self.secret = os.path.join(lab.dir, "secret")
        with open(self.secret, "w") as f:
            f.write("store-failover-secret-%08x\n" % random.getrandbits(32))
        os.chmod(self.secret, 0o600)
        self.n = 0
        self.masters = [self.master() for _ in range(2)]
        self.nodes = [lab.start(f"node{i}", [lab.bin("baton-store"), "node", "--registry",
                                             registry, "--segment-bytes", "256M", "--id",
                                             f"n{i}", "--host", HOST, "--kv-secret-file",
                                             self.secret], keys=("node",)) for i in range(3)]

    def master(self):
        self.n += 1
        return self.lab.start(f"master{self.n}", [
            self.lab.bin("baton-store"), "master", "--host", HOST, "--port", "0", "--http-port",
            "0", "--registry", self.registry, "--kv-secret-file", self.secret],
            keys=("master", "http"))

    def leader(self, timeout=30):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            lead = [m for m in self.masters if m.p.poll() is None and is_leader(m.port)]
            if len(lead) == 1:
                return lead[0]
            time.sleep(0.05)
        raise RuntimeError("no single leader")

    def cmd(self, *args):
        p = subprocess.run([self.lab.bin("baton-store"), *args, "--registry", self.registry,
                            "--kv-secret-file", self.secret, "--timeout-ms", "1000"],
                           capture_output=True, timeout=60)
        return p.returncode

    def put(self, key, data):
        path = os.path.join(self.lab.dir, "in")
        with open(path, "wb") as f:
            f.write(data)
        return self.cmd("put", key, path)

    def get(self, key):
        path = os.path.join(self.lab.dir, "out")
        if self.cmd("get", key, path) != 0:
            return None
        with open(path, "rb") as f:
            return f.read()

    def first_put_after(self, t0, key, timeout=60):
        data = os.urandom(4096)
        while time.monotonic() - t0 < timeout:
            if self.put(key, data) == 0:
                return time.monotonic() - t0
            time.sleep(0.02)
        raise RuntimeError("no put accepted after the failover")


def failovers(lab, args, rows_kill, rows_stop):
    with EtcdCluster(3, name="store-failover-etcd") as etcd:
        ha = Ha(lab, etcd.url("/storefailover"))
        ha.leader()
        objs = {}
        for k in range(args.kills):
            for i in range(args.objects):
                key = f"r{k}-o{i}"
                objs[key] = os.urandom(random.choice([4096, 65536, 300000]))
                if ha.put(key, objs[key]) != 0:
                    raise RuntimeError(f"put {key} failed")
            old = ha.leader()
            os.kill(old.pid, signal.SIGKILL)
            t0 = time.monotonic()
            took = ha.first_put_after(t0, f"after-{k}")
            new = ha.leader()
            bad = sum(1 for key, v in objs.items() if ha.get(key) != v)
            rows_kill.append([k + 1, took, metric(new.port, "failover_seconds"),
                              int(metric(new.port, "restored_objects")), len(objs), bad])
            if bad:
                raise RuntimeError(f"{bad} objects not read back after failover {k + 1}")
            old.p.wait(timeout=5)
            ha.masters = [m for m in ha.masters if m is not old] + [ha.master()]
        if args.stop:
            old = ha.leader()
            os.kill(old.pid, signal.SIGSTOP)
            t0 = time.monotonic()
            took = ha.first_put_after(t0, "after-stop")
            os.kill(old.pid, signal.SIGCONT)
            try:
                old.p.wait(timeout=10)
                exited = f"exited ({old.p.returncode})"
            except subprocess.TimeoutExpired:
                exited = "STILL RUNNING"
            bad = sum(1 for key, v in objs.items() if ha.get(key) != v)
            rows_stop.append(["SIGSTOP", took, exited, bad])
        for p in ha.nodes + ha.masters:
            p.stop()


def oplog_cost(lab, args, rows):
    with EtcdCluster(1, name="store-oplog-etcd") as etcd:
        secret = os.path.join(lab.dir, "secret1")
        with open(secret, "w") as f:
            f.write("store-oplog-secret-0123456789\n")
        for size, batch in args.sizes:
            for reg in (None, etcd.url(f"/oplog{size}")):
                m = lab.start(f"m-{size}-{bool(reg)}", [
                    lab.bin("baton-store"), "master", "--host", HOST, "--port", "0",
                    "--http-port", "0", "--kv-secret-file", secret] +
                    (["--registry", reg] if reg else []), keys=("master", "http"))
                deadline = time.monotonic() + 20
                while not is_leader(m.port) and time.monotonic() < deadline:
                    time.sleep(0.05)
                addr = f"{HOST}:{m.ports['master']}"
                n = lab.start(f"n-{size}-{bool(reg)}", [
                    lab.bin("baton-store"), "node", "--master", addr, "--segment-bytes", "1G",
                    "--host", HOST, "--kv-secret-file", secret], keys=("node",))
                time.sleep(1.0)
                r = subprocess.run([lab.bin("baton-store"), "bench", "--master", addr,
                                    "--kv-secret-file", secret, "--size", size, "--batch",
                                    str(batch), "--rounds", str(args.rounds)],
                                   capture_output=True, text=True, timeout=300)
                last = [json.loads(x) for x in r.stdout.splitlines() if '"round"' in x][-1]
                txns = metric(m.port, "oplog_txns_total")
                secs = metric(m.port, "oplog_txn_seconds_total")
                rows.append([size, batch, "etcd log" if reg else "none", last["put_GBps"],
                             last["get_GBps"], int(txns),
                             secs / txns * 1000 if txns else None, last["corrupted"]])
                n.stop()
                m.stop()


def restore_scale(lab, args, rows):
    with EtcdCluster(1, name="store-restore-etcd") as etcd:
        ha = Ha(lab, etcd.url("/storerestore"))
        ha.leader()
        for n in args.restore:
            rounds = max(1, n // 1024)
            r = subprocess.run([lab.bin("baton-store"), "bench", "--master", ha.registry,
                                "--kv-secret-file", ha.secret, "--size", "4K", "--batch",
                                "1024", "--rounds", str(rounds)],
                               capture_output=True, text=True, timeout=900)
            summary = json.loads(r.stdout.splitlines()[-1])
            old = ha.leader()
            objects = int(metric(old.port, "objects"))
            os.kill(old.pid, signal.SIGKILL)
            t0 = time.monotonic()
            took = ha.first_put_after(t0, f"after-restore-{n}")
            new = ha.leader()
            rows.append([objects, int(metric(new.port, "restored_objects")),
                         metric(new.port, "failover_seconds"), took, summary["corrupted"]])
            old.p.wait(timeout=5)
            ha.masters = [m for m in ha.masters if m is not old] + [ha.master()]
        for p in ha.nodes + ha.masters:
            p.stop()


def main():
    p = scenlib.arg_parser(__doc__.split("\n")[0])
    p.add_argument("--kills", type=int, default=5, help="leader kills (5)")
    p.add_argument("--objects", type=int, default=20, help="objects put before each kill (20)")
    p.add_argument("--rounds", type=int, default=5, help="bench rounds per cost run (5)")
    p.add_argument("--restore", type=lambda x: [int(v) for v in x.split(",")],
                   default=[20480, 61440], help="objects held at each takeover at scale "
                   "(20480,61440; cumulative)")
    args = p.parse_args()
    args.stop = not args.smoke
    args.sizes = [("4K", 128), ("1M", 64)]
    if args.smoke:
        args.kills, args.objects, args.rounds = 1, 4, 2
        args.sizes = [("4K", 32)]
        args.restore = []
    if etcd_binary() is None:
        scenlib.skip_note("etcd is not installed")
        return 0
    print(scenlib.machine_line())
    rows_kill, rows_stop, rows_cost, rows_scale = [], [], [], []
    with scenlib.Lab(args, "store-failover") as lab:
        failovers(lab, args, rows_kill, rows_stop)
        oplog_cost(lab, args, rows_cost)
        if args.restore:
            restore_scale(lab, args, rows_scale)
    scenlib.print_table(
        "kill -9 of the leading master", ["round", "first put after (s)", "restore (s)",
                                          "restored objects", "objects", "not read back"],
        rows_kill, "first put: a new `baton-store put` process per try, every 20 ms, through the "
        "etcd:// registry; restore: the new leader's baton_store_failover_seconds")
    if rows_stop:
        scenlib.print_table("SIGSTOP of the leading master (no answer: the lease TTL decides)",
                            ["fault", "first put after (s)", "old leader on SIGCONT",
                             "not read back"], rows_stop)
    scenlib.print_table(
        "the operation log's cost (one master, one node, tcp)",
        ["size", "batch", "log", "put GB/s", "get GB/s", "log txns", "ms per txn", "corrupted"],
        rows_cost, scenlib.load_now())
    if rows_scale:
        scenlib.print_table("takeover at scale (kill -9 of the leader holding N objects)",
                            ["objects", "restored", "restore (s)", "first put after (s)",
                             "corrupted"], rows_scale)
    scenlib.write_json(args.json, {"kill": rows_kill, "stop": rows_stop, "cost": rows_cost,
                                   "scale": rows_scale})
    return 0


if __name__ == "__main__":
    sys.exit(main())
