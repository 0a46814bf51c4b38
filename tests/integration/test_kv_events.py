"""test_kv_events.py — src/kvevents on the wire against a publisher and a subscriber written here
in Python to vLLM's and SGLang's formats (python3-zmq, python3-msgpack), independently of Baton's
encoder: stored / removed / cleared in both event encodings and both replay reply forms, map and
array batches, integer (negative, above 2^63) and 32-byte digest hashes, DP ranks, a sequence gap
filled by replay, a gap older than the replay buffer and a restarted publisher (resets), malformed
and hostile streams (refused, the subscriber unharmed); and Baton's publisher read by Python.
Debian's python3 has the two modules; when this interpreter lacks them the test re-runs itself
under /usr/bin/python3, and reports itself skipped when neither has them."""
import json
import os
import queue
import subprocess
import sys
import threading
import time

try:
    import msgpack
    import zmq
except ImportError:
    if sys.executable != "/usr/bin/python3" and os.path.exists("/usr/bin/python3"):
        os.execv("/usr/bin/python3", ["/usr/bin/python3", "-u"] + sys.argv)
    print("[ SKIPPED ] python3-zmq and python3-msgpack are not installed "
          "(scripts/install-deps.sh --test)")
    sys.exit(77)

sys.path.insert(0, os.path.dirname(__file__))
from harness import TestRunner, wait_until  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
BUILD = os.environ.get("BATON_BUILD_DIR", os.path.join(HERE, "..", "..", "build"))
PROBE = os.path.join(BUILD, "tests", "unit", "kvevents", "kvev_probe")
CTX = zmq.Context.instance()
END = (-1).to_bytes(8, "big", signed=True)


def stored(hashes, parent, tokens, bs, medium="GPU", form="map"):
    if form == "map":
        return {"type": "BlockStored", "block_hashes": hashes, "parent_block_hash": parent,
                "token_ids": tokens, "block_size": bs, "lora_id": None, "medium": medium,
                "lora_name": None}
    return ["BlockStored", hashes, parent, tokens, bs, None, medium]


def removed(hashes, medium="GPU", form="map"):
    if form == "map":
        return {"type": "BlockRemoved", "block_hashes": hashes, "medium": medium}
    return ["BlockRemoved", hashes, medium]


def cleared(form="map"):
    return {"type": "AllBlocksCleared"} if form == "map" else ["AllBlocksCleared"]


class PyPublisher:
    """vLLM's ZmqEventPublisher, written from its documented wire: PUB [topic, seq, payload],
    a ROUTER answering [identity, "", start] with every buffered batch from start, then the end
    marker; reply_topic picks [topic, seq, payload] / ["", -1, ""] or [seq, payload] / [-1, ""]."""

    def __init__(self, reply_topic=True, buffer_steps=1000, topic=b"kv"):
        self.pub = CTX.socket(zmq.PUB)
        self.port = self.pub.bind_to_random_port("tcp://127.0.0.1")
        self.router = CTX.socket(zmq.ROUTER)
        self.replay_port = self.router.bind_to_random_port("tcp://127.0.0.1")
        self.reply_topic, self.topic, self.steps = reply_topic, topic, buffer_steps
        self.buf, self.seq, self.lock = [], 0, threading.Lock()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    @property
    def endpoints(self):
        return f"tcp://127.0.0.1:{self.port}", f"tcp://127.0.0.1:{self.replay_port}"

    def publish(self, events, dp=0, live=True, payload=None, seq=None):
        if payload is None:
            batch = [time.time(), events] + ([] if dp is None else [dp])
            payload = msgpack.packb(batch, use_bin_type=True)
        with self.lock:
            s = self.seq if seq is None else seq
            self.seq = s + 1
            self.buf = (self.buf + [(s, payload)])[-self.steps:]
        if live:
            self.pub.send_multipart([self.topic, s.to_bytes(8, "big"), payload])
        return s

    def _serve(self):
        while not self.stop.is_set():
            if not self.router.poll(50):
                continue
            ident, _, start = self.router.recv_multipart()
            start = int.from_bytes(start, "big", signed=True)
            with self.lock:
                items = [(s, p) for s, p in self.buf if s >= start]
            for s, p in items:
                head = [ident, b""] + ([self.topic] if self.reply_topic else [])
                self.router.send_multipart(head + [s.to_bytes(8, "big"), p])
            self.router.send_multipart([ident, b""] + ([b""] if self.reply_topic else []) + [END, b""])

    def close(self):
        self.stop.set()
        self.thread.join()
        self.pub.close(0)
        self.router.close(0)


