"""test_store_ha.py — baton-store masters elected through a real 3-member etcd cluster on loopback:
two masters campaign, clients and nodes find the leader through the etcd:// URL, the leader is
killed with -9 while a large striped put is under way, and the standby takes over from the
operation log in etcd: every object committed before the kill is read back byte for byte (a
striped one with replicas and a soft-pinned one in another namespace too), the put cut off by the
kill is either whole or absent (never half-written), removed objects stay removed, nodes carry
on without a restart, and puts, gets and removes work again. A leader stopped with SIGSTOP is
replaced when its lease expires and, resumed, exits."""

import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import harness  # noqa: E402
from etcd_cluster import EtcdCluster, etcd_binary  # noqa: E402
from harness import HOST, SkipTest, TestRunner  # noqa: E402
from test_store import Store  # noqa: E402


class HaStore(Store):
    """Two masters on one etcd:// registry, nodes and commands that use the registry."""

    def __init__(self, cluster, registry, master_args=()):
        self.c = cluster
        self.registry = registry
        self.master_args = tuple(master_args)
        import tempfile
        self.dir = tempfile.mkdtemp(prefix="store-ha-", dir=cluster.logdir)
        self.secret = os.path.join(self.dir, "secret")
        with open(self.secret, "w") as f:
            f.write("store-ha-test-secret-0123456789\n")
        os.chmod(self.secret, 0o600)
        self.masters = [self.master_proc(f"master{i}") for i in range(2)]
        self.nodes = [cluster.start(f"n{i}", [harness.binary("baton-store"), "node", "--registry",
                                              registry, "--segment-bytes", "64M", "--id", f"n{i}",
                                              "--host", HOST, "--kv-secret-file", self.secret],
                                    wait=("node", "bootstrap")) for i in range(3)]

    def master_proc(self, name):
        return self.c.start(name, [harness.binary("baton-store"), "master", "--host", HOST,
                                   "--port", "0", "--http-port", "0", "--kv-secret-file",
                                   self.secret, "--registry", self.registry,
                                   "--node-timeout-ms", "1500", "--lease-ttl-ms", "3000",
                                   *self.master_args],
                           wait=("master", "http"))

    def cmd(self, *args, secret=None):
        p = subprocess.run([harness.binary("baton-store"), *args, "--registry", self.registry,
                            "--kv-secret-file", secret or self.secret, "--timeout-ms", "1000"],
                           capture_output=True, text=True, timeout=60)
        return p.returncode, p.stdout, p.stderr

    def leader(self):
        lead = [m for m in self.masters if m.alive() and
                json.loads(harness.get(m.wait_port("http"), "/health").body)["leader"]]
        return lead[0] if len(lead) == 1 else None


def metric(port, name):
    for line in harness.get(port, "/metrics").body.decode().splitlines():
        if line.startswith(f"baton_store_{name} "):
            return int(float(line.split()[1]))
    raise AssertionError(f"no metric {name}")


