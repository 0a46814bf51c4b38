"""test_store.py — baton-store with real processes on loopback: a master and three nodes sharing a
secret; puts and gets of many objects through the `baton-store` commands with every byte compared;
a large object striped over the three nodes; replicas=2 with a node killed -9 (every object still
readable, at once and after the master noticed); capacity pressure with leases held (refused) and
after they lapse (evicted); hostile bytes on every port (master control, master HTTP, node control,
node data) and a client with the wrong secret, after which everything still serves (SIGPIPE, what a
peer gone mid-write raises, included); exit codes."""

import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import harness  # noqa: E402
from harness import HOST, TestRunner  # noqa: E402

MIB = 1 << 20


class Store:
    """A master and its nodes in one harness.Cluster, and the client commands against them."""

    def __init__(self, cluster, nodes=3, segment="64M", master_args=(), secret=None,
                 node_args=()):
        self.c = cluster
        self.dir = tempfile.mkdtemp(prefix="store-data-", dir=cluster.logdir)
        self.secret = os.path.join(self.dir, "secret")
        with open(self.secret, "w") as f:
            f.write(secret or "store-test-secret-%08x\n" % random.getrandbits(32))
        os.chmod(self.secret, 0o600)
        self.master = cluster.start(
            "master", [harness.binary("baton-store"), "master", "--host", HOST, "--port", "0",
                       "--http-port", "0", "--kv-secret-file", self.secret,
                       "--node-timeout-ms", "1500", *master_args], wait=("master", "http"))
        self.addr = f"{HOST}:{self.master.wait_port('master')}"
        self.http = self.master.wait_port("http")
        self.node_args = node_args
        self.nodes = [self.node(f"n{i}", segment) for i in range(nodes)]
        harness.wait_until(lambda: self.stat().get("nodes") == nodes, timeout=20,
                           what=f"{nodes} nodes registered")

    def node(self, name, segment):
        return self.c.start(name, [harness.binary("baton-store"), "node", "--master", self.addr,
                                   "--segment-bytes", segment, "--id", name, "--host", HOST,
                                   "--kv-secret-file", self.secret, *self.node_args],
                            wait=("node", "bootstrap"))

    def cmd(self, *args, secret=None):
        p = subprocess.run([harness.binary("baton-store"), *args, "--master", self.addr,
                            "--kv-secret-file", secret or self.secret], capture_output=True,
                           text=True, timeout=60)
        return p.returncode, p.stdout, p.stderr

    def put(self, key, data, *extra):
        path = os.path.join(self.dir, "in-" + key)
        with open(path, "wb") as f:
            f.write(data)
        rc, out, err = self.cmd("put", key, path, *extra)
        os.unlink(path)
        return rc, out + err

    def get(self, key):
        """(rc, bytes or None)."""
        path = os.path.join(self.dir, "out-" + key)
        rc, out, err = self.cmd("get", key, path)
        data = None
        if rc == 0:
            with open(path, "rb") as f:
                data = f.read()
            os.unlink(path)
        return rc, data, err

    def stat(self):
        rc, out, err = self.cmd("stat")
        assert rc == 0, f"stat failed: {err}"
        return json.loads(out)

    def metric(self, name):
        body = harness.get(self.http, "/metrics").body.decode()
        for line in body.splitlines():
            if line.startswith(f"baton_store_{name} "):
                return int(line.split()[1])
        raise AssertionError(f"no metric {name}")


def test_put_get_many():
    with harness.Cluster("store-many") as c:
        st = Store(c)
        rnd = random.Random(7)
        objs = {}
        for i in range(40):
            size = rnd.choice([1, 63, 64, 65, 4096, 70000, 300000])
            objs[f"obj-{i}"] = rnd.randbytes(size)
        for k, v in objs.items():
            rc, out = st.put(k, v)
            assert rc == 0, f"put {k}: {out}"
        for k, v in objs.items():
            rc, data, err = st.get(k)
            assert rc == 0, f"get {k}: {err}"
            assert data == v, f"{k}: the bytes read back differ"
        s = st.stat()
        assert s["objects"] == 40 and s["used"] >= sum(len(v) for v in objs.values())
        # immutable: a second put of a key is refused, the first bytes stay
        rc, out = st.put("obj-0", b"other bytes")
        assert rc == 2 and "exists" in out
        assert st.get("obj-0")[1] == objs["obj-0"]
        # exists: one line per key, then the prefix; exit 1 when one is missing
        rc, out, _ = st.cmd("exists", "obj-1", "obj-2", "missing", "obj-3")
        assert rc == 1
        assert out.splitlines() == ["obj-1 1", "obj-2 1", "missing 0", "obj-3 1", "prefix 2"]
        # the HTTP query grants no lease, answers per key
        q = harness.get(st.http, "/batch_query_keys?keys=obj-1,missing")
        assert q.status == 200
        ans = json.loads(q.body)
        assert ans["obj-1"] == {"exists": True, "size": len(objs["obj-1"]), "replicas": 1}
        assert ans["missing"]["exists"] is False
        assert st.metric("state_refused_total") == 0