class Probe:
    """kvev_probe sub: Baton's subscriber printing each callback as a JSON line."""

    def __init__(self, ep, replay, batches, timeout_ms=20000, sync=True):
        args = [PROBE, "sub", ep, replay or "-", str(batches), str(timeout_ms)]
        self.p = subprocess.Popen(args + (["sync"] if sync else []), stdout=subprocess.PIPE, text=True)
        self.q = queue.Queue()
        self.sync = sync
        threading.Thread(target=self._read, daemon=True).start()
        self.lines = []
        assert self.next()["ev"] == "ready"

    def _read(self):
        for line in self.p.stdout:
            self.q.put(json.loads(line))
        self.q.put(None)

    def next(self, timeout=20):
        ev = self.q.get(timeout=timeout)
        assert ev is not None, "probe exited early"
        self.lines.append(ev)
        return ev

    def until(self, pred, timeout=20):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            ev = self.next(timeout=max(0.1, deadline - time.monotonic()))
            if pred(ev):
                return ev
        raise AssertionError("probe never reported the expected event")

    def finish(self):
        rc = self.p.wait(timeout=30)
        while True:
            ev = self.q.get(timeout=5)
            if ev is None:
                return rc
            self.lines.append(ev)


def batches(lines):
    return [e for e in lines if e["ev"] == "batch"]


def connect_live(pub, probe):
    """Empty live batches until the probe sees one live (its SUB is connected by then); a batch
    published after the probe's sync ended can only have reached it live."""
    if probe.sync:
        probe.until(lambda e: e["ev"] == "synced")

    def seen():
        s = pub.publish([])
        try:
            ev = probe.until(lambda e: e["ev"] == "batch" and e["seq"] >= s, timeout=0.2)
            return ev
        except (AssertionError, queue.Empty):
            return None
    wait_until(seen, timeout=20, what="the probe's subscription")


DIGEST = bytes(range(32))


def check_events(form, reply_topic):
    pub = PyPublisher(reply_topic=reply_topic)
    try:
        big = 2**63 + 5  # an unsigned 64-bit hash keeps its bits: read back as negative
        pub.publish([stored([DIGEST, -7], None, [1, 2, 3, 4, 5, 6], 3, form=form)], dp=2)
        pub.publish([stored([big], DIGEST, [9, 9, 9], 3, medium="CPU", form=form),
                     removed([-7], form=form)], dp=None)
        pub.publish([cleared(form)], dp=2)
        probe = Probe(*pub.endpoints, batches=3)
        assert probe.finish() == 0, probe.lines
        got = batches(probe.lines)
        assert [b["seq"] for b in got] == [0, 1, 2]
        assert [b["dp"] for b in got] == [2, -1, 2]
        e0 = got[0]["events"][0]
        assert e0 == {"type": "stored", "medium": "GPU", "hashes": [DIGEST.hex(), -7],
                      "parent": None, "block_size": 3, "tokens": [1, 2, 3, 4, 5, 6]}, e0
        e1, e2 = got[1]["events"]
        assert e1["hashes"] == [big - 2**64] and e1["parent"] == DIGEST.hex() and e1["medium"] == "CPU"
        assert e2 == {"type": "removed", "medium": "GPU", "hashes": [-7]}
        assert got[2]["events"] == [{"type": "cleared", "medium": "", "hashes": []}]
        synced = [e for e in probe.lines if e["ev"] == "synced"]
        assert synced == [{"ev": "synced", "known": 1}], synced
    finally:
        pub.close()


def test_map_events_topic_replies():
    check_events("map", True)


def test_array_events_seq_replies():
    check_events("array", False)


def test_map_batch():
    """The batch itself as a map (msgspec without array_like): read the same."""
    pub = PyPublisher()
    try:
        payload = msgpack.packb({"ts": 1.0, "events": [removed([5])], "data_parallel_rank": 1})
        pub.publish(None, payload=payload)
        probe = Probe(*pub.endpoints, batches=1)
        assert probe.finish() == 0
        assert batches(probe.lines)[0]["events"][0]["hashes"] == [5]
    finally:
        pub.close()


def test_gap_replayed():
    pub = PyPublisher()
    try:
        probe = Probe(*pub.endpoints, batches=10**6, timeout_ms=30000)
        connect_live(pub, probe)
        a = pub.publish([removed([1])])
        pub.publish([removed([2])], live=False)  # lost on the way: only in the replay buffer
        pub.publish([removed([3])], live=False)
        c = pub.publish([removed([4])])
        ev = probe.until(lambda e: e["ev"] == "batch" and e["seq"] == c)
        seqs = [b["seq"] for b in batches(probe.lines) if b["seq"] >= a]
        assert seqs == [a, a + 1, a + 2, c], seqs
        assert ev["events"][0]["hashes"] == [4]
        assert not [e for e in probe.lines if e["ev"] in ("reset", "error")], probe.lines
    finally:
        probe.p.kill()
        pub.close()


