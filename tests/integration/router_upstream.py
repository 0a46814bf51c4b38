"""router_upstream.py — a scriptable, recording HTTP/1.1 upstream for router tests.

Stands in for a prefill/decode/regular worker. Every request is recorded (path, headers, raw
body, parsed JSON, arrival time, end time, whether the router closed the connection on it).
What it answers is decided by `script(req, io)`, a function the test sets; `io` offers plain
JSON answers, SSE streams written event by event, holding the request until the router closes
it, and dying mid-stream. Standard library only; one thread per connection; keep-alive.
"""

import json
import select
import socket
import threading
import time
import traceback


class Request:
    def __init__(self, method, path, headers, body):
        self.method = method
        self.path = path
        self.headers = headers  # dict, lower-case names
        self.body = body
        self.t_start = time.monotonic()
        self.t_end = None
        self.closed_by_peer = False  # the router closed the connection while we served it
        self.t_closed = None
        self.notes = {}

    def json(self):
        return json.loads(self.body)


class PeerClosed(Exception):
    pass


class IO:
    """What a script uses to answer one request."""

    def __init__(self, upstream, sock, req):
        self.up = upstream
        self.sock = sock
        self.req = req
        self.keep_alive = True

    def _send(self, data):
        try:
            self.sock.sendall(data)
        except OSError as e:
            self._mark_closed()
            raise PeerClosed() from e

    def _mark_closed(self):
        if not self.req.closed_by_peer:
            self.req.closed_by_peer = True
            self.req.t_closed = time.monotonic()
            with self.up.cond:
                self.up.cond.notify_all()

    def peer_closed(self, timeout=0.0):
        """True when the router closed (or reset) the connection; waits up to timeout."""
        r, _, _ = select.select([self.sock], [], [], timeout)
        if not r:
            return False
        try:
            data = self.sock.recv(1, socket.MSG_PEEK)
        except OSError:
            data = b""
        if data == b"":
            self._mark_closed()
            return True
        return False

    def respond(self, status, body, ctype="application/json"):
        if not isinstance(body, (bytes, str)):
            body = json.dumps(body)
        if isinstance(body, str):
            body = body.encode()
        head = (f"HTTP/1.1 {status} X\r\nContent-Type: {ctype}\r\n"
                f"Content-Length: {len(body)}\r\n\r\n").encode()
        self._send(head + body)

    def start_sse(self, status=200, headers=()):
        extra = "".join(f"{k}: {v}\r\n" for k, v in headers)
        self._send(f"HTTP/1.1 {status} X\r\nContent-Type: text/event-stream\r\n{extra}"
                   f"Transfer-Encoding: chunked\r\n\r\n".encode())

    def chunk(self, data):
        if isinstance(data, str):
            data = data.encode()
        self._send(b"%x\r\n%s\r\n" % (len(data), data))

    def event(self, obj):
        payload = obj if isinstance(obj, str) else json.dumps(obj)
        self.chunk(f"data: {payload}\n\n")

    def end_sse(self):
        self._send(b"0\r\n\r\n")

    def hold(self, timeout=10.0):
        """Answers nothing until the router closes the connection (or timeout). Returns True
        when it was closed."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.peer_closed(0.05):
                return True
        self.keep_alive = False
        return False

    def die(self):
        """Closes the connection abruptly (RST), as a crashed worker would."""
        self.keep_alive = False
        try:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        except OSError:
            pass
        self.sock.close()


def default_script(req, io):
    io.respond(200, {"ok": True, "path": req.path})


class Upstream:
    def __init__(self, name="upstream", script=None, scripted_health=False, models=None):
        self.name = name
        # The router's health checker also reads GET <prefix>/v1/models of a worker registered
        # without a model_id: answered here like /health (not recorded, not scripted): the
        # `models` ids as an OpenAI list, or 404 (an unnamed worker) when None.
        self.models = models
        self.model_reads = 0
        self.script = script or default_script
        # The router checks every worker with GET <prefix>/health. Like a real worker, the
        # upstream answers those itself (200, not recorded, not scripted) unless a test wants
        # to script them (scripted_health=True).
        self.scripted_health = scripted_health
        self.health_checks = 0
        self.requests = []
        self.cond = threading.Condition()
        self.ls = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.ls.bind(("127.0.0.1", 0))
        self.ls.listen(128)
        self.port = self.ls.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.connections = 0
        # Exceptions a script raised on its connection thread: __exit__ fails the test with
        # the first one (a thread's exception alone would only be printed).
        self.errors = []
        self._stop = False
        self._threads = []
        self._socks = set()
        t = threading.Thread(target=self._accept, daemon=True)
        t.start()
        self._threads.append(t)

    # ---- server side ----

    def _accept(self):
        while not self._stop:
            try:
                s, _ = self.ls.accept()
            except OSError:
                return
            with self.cond:
                self.connections += 1
                self._socks.add(s)
            t = threading.Thread(target=self._serve, args=(s,), daemon=True)
            t.start()

    def _read_request(self, s, buf):
        while b"\r\n\r\n" not in buf:
            d = s.recv(65536)
            if not d:
                return None, buf
            buf += d
        head, _, rest = buf.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        method, path, _ = lines[0].split(" ", 2)
        headers = {}
        for ln in lines[1:]:
            k, _, v = ln.partition(":")
            headers[k.strip().lower()] = v.strip()
        n = int(headers.get("content-length", "0"))
        if headers.get("transfer-encoding", "").lower() == "chunked":
            raise RuntimeError("chunked request bodies are not expected from the router")
        while len(rest) < n:
            d = s.recv(65536)
            if not d:
                return None, b""
            rest += d
        return Request(method, path, headers, rest[:n]), rest[n:]

    def _serve(self, s):
        buf = b""
        try:
            while not self._stop:
                req, buf = self._read_request(s, buf)
                if req is None:
                    return
                if (not self.scripted_health and req.method == "GET"
                        and req.path.split("?")[0].endswith("/health")):
                    with self.cond:
                        self.health_checks += 1
                    IO(self, s, req).respond(200, b"")
                    continue
                if (not self.scripted_health and req.method == "GET"
                        and req.headers.get("user-agent") == "baton-health"
                        and req.path.split("?")[0].endswith("/v1/models")):
                    with self.cond:
                        self.model_reads += 1
                    if self.models is None:
                        IO(self, s, req).respond(404, {"error": {"message": "not found"}})
                    else:
                        IO(self, s, req).respond(200, {"object": "list", "data": [
                            {"id": m, "object": "model", "created": 0, "owned_by": "vllm",
                             "root": "/models/" + m} for m in self.models]})
                    continue
                with self.cond:
                    self.requests.append(req)
                    self.cond.notify_all()
                io = IO(self, s, req)
                try:
                    self.script(req, io)
                except PeerClosed:
                    pass
                except OSError:
                    io._mark_closed()
                except Exception:  # noqa: BLE001 - handed to the test by __exit__
                    with self.cond:
                        self.errors.append(f"{self.name}: the script failed on {req.method} "
                                           f"{req.path}:\n{traceback.format_exc()}")
                        self.cond.notify_all()
                    return
                req.t_end = time.monotonic()
                with self.cond:
                    self.cond.notify_all()
                if req.closed_by_peer or not io.keep_alive:
                    return
        except OSError:
            return
        finally:
            with self.cond:
                self._socks.discard(s)
            try:
                s.close()
            except OSError:
                pass

    # ---- test side ----

    def wait_requests(self, n, timeout=10.0):
        deadline = time.monotonic() + timeout
        with self.cond:
            while len(self.requests) < n:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"{self.name}: {len(self.requests)} requests, wanted {n}")
                self.cond.wait(left)
            return list(self.requests)

    def wait_closed(self, req, timeout=10.0):
        """Waits until the router closed the connection of req (or it ended); returns whether
        it was closed by the router."""
        deadline = time.monotonic() + timeout
        with self.cond:
            while not req.closed_by_peer and req.t_end is None:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self.cond.wait(left)
            return req.closed_by_peer

    def wait_done(self, req, timeout=10.0):
        deadline = time.monotonic() + timeout
        with self.cond:
            while req.t_end is None:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"{self.name}: request {req.path} did not end")
                self.cond.wait(left)

    def reset(self, script=None):
        with self.cond:
            self.requests = []
        if script is not None:
            self.script = script

    def close(self):
        self._stop = True
        try:
            self.ls.close()
        except OSError:
            pass
        with self.cond:
            socks = list(self._socks)
        for s in socks:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        self.close()
        with self.cond:
            errors = list(self.errors)
        if exc_type is None and errors:
            raise AssertionError(errors[0])
        return False


_held_dead = []


def closed_port():
    """A loopback port where connecting is refused. The port stays bound (never listening) for
    the life of the test process, so no other process can take it meanwhile."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    _held_dead.append(s)
    return s.getsockname()[1]


