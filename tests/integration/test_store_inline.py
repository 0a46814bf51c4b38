#!/usr/bin/env python3
"""baton-store inline reads: a small object's bytes asked of its node over the node's control port
(NODE_READ) instead of the engines. The bytes come back exact; a node that refuses (its
--inline-max), restarts behind a cached location (its fresh segment answers bytes whose checksum
does not match) or is gone leaves the read to the engine path in the same call; the node refuses
hostile NODE_READ frames cleanly and stops reading a client that does not read its answers."""

import json
import os
import random
import re
import socket
import struct
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import harness  # noqa: E402
from harness import HOST, TestRunner  # noqa: E402
from test_store import Store, bench_lines  # noqa: E402

NODE_READ, REPLY = 33, 64
EINVAL, ETOOBIG, ERKEY = -20001, -20006, -20022
INLINE_RE = r"node_inline reads=(\d+) bytes=(\d+) refused=(\d+) slow_readers_paused=(\d+)"


def inline_counts(node):
    """The node's last logged inline counters (reads, bytes, refused, paused), or zeros."""
    last = (0, 0, 0, 0)
    for line in node.tail(100000).splitlines():
        m = re.search(INLINE_RE, line)
        if m:
            last = tuple(int(x) for x in m.groups())
    return last


def frame(ftype, req_id, slices=(), body_tail=None):
    """A store control frame (proto.h's layout) with the given slices (off, len)."""
    body = b"\x00\x00\x00"  # id, ns, host: empty
    body += struct.pack("<IIHHQIIQiI", 0, 0, 0, 0, 0, 0, 0, 0, 0, 0)
    body += b"\x00" * 64  # nonce, mac
    body += struct.pack("<HH", 0, 0)  # items, ritems
    body += struct.pack("<I", len(slices))
    for off, ln in slices:
        body += struct.pack("<IIQQ", 0, 0, off, ln)
    body += struct.pack("<HI", 0, 0)  # nodes, text
    if body_tail is not None:
        body = body_tail
    return struct.pack("<IBBHII", 0x52545342, 1, ftype, 0, req_id, len(body)) + body


def recv_exact(s, n):
    buf = b""
    while len(buf) < n:
        chunk = s.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("closed")
        buf += chunk
    return buf


def read_reply(s):
    """(req_id, status, text) of one REPLY frame."""
    magic, ver, ftype, _, req_id, blen = struct.unpack("<IBBHII", recv_exact(s, 16))
    assert magic == 0x52545342 and ftype == REPLY, (magic, ftype)
    body = recv_exact(s, blen)
    at = 0
    for _ in range(3):  # id, ns, host
        at += 1 + body[at]
    status, = struct.unpack_from("<i", body, at + 36)
    at += 36 + 8 + 64 + 2 + 2
    n_slices, = struct.unpack_from("<I", body, at)
    at += 4 + 24 * n_slices
    n_nodes, = struct.unpack_from("<H", body, at)
    assert n_nodes == 0
    text_len, = struct.unpack_from("<I", body, at + 2)
    return req_id, status, body[at + 6:at + 6 + text_len]


def ask(port, slices, req_id=1):
    with socket.create_connection((HOST, port), timeout=10) as s:
        s.sendall(frame(NODE_READ, req_id, slices))
        return read_reply(s)


def test_inline_bytes():
    """Objects up to the threshold come back exact through the nodes' control ports (the nodes
    count them), larger ones through the engines; nothing is refused. A batch is read inline
    only when it totals at most the threshold."""
    with harness.Cluster("store-inline-bytes") as c:
        st = Store(c, nodes=2)
        rnd = random.Random(23)
        sizes = [1, 63, 4096, 65536, 65537, 300000]
        objs = {f"o{i}": rnd.randbytes(n) for i, n in enumerate(sizes)}
        for k, v in objs.items():
            rc, out = st.put(k, v)
            assert rc == 0, out
        for k, v in objs.items():
            rc, data, err = st.get(k)
            assert rc == 0, f"get {k}: {err}"
            assert data == v, f"{k} ({len(v)} bytes): the bytes read back differ"
        small = sum(len(v) for v in objs.values() if len(v) <= 65536)

        def counted():
            got = [inline_counts(n) for n in st.nodes]
            return sum(g[0] for g in got) >= 4 and sum(g[1] for g in got) >= small

        harness.wait_until(counted, timeout=20, what="the nodes' inline reads logged")
        assert all(inline_counts(n)[2] == 0 for n in st.nodes)
        # a batch is read inline only when it totals at most the threshold (64 KiB)
        for batch, inline in ((8, 2 * 8), (32, 0)):
            p = subprocess.run([harness.binary("baton-store"), "bench", "--master", st.addr,
                                "--kv-secret-file", st.secret, "--size", "4K", "--batch",
                                str(batch), "--rounds", "1", "--reads", "2"],
                               capture_output=True, text=True, timeout=120)
            assert p.returncode == 0, p.stdout + p.stderr
            summary = json.loads(p.stdout.splitlines()[-1])
            assert summary["corrupted"] == 0 and summary["get_ok"] == 2 * batch, summary
            assert summary["inline_reads"] == inline and summary["inline_fallbacks"] == 0, summary