def test_gap_lost_and_restart_reset():
    pub = PyPublisher(buffer_steps=2)
    try:
        probe = Probe(*pub.endpoints, batches=10**6, timeout_ms=30000)
        connect_live(pub, probe)
        for k in range(4):
            pub.publish([removed([k])], live=False)  # more than the buffer holds
        s = pub.publish([removed([99])])
        probe.until(lambda e: e["ev"] == "reset" and "replay buffer" in e["why"])
        probe.until(lambda e: e["ev"] == "batch" and e["seq"] == s)
        pub.publish([removed([100])], seq=0)  # a new incarnation starts at 0 again
        probe.until(lambda e: e["ev"] == "reset" and "restarted" in e["why"])
        probe.until(lambda e: e["ev"] == "batch" and e["seq"] == 0)
    finally:
        probe.p.kill()
        pub.close()


def test_hostile_streams():
    """Each bad message ends the subscription with an error; the probe exits cleanly (2)."""
    bad = [
        [b"kv", (1).to_bytes(8, "big")],                      # two frames
        [b"kv", b"\x01\x02", b"\x90"],                          # short sequence
        [b"kv", (0).to_bytes(8, "big"), b"\xdd\xff\xff\xff\xff"],  # 4 G elements claimed
        [b"kv", (0).to_bytes(8, "big"), b"\x92\x01" + b"\x91" * 5000],  # nesting
        [b"kv", (0).to_bytes(8, "big"), msgpack.packb([1.0, [["BlockStored", [1], None, [1], 4]]])],
        [b"kv", (0).to_bytes(8, "big"), b"\x00" * (2 << 20)],  # past the 1 MiB payload limit
    ]
    for msg in bad:
        pub = PyPublisher()
        try:
            probe = Probe(*pub.endpoints, batches=10**6, timeout_ms=30000, sync=False)
            connect_live(pub, probe)
            seen = len(batches(probe.lines))
            pub.pub.send_multipart(msg)
            if len(msg[-1]) > (1 << 20):
                # ZMQ drops the connection at the size limit: the message never reaches Baton's
                # decoder, and the probe lives on (the owner resubscribes a silent stream).
                time.sleep(0.5)
                assert probe.p.poll() is None
                assert len(batches(probe.lines)) == seen
                probe.p.kill()
                continue
            probe.until(lambda e: e["ev"] == "error")
            assert probe.finish() == 2
        finally:
            if probe.p.poll() is None:
                probe.p.kill()
            pub.close()


def test_baton_publisher_read_by_python():
    """kvev_probe pub (Baton's encoder and replay ROUTER) decoded here with msgpack, for each
    encoding and reply form; the replay from 0 returns the batches published before we came."""
    for enc, reply_topic in (("map", 1), ("array", 0)):
        p = subprocess.Popen([PROBE, "pub", "tcp://127.0.0.1:*", "tcp://127.0.0.1:*", enc,
                              str(reply_topic), "3", "20"], stdout=subprocess.PIPE, text=True)
        try:
            ready = json.loads(p.stdout.readline())
            assert ready["ev"] == "ready", ready
            ep, rep = ready["endpoint"], ready["replay"]
            d = CTX.socket(zmq.DEALER)
            d.connect(rep)
            d.send_multipart([b"", (0).to_bytes(8, "big")])
            got = []
            while True:
                assert d.poll(10000)
                frames = d.recv_multipart()
                assert frames[0] == b""
                frames = frames[1:]
                assert len(frames) == (3 if reply_topic else 2), frames
                seq = int.from_bytes(frames[-2], "big", signed=True)
                if seq == -1:
                    assert frames[-1] == b"" and (not reply_topic or frames[0] == b"")
                    break
                if reply_topic:
                    assert frames[0] == b"kv"
                got.append((seq, msgpack.unpackb(frames[-1], raw=False)))
            d.close(0)
            assert [s for s, _ in got[:3]] == [0, 1, 2]
            ts, events, dp = got[1][1]
            assert dp == 0 and len(events) == 1
            ev = events[0]
            if enc == "map":
                assert ev["type"] == "BlockStored" and ev["block_hashes"][0] == 1002
                assert ev["block_hashes"][1] == bytes([1]) * 32 and ev["token_ids"] == list(range(8, 16))
                assert ev["block_size"] == 4 and ev["medium"] == "GPU" and ev["parent_block_hash"] is None
            else:
                assert ev[0] == "BlockStored" and ev[1] == [1002, bytes([1]) * 32]
                assert ev[2] is None and ev[3] == list(range(8, 16)) and ev[4] == 4 and ev[6] == "GPU"
            sub = CTX.socket(zmq.SUB)
            sub.setsockopt(zmq.SUBSCRIBE, b"")
            sub.connect(ep)
            assert sub.poll(10000)
            topic, seq, payload = sub.recv_multipart()
            assert topic == b"kv" and int.from_bytes(seq, "big") >= 3
            msgpack.unpackb(payload)
            sub.close(0)
        finally:
            p.kill()
            p.wait()


