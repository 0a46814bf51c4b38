"""test_kv_bootstrap_guard.py — what a prefill worker's KV bootstrap port holds for peers that have
not finished (or authenticated) their handshake: a frame other than AUTH / HELLO / LANE_HELLO is
refused from its header before its body is read, with and without --kv-secret-file; pending
connections are capped per engine and per address and their read buffers charged to a budget
(all three in /metrics); a flood of idle connections leaves the worker's /health and routed
traffic working (the descriptor limit is raised, as the router does); their close lines are
rate-limited."""

import os
import socket
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from harness import Cluster, get, post, wait_until  # noqa: E402

from kv_attacks import F_HELLO, F_OFFER, HELLO_MAX, header  # noqa: E402

FAST = ("--prefill-us-per-token", "10", "--decode-us-per-token", "200")


def metric(port, name):
    for line in get(port, "/metrics").text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    return None


def write_secret(dirname):
    path = os.path.join(dirname, "kv-secret")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write("a secret shared by this test's engines\n")
    return path


def connect(port, src="127.0.0.1", timeout=10.0):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.settimeout(timeout)
    s.bind((src, 0))
    s.connect((harness.HOST, port))
    return s


def closed_by_peer(s, timeout=20.0):
    """True once the worker closed s (EOF or reset) within timeout."""
    s.settimeout(timeout)
    try:
        while True:
            if s.recv(65536) == b"":
                return True
    except (ConnectionResetError, BrokenPipeError):
        return True
    except socket.timeout:
        return False


def raise_own_fd_limit(n):
    import resource
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < n:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(n, hard), hard))
    if resource.getrlimit(resource.RLIMIT_NOFILE)[0] < n:
        raise harness.SkipTest(f"this test needs {n} descriptors")


def test_frame_refused_from_header():
    """A header announcing a 2 MiB OFFER on a fresh connection is refused at once — before its
    body arrives and long before the handshake timeout — with and without a secret, and counted."""
    with Cluster("kv-guard-header") as c:
        secret = write_secret(c.logdir)
        for extra in ((), ("--kv-secret-file", secret)):
            p = c.worker("prefill", *FAST, *extra, name=f"prefill{len(extra)}")
            boot = p.wait_port("bootstrap")
            s = connect(boot)
            s.sendall(header(F_OFFER, 2 << 20) + b"\0" * 4096)
            assert closed_by_peer(s), "the worker kept reading an OFFER before the handshake"
            s.close()
            if extra:
                p.wait_log(r'kv_auth_refused .*reason="frame before authentication"')
                assert metric(p.port, "baton_kv_auth_failures_total") >= 1
            else:
                p.wait_log(r'conn_closed .*reason="unexpected OFFER frame')
                assert metric(p.port, "baton_kv_frames_rejected_total") >= 1
            assert not any("handshake timed out" in ln for ln in open(p.log_path))


BUDGET = 131072