def test_striping():
    with harness.Cluster("store-stripe") as c:
        st = Store(c)
        data = random.Random(3).randbytes(12 * MIB + 12345)
        rc, out = st.put("big", data)
        assert rc == 0, out
        used = [n["used"] for n in st.stat()["node_list"]]
        # 4 MiB stripes: every node holds a slice of the one replica
        assert len(used) == 3 and all(u >= 4 * MIB for u in used), used
        rc, got, err = st.get("big")
        assert rc == 0 and got == data, err


def test_replicas_node_killed():
    with harness.Cluster("store-kill") as c:
        st = Store(c)
        rnd = random.Random(11)
        objs = {f"r{i}": rnd.randbytes(rnd.choice([100, 5000, 200000])) for i in range(24)}
        objs["big2"] = rnd.randbytes(9 * MIB)
        for k, v in objs.items():
            rc, out = st.put(k, v, "--replicas", "2")
            assert rc == 0 and "replicas 2" in out, out
        st.nodes[1].kill()
        # at once (the master does not know yet: reads fail over to the other replica) ...
        for k, v in objs.items():
            rc, got, err = st.get(k)
            assert rc == 0 and got == v, f"{k} right after the kill: rc={rc} {err}"
        # ... and once the master noticed (node timeout 1.5 s + a tick)
        harness.wait_until(lambda: st.stat()["nodes"] == 2, timeout=15, what="node lost")
        assert st.metric("nodes_lost_total") == 1
        for k, v in objs.items():
            rc, got, err = st.get(k)
            assert rc == 0 and got == v, f"{k} after the loss: {err}"
        # new puts go to the two that are left
        rc, out = st.put("after", b"x" * 1000, "--replicas", "2")
        assert rc == 0 and "replicas 2" in out, out


def test_capacity_pressure():
    with harness.Cluster("store-pressure") as c:
        # leases of 1 minute: everything read stays pinned by its lease; the watermark at 100 %
        # so that only a put finding no space evicts (the ten objects fill 98 %)
        st = Store(c, nodes=1, segment="1M",
                   master_args=("--lease-ttl-ms", "60000", "--eviction-high-watermark", "1"))
        blob = random.Random(5).randbytes(100 * 1024)
        for i in range(10):
            rc, out = st.put(f"p{i}", blob)
            assert rc == 0, out
        rc, out, _ = st.cmd("exists", *[f"p{i}" for i in range(10)])  # leases all ten
        assert rc == 0, out
        rc, out = st.put("more", blob)
        assert rc == 2 and "no space" in out, out
        assert st.metric("evictions_total") == 0
        for i in range(10):
            assert st.get(f"p{i}")[1] == blob
    with harness.Cluster("store-pressure2") as c:
        # leases of 300 ms: once they lapse, a put that finds no space evicts LRU objects
        st = Store(c, nodes=1, segment="1M", master_args=("--lease-ttl-ms", "300"))
        blobs = {f"q{i}": random.Random(i).randbytes(100 * 1024) for i in range(10)}
        for k, v in blobs.items():
            assert st.put(k, v)[0] == 0
        time.sleep(0.5)
        for i in range(5):
            rc, out = st.put(f"new{i}", blobs["q0"])
            assert rc == 0, out
        assert st.metric("evictions_total") >= 1
        for k, v in blobs.items():
            rc, got, _ = st.get(k)
            assert rc in (0, 1) and (rc == 1 or got == v)  # evicted, or intact


