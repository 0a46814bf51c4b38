"""test_limits.py — resource exhaustion as an attacker would try it: the router out of
file descriptors (a low RLIMIT_NOFILE set in its child) backs off instead of spinning, writes a
bounded log, and recovers by itself; 30 clients sending big bodies and stalling keep the
router's RSS within --max-buffered-bytes plus a bound, while normal requests still succeed and
the waiting bodies get 503 server_busy after the body timeout."""

import os
import re
import socket
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from harness import HOST, Cluster, TestRunner, binary, get, post, wait_until  # noqa: E402
from router_upstream import Upstream  # noqa: E402

GEN = {"text": "hello", "sampling_params": {"max_new_tokens": 4}}
MiB = 1024 * 1024

# Runs the router with a descriptor limit of its own (the test's limits stay as they are).
LIMITED = ("import os, resource, sys; n = int(sys.argv[1]); "
           "resource.setrlimit(resource.RLIMIT_NOFILE, (n, n)); "
           "os.execv(sys.argv[2], sys.argv[2:])")


def cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_bytes(pid):
    with open(f"/proc/{pid}/status") as f:
        for ln in f:
            if ln.startswith("VmRSS:"):
                return int(ln.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def test_fd_exhaustion():
    with Cluster("limits-fd") as c:
        argv = [sys.executable, "-c", LIMITED, "64", binary("baton"), "--host", HOST, "--port",
                "0", "--threads", "1", "--check-interval-ms", "0"]
        r = c.start("router", argv)
        m = r.wait_log(r"fd_limit soft_before=64 soft=64 hard=64 max_connections=(\d+)")
        assert int(m.group(1)) == 32, m.group(0)  # half the descriptors for clients
        r.wait_log(r"max_connections_lowered from=10000 to=32")
        assert get(r.port, "/health").status == 200
        log_before = os.path.getsize(r.log_path)
        cpu0 = cpu_seconds(r.p.pid)
        t0 = time.monotonic()
        socks = []
        try:
            for _ in range(300):  # far more than 64 descriptors; the backlog holds the rest
                s = socket.socket()
                s.settimeout(5)
                s.connect((HOST, r.port))
                socks.append(s)
            r.wait_log(r"accept_paused err=too many open files")
            time.sleep(3.0)  # held at the limit: a spinning router would burn ~3 s of CPU here
            held = time.monotonic() - t0
            cpu = cpu_seconds(r.p.pid) - cpu0
            assert cpu < 0.5 * held, (cpu, held)
            grown = os.path.getsize(r.log_path) - log_before
            assert grown < 64 * 1024, grown  # the issue measured 400 MB in 4 s
            paused = len(re.findall(r"accept_paused", r.tail(100000)))
            assert paused <= 10 * (int(held) + 2), paused
            assert r.alive()
        finally:
            for s in socks:
                s.close()
        # descriptors free up: service resumes by itself
        wait_until(lambda: get(r.port, "/health", timeout=3).status == 200, timeout=20,
                   what="router serving again after the descriptor flood")
        ok = sum(get(r.port, "/health", timeout=5).status == 200 for _ in range(20))
        assert ok == 20, ok


def attack(port, n_clients, offered, content_length):
    """n_clients each announce content_length bytes, send up to `offered` of them as fast as
    the router takes them, then stall. Returns the sockets (still open)."""
    socks = []
    for _ in range(n_clients):
        s = socket.create_connection((HOST, port), timeout=5)
        s.sendall(f"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  f"Content-Length: {content_length}\r\n\r\n".encode())
        s.setblocking(False)
        socks.append([s, 0])
    block = b"x" * (256 * 1024)
    deadline = time.monotonic() + 4.0
    while time.monotonic() < deadline:
        progress = False
        for e in socks:
            if e[1] >= offered:
                continue
            try:
                e[1] += e[0].send(block[:offered - e[1]])
                progress = True
            except (BlockingIOError, InterruptedError):
                pass
        if not progress:
            time.sleep(0.05)
    return socks


def test_memory_budget():
    budget = 32 * MiB
    with Upstream("regular") as w, Cluster("limits-mem") as c:
        r = c.router("--worker", w.url, "--threads", "1", "--check-interval-ms", "0",
                     "--max-buffered-bytes", str(budget), "--body-timeout-ms", "4000")
        assert post(r.port, "/generate", GEN).status == 200
        rss0 = rss_bytes(r.p.pid)
        # 30 clients x 8 MiB offered = 240 MiB (each announcing 59 MB, under the 64 MiB limit)
        socks = attack(r.port, 30, 8 * MiB, 59 * 1000 * 1000)
        try:
            sent = sum(e[1] for e in socks)
            rss = rss_bytes(r.p.pid)
            # the budget, its small-body reserve (1/8), one read per thread, and slack for the
            # allocator (without a budget this attack grows RSS by ~240 MiB)
            bound = budget + budget // 8 + 16 * MiB
            assert rss - rss0 <= bound, (rss - rss0, bound, sent)
            r.wait_log(r"body_waits_for_budget")
            # normal requests still succeed while the big bodies wait
            for _ in range(5):
                res = post(r.port, "/generate", GEN, timeout=10)
                assert res.status == 200, res.text
            # after the body timeout the waiting bodies are answered 503 server_busy
            busy = 0
            t_end = time.monotonic() + 15
            for e in socks:
                e[0].setblocking(True)
                e[0].settimeout(max(0.1, t_end - time.monotonic()))
                try:
                    head = e[0].recv(4096)
                except OSError:
                    continue
                if head.startswith(b"HTTP/1.1 503") and b"server_busy" in head:
                    busy += 1
            assert busy > 0, "no waiting body got 503 server_busy"
            assert rss_bytes(r.p.pid) - rss0 <= bound
        finally:
            for e in socks:
                e[0].close()
        # everything is given back: a big body within the budget goes through afterwards
        big = {"text": "y" * (4 * MiB), "sampling_params": {"max_new_tokens": 1}}
        wait_until(lambda: post(r.port, "/generate", big, timeout=10).status == 200, timeout=15,
                   what="a 4 MiB body accepted after the attack")


def main():
    t = TestRunner()
    t.run(test_fd_exhaustion)
    t.run(test_memory_budget)
    t.finish()


if __name__ == "__main__":
    main()
