"""test_kv_l3.py — the precise policy's L3 credit end to end: baton-workers with HiCache tiers put
their pages in a real baton-store whose master publishes them as KV events (medium L3, the same
blocks as the workers' own L1 events); a router following the store's events (--store-kv-events)
credits them on every worker. A prompt computed on worker A (not routed to) is then routed to a
tiered worker that fetches it from the store instead of to the worker holding its first blocks in
L1 but busy — and to that one when the credit is off. With two masters on etcd, the new leader's
AllBlocksCleared and republication rebuild the router's L3 view."""
import os
import sys
import threading

try:
    import msgpack  # noqa: F401
    import zmq  # noqa: F401
except ImportError:
    if sys.executable != "/usr/bin/python3" and os.path.exists("/usr/bin/python3"):
        os.execv("/usr/bin/python3", ["/usr/bin/python3", "-u"] + sys.argv)
    print("[ SKIPPED ] python3-zmq and python3-msgpack are not installed "
          "(scripts/install-deps.sh --test)")
    sys.exit(77)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import harness  # noqa: E402
from etcd_cluster import EtcdCluster, etcd_binary  # noqa: E402
from harness import HOST, Cluster, SkipTest, TestRunner, get, post, wait_until  # noqa: E402
from test_kv_routing import FAST, free_port, kv_worker, l1, metric, register  # noqa: E402
from test_store import Store  # noqa: E402

ANY = "tcp://127.0.0.1:*"
KV_ARGS = ("--kv-events-endpoint", ANY, "--kv-events-replay-endpoint", ANY)


def endpoints(masters):
    pub = ",".join(f"tcp://{HOST}:{m.wait_port('kvevents')}" for m in masters)
    rep = ",".join(f"tcp://{HOST}:{m.wait_port('kvreplay')}" for m in masters)
    return pub, rep


def kv_store(rport):
    return get(rport, "/workers").json().get("kv_store")


def l3_blocks(rport):
    s = kv_store(rport)
    return s["blocks_L3"] if s and s["known"] else -1


def tier_worker(c, st, name):
    """A worker with L2 and the store as L3, its pages (4 tokens) announced as KV events."""
    pub, rep = free_port(), free_port()
    w = c.worker("regular", *FAST, "--cache-tokens", "256", "--l2-bytes", "1M",
                 "--kv-secret-file", st.secret, "--store-master", st.addr,
                 "--hicache-storage-prefetch-policy", "wait_complete",
                 "--prefetch-min-tokens", "4",
                 "--kv-events-endpoint", f"tcp://127.0.0.1:{pub}",
                 "--kv-events-replay-endpoint", f"tcp://127.0.0.1:{rep}", name=name)
    w.kv = (pub, rep)
    return w


def direct(w, ids):
    r = post(w.port, "/generate", {"input_ids": ids, "sampling_params": {"max_new_tokens": 1}})
    assert r.status == 200, r.text


def routed(rport, ids):
    """The cached tokens of a routed request, per tier (device, host, storage; a worker without
    tiers: all on the device)."""
    r = post(rport, "/generate", {"input_ids": ids, "sampling_params": {"max_new_tokens": 1}})
    assert r.status == 200, r.text
    m = r.json()["meta_info"]
    return m.get("cached_tokens_details",
                 {"device": m["cached_tokens"], "host": 0, "storage": 0})


def busy(rport, w, wid, out):
    """A long request pinned to w through the router (its prompt tokens count as w's load)."""
    r = post(rport, "/generate", {"input_ids": [9000 + i for i in range(24)],
                                  "sampling_params": {"max_new_tokens": 40000,
                                                      "ignore_eos": True}},
             headers={"X-Baton-Target-Worker": wid})
    out.append(r.status)


def in_flight(rport, wid):
    return get(rport, f"/workers/{wid}").json()["in_flight"]