def test_pending_caps_and_budget():
    """Pending connections beyond --kv-max-pending-per-addr (from one address) and
    --kv-max-pending (from two) are closed at once; half-sent HELLOs beyond the
    --kv-pending-buffer-bytes budget are closed; the gauges never pass their caps."""
    raise_own_fd_limit(512)
    with Cluster("kv-guard-caps") as c:
        # The budget holds the 30 pending connections' first 4 KiB buffers (122,880 bytes), so
        # the first phase meets the connection caps, never the budget, in any read order.
        p = c.worker("prefill", *FAST, "--kv-max-pending", "30", "--kv-max-pending-per-addr",
                     "20", "--kv-pending-buffer-bytes", str(BUDGET))
        boot = p.wait_port("bootstrap")
        socks = []
        for src in ("127.0.0.2", "127.0.0.3"):
            for _ in range(40):
                s = connect(boot, src)
                s.sendall(header(F_HELLO, HELLO_MAX)[:4])  # one read each: a buffer is charged
                socks.append(s)
        wait_until(lambda: metric(p.port, "baton_kv_connections_refused_total") >= 1,
                   what="refusals over the pending caps")
        assert metric(p.port, "baton_kv_pending_connections") <= 30
        assert metric(p.port, "baton_kv_pending_buffer_bytes") <= BUDGET
        p.wait_log(r'conn_refused .*reason="too many pending connections')
        for s in socks:
            s.close()
        wait_until(lambda: metric(p.port, "baton_kv_pending_connections") == 0,
                   what="pending connections released")
        assert metric(p.port, "baton_kv_pending_buffer_bytes") == 0
        # Half-sent HELLOs (allowed, bounded by the type) fill the buffer budget: the ones past
        # it are closed, the budget is never passed.
        refused0 = metric(p.port, "baton_kv_connections_refused_total")
        socks = []
        for i in range(16):  # 16 x >= 12 KiB buffers pass the budget
            s = connect(boot, "127.0.0.%d" % (4 + i))
            try:
                s.sendall(header(F_HELLO, HELLO_MAX) + b"\x04\x00" + b"\0" * 12000)
            except (ConnectionResetError, BrokenPipeError):
                pass
            socks.append(s)
        wait_until(lambda: metric(p.port, "baton_kv_connections_refused_total") > refused0,
                   what="a refusal over the buffer budget")
        assert metric(p.port, "baton_kv_pending_buffer_bytes") <= BUDGET
        p.wait_log(r'reason="pending read budget')
        for s in socks:
            s.close()
        # and the worker still serves a well-behaved pair afterwards
        d = c.worker("decode", *FAST)
        r = c.router("--prefill", harness.url(p.port), str(boot), "--decode", harness.url(d.port))
        res = post(r.port, "/generate", {"text": "still fine", "sampling_params":
                                         {"max_new_tokens": 3}})
        assert res.status == 200, res.text


def test_flood_keeps_http_serving():
    """~1,500 idle connections to the KV port of a prefill started with a soft descriptor limit
    of 1024: the worker raised it, its /health answers and PD requests through a router succeed
    during the flood; its conn_closed / conn_refused lines are rate-limited."""
    raise_own_fd_limit(4096)
    with Cluster("kv-guard-flood") as c:
        exe = harness.binary("baton-worker")
        argv = ["sh", "-c", 'ulimit -Sn 1024 && exec "$@"', "sh", exe, "--mode", "prefill",
                "--host", harness.HOST, "--port", "0", "--bootstrap-port", "0", *FAST]
        p = c.start("prefill", argv, wait=("http", "bootstrap"))
        d = c.worker("decode", *FAST)
        boot = p.wait_port("bootstrap")
        r = c.router("--prefill", harness.url(p.port), str(boot), "--decode", harness.url(d.port))
        socks = []
        try:
            for _ in range(1500):
                try:
                    socks.append(connect(boot, "127.0.0.2", timeout=5.0))
                except OSError:
                    pass  # a backlog full under load: the flood is what was sent
            assert len(socks) >= 1000, len(socks)
            assert get(p.port, "/health", timeout=10).status == 200
            for i in range(3):
                res = post(r.port, "/generate", {"text": f"during the flood {i}",
                                                 "sampling_params": {"max_new_tokens": 3}})
                assert res.status == 200, res.text
        finally:
            for s in socks:
                s.close()
        with open(f"/proc/{p.p.pid}/limits") as f:
            soft = [ln.split()[3] for ln in f if ln.startswith("Max open files")][0]
        assert soft == "unlimited" or int(soft) > 1024, f"soft descriptor limit {soft}"
        time.sleep(1.2)  # the next line in a later second carries the suppression summary
        s = connect(boot)
        s.close()
        p.wait_log(r"log_suppressed event=conn_(closed|refused)")
        lines = [ln for ln in open(p.log_path) if "conn_closed" in ln or "conn_refused" in ln]
        assert len(lines) < 300, f"{len(lines)} close lines for 1500 connections"


def main():
    t = harness.TestRunner()
    for fn in (test_frame_refused_from_header, test_pending_caps_and_budget,
               test_flood_keeps_http_serving):
        t.run(fn)
    t.finish()


if __name__ == "__main__":
    main()
