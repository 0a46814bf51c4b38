"""router_attacks.py — hostile clients and hostile workers against the router, one function
each, reusable by any test (the hardening tests, the soak): clients that never read their
streams, that half-close, that send huge bodies; upstream scripts (router_upstream.Upstream)
that never end an SSE event, send an endless answer, or close in the middle of an event.
Standard library only."""

import json
import socket
import time

HOST = "127.0.0.1"


def _post_bytes(path, body, host=HOST, extra=b""):
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    return (f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(data)}\r\n").encode() + extra + b"\r\n" + data


# ---- clients ----

def half_closed_request(port, path, body, timeout=20.0):
    """Sends one whole request, half-closes (shutdown SHUT_WR) and reads until the router
    closes. Returns the raw bytes received."""
    s = socket.create_connection((HOST, port), timeout=timeout)
    try:
        s.sendall(_post_bytes(path, body))
        s.shutdown(socket.SHUT_WR)
        out = b""
        while True:
            d = s.recv(65536)
            if not d:
                return out
            out += d
    finally:
        s.close()


def idle_stream_readers(port, n, path, body, rcvbuf=4096):
    """Opens n streamed requests and never reads them (a small receive buffer so the router's
    writes back up soon). Returns the sockets; close them with close_all()."""
    socks = []
    for _ in range(n):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        s.settimeout(10)
        s.connect((HOST, port))
        s.sendall(_post_bytes(path, body))
        socks.append(s)
    return socks


def close_all(socks):
    for s in socks:
        try:
            s.close()
        except OSError:
            pass


def raw_request(port, raw, timeout=10.0):
    """Sends raw bytes, returns what comes back until the router closes (or timeout)."""
    s = socket.create_connection((HOST, port), timeout=timeout)
    out = b""
    try:
        s.sendall(raw)
        while True:
            try:
                d = s.recv(65536)
            except socket.timeout:
                break
            if not d:
                break
            out += d
    finally:
        s.close()
    return out


# ---- hostile workers: scripts for router_upstream.Upstream ----

def endless_event_script(chunk=64 * 1024, total=64 << 20, ctype_sse=True):
    """A decode that starts an SSE stream and sends `total` bytes of one event that never ends
    (no blank line). Stops when the router closes the connection."""
    def script(req, io):
        io.start_sse()
        line = b"data: " + b"x" * (chunk - 6)
        sent = 0
        try:
            while sent < total:
                io.chunk(line)
                sent += len(line)
            io.end_sse()
        except Exception:  # noqa: BLE001 — the router closed the leg: what we want
            req.notes["stopped_at"] = sent
            io.keep_alive = False
            return
        req.notes["stopped_at"] = sent
    return script


def endless_body_script(chunk=64 * 1024, total=512 << 20):
    """A worker whose non-streamed JSON answer never ends (chunked, `total` bytes of it)."""
    def script(req, io):
        io._send(b"HTTP/1.1 200 X\r\nContent-Type: application/json\r\n"
                 b"Transfer-Encoding: chunked\r\n\r\n")
        sent = 0
        piece = b'{"text":"' + b"y" * (chunk - 9)
        try:
            while sent < total:
                io.chunk(piece)
                sent += len(piece)
            io.end_sse()
        except Exception:  # noqa: BLE001
            io.keep_alive = False
        req.notes["stopped_at"] = sent
    return script


def partial_event_then_close_script(events=2, partial=b'data: {"text":"trunc'):
    """A decode that streams `events` whole events, then part of one, then closes (RST)."""
    def script(req, io):
        io.start_sse()
        for i in range(events):
            io.event({"text": f"t{i}", "index": 0})
        io.chunk(partial)
        time.sleep(0.05)
        io.die()
    return script


def rss_kb(pid):
    with open(f"/proc/{pid}/status") as f:
        for ln in f:
            if ln.startswith("VmRSS:"):
                return int(ln.split()[1])
    return 0
