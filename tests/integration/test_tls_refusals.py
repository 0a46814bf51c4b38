"""test_tls_refusals.py — bad input on a TLS port ends that one connection with a log line and a
metric, and nothing else: plain HTTP, garbage, truncated and never-finished handshakes,
renegotiation, TLS 1.3-only and non-AEAD clients. The failure log is rate-limited under a flood.
Then certificates are reloaded (SIGHUP) under load: no request fails, connections already open
keep working, new ones see the new certificate (router and worker)."""

import os
import shutil
import socket
import ssl
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from harness import Cluster, raw_exchange, wait_until  # noqa: E402
from tls_pki import exchange, https_url, metric, request, run_tests, tls_socket  # noqa: E402
import http.client  # noqa: E402

PKI = None
MSGS = [{"role": "user", "content": "refusals"}]


def client_hello():
    """The first flight of a real TLS client, without a server."""
    ctx = ssl.create_default_context()
    inc, out = ssl.MemoryBIO(), ssl.MemoryBIO()
    obj = ctx.wrap_bio(inc, out, server_hostname="localhost")
    try:
        obj.do_handshake()
    except ssl.SSLWantReadError:
        pass
    return out.read()


def failures(ctx, port, reason):
    return metric(request(ctx, port, "GET", "/metrics").text, "baton_tls_failures_total",
                  side="server", reason=reason)


def read_to_eof(s, limit_s=20.0):
    """Reads until the peer closes (bounded); returns the bytes, or None if it never closed."""
    s.settimeout(1.0)
    data = b""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        try:
            b = s.recv(65536)
        except socket.timeout:
            continue
        except ConnectionResetError:
            return data
        if not b:
            return data
        data += b
    return None


def still_serves(ctx, port):
    res = request(ctx, port, "POST", "/v1/chat/completions",
                  {"model": "m", "messages": MSGS, "max_tokens": 3})
    assert res.status == 200, (res.status, res.text)