class SSEClient:
    """Reads an SSE response incrementally over a raw socket (http.client buffers too much to
    observe pass-through)."""

    def __init__(self, port, path, body, timeout=10.0, host="127.0.0.1"):
        self.sock = socket.create_connection((host, port), timeout=timeout)
        self.port, self.path = port, path
        data = json.dumps(body).encode() if not isinstance(body, bytes) else body
        self.sock.sendall((f"POST {path} HTTP/1.1\r\nHost: {host}\r\n"
                           f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n"
                           f"\r\n").encode() + data)
        self.buf = b""
        self.status = None
        self.headers = {}
        self._body = b""  # de-chunked bytes not yet consumed as events
        self._chunk_left = None
        self.ended = False
        self._read_head()

    def _recv(self):
        d = self.sock.recv(65536)
        if not d:
            raise EOFError("connection closed")
        self.buf += d

    def _read_head(self):
        while b"\r\n\r\n" not in self.buf:
            self._recv()
        head, _, self.buf = self.buf.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        self.status = int(lines[0].split(" ")[1])
        for ln in lines[1:]:
            k, _, v = ln.partition(":")
            self.headers[k.strip().lower()] = v.strip()

    def _dechunk(self):
        """Moves complete chunks from buf to _body; sets ended at the last chunk."""
        while not self.ended and b"\r\n" in self.buf:
            line, _, rest = self.buf.partition(b"\r\n")
            n = int(line.split(b";")[0], 16)
            if n == 0:
                if rest.startswith(b"\r\n"):
                    self.ended = True
                    self.buf = rest[2:]
                return
            if len(rest) < n + 2:
                return
            self._body += rest[:n]
            self.buf = rest[n + 2:]

    def _pop_event(self):
        while True:
            norm = self._body.replace(b"\r\n", b"\n")
            if b"\n\n" not in norm:
                return None
            block, _, rest = norm.partition(b"\n\n")
            self._body = rest
            data = [ln[5:].lstrip(b" ") for ln in block.split(b"\n") if ln.startswith(b"data:")]
            if data:
                ev = b"\n".join(data).decode()
                # no SSE error event names a worker's address (harness.py)
                from harness import assert_no_worker_addr
                assert_no_worker_addr(self.port, "POST", self.path, ev)
                return ev

    def next_event(self):
        """The next data payload (str), or None at the end of the stream."""
        while True:
            ev = self._pop_event()
            if ev is not None:
                return ev
            if self.ended:
                return None
            before = len(self._body)
            self._dechunk()
            if self.ended or len(self._body) != before:
                continue
            self._recv()

    def events(self):
        out = []
        while True:
            e = self.next_event()
            if e is None:
                return out
            out.append(e)

    def read_rest_raw(self, timeout=5.0):
        self.sock.settimeout(timeout)
        try:
            while True:
                d = self.sock.recv(65536)
                if not d:
                    break
                self.buf += d
        except OSError:
            pass
        return self.buf

    def close(self):
        try:
            self.sock.close()
        except OSError:
            pass