def replay_all(rep, start=0):
    """Every batch the replay endpoint holds from start, decoded here."""
    d = CTX.socket(zmq.DEALER)
    d.connect(rep)
    d.send_multipart([b"", start.to_bytes(8, "big")])
    got = []
    while True:
        assert d.poll(10000), "no replay reply"
        frames = d.recv_multipart()[1:]
        seq = int.from_bytes(frames[-2], "big", signed=True)
        if seq == -1:
            break
        got.append((seq, msgpack.unpackb(frames[-1], raw=False)))
    d.close(0)
    return got


def test_worker_publishes_its_cache():
    """baton-worker --kv-events-endpoint: each prompt's whole pages as BlockStored (chained by
    parent, the page's token ids, medium GPU), evictions as BlockRemoved of the same hashes."""
    from harness import Cluster, post
    any_port = "tcp://127.0.0.1:*"
    with Cluster("kv-events-worker") as c:
        w = c.worker("regular", "--decode-us-per-token", "0", "--prefill-us-per-token", "0",
                     "--page-tokens", "4", "--cache-tokens", "8",
                     "--kv-events-endpoint", any_port, "--kv-events-replay-endpoint", any_port)
        rep = f"tcp://127.0.0.1:{w.wait_port('kvreplay')}"
        a = [11, 12, 13, 14, 15, 16, 17, 18, 19, 20]
        assert post(w.port, "/generate", {"input_ids": a, "sampling_params": {"max_new_tokens": 1}}).status == 200
        got = wait_until(lambda: replay_all(rep) or None, what="the first batch")
        assert [s for s, _ in got] == [0]
        ts, events, dp = got[0][1]
        assert dp == 0 and [e["type"] for e in events] == ["BlockStored", "BlockStored"], events
        first, second = events
        assert first["token_ids"] == a[0:4] and second["token_ids"] == a[4:8]
        assert first["parent_block_hash"] is None and second["parent_block_hash"] == first["block_hashes"][0]
        assert first["block_size"] == 4 and first["medium"] == "GPU"
        b = [31, 32, 33, 34, 35]  # one page more than the capacity leaves: the oldest leaf goes
        assert post(w.port, "/generate", {"input_ids": b, "sampling_params": {"max_new_tokens": 1}}).status == 200
        got = wait_until(lambda: [x for x in replay_all(rep) if x[0] == 1] or None, what="the second batch")
        events = got[0][1][1]
        assert [e["type"] for e in events] == ["BlockRemoved", "BlockStored"], events
        assert events[0]["block_hashes"] == second["block_hashes"]
        assert events[1]["token_ids"] == b[0:4] and events[1]["parent_block_hash"] is None
        # The same pages in another worker process hash the same (no seed, no addresses).
        w.stop()
        w2 = c.worker("regular", "--page-tokens", "4", "--cache-tokens", "8",
                      "--kv-events-endpoint", any_port, "--kv-events-replay-endpoint", any_port)
        rep2 = f"tcp://127.0.0.1:{w2.wait_port('kvreplay')}"
        assert post(w2.port, "/generate", {"input_ids": a, "sampling_params": {"max_new_tokens": 1}}).status == 200
        again = wait_until(lambda: replay_all(rep2) or None, what="the restarted worker's batch")
        assert again[0][1][1][0]["block_hashes"] == first["block_hashes"]


if __name__ == "__main__":
    r = TestRunner()
    for t in (test_map_events_topic_replies, test_array_events_seq_replies, test_map_batch,
              test_gap_replayed, test_gap_lost_and_restart_reset, test_hostile_streams,
              test_baton_publisher_read_by_python, test_worker_publishes_its_cache):
        r.run(t)
    r.finish()