def test_bad_input():
    srv = PKI.cert("srv")
    ctx = PKI.client_context()
    with Cluster("tls-bad") as c:
        w = c.worker("regular")
        r = c.router("--tls-cert", srv[0], "--tls-key", srv[1], "--header-timeout-ms", "500",
                      "--worker", f"http://127.0.0.1:{w.port}")
        port = r.port

        # Plain HTTP on the TLS port: a plain 400 saying so, then close.
        out = raw_exchange(port, b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        assert out.startswith(b"HTTP/1.1 400"), out
        assert b"tls_required" in out, out
        wait_until(lambda: failures(ctx, port, "plaintext_http") >= 1, what="plaintext metric")

        # Garbage, and a record header announcing an impossible length: closed, counted.
        for junk in (b"\x00\x01\x02\x03garbage" * 8, b"\x16\x03\x01\xff\xff" + b"A" * 64):
            s = socket.create_connection(("127.0.0.1", port), timeout=10)
            s.sendall(junk)
            assert read_to_eof(s) is not None, "garbage did not end the connection"
            s.close()
        wait_until(lambda: failures(ctx, port, "bad_record") >= 2, what="bad_record metric")

        # A handshake cut short by the client.
        hello = client_hello()
        s = socket.create_connection(("127.0.0.1", port), timeout=10)
        s.sendall(hello[: len(hello) // 2])
        s.close()
        wait_until(lambda: failures(ctx, port, "truncated_handshake") >= 1,
                   what="truncated_handshake metric")

        # A handshake that never finishes: the header timeout (500 ms here) ends it.
        s = socket.create_connection(("127.0.0.1", port), timeout=10)
        s.sendall(hello[:20])
        assert read_to_eof(s) is not None, "a stalled handshake was never closed"
        s.close()
        wait_until(lambda: failures(ctx, port, "handshake_timeout") >= 1,
                   what="handshake_timeout metric")

        # Renegotiation (openssl s_client's "R" command, TLS 1.2): the connection is closed.
        p = subprocess.Popen(["openssl", "s_client", "-connect", f"127.0.0.1:{port}", "-tls1_2",
                              "-CAfile", PKI.ca[0], "-servername", "localhost"],
                             stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
        try:
            time.sleep(0.5)  # let the handshake finish (the command is read after it)
            p.stdin.write(b"R\n")
            p.stdin.flush()
            wait_until(lambda: failures(ctx, port, "renegotiation") >= 1, timeout=20,
                       what="renegotiation refused")
            p.wait(timeout=20)  # the router closed the connection, so s_client ends
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()

        # Clients the configuration refuses: TLS 1.3 only, non-AEAD suites only.
        only13 = PKI.client_context()
        only13.minimum_version = ssl.TLSVersion.TLSv1_3
        weak = PKI.client_context()
        weak.maximum_version = ssl.TLSVersion.TLSv1_2
        weak.set_ciphers("ECDHE-ECDSA-AES128-SHA256:ECDHE-ECDSA-AES128-SHA")
        for bad in (only13, weak):
            try:
                tls_socket(bad, port).close()
            except (ssl.SSLError, ConnectionError):
                pass
            else:
                raise AssertionError("a TLS 1.3-only or non-AEAD client was accepted")
        wait_until(lambda: failures(ctx, port, "handshake_failed") >= 2,
                   what="handshake_failed metric")

        # Nothing else was affected.
        still_serves(ctx, port)
        assert r.alive()


def test_connection_cap():
    """Over --max-connections a TLS client is closed before the handshake (no session exists
    to carry the plain-HTTP 503); the connection already open is untouched."""
    srv = PKI.cert("srv")
    ctx = PKI.client_context()
    with Cluster("tls-cap") as c:
        w = c.worker("regular")
        r = c.router("--tls-cert", srv[0], "--tls-key", srv[1], "--max-connections", "1",
                     "--threads", "1", "--worker", f"http://127.0.0.1:{w.port}")
        held = http.client.HTTPSConnection("127.0.0.1", r.port, timeout=30, context=ctx)
        try:
            assert exchange(held, "GET", "/health").status == 200
            try:
                tls_socket(ctx, r.port).close()
            except (ssl.SSLError, ConnectionError, OSError):
                pass
            else:
                raise AssertionError("a connection over the cap completed its handshake")
            r.wait_log(r"connection_rejected reason=max_connections")
            assert exchange(held, "GET", "/health").status == 200
        finally:
            held.close()
        wait_until(lambda: still_ok(ctx, r.port), what="service after the held one closed")


def still_ok(ctx, port):
    try:
        return request(ctx, port, "GET", "/health").status == 200
    except (ssl.SSLError, ConnectionError, OSError):
        return False


def test_upstream_handshake_stall():
    """An https:// worker that accepts and never answers the handshake: the connect timeout
    bounds it, the client gets a clean 502 naming TLS, nothing was sent but the ClientHello."""
    lsock = socket.socket()
    lsock.bind(("127.0.0.1", 0))
    lsock.listen(16)
    port = lsock.getsockname()[1]
    got, stop = [], threading.Event()

    def silent():
        lsock.settimeout(0.2)
        conns = []
        while not stop.is_set():
            try:
                cs, _ = lsock.accept()
            except socket.timeout:
                continue
            cs.settimeout(0.2)
            conns.append(cs)
            try:
                got.append(cs.recv(65536))
            except socket.timeout:
                pass
        for cs in conns:
            cs.close()

    t = threading.Thread(target=silent)
    t.start()
    try:
        with Cluster("tls-stall") as c:
            r = c.router("--worker", f"https://127.0.0.1:{port}", "--connect-timeout-ms", "500",
                         "--max-retries", "0", "--check-interval-ms", "0",
                         "--upstream-ca", PKI.ca[0])
            from harness import post
            res = post(r.port, "/v1/chat/completions",
                       {"model": "m", "messages": MSGS, "max_tokens": 3}, timeout=30)
            assert res.status == 502, (res.status, res.text)
            assert "TLS" in res.json()["error"]["message"], res.text
            assert "127.0.0.1" not in res.text, res.text
            from harness import get
            text = get(r.port, "/metrics").text
            assert metric(text, "baton_tls_failures_total", side="client",
                          reason="handshake_timeout") >= 1, text
    finally:
        stop.set()
        t.join(timeout=10)
        lsock.close()
    assert got and all(g[:1] == b"\x16" for g in got if g), got  # a ClientHello, no request
    assert not any(b"chat/completions" in g for g in got), got


def test_failure_log_rate_limited():
    srv = PKI.cert("srv")
    ctx = PKI.client_context()
    with Cluster("tls-flood") as c:
        w = c.worker("regular")
        r = c.router("--tls-cert", srv[0], "--tls-key", srv[1],
                     "--worker", f"http://127.0.0.1:{w.port}")
        flood = 200
        for _ in range(flood):
            raw_exchange(r.port, b"\x00garbage", timeout=5)
        wait_until(lambda: failures(ctx, r.port, "bad_record") >= flood, what="all counted")
        time.sleep(1.1)  # the next second's first line reports how many were dropped
        raw_exchange(r.port, b"\x00garbage", timeout=5)
        r.wait_log(r"log_suppressed event=tls_failed count=\d+")
        with open(r.log_path) as f:
            lines = sum(1 for ln in f if "tls_failed" in ln)
        assert lines < flood, f"{lines} failure lines for {flood} bad connections"
        still_serves(ctx, r.port)


def der(pem_path):
    with open(pem_path) as f:
        return ssl.PEM_cert_to_DER_cert(f.read())


def peer_der(ctx, port):
    s = tls_socket(ctx, port)
    try:
        return s.getpeercert(binary_form=True)
    finally:
        s.close()


def test_reload_under_load():
    a = PKI.cert("cert-a")
    b = PKI.cert("cert-b")
    live = (PKI.path("live.pem"), PKI.path("live.key"))

    def install(cert):
        for src, dst in zip(cert, live):
            shutil.copyfile(src, dst + ".tmp")
            os.replace(dst + ".tmp", dst)  # whole files only: never a half-written one

    install(a)
    ctx = PKI.client_context()
    with Cluster("tls-reload") as c:
        w = c.worker("regular", "--tls-cert", live[0], "--tls-key", live[1])
        r = c.router("--tls-cert", live[0], "--tls-key", live[1], "--upstream-ca", PKI.ca[0],
                     "--worker", https_url(w.port))
        assert peer_der(ctx, r.port) == der(a[0])
        held = http.client.HTTPSConnection("127.0.0.1", r.port, timeout=30, context=ctx)
        res = exchange(held, "GET", "/health")
        assert res.status == 200

        stop = threading.Event()
        errors, done = [], [0]

        def load(keepalive):
            conn = None
            while not stop.is_set():
                try:
                    if conn is None or not keepalive:
                        conn = http.client.HTTPSConnection("127.0.0.1", r.port, timeout=30,
                                                           context=ctx)
                    res = exchange(conn, "POST", "/v1/chat/completions",
                                   {"model": "m", "messages": MSGS, "max_tokens": 2})
                    if res.status != 200:
                        errors.append((res.status, res.text))
                    done[0] += 1
                    if not keepalive:
                        conn.close()
                except Exception as e:  # noqa: BLE001 - every failure is a test failure
                    errors.append(repr(e))
                    conn = None

        threads = [threading.Thread(target=load, args=(k,)) for k in (True, False)]
        for t in threads:
            t.start()
        try:
            wait_until(lambda: done[0] >= 10, what="load running")
            install(b)
            r.signal(__import__("signal").SIGHUP)
            w.signal(__import__("signal").SIGHUP)
            r.wait_log(r"tls_reloaded which=client_port")
            w.wait_log(r"tls_reloaded")
            before = done[0]
            wait_until(lambda: done[0] >= before + 10, what="load after the reload")
        finally:
            stop.set()
            for t in threads:
                t.join(timeout=60)
        assert not errors, errors[:5]
        # New connections see the new certificate, on the router and on the worker.
        assert peer_der(ctx, r.port) == der(b[0])
        assert peer_der(ctx, w.port) == der(b[0])
        # The connection opened before the reload still works.
        res = exchange(held, "GET", "/health")
        assert res.status == 200
        held.close()
        # A reload that fails (a key that does not match) keeps the current certificate.
        shutil.copyfile(a[1], live[1] + ".tmp")
        os.replace(live[1] + ".tmp", live[1])
        r.signal(__import__("signal").SIGHUP)
        r.wait_log(r"tls_reload_failed which=client_port")
        assert peer_der(ctx, r.port) == der(b[0])
        text = request(ctx, r.port, "GET", "/metrics").text
        assert metric(text, "baton_tls_reloads_total", result="ok") >= 2, text
        assert metric(text, "baton_tls_reloads_total", result="failed") >= 1, text


def use_pki(pki):
    global PKI
    PKI = pki


def main():
    run_tests([test_bad_input, test_connection_cap, test_upstream_handshake_stall,
               test_failure_log_rate_limited,
               test_reload_under_load], use_pki)


if __name__ == "__main__":
    main()