def test_namespace_quota():
    """One namespace over its quota evicts its own oldest objects, never another's."""
    with harness.Cluster("store-quota") as c:
        st = Store(c, nodes=1, segment="8M",
                   master_args=("--namespace-quota", "modelA=300K", "--lease-ttl-ms", "100"))
        blob = random.Random(9).randbytes(100 * 1024)
        assert st.put("b0", blob, "--namespace", "modelB")[0] == 0
        for i in range(3):
            assert st.put(f"a{i}", blob, "--namespace", "modelA")[0] == 0
        time.sleep(0.3)  # no lease left
        rc, out = st.put("a3", blob, "--namespace", "modelA")
        assert rc == 0, out
        gone = [k for k in ("a0", "a1", "a2")
                if st.cmd("exists", k, "--namespace", "modelA")[0] == 1]
        assert gone == ["a0"], gone
        assert st.cmd("exists", "b0", "--namespace", "modelB")[0] == 0
        # one object larger than the quota: refused
        rc, out = st.put("huge", blob * 4, "--namespace", "modelA")
        assert rc == 2 and "quota" in out, out
        assert st.metric("evictions_total") == 1


def hostile(port, payload):
    try:
        with socket.create_connection((HOST, port), timeout=5) as s:
            s.sendall(payload)
            s.settimeout(3)
            try:
                while s.recv(65536):
                    pass
            except (socket.timeout, ConnectionResetError):
                pass
    except OSError:
        pass


def test_hostile_bytes():
    with harness.Cluster("store-hostile") as c:
        st = Store(c, nodes=1)
        node = st.nodes[0]
        rnd = random.Random(13)
        ports = [st.master.wait_port("master"), st.http, node.wait_port("node"),
                 node.wait_port("bootstrap")]
        frames = [b"", b"\x00" * 64, b"GET / HTTP/1.1\r\n\r\n", rnd.randbytes(5000),
                  b"BSTR\x01\x0a\x00\x00" + b"\x01\x00\x00\x00" + b"\xff\xff\xff\x7f",
                  b"BSTR\x01\x0a\x00\x00" + b"\x01\x00\x00\x00" + b"\x10\x00\x00\x00" + b"\x00" * 16]
        for port in ports:
            for f in frames:
                hostile(port, f)
        # a client with another secret
        other = os.path.join(st.dir, "other")
        with open(other, "w") as f:
            f.write("a-different-secret-0123456789\n")
        os.chmod(other, 0o600)
        rc, out, err = st.cmd("stat", secret=other)
        assert rc == 2, out
        rc, out, err = st.cmd("put", "k", other, secret=other)
        assert rc == 2
        assert st.metric("ctrl_refused_total") >= 3
        # a peer gone mid-write raises SIGPIPE in the writer: it must cost the connection only
        for p in [st.master] + st.nodes:
            p.signal(signal.SIGPIPE)
        time.sleep(0.2)
        # everything still serves
        assert st.master.alive() and node.alive() and all(n.alive() for n in st.nodes)
        rc, out = st.put("after", b"still here")
        assert rc == 0, out
        assert st.get("after")[1] == b"still here"
        h = harness.get(st.http, "/batch_query_keys?keys=%00")
        assert h.status == 400
        assert harness.get(st.http, "/nope").status == 404


def test_exit_codes():
    with harness.Cluster("store-codes") as c:
        st = Store(c, nodes=1)
        assert st.get("never")[0] == 1
        assert st.cmd("rm", "never")[0] == 1
        assert st.put("k", b"v")[0] == 0
        assert st.cmd("rm", "k")[0] == 0  # no lease held: removed
        assert st.get("k")[0] == 1
        rc, _, err = st.cmd("get")  # missing arguments
        assert rc == 2
        p = subprocess.run([harness.binary("baton-store"), "stat", "--master", "127.0.0.1:1"],
                           capture_output=True, text=True, timeout=60)
        assert p.returncode == 2
        p = subprocess.run([harness.binary("baton-store"), "master", "--port", "0"],
                           capture_output=True, text=True, timeout=60)
        assert p.returncode == 2  # --http-port missing


def bench(st, *args):
    """A long-lived client: baton-store bench paced at about 20 MB/s (so that its leased working
    set stays far below the store's capacity), its output in a file."""
    out = tempfile.TemporaryFile(mode="w+")
    p = subprocess.Popen([harness.binary("baton-store"), "bench", "--master", st.addr,
                          "--kv-secret-file", st.secret, "--size", "64K", "--batch", "8",
                          "--interval-ms", "20", *args], stdout=out, text=True)
    return p, out


def bench_lines(p):
    proc, out = p
    proc.wait(timeout=120)
    out.seek(0)
    return [json.loads(line) for line in out.read().splitlines() if line.startswith("{")]