def test_inline_refused_falls_back():
    """A node that answers at most 1 KiB inline refuses a 4 KiB read (BATON_XFER_ETOOBIG); the
    client reads the object through the engines in the same call: exact bytes, exit 0."""
    with harness.Cluster("store-inline-refused") as c:
        st = Store(c, nodes=1, node_args=("--inline-max", "1K"))
        data = os.urandom(4096)
        assert st.put("big", data)[0] == 0
        small = os.urandom(1000)
        assert st.put("small", small)[0] == 0
        rc, got, err = st.get("big")
        assert rc == 0 and got == data, err
        rc, got, err = st.get("small")
        assert rc == 0 and got == small, err
        harness.wait_until(lambda: inline_counts(st.nodes[0])[2] >= 1 and
                           inline_counts(st.nodes[0])[0] >= 1, timeout=20,
                           what="one inline read refused, one served")


def test_inline_node_restarted():
    """A client reads located objects (replicas 2) every 400 ms while the node serving them inline
    is killed and restarted on the same control port: the old connection breaks, the new node
    answers from its fresh segment (bytes whose CRC32C does not match), and every read falls back
    to the engines and the other replica in the same call; no byte comes back wrong."""
    with harness.Cluster("store-inline-restart") as c:
        st = Store(c, nodes=0, master_args=("--lease-ttl-ms", "30000"))
        ports = harness.free_ports(2)
        argv = lambda i: [harness.binary("baton-store"), "node", "--master", st.addr,  # noqa
                          "--segment-bytes", "16M", "--id", f"n{i}", "--host", HOST,
                          "--port", str(ports[i]), "--kv-secret-file", st.secret]
        nodes = [c.start(f"n{i}", argv(i), wait=("node", "bootstrap")) for i in range(2)]
        harness.wait_until(lambda: st.stat().get("nodes") == 2, timeout=20, what="2 nodes")
        p = subprocess.Popen([harness.binary("baton-store"), "bench", "--master", st.addr,
                              "--kv-secret-file", st.secret, "--size", "4K", "--batch", "16",
                              "--replicas", "2", "--rounds", "1", "--reads", "30",
                              "--read-interval-ms", "400"], stdout=subprocess.PIPE, text=True)
        harness.wait_until(lambda: any(inline_counts(n)[0] > 0 for n in nodes), timeout=20,
                           what="inline reads served")
        victim = next(i for i in range(2) if inline_counts(nodes[i])[0] > 0)
        nodes[victim].kill()
        again = c.start(f"n{victim}-again", argv(victim), wait=("node", "bootstrap"))
        out, _ = p.communicate(timeout=120)
        assert p.returncode == 0, out
        summary = [json.loads(x) for x in out.splitlines() if x.startswith("{")][-1]
        assert summary["corrupted"] == 0 and summary["missing"] == 0, summary
        assert summary["get_failed"] == 0 and summary["get_ok"] == 16 * 30, summary
        assert summary["inline_reads"] > 0 and summary["inline_fallbacks"] > 0, summary
        # the restarted node answered some of them: bytes the client's checksum refused
        again.stop()
        assert inline_counts(again)[0] > 0, again.tail(20)


