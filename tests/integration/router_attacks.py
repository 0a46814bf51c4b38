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


def dechunk(raw):
    """The body of a raw HTTP/1.1 response (chunked or not) and its status: (status, body,
    complete). A cut chunked body gives what arrived and complete=False."""
    head, _, rest = raw.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1]) if head.startswith(b"HTTP/") else 0
    if b"transfer-encoding: chunked" not in head.lower():
        return status, rest, True
    body = b""
    while True:
        line, sep, rest = rest.partition(b"\r\n")
        if not sep:
            return status, body, False
        n = int(line.split(b";")[0] or b"0", 16)
        if n == 0:
            return status, body, True
        if len(rest) < n + 2:
            return status, body + rest[:n], False
        body += rest[:n]
        rest = rest[n + 2:]


def stream_request(port, path, body, timeout=30.0):
    """POSTs a request and reads the whole answer until the router closes or ends the
    response: (status, de-chunked body, complete)."""
    s = socket.create_connection((HOST, port), timeout=timeout)
    out = b""
    try:
        s.sendall(_post_bytes(path, body, extra=b"Connection: close\r\n"))
        while True:
            d = s.recv(65536)
            if not d:
                break
            out += d
    finally:
        s.close()
    return dechunk(out)


def whatwg_sse_events(body):
    """The events an EventSource sees in `body`, by the WHATWG HTML "event stream
    interpretation" algorithm: lines end at CRLF, LF or CR; a blank line dispatches the event
    (its data lines joined with LF); fields without a colon are names with an empty value; an
    event not ended by a blank line when the stream ends is discarded. Returns the data
    strings of the dispatched events that had data."""
    text = body.decode("utf-8", errors="replace")
    if text.startswith("\ufeff"):
        text = text[1:]
    events, data, i, n = [], [], 0, len(text)
    while i < n:
        j = i
        while j < n and text[j] not in "\r\n":
            j += 1
        if j == n:
            break  # an incomplete line at the end of the stream is never processed
        line = text[i:j]
        i = j + 2 if text.startswith("\r\n", j) else j + 1
        if line == "":
            if data:
                events.append("\n".join(data))
            data = []
            continue
        if line.startswith(":"):
            continue
        name, colon, value = line.partition(":")
        if colon and value.startswith(" "):
            value = value[1:]
        if name == "data":
            data.append(value)
    return events


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
