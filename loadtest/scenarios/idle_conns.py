#!/usr/bin/env python3
"""idle_conns.py — scenario 3: memory held by idle keep-alive client connections.

Opens N keep-alive connections to Baton (and to nginx, when installed, as a reference), makes
one request on each so it is a real served keep-alive connection, leaves them all open and idle,
and reads the proxy's VmRSS (/proc/PID/status) before and after: RSS per connection. Checks at
the end that a sample of the idle connections still serves a request.
"""

import os
import random
import socket
import sys
import time

import scenlib

REQ = b"GET /health HTTP/1.1\r\nHost: bench\r\n\r\n"


def read_response(s):
    """Reads one small HTTP response (Content-Length framed); returns its status."""
    buf = b""
    while b"\r\n\r\n" not in buf:
        chunk = s.recv(4096)
        if not chunk:
            raise RuntimeError("connection closed before the response")
        buf += chunk
    head, _, body = buf.partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    status = int(lines[0].split()[1])
    length = 0
    for ln in lines[1:]:
        k, _, v = ln.partition(b":")
        if k.strip().lower() == b"content-length":
            length = int(v.strip())
    while len(body) < length:
        chunk = s.recv(4096)
        if not chunk:
            raise RuntimeError("connection closed in the body")
        body += chunk
    return status


def rss_of(proc, with_children):
    pids = [proc.pid] + (scenlib.children(proc.pid) if with_children else [])
    return sum(scenlib.rss_kib(p) for p in pids)


def measure(name, proc, port, n, with_children=False, settle=1.0):
    # A few requests first, so lazily allocated per-thread state is not counted per connection.
    for _ in range(20):
        s = socket.create_connection((scenlib.HOST, port), timeout=10)
        s.sendall(REQ)
        read_response(s)
        s.close()
    time.sleep(settle)
    before = rss_of(proc, with_children)
    socks = []
    try:
        t0 = time.monotonic()
        for i in range(n):
            s = socket.create_connection((scenlib.HOST, port), timeout=30)
            s.sendall(REQ)
            st = read_response(s)
            if st != 200:
                raise RuntimeError(f"{name}: connection {i}: GET /health answered {st}")
            socks.append(s)
        opened_s = time.monotonic() - t0
        time.sleep(settle)
        after = rss_of(proc, with_children)
        # The connections are still alive and served: a sample of them asks once more.
        sample = random.Random(1).sample(socks, min(100, len(socks)))
        for s in sample:
            s.sendall(REQ)
            if read_response(s) != 200:
                raise RuntimeError(f"{name}: an idle connection no longer serves requests")
    finally:
        for s in socks:
            s.close()
    delta = after - before
    return {"path": name, "connections": n, "rss_before_kib": before, "rss_after_kib": after,
            "delta_kib": delta, "per_conn_bytes": delta * 1024 / n, "open_s": opened_s,
            "alive_checked": len(sample)}


def main():
    ap = scenlib.arg_parser(__doc__.split("\n")[0])
    ap.add_argument("--connections", type=int, default=10000)
    args = ap.parse_args()
    if args.smoke:
        args.connections = 300
    n = args.connections
    print("== Scenario 3: idle keep-alive connection memory ==")
    print(scenlib.machine_line())
    # Every connection is a descriptor here and in the proxy (children inherit the limit).
    # The router keeps half its descriptors for client connections (main.c raise_fd_limit).
    limit = scenlib.raise_nofile(2 * n + 1024)
    if limit < n + 256:
        print(f"SKIPPED: the descriptor limit is {limit}, need {n + 256} "
              f"(raise it: ulimit -n {2 * n + 1024})")
        return 0
    rows = []
    figures = {"config": vars(args), "runs": []}
    with scenlib.Lab(args, "idle") as lab:
        w = lab.worker("regular", "--prefill-us-per-token", 0, "--decode-us-per-token", 0)
        # One thread: its listener takes every connection (with several, the kernel spreads
        # them unevenly and each instance has its own cap); memory per connection is the same.
        r = lab.router("--worker", w.url, "--max-connections", n + 1000, "--threads", 1,
                       "--keepalive-timeout-ms", 600000)
        res = measure("baton", r, r.port, n)
        figures["runs"].append(res)
        ngx = lab.nginx([w.port])
        if ngx:
            res_n = measure("nginx", ngx, ngx.port, n, with_children=True)
            figures["runs"].append(res_n)
        else:
            scenlib.skip_note("nginx is not installed: no nginx row")
        for x in figures["runs"]:
            rows.append([x["path"], x["connections"], x["rss_before_kib"] / 1024,
                         x["rss_after_kib"] / 1024, x["delta_kib"] / 1024,
                         x["per_conn_bytes"] / 1024, x["delta_kib"] / 1024 * 10000 / n,
                         x["alive_checked"]])
        scenlib.print_table(
            f"{n} idle keep-alive connections (one GET /health served on each)",
            ["path", "conns", "RSS before MiB", "RSS after MiB", "delta MiB", "KiB/conn",
             "MiB per 10k", "alive checked"], rows,
            note="nginx: master + worker processes summed. Design target for Baton: "
                 "10,000 idle connections in <= 100 MiB.")
    scenlib.write_json(args.json, figures)
    print(f"\nscenario 3 done; {scenlib.load_now()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