def test_inline_own_progress():
    """Own-progress mode: a located 4 KiB object read 200 times from the calling thread (inline,
    its completion through the client's fd and dispatch), every byte compared, beside the mode's
    batch put / get / exists / remove and its orderly close."""
    with harness.Cluster("store-inline-own") as c:
        st = Store(c, nodes=2)
        p = subprocess.run([harness.binary("baton-store"), "bench", "--master", st.addr,
                            "--kv-secret-file", st.secret, "--size", "300K", "--batch", "4",
                            "--own-progress", "--latency", "200"],
                           capture_output=True, text=True, timeout=120)
        assert p.returncode == 0, p.stdout + p.stderr
        line = json.loads(p.stdout.splitlines()[-1])
        assert line["small_gets_ok"] == 200 and line["corrupted"] == 0, line
        assert line["inline_reads"] >= 200 and line["inline_fallbacks"] == 0, line


def test_inline_hostile_and_slow():
    """NODE_READ on a node's control port (no secret here, so raw frames reach it): too large,
    out of range, no slice, too many slices get their error replies on a connection that stays;
    malformed frames close the connection; a client that asks without reading is paused (counted)
    while another is served, and gets every answer once it reads."""
    with harness.Cluster("store-inline-hostile") as c:
        master = c.start("master", [harness.binary("baton-store"), "master", "--host", HOST,
                                    "--port", "0", "--http-port", "0"], wait=("master", "http"))
        addr = f"{HOST}:{master.wait_port('master')}"
        node = c.start("n0", [harness.binary("baton-store"), "node", "--master", addr,
                              "--segment-bytes", "16M", "--id", "n0", "--host", HOST],
                       wait=("node", "bootstrap"))
        port = node.wait_port("node")
        seg = 16 << 20
        assert ask(port, [(0, 65537)])[1] == ETOOBIG
        assert ask(port, [(seg - 10, 11)])[1] == ERKEY
        assert ask(port, [(0, 0)])[1] == ERKEY
        assert ask(port, [(1 << 63, 1)])[1] == ERKEY
        assert ask(port, [])[1] == EINVAL
        assert ask(port, [(0, 1)] * 65)[1] == EINVAL
        assert ask(port, [(0, 100), (4096, 28)]) == (1, 0, b"\x00" * 128)
        with socket.create_connection((HOST, port), timeout=10) as s:  # refusals keep it open
            s.sendall(frame(NODE_READ, 5, [(0, 1 << 20)]) + frame(NODE_READ, 6, [(0, 10)]))
            assert read_reply(s)[:2] == (5, ETOOBIG)
            assert read_reply(s) == (6, 0, b"\x00" * 10)
        good = frame(NODE_READ, 1, [(0, 16)])
        hostile = [good[:20], good[:16] + b"\xff" * (len(good) - 16),
                   frame(NODE_READ, 1, body_tail=b"\x00" * 10),
                   good[:-6] + struct.pack("<HI", 0, 1000),  # text longer than the frame
                   bytes(good[:5]) + b"\x63" + good[6:]]     # an unknown type
        for f in hostile:
            with socket.create_connection((HOST, port), timeout=10) as s:
                s.sendall(f)
                s.shutdown(socket.SHUT_WR)
                s.settimeout(5)
                try:
                    while s.recv(65536):
                        pass
                except (socket.timeout, ConnectionResetError):
                    pass
        assert node.alive()

        # a reader that does not read: far more answers than socket buffers and the bound hold
        n = 600
        slow = socket.socket()
        slow.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before connect: it sticks
        slow.settimeout(30)
        slow.connect((HOST, port))
        slow.sendall(b"".join(frame(NODE_READ, i, [(0, 65536)]) for i in range(n)))
        harness.wait_until(lambda: inline_counts(node)[3] >= 1, timeout=30,
                           what="the slow reader paused")
        assert ask(port, [(0, 8)])[1] == 0  # another client is served meanwhile
        for i in range(n):
            req_id, status, text = read_reply(slow)
            assert (req_id, status, len(text)) == (i, 0, 65536)
        slow.close()
        assert node.alive()


if __name__ == "__main__":
    r = TestRunner()
    r.run(test_inline_bytes)
    r.run(test_inline_refused_falls_back)
    r.run(test_inline_node_restarted)
    r.run(test_inline_own_progress)
    r.run(test_inline_hostile_and_slow)
    r.finish()
