"""harness.py — start Baton processes on loopback ephemeral ports, talk HTTP to them, clean up.

Standard library only. Every process is started with port 0 and its real port is read from its
`listening addr=HOST:PORT` log line. Everything started through a Cluster is killed when the
Cluster closes (also on an exception), and each process's stderr is kept in a temporary
directory that is printed when a test fails.
"""

import http.client
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse

BUILD_DIR = os.environ.get("BATON_BUILD_DIR") or os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "..", "..", "build")
HOST = "127.0.0.1"

# One definition of "a free port for a server that must be told its port": the benchmark
# scenarios' (drawn outside the kernel's ephemeral range).
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                "loadtest", "scenarios"))
from scenlib import free_port, free_ports  # noqa: E402,F401

# "listening addr=H:P" is the HTTP port; "<what>_listening addr=H:P" another one (bootstrap_...).
_LISTEN_RE = re.compile(r"\s(?:([a-z]+)_)?listening addr=(\S+):(\d+)")


# No answer a client gets may name an internal worker address (it would map the private
# network for an outsider). Each router started
# here records the "host:port" of every worker URL on its command line (and in its --config
# file, and those added through the admin API); request() fails on any response from that
# router that names one, except on the admin and metrics routes, whose purpose is to show them.
_WORKER_URL_RE = re.compile(r"https?://([A-Za-z0-9.\-\[\]:]+:\d+)")
_ADDR_SHOWN_PATHS = ("/workers", "/add_worker", "/remove_worker", "/list_workers", "/metrics")
_worker_addrs = {}  # router port -> set of "host:port"


def note_worker_urls(router_port, text):
    """Records the worker addresses named in text as ones router_port must never show."""
    addrs = _worker_addrs.setdefault(router_port, set())
    for m in _WORKER_URL_RE.finditer(urllib.parse.unquote(str(text))):
        addrs.add(m.group(1))


def assert_no_worker_addr(router_port, method, path, data):
    """Fails when a router's answer (not an admin/metrics one) names a worker address."""
    if path.split("?", 1)[0].startswith(_ADDR_SHOWN_PATHS):
        return
    text = data.decode("latin-1") if isinstance(data, bytes) else str(data)
    for addr in _worker_addrs.get(router_port, ()):
        assert addr not in text, f"{method} {path}: the answer names worker {addr}: {text[:300]}"


def sanitized():
    """True for a SANITIZE=1 build (ASan/UBSan): tools such as valgrind cannot run it."""
    try:
        with open(os.path.join(BUILD_DIR, "CMakeCache.txt")) as f:
            return re.search(r"^BATON_SANITIZE:BOOL=ON$", f.read(), re.M) is not None
    except OSError:
        return False


def binary(name):
    path = os.path.join(BUILD_DIR, name)
    if not os.path.exists(path):
        raise RuntimeError(f"binary not built: {path}")
    return path


class Proc:
    """A child process whose stderr is copied to a log file and scanned for listen lines."""

    def __init__(self, name, argv, logdir, env=None):
        self.name = name
        self.argv = argv
        self.log_path = os.path.join(logdir, f"{name}.log")
        self.ports = {}  # "http" -> port, "bootstrap" -> port, ...
        self._lines = []
        self._cond = threading.Condition()
        full_env = dict(os.environ)
        if env:
            full_env.update(env)
        self.p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.PIPE, env=full_env, start_new_session=True)
        self._log = open(self.log_path, "w")
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self):
        for raw in self.p.stderr:
            line = raw.decode("utf-8", "replace")
            self._log.write(line)
            self._log.flush()
            m = _LISTEN_RE.search(line)
            with self._cond:
                if m:
                    key = m.group(1) or "http"
                    self.ports.setdefault(key, int(m.group(3)))
                self._lines.append(line)
                self._cond.notify_all()
        with self._cond:
            self._cond.notify_all()

    def wait_port(self, key="http", timeout=20.0):
        deadline = time.monotonic() + timeout
        with self._cond:
            while key not in self.ports:
                if self.p.poll() is not None:
                    raise RuntimeError(f"{self.name} exited with {self.p.returncode} before "
                                       f"listening; log: {self.log_path}\n{self.tail()}")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise RuntimeError(f"{self.name} did not listen ({key}) within {timeout}s\n"
                                       f"{self.tail()}")
                self._cond.wait(min(left, 0.2))
            return self.ports[key]

    def wait_log(self, pattern, timeout=10.0):
        """Waits for a log line matching the regex; returns the match."""
        rx = re.compile(pattern)
        deadline = time.monotonic() + timeout
        seen = 0
        with self._cond:
            while True:
                for line in self._lines[seen:]:
                    m = rx.search(line)
                    if m:
                        return m
                seen = len(self._lines)
                left = deadline - time.monotonic()
                # an exited process: only once its last lines are read (the reader is done)
                if left <= 0 or (self.p.poll() is not None and not self._reader.is_alive()
                                 and seen == len(self._lines)):
                    raise RuntimeError(f"{self.name}: no log line /{pattern}/\n{self.tail()}")
                self._cond.wait(min(left, 0.2))

    def tail(self, n=30):
        with self._cond:
            return "".join(self._lines[-n:])

    @property
    def port(self):
        return self.wait_port("http")

    def alive(self):
        return self.p.poll() is None

    def signal(self, sig):
        if self.alive():
            os.killpg(self.p.pid, sig)

    def kill(self):
        """SIGKILL and reap."""
        self.signal(signal.SIGKILL)
        try:
            self.p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        self._reader.join(timeout=5)

    def stop(self, timeout=10.0):
        """SIGTERM, then SIGKILL after timeout. Returns the exit code."""
        self.signal(signal.SIGTERM)
        try:
            self.p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
        self._reader.join(timeout=5)
        return self.p.returncode