def test_failover():
    if etcd_binary() is None:
        raise SkipTest("etcd is not installed")
    with EtcdCluster(3, name="store-etcd") as etcd, harness.Cluster("store-ha") as c:
        st = HaStore(c, etcd.url("/storeha"))
        leader = harness.wait_until(st.leader, timeout=20, what="one leader")
        harness.wait_until(lambda: st.cmd("stat")[0] == 0 and
                           json.loads(st.cmd("stat")[1])["nodes"] == 3, timeout=20,
                           what="3 nodes with the leader")
        committed = {f"before-{i}": os.urandom(1000 + 7919 * i) for i in range(8)}
        for k, v in committed.items():
            rc, out = st.put(k, v)
            assert rc == 0, out
        committed["striped"] = os.urandom(9 * 1024 * 1024 + 123)  # 3 stripes, 2 replicas
        rc, out = st.put("striped", committed["striped"], "--replicas", "2")
        assert rc == 0, out
        pinned = os.urandom(5000)
        rc, out = st.put("pinned", pinned, "--soft-pin", "--namespace", "tenant")
        assert rc == 0, out
        rc, out = st.put("removed", b"gone")
        assert rc == 0, out
        assert st.cmd("rm", "removed")[0] == 0
        for k, v in committed.items():
            assert st.get(k)[1] == v

        # a put under way when the leader dies: 24 MiB, striped over the three nodes
        cut = os.urandom(24 * 1024 * 1024)
        path = os.path.join(st.dir, "in-cut")
        with open(path, "wb") as f:
            f.write(cut)
        putter = subprocess.Popen([harness.binary("baton-store"), "put", "cut", path,
                                   "--registry", st.registry, "--kv-secret-file", st.secret,
                                   "--timeout-ms", "5000"],
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        lhttp = leader.wait_port("http")
        harness.wait_until(lambda: metric(lhttp, "puts_in_flight") >= 1 or
                                  putter.poll() is not None, timeout=30, interval=0.005,
                                  what="the put under way")
        in_flight = putter.poll() is None
        leader.kill()
        t0 = time.monotonic()
        # a put through the registry succeeds again once the standby leads
        data = os.urandom(300000)
        harness.wait_until(lambda: st.put("after", data)[0] == 0, timeout=30, interval=0.05,
                           what="a put after the failover")
        took = time.monotonic() - t0
        print(f"failover: first put accepted {took:.2f} s after kill -9 of the leader",
              flush=True)
        cut_out = putter.communicate(timeout=60)[0]
        new = st.leader()
        assert new is not None and new is not leader
        http = new.wait_port("http")
        # the committed objects and the pinned one; the cut-off put too if it committed in time
        assert metric(http, "restored_objects") in (len(committed) + 1, len(committed) + 2)
        assert metric(http, "leader_acquired_total") == 1
        rc, got, err = st.get("after")
        assert rc == 0 and got == data, err
        # every object committed under the old leader, byte for byte
        for k, v in committed.items():
            rc, got, err = st.get(k)
            assert rc == 0, f"{k} lost in the failover: {err}"
            assert got == v, f"{k}: the bytes read back differ"
        rc, out, err = st.cmd("get", "pinned", os.path.join(st.dir, "out-pinned"),
                              "--namespace", "tenant")
        assert rc == 0, err
        with open(os.path.join(st.dir, "out-pinned"), "rb") as f:
            assert f.read() == pinned
        assert st.get("removed")[0] == 1
        # the put the kill cut off: whole when its putter was told so, otherwise whole or absent
        rc, got, err = st.get("cut")
        if putter.returncode == 0:
            assert rc == 0 and got == cut, f"an acknowledged put was lost: {err}"
        else:
            assert rc == 1 or (rc == 0 and got == cut), f"half-written: rc {rc} {err}"
        if in_flight and rc == 1:  # taken over: its space held, its key free
            assert metric(http, "restored_putting") == 1
        print(f"the cut-off put (in flight at the kill: {in_flight}): putter rc {putter.returncode} ({cut_out.strip()[-80:]}), "
              f"after the failover: {'whole' if rc == 0 else 'absent'}", flush=True)
        # the nodes go on with the new leader without a restart; it serves and removes again
        harness.wait_until(lambda: json.loads(st.cmd("stat")[1])["nodes"] == 3, timeout=20,
                           what="every node alive with the new leader")
        assert all(n.alive() for n in st.nodes)
        # restored objects are leased for a lease TTL (a read the old leader granted may run)
        harness.wait_until(lambda: st.cmd("rm", "before-0")[0] == 0, timeout=20,
                           what="a remove once the restored lease lapsed")
        assert st.get("before-0")[0] == 1
        rc, out = st.put("before-0", committed["before-0"])
        assert rc == 0, out
        assert st.get("before-0")[1] == committed["before-0"]
        stat = json.loads(st.cmd("stat")[1])
        assert stat["objects"] == len(committed) + 2 + (st.get("cut")[0] == 0), stat


def test_stopped_leader():
    """A leader that does not answer (SIGSTOP: a partition, a stall) is not probed dead; the
    standby takes over when its lease expires, and the old leader, resumed, finds its lease gone
    and exits without writing a record: what the new leader committed stays."""
    if etcd_binary() is None:
        raise SkipTest("etcd is not installed")
    import signal
    with EtcdCluster(3, name="store-etcd-stop") as etcd, harness.Cluster("store-ha-stop") as c:
        st = HaStore(c, etcd.url("/storehastop"))
        leader = harness.wait_until(st.leader, timeout=20, what="one leader")
        harness.wait_until(lambda: json.loads(st.cmd("stat")[1])["nodes"] == 3, timeout=20,
                           what="3 nodes with the leader")
        before = os.urandom(70000)
        assert st.put("before", before)[0] == 0
        leader.signal(signal.SIGSTOP)
        t0 = time.monotonic()
        after = os.urandom(70000)
        harness.wait_until(lambda: st.put("after", after)[0] == 0, timeout=30, interval=0.05,
                           what="a put once the standby leads")
        print(f"stopped leader: first put accepted {time.monotonic() - t0:.2f} s after SIGSTOP "
              "(the lease TTL)", flush=True)
        leader.signal(signal.SIGCONT)
        leader.p.wait(timeout=20)  # resumed: its lease is gone, it exits
        assert leader.p.returncode == 1, leader.p.returncode
        leader.wait_log(r"master_leadership_lost")  # (the log is read by another thread)
        for k, v in (("before", before), ("after", after)):
            assert all(n.alive() for n in st.nodes), [(n.p.returncode, n.tail(3)) for n in st.nodes]
            rc, got, err = st.get(k)
            assert rc == 0 and got == v, (k, rc, err)
        # its supervisor starts it again: a standby. A leader stopped with SIGTERM (a rolling
        # update) writes what it owes the log, gives its lease back and exits 0: the standby
        # leads at once, whatever the old address does once the process is gone.
        st.masters = [m for m in st.masters if m is not leader] + [st.master_proc("master2")]
        current = harness.wait_until(st.leader, timeout=20, what="one leader")
        current.signal(signal.SIGTERM)
        t0 = time.monotonic()
        harness.wait_until(lambda: st.put("after-term", after)[0] == 0, timeout=30,
                           interval=0.05, what="a put after SIGTERM of the leader")
        print(f"leader stopped with SIGTERM: first put accepted {time.monotonic() - t0:.2f} s "
              "later", flush=True)
        current.p.wait(timeout=20)
        assert current.p.returncode == 0, current.p.returncode
        current.wait_log(r"leadership_resigned .*revoked=yes")
        for k, v in (("before", before), ("after", after), ("after-term", after)):
            assert st.get(k)[1] == v, k


if __name__ == "__main__":
    r = TestRunner()
    r.run(test_failover)
    r.run(test_stopped_leader)
    r.finish()
