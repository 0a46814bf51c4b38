"""test_store_ha.py — baton-store masters elected through a real 3-member etcd cluster on loopback:
two masters campaign, clients and nodes find the leader through the etcd:// URL, the leader is
killed with -9 and the standby leads within a bound, nodes register with it by themselves, and puts
and gets work again with every byte compared. What a failover does NOT keep yet is asserted too:
objects committed under the old leader are gone (the new leader starts from empty metadata)."""

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

    def __init__(self, cluster, registry):
        self.c = cluster
        self.registry = registry
        import tempfile
        self.dir = tempfile.mkdtemp(prefix="baton-store-ha-")
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
                                   "--node-timeout-ms", "1500"], wait=("master", "http"))

    def cmd(self, *args, secret=None):
        p = subprocess.run([harness.binary("baton-store"), *args, "--registry", self.registry,
                            "--kv-secret-file", secret or self.secret, "--timeout-ms", "1000"],
                           capture_output=True, text=True, timeout=60)
        return p.returncode, p.stdout, p.stderr

    def leader(self):
        lead = [m for m in self.masters if m.alive() and
                json.loads(harness.get(m.wait_port("http"), "/health").body)["leader"]]
        return lead[0] if len(lead) == 1 else None


def test_failover():
    if etcd_binary() is None:
        raise SkipTest("etcd is not installed")
    with EtcdCluster(3, name="store-etcd") as etcd, harness.Cluster("store-ha") as c:
        st = HaStore(c, etcd.url("/storeha"))
        leader = harness.wait_until(st.leader, timeout=20, what="one leader")
        harness.wait_until(lambda: st.cmd("stat")[0] == 0 and
                           json.loads(st.cmd("stat")[1])["nodes"] == 3, timeout=20,
                           what="3 nodes with the leader")
        data = os.urandom(300000)
        rc, out = st.put("before", data, "--replicas", "2")
        assert rc == 0, out
        assert st.get("before")[1] == data
        leader.kill()
        t0 = time.monotonic()
        # a put through the registry succeeds again once the standby leads
        harness.wait_until(lambda: st.put("after", data)[0] == 0, timeout=30, interval=0.05,
                           what="a put after the failover")
        took = time.monotonic() - t0
        print(f"failover: first put accepted {took:.2f} s after kill -9 of the leader "
              "(lease TTL 2 s)", flush=True)
        new = st.leader()
        assert new is not None and new is not leader
        rc, got, err = st.get("after")
        assert rc == 0 and got == data, err
        harness.wait_until(lambda: json.loads(st.cmd("stat")[1])["nodes"] == 3, timeout=20,
                           what="every node registered with the new leader")
        # not kept across a failover (yet): the old leader's objects
        assert st.get("before")[0] == 1


if __name__ == "__main__":
    r = TestRunner()
    r.run(test_failover)
    r.finish()