class Cluster:
    """Owns processes started for one test; use as a context manager."""

    def __init__(self, name="test"):
        self.logdir = tempfile.mkdtemp(prefix=f"baton-{name}-")
        self.procs = []
        self._ok = False

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        for p in reversed(self.procs):
            p.kill()
        if exc_type is None or issubclass(exc_type, SkipTest):
            # logs and whatever the test kept beside them (secrets, configs, data files)
            shutil.rmtree(self.logdir, ignore_errors=True)
        else:
            for p in self.procs:
                sys.stderr.write(f"---- last log lines of {p.name} ({p.log_path}) ----\n")
                sys.stderr.write(p.tail(40))
        return False

    def start(self, name, argv, env=None, wait=("http",)):
        p = Proc(name, argv, self.logdir, env=env)
        self.procs.append(p)
        for key in wait:
            p.wait_port(key)
        return p

    def worker(self, mode, *extra, name=None, env=None):
        """Starts baton-worker on ephemeral ports; a prefill worker also gets a bootstrap port."""
        argv = [binary("baton-worker"), "--mode", mode, "--host", HOST, "--port", "0"]
        wait = ("http",)
        if mode == "prefill":
            argv += ["--bootstrap-port", "0"]
            wait = ("http", "bootstrap")
        argv += list(extra)
        return self.start(name or f"worker-{mode}-{len(self.procs)}", argv, env=env, wait=wait)

    def router(self, *extra, name="router", env=None):
        argv = [binary("baton"), "--host", HOST, "--port", "0"] + list(extra)
        p = self.start(name, argv, env=env)
        _worker_addrs[p.port] = set()
        for i, a in enumerate(extra):
            note_worker_urls(p.port, a)
            if a == "--config" and i + 1 < len(extra):
                with open(extra[i + 1], encoding="utf-8") as f:
                    note_worker_urls(p.port, f.read())
        return p

    def pd(self, worker_args=(), router_args=()):
        """One prefill, one decode and a router in front of them."""
        p = self.worker("prefill", *worker_args)
        d = self.worker("decode", *worker_args)
        r = self.router("--prefill", url(p.port), str(p.wait_port("bootstrap")),
                        "--decode", url(d.port), *router_args)
        return p, d, r


def url(port, host=HOST):
    return f"http://{host}:{port}"


class Response:
    def __init__(self, status, headers, body):
        self.status = status
        self.headers = headers  # dict, lower-case names
        self.body = body

    def json(self):
        return json.loads(self.body)

    @property
    def text(self):
        return self.body.decode("utf-8", "replace")


def request(port, method, path, body=None, headers=None, timeout=30.0, host=HOST):
    """One HTTP request on a fresh connection; body may be bytes, str or a JSON-able object."""
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        return exchange(conn, method, path, body, headers)
    finally:
        conn.close()


def exchange(conn, method, path, body=None, headers=None):
    """One request on a connection the caller keeps (HTTP or HTTPS, keep-alive)."""
    hdrs = dict(headers or {})
    if body is not None and not isinstance(body, (bytes, str)):
        body = json.dumps(body)
        hdrs.setdefault("Content-Type", "application/json")
    if path.startswith(("/workers", "/add_worker")):
        note_worker_urls(conn.port, path)
        note_worker_urls(conn.port, body if body is not None else "")
    conn.request(method, path, body=body, headers=hdrs)
    r = conn.getresponse()
    data = r.read()
    assert_no_worker_addr(conn.port, method, path, data)
    return Response(r.status, {k.lower(): v for k, v in r.getheaders()}, data)


def post(port, path, obj, **kw):
    return request(port, "POST", path, body=obj, **kw)


def get(port, path, **kw):
    return request(port, "GET", path, **kw)


def sse_events(body):
    """Splits an SSE body into the data payloads, in order (including the final "[DONE]")."""
    out = []
    text = body.decode("utf-8") if isinstance(body, bytes) else body
    for block in text.replace("\r\n", "\n").split("\n\n"):
        data = [ln[5:].lstrip(" ") for ln in block.split("\n") if ln.startswith("data:")]
        if data:
            out.append("\n".join(data))
    return out


def raw_exchange(port, payload, timeout=10.0, host=HOST, read_all=True):
    """Sends raw bytes on a new connection and returns everything read until close or timeout."""
    s = socket.create_connection((host, port), timeout=timeout)
    try:
        s.sendall(payload)
        chunks = []
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                b = s.recv(65536)
            except socket.timeout:
                break
            if not b:
                break
            chunks.append(b)
            if not read_all:
                break
        return b"".join(chunks)
    finally:
        s.close()


def wait_until(pred, timeout=10.0, interval=0.05, what="condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


class TestRunner:
    """Minimal runner: run(fn, ...) each test, print a summary line ctest and CI can read."""

    def __init__(self):
        self.passed = 0
        self.failed = 0
        self.skipped = 0

    def run(self, fn, *args):
        name = fn.__name__
        t0 = time.monotonic()
        try:
            fn(*args)
        except SkipTest as e:
            self.skipped += 1
            print(f"[ SKIPPED ] {name}: {e}", flush=True)
            return
        except Exception as e:  # noqa: BLE001 - report every failure
            self.failed += 1
            import traceback
            traceback.print_exc()
            print(f"[  FAILED ] {name}: {e!r}", flush=True)
            return
        self.passed += 1
        print(f"[       OK ] {name} ({time.monotonic() - t0:.2f}s)", flush=True)

    def finish(self):
        print(f"{self.passed} passed, {self.failed} failed, {self.skipped} skipped", flush=True)
        sys.exit(1 if self.failed else 0)


class SkipTest(Exception):
    pass