def test_master_stopped_then_back():
    """A long-lived client (bench) through a master stopped for 5 s: calls fail meanwhile, the
    same client works again afterwards without a restart, and no byte comes back wrong."""
    with harness.Cluster("store-sigstop") as c:
        # short leases: the bench's working set is larger than the store, leased objects stay
        st = Store(c, master_args=("--lease-ttl-ms", "1000"))
        p = bench(st, "--duration-s", "12")
        time.sleep(2)
        st.master.signal(signal.SIGSTOP)
        time.sleep(5)
        st.master.signal(signal.SIGCONT)
        lines = bench_lines(p)
        summary = lines[-1]
        rounds = [x for x in lines if "round" in x]
        assert summary["corrupted"] == 0 and summary["missing"] == 0, summary
        assert summary["put_failed"] > 0, "the stop was not seen"
        # progress after the master came back: the last rounds succeeded
        assert rounds[-1]["last_error"] == "", rounds[-5:]
        assert rounds[-1]["get_ok"] > rounds[0]["get_ok"], rounds[-5:]
        # the master took its own stop for what it was: no node declared lost
        assert st.metric("nodes_lost_total") == 0
        ok_after = [x for x in rounds if x["put_failed"] == summary["put_failed"]]
        assert len(ok_after) >= 2 and ok_after[-1]["put_ok"] > ok_after[0]["put_ok"], rounds[-5:]


def test_node_stopped_then_back():
    """A node stopped longer than the node timeout is declared lost; reads keep working from the
    other replicas; when it resumes it registers again by itself."""
    with harness.Cluster("store-node-stop") as c:
        st = Store(c, master_args=("--lease-ttl-ms", "1000"))
        # every batch read three times: the later reads go straight to the nodes the client
        # located (the location cache), and must find the replicas on the live nodes
        p = bench(st, "--replicas", "2", "--duration-s", "10", "--reads", "3")
        time.sleep(1.5)
        st.nodes[2].signal(signal.SIGSTOP)
        harness.wait_until(lambda: st.stat()["nodes"] == 2, timeout=15, what="node lost")
        time.sleep(1)
        st.nodes[2].signal(signal.SIGCONT)
        harness.wait_until(lambda: st.stat()["nodes"] == 3, timeout=15, what="node back")
        summary = bench_lines(p)[-1]
        assert summary["corrupted"] == 0, summary
        assert summary["get_ok"] > 0, summary
        assert st.metric("nodes_lost_total") == 1


def test_location_cache():
    """A get of an object located within its lease (by a get or an exists) reads from the nodes
    without asking the master: bench --latency N makes N gets through the cache, N through a client
    without one and N exists (which locate too), so the master counts 2N (+1, the first located
    get) lookups instead of 3N; every read passes its checksum and lease checks."""
    n = 40
    with harness.Cluster("store-loc-cache") as c:
        st = Store(c, nodes=2)
        before = st.metric("gets_total")
        p = subprocess.run([harness.binary("baton-store"), "bench", "--master", st.addr,
                            "--kv-secret-file", st.secret, "--size", "4K", "--latency", str(n)],
                           capture_output=True, text=True, timeout=120)
        assert p.returncode == 0, p.stdout + p.stderr
        line = json.loads(p.stdout.splitlines()[-1])
        assert line["failed"] == 0, line
        gets = st.metric("gets_total") - before
        assert 2 * n < gets < 3 * n, (gets, line)


def node_peers(node):
    """The node's last logged libbaton peer count and client peers forgotten, or None."""
    last = None
    for line in node.tail(100000).splitlines():
        m = re.search(r"node_peers xfer_peers=(\d+) client_peers=\d+ client_peers_forgotten=(\d+)",
                      line)
        if m:
            last = (int(m.group(1)), int(m.group(2)))
    return last


def test_node_forgets_clients():
    """Every short-lived client that puts makes the node's engine connect to it (the node pulls the
    bytes); once the client is gone the node forgets that peer, so its peer count returns to its
    baseline (0) instead of growing by one per client it ever served, and a later client still
    writes and reads."""
    n = 8
    with harness.Cluster("store-forget") as c:
        st = Store(c, nodes=1)
        for i in range(n):
            rc, out = st.put(f"short-{i}", os.urandom(3000 + i))
            assert rc == 0, out
        def back_to_baseline():
            last = node_peers(st.nodes[0])
            return last is not None and last[0] == 0 and last[1] >= n

        harness.wait_until(back_to_baseline, timeout=40,
                           what="the node's peer count back to 0, every client forgotten")
        data = os.urandom(5000)
        assert st.put("after", data)[0] == 0
        assert st.get("after")[1] == data