def test_l3_credit_changes_the_pick():
    with Cluster("kv-l3") as c:
        st = Store(c, nodes=2, segment="16M", master_args=KV_ARGS)
        pub, rep = endpoints([st.master])
        a = tier_worker(c, st, "a")  # computes the prompts; not routed to
        b = tier_worker(c, st, "b")
        d = tier_worker(c, st, "d")
        common = ("--policy", "precise", "--precise-provisional-ms", "0",
                  "--store-kv-events", pub, "--store-kv-events-replay", rep)
        r = c.router(*common, name="router")
        r0 = c.router(*common, "--precise-l3-credit-pct", "0", name="router0")
        ids = {}
        for rt in (r, r0):
            ids[rt.port] = {w: register(rt.port, w) for w in (b, d)}
        p1 = [5000 + i for i in range(64)]
        p2 = [7000 + i for i in range(64)]
        for p in (p1, p2):
            direct(a, p)  # 16 pages each, written through to the store
        for p in (p1, p2):
            direct(d, p[:32])  # D holds their first 8 blocks in L1 (in the store already)
        for rt in (r, r0):
            wait_until(lambda: l3_blocks(rt.port) == 32, timeout=30,
                       what="the store's 32 blocks indexed as L3")
            wait_until(lambda: l1(rt.port, d) >= 16, what="D's 16 blocks indexed")
        s = kv_store(r.port)
        assert s["last_seq"] >= 0 and s["masters"][0]["state"] == "synced", s
        assert metric(r.port, "baton_kv_index_blocks", {"worker": "@store", "tier": "L3"}) == 32
        # D busy with a 24-token prompt on each router. The probe's 68 tokens, 16 blocks of them
        # in the store, 8 in D's L1: with the credit D costs 68 - 4 x (8 + 0.5 x 8) + 24 = 44,
        # B 68 - 4 x 0.5 x 16 = 36 (B wins and fetches the prefix from L3); without it D costs
        # 68 - 32 + 24 = 60 and B 68 (D wins).
        done = []
        th = [threading.Thread(target=busy, args=(rt.port, d, ids[rt.port][d], done))
              for rt in (r, r0)]
        for t in th:
            t.start()
        for rt in (r, r0):
            wait_until(lambda: in_flight(rt.port, ids[rt.port][d]) == 1,
                       what="D's long request in flight")
        got = routed(r.port, p2 + [1, 2, 3, 4])
        assert got == {"device": 0, "host": 0, "storage": 64}, got
        assert metric(r.port, "baton_routing_precise_l3_credited_total") == 1
        assert metric(r.port, "baton_routing_precise_l3_tokens_total") == 64
        got = routed(r0.port, p1 + [1, 2, 3, 4])
        assert got["device"] == 32, got
        assert metric(r0.port, "baton_routing_precise_l3_credited_total") == 0
        assert in_flight(r.port, ids[r.port][d]) == 1, "the long request ended: no load term"
        for t in th:
            t.join(60)
        assert done == [200, 200], done


def test_store_failover_rebuilds_l3():
    if etcd_binary() is None:
        raise SkipTest("etcd is not installed")
    from test_store_ha import HaStore
    with EtcdCluster(1, name="kv-l3-etcd") as etcd, harness.Cluster("kv-l3-ha") as c:
        st = HaStore(c, etcd.url("/kvl3"), master_args=KV_ARGS)
        leader = harness.wait_until(st.leader, timeout=20, what="one leader")
        pub, rep = endpoints(st.masters)
        r = c.router("--policy", "precise", "--store-kv-events", pub,
                     "--store-kv-events-replay", rep)
        assert st.put("b1", os.urandom(3000), "--block", "301::1,2")[0] == 0
        assert st.put("b2", os.urandom(3000), "--block", "302:301:3,4")[0] == 0
        assert st.put("b3", os.urandom(3000), "--block", "303:302:5,6")[0] == 0
        wait_until(lambda: l3_blocks(r.port) == 3, timeout=20, what="3 L3 blocks indexed")
        lead_ep = f"tcp://{HOST}:{leader.wait_port('kvevents')}"
        assert [m["endpoint"] for m in kv_store(r.port)["masters"] if m["leading"]] == [lead_ep]
        leader.kill()
        new = harness.wait_until(lambda: st.leader() if st.leader() is not leader else None,
                                 timeout=20, what="the standby leads")
        new_ep = f"tcp://{HOST}:{new.wait_port('kvevents')}"

        def rebuilt():
            s = kv_store(r.port)
            m = [x for x in s["masters"] if x["endpoint"] == new_ep][0]
            return m["clears"] >= 1 and m["leading"] and s["blocks_L3"] == 3

        wait_until(rebuilt, timeout=30, what="the new leader's clear and republication applied")
        # the new leader's removals apply to the same view
        harness.wait_until(lambda: st.cmd("rm", "b3")[0] == 0, timeout=20,
                           what="rm once the restored lease lapsed")
        wait_until(lambda: l3_blocks(r.port) == 2, timeout=20, what="b3's removal applied")


if __name__ == "__main__":
    t = TestRunner()
    t.run(test_l3_credit_changes_the_pick)
    t.run(test_store_failover_rebuilds_l3)
    t.finish()
