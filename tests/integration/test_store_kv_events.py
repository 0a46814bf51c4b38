"""test_store_kv_events.py — the baton-store master publishes vLLM KV events for objects put with
the KV block they hold (`put --block HASH:[PARENT]:IDS`): BlockStored at the commit (medium
"L3", the chain's parent, the token ids, block_size), BlockRemoved when the object goes (rm,
eviction), nothing for objects without a block or puts that never commit; read by a Python
subscriber written to vLLM's wire (python3-zmq, python3-msgpack), live on the PUB socket and
through the replay socket. With two masters on etcd, the leader's successor opens with
AllBlocksCleared and publishes the committed blocks it restored."""
import os
import subprocess
import sys

try:
    import msgpack
    import zmq
except ImportError:
    if sys.executable != "/usr/bin/python3" and os.path.exists("/usr/bin/python3"):
        os.execv("/usr/bin/python3", ["/usr/bin/python3", "-u"] + sys.argv)
    print("[ SKIPPED ] python3-zmq and python3-msgpack are not installed "
          "(scripts/install-deps.sh --test)")
    sys.exit(77)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import harness  # noqa: E402
from etcd_cluster import EtcdCluster, etcd_binary  # noqa: E402
from harness import HOST, SkipTest, TestRunner  # noqa: E402
from test_kv_events import replay_all  # noqa: E402
from test_store import Store  # noqa: E402

CTX = zmq.Context.instance()
ANY = "tcp://127.0.0.1:*"
KV_ARGS = ("--kv-events-endpoint", ANY, "--kv-events-replay-endpoint", ANY)


def events(batches):
    """The events of decoded batches (map-form batches: [ts, events, dp_rank])."""
    out = []
    for _, b in batches:
        out.extend(b[1])
    return out


def kind(evs, t):
    return [e for e in evs if e["type"] == t]


def subscriber(port):
    s = CTX.socket(zmq.SUB)
    s.setsockopt(zmq.SUBSCRIBE, b"")
    s.connect(f"tcp://{HOST}:{port}")
    return s


def test_stored_and_removed():
    with harness.Cluster("store-kvev") as c:
        st = Store(c, nodes=2, master_args=KV_ARGS)
        rep = f"tcp://{HOST}:{st.master.wait_port('kvreplay')}"
        sub = subscriber(st.master.wait_port("kvevents"))
        # the slow joiner: a first put whose event the subscription may miss (replay has it)
        assert st.put("b1", os.urandom(5000), "--block", "101::1,2,3,4")[0] == 0
        assert st.put("b2", os.urandom(5000), "--block", "102:101:5,6,7,8")[0] == 0
        assert st.put("plain", os.urandom(100))[0] == 0  # no block: no event
        assert st.put("b3", os.urandom(5000), "--block", "103:102:9,10,11,12",
                      "--replicas", "2")[0] == 0
        # a second put of a committed key is refused: no second event
        assert st.put("b3", os.urandom(10), "--block", "103:102:9,10,11,12")[0] == 2
        assert st.cmd("rm", "b3")[0] == 0
        assert st.put("b4", os.urandom(64), "--block", "-7::4294967295")[0] == 0
        evs = events(replay_all(rep))
        stored = kind(evs, "BlockStored")
        assert [e["block_hashes"] for e in stored] == [[101], [102], [103], [-7]], evs
        assert [e["parent_block_hash"] for e in stored] == [None, 101, 102, None]
        assert stored[1]["token_ids"] == [5, 6, 7, 8] and stored[1]["block_size"] == 4
        assert stored[3]["token_ids"] == [4294967295] and stored[3]["block_size"] == 1
        assert all(e["medium"] == "L3" for e in evs), evs
        assert [e["block_hashes"] for e in kind(evs, "BlockRemoved")] == [[103]]
        # live on the PUB socket too: at least the later batches, in order
        live = []
        while sub.poll(2000):
            topic, seq, payload = sub.recv_multipart()
            live.append((int.from_bytes(seq, "big"), msgpack.unpackb(payload, raw=False)))
        assert live and events(live) == evs[len(evs) - len(events(live)):], live
        assert [s for s, _ in live] == sorted(s for s, _ in live)
        # bad --block arguments are refused by the CLI, the store goes on
        for bad in ("x::1", "1:2", "1::", "1::1,,2", "1::-1"):
            assert st.put("bad", b"x", "--block", bad)[0] == 2, bad
        assert st.metric("kv_events_stored_total") == 4
        assert st.metric("kv_events_removed_total") == 1
        assert st.metric("kv_event_blocks") == 3
        sub.close(0)


def test_evicted_block_removed():
    with harness.Cluster("store-kvev-evict") as c:
        st = Store(c, nodes=1, segment="1M", master_args=KV_ARGS + ("--lease-ttl-ms", "1"))
        rep = f"tcp://{HOST}:{st.master.wait_port('kvreplay')}"
        for i in range(12):  # 12 x 200 KB in 1 MB: the first ones are evicted
            rc, out = st.put(f"e{i}", os.urandom(200000), "--block", f"{1000 + i}::{i}")
            assert rc == 0, out
        evs = events(replay_all(rep))
        removed = [e["block_hashes"][0] for e in kind(evs, "BlockRemoved")]
        assert removed and st.metric("evictions_total") >= len(removed), evs
        assert set(removed) <= {1000 + i for i in range(12)}
        assert len(kind(evs, "BlockStored")) == 12
        assert st.metric("kv_event_blocks") == 12 - len(removed)


def test_failover_republishes():
    if etcd_binary() is None:
        raise SkipTest("etcd is not installed")
    from test_store_ha import HaStore
    with EtcdCluster(1, name="store-kvev-etcd") as etcd, harness.Cluster("store-kvev-ha") as c:
        st = HaStore(c, etcd.url("/kvev"), master_args=KV_ARGS)
        leader = harness.wait_until(st.leader, timeout=20, what="one leader")
        assert st.put("b1", os.urandom(3000), "--block", "201::1,2")[0] == 0
        assert st.put("b2", os.urandom(3000), "--block", "202:201:3,4")[0] == 0
        assert st.put("b3", os.urandom(3000), "--block", "203:202:5,6")[0] == 0
        assert st.cmd("rm", "b3")[0] == 0
        leader.kill()
        new = harness.wait_until(lambda: st.leader() if st.leader() is not leader else None,
                                 timeout=20, what="the standby leads")
        evs = events(replay_all(f"tcp://{HOST}:{new.wait_port('kvreplay')}"))
        assert evs and evs[0]["type"] == "AllBlocksCleared", evs
        stored = kind(evs, "BlockStored")
        assert sorted(e["block_hashes"][0] for e in stored) == [201, 202], evs
        b2 = [e for e in stored if e["block_hashes"] == [202]][0]
        assert b2["parent_block_hash"] == 201 and b2["token_ids"] == [3, 4]
        # removals go on from the new leader
        harness.wait_until(lambda: st.cmd("rm", "b2")[0] == 0, timeout=20,
                           what="rm once the restored lease lapsed")
        evs = events(replay_all(f"tcp://{HOST}:{new.wait_port('kvreplay')}"))
        assert [e["block_hashes"] for e in kind(evs, "BlockRemoved")] == [[202]], evs


if __name__ == "__main__":
    r = TestRunner()
    r.run(test_stored_and_removed)
    r.run(test_evicted_block_removed)
    r.run(test_failover_republishes)
    r.finish()