def test_own_progress():
    """The client without a caller loop (own-progress mode, bench --own-progress): a batch put,
    read back with every byte compared, exists from this thread and from a second one, remove,
    every callback run through the client's fd and dispatch; then the client and its engine
    close in order."""
    with harness.Cluster("store-own") as c:
        st = Store(c, nodes=2)
        p = subprocess.run([harness.binary("baton-store"), "bench", "--master", st.addr,
                            "--kv-secret-file", st.secret, "--size", "300K", "--batch", "6",
                            "--own-progress"], capture_output=True, text=True, timeout=120)
        assert p.returncode == 0, p.stdout + p.stderr
        line = json.loads(p.stdout.splitlines()[-1])
        assert line["put_ok"] == 6 and line["get_ok"] == 6 and line["corrupted"] == 0, line


def test_node_peer_bound():
    """--max-client-peers 1 with two long-lived clients writing at once: the node keeps one
    client's peer, forgets the other's (even while its client lives) and makes it again at its
    next put; every put and get still succeeds and no byte comes back wrong."""
    with harness.Cluster("store-peer-bound") as c:
        # short leases: the two clients' working set stays below the store's capacity
        st = Store(c, nodes=1, node_args=("--max-client-peers", "1"),
                   master_args=("--lease-ttl-ms", "1000"))
        ps = [bench(st, "--duration-s", "4") for _ in range(2)]
        for p in ps:
            lines = bench_lines(p)
            summary = lines[-1]
            errors = {x["last_error"] for x in lines if x.get("last_error")}
            assert summary["corrupted"] == 0 and summary["put_failed"] == 0, (summary, errors)
            assert summary["get_failed"] == 0 and summary["get_ok"] > 0, summary

        def forgot_live_ones():  # two when the clients left, more for the bound's evictions
            last = node_peers(st.nodes[0])
            return last is not None and last[1] > 2

        harness.wait_until(forgot_live_ones, timeout=20, what="clients forgotten past the bound")


def test_node_write_bounded():
    """A put's pull is bounded on the node (--write-timeout-ms): a client that asks the node to
    write a slice and then holds the node's pull without answering it (its export gone, its room
    callback keeping the room; tests/unit/store/store_hold_client.c) gets the node's answer, a
    time-out, instead of a write that never ends while the client lives; the node aborts the pull
    (the client sees its room end), logs the failed write and goes on serving puts and gets."""
    hold = os.path.join(harness.BUILD_DIR, "tests", "unit", "store", "store_hold_client")
    with harness.Cluster("store-write-bound") as c:
        st = Store(c, nodes=1, node_args=("--write-timeout-ms", "500"))
        node = st.nodes[0]
        # its own deadline far above the node's bound: "no_reply" means the write never ended
        p = subprocess.run([hold, f"{HOST}:{node.wait_port('node')}", st.secret, "60000"],
                           capture_output=True, text=True, timeout=90)
        assert p.returncode == 0, p.stderr
        assert "held_room n=1" in p.stderr, p.stderr  # the pull reached it and was held
        assert p.stdout.strip() == "reply status=BATON_XFER_ETIMEOUT", (p.stdout, p.stderr)
        assert "room_closed status=BATON_XFER_EABORTED" in p.stderr, p.stderr
        node.wait_log(r"node_write_failed peer=127\.0\.0\.1:\d+ err=timed out")
        data = os.urandom(5000)
        assert st.put("after", data)[0] == 0
        assert st.get("after")[1] == data


def test_metrics_promtool():
    promtool = shutil.which("promtool")
    if promtool is None:
        raise harness.SkipTest("promtool is not installed")
    with harness.Cluster("store-promtool") as c:
        st = Store(c, nodes=1)
        st.put("k", b"v")
        body = harness.get(st.http, "/metrics").body
        r = subprocess.run([promtool, "check", "metrics"], input=body, capture_output=True,
                           timeout=60)
        assert r.returncode == 0, r.stdout + r.stderr


if __name__ == "__main__":
    r = TestRunner()
    r.run(test_put_get_many)
    r.run(test_striping)
    r.run(test_replicas_node_killed)
    r.run(test_capacity_pressure)
    r.run(test_namespace_quota)
    r.run(test_hostile_bytes)
    r.run(test_exit_codes)
    r.run(test_master_stopped_then_back)
    r.run(test_node_stopped_then_back)
    r.run(test_location_cache)
    r.run(test_node_forgets_clients)
    r.run(test_own_progress)
    r.run(test_node_peer_bound)
    r.run(test_node_write_bounded)
    r.run(test_metrics_promtool)
    r.finish()
