"""test_tls.py — HTTPS client → router → HTTPS workers: PD and regular, streaming and not,
keep-alive, pipelining and chunked bodies over TLS, with and without mTLS on both hops, and
workers whose certificates fail verification (wrong host, self-signed, expired, untrusted
client certificate): the client gets a clean 502 naming TLS, the worker never gets a request,
and the reason is in the router's log and metrics. Certificates are made at test time."""

import json
import os
import socket
import ssl
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import simtext  # noqa: E402
from harness import Cluster, sse_events  # noqa: E402
from router_upstream import SSEClient, Upstream  # noqa: E402
from tls_pki import exchange, https_url, metric, request, run_tests, tls_socket  # noqa: E402
import http.client  # noqa: E402

MSGS = [{"role": "user", "content": "hello over tls"}]
PKI = None


def chat(ctx, port, stream=False, max_tokens=6):
    body = {"model": "m", "messages": MSGS, "max_tokens": max_tokens, "stream": stream}
    return request(ctx, port, "POST", "/v1/chat/completions", body)


def check_chat(ctx, port, max_tokens=6):
    want = simtext.complete_chat(MSGS, max_tokens)
    res = chat(ctx, port, max_tokens=max_tokens)
    assert res.status == 200, (res.status, res.text)
    assert res.json()["choices"][0]["message"]["content"] == want.text, (res.json(), want)
    res = chat(ctx, port, stream=True, max_tokens=max_tokens)
    assert res.status == 200, (res.status, res.text)
    assert res.headers.get("transfer-encoding") == "chunked", res.headers
    evs = sse_events(res.body)
    assert evs[-1] == "[DONE]", evs[-3:]
    text = "".join(json.loads(e)["choices"][0]["delta"].get("content") or ""
                   for e in evs[:-1] if json.loads(e)["choices"])
    assert text == want.text, (text, want)


def tls_worker(c, mode, cert, *extra):
    return c.worker(mode, "--tls-cert", cert[0], "--tls-key", cert[1], *extra)


def tls_pd(c, srv, worker_extra=(), router_extra=()):
    p = tls_worker(c, "prefill", srv, *worker_extra)
    d = tls_worker(c, "decode", srv, *worker_extra)
    r = c.router("--tls-cert", srv[0], "--tls-key", srv[1], "--upstream-ca", PKI.ca[0],
                 "--prefill", https_url(p.port), str(p.wait_port("bootstrap")),
                 "--decode", https_url(d.port), *router_extra)
    return p, d, r


def router_metrics(ctx, port):
    res = request(ctx, port, "GET", "/metrics")
    assert res.status == 200, res.status
    return res.text


def test_https_pd_end_to_end():
    srv = PKI.cert("srv")
    ctx = PKI.client_context()
    with Cluster("tls-pd") as c:
        _, _, r = tls_pd(c, srv)
        check_chat(ctx, r.port)
        # The client side is TLS 1.2 with an AEAD suite and ALPN http/1.1, SNI accepted.
        s = tls_socket(ctx, r.port, server_hostname="localhost")
        try:
            assert s.version() == "TLSv1.2", s.version()
            name, _, bits = s.cipher()
            assert "GCM" in name or "CHACHA20" in name, name
            assert name.startswith("ECDHE"), name
        finally:
            s.close()
        actx = PKI.client_context()
        actx.set_alpn_protocols(["http/1.1"])
        s = tls_socket(actx, r.port)
        try:
            assert s.selected_alpn_protocol() == "http/1.1"
        finally:
            s.close()
        text = router_metrics(ctx, r.port)
        # Both hops did handshakes: the client's to the router, the router's to the workers.
        assert metric(text, "baton_tls_handshakes_total", side="server") >= 3, text
        assert metric(text, "baton_tls_handshakes_total", side="client") >= 2, text


def test_certificate_chain():
    """Leaf + intermediate in the certificate file, clients trusting only the root: the
    client port and an https:// worker both serve the chain, both hops verify."""
    inter = PKI.intermediate("inter")
    leaf = PKI.cert("leaf", ca=inter)
    chain = PKI.chain("leaf", leaf, inter)
    ctx = PKI.client_context()  # the root only
    with Cluster("tls-chain") as c:
        w = tls_worker(c, "regular", chain)
        r = c.router("--tls-cert", chain[0], "--tls-key", chain[1], "--upstream-ca", PKI.ca[0],
                     "--worker", https_url(w.port))
        check_chat(ctx, r.port)
        # The leaf alone (no intermediate) cannot be verified by a root-only client. (This
        # router takes its TLS files from the JSON config file's "tls" object.)
        conf = PKI.path("baton-tls.json")
        with open(conf, "w") as f:
            json.dump({"tls": {"cert": leaf[0], "key": leaf[1], "upstream_ca": PKI.ca[0]}}, f)
        with Cluster("tls-nochain") as c2:
            r2 = c2.router("--config", conf, "--worker", https_url(w.port))
            try:
                tls_socket(ctx, r2.port).close()
            except ssl.SSLCertVerificationError:
                pass
            else:
                raise AssertionError("a leaf without its intermediate verified")


def test_keepalive_pipelining_chunked():
    srv = PKI.cert("srv")
    ctx = PKI.client_context()
    with Cluster("tls-ka") as c:
        w = tls_worker(c, "regular", srv)
        r = c.router("--tls-cert", srv[0], "--tls-key", srv[1], "--upstream-ca", PKI.ca[0],
                     "--worker", https_url(w.port))
        want = simtext.complete_chat(MSGS, 4)
        # Keep-alive: several requests (one streamed) on one TLS connection.
        conn = http.client.HTTPSConnection("127.0.0.1", r.port, timeout=30, context=ctx)
        try:
            for i in range(4):
                res = exchange(conn, "POST", "/v1/chat/completions",
                               {"model": "m", "messages": MSGS, "max_tokens": 4,
                                "stream": i == 2})
                assert res.status == 200, (i, res.status, res.text)
            sock_before = conn.sock
            res = exchange(conn, "GET", "/health")
            assert res.status == 200
            assert conn.sock is sock_before  # still the same TLS connection
        finally:
            conn.close()
        # Pipelining: two requests in one write, two answers in order.
        body = json.dumps({"model": "m", "messages": MSGS, "max_tokens": 4}).encode()
        one = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
               b"\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        s = tls_socket(ctx, r.port, timeout=30)
        try:
            s.sendall(one + one)
            data = b""
            while data.count(b"HTTP/1.1 200") < 2 or not data.rstrip().endswith(b"}"):
                chunk = s.recv(65536)
                if not chunk:
                    break
                data += chunk
                if data.count(want.text.encode()) >= 2:
                    break
            assert data.count(b"HTTP/1.1 200 OK") == 2, data
            assert data.count(want.text.encode()) == 2, data
        finally:
            s.close()
        # A chunked request body over TLS.
        s = tls_socket(ctx, r.port, timeout=30)
        try:
            half = len(body) // 2
            req = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
                   b"application/json\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
                   + b"%x\r\n" % half + body[:half] + b"\r\n"
                   + b"%x\r\n" % (len(body) - half) + body[half:] + b"\r\n0\r\n\r\n")
            s.sendall(req)
            data = b""
            while True:
                chunk = s.recv(65536)
                if not chunk:
                    break
                data += chunk
            assert data.startswith(b"HTTP/1.1 200 OK"), data[:200]
            assert want.text.encode() in data, data
        finally:
            s.close()


def test_mtls_both_hops():
    srv = PKI.cert("srv")
    client = PKI.cert("client", cn="client", san="DNS:client", client=True)
    router_cli = PKI.cert("router-cli", cn="router", san="DNS:router", client=True)
    rogue = PKI.cert("rogue", cn="rogue", san="DNS:rogue", client=True, ca=PKI.other_ca)
    with Cluster("tls-mtls") as c:
        w = tls_worker(c, "regular", srv, "--tls-client-ca", PKI.ca[0])
        r = c.router("--tls-cert", srv[0], "--tls-key", srv[1], "--tls-client-ca", PKI.ca[0],
                     "--upstream-ca", PKI.ca[0], "--upstream-cert", router_cli[0],
                     "--upstream-key", router_cli[1], "--worker", https_url(w.port))
        ok = PKI.client_context(cert=client)
        check_chat(ok, r.port)
        # No client certificate, or one from another CA: the handshake fails, nothing else.
        for bad in (PKI.client_context(), PKI.client_context(cert=rogue)):
            try:
                res = chat(bad, r.port)
            except (ssl.SSLError, ConnectionError, OSError):
                pass
            else:
                raise AssertionError(f"mTLS port answered without a valid client cert: "
                                     f"{res.status}")
        text = router_metrics(ok, r.port)
        assert metric(text, "baton_tls_failures_total", side="server",
                      reason="cert_missing") >= 1, text
        assert metric(text, "baton_tls_failures_total", side="server",
                      reason="cert_untrusted") >= 1, text
        check_chat(ok, r.port)  # still serving

        # A router without a client certificate is refused by the mTLS worker: clean 502.
        r2 = c.router("--upstream-ca", PKI.ca[0], "--worker", https_url(w.port),
                      "--max-retries", "0", name="router-nocert")
        from harness import post
        res = post(r2.port, "/v1/chat/completions", {"model": "m", "messages": MSGS,
                                                      "max_tokens": 3})
        assert res.status == 502, (res.status, res.text)
        assert "TLS" in res.json()["error"]["message"], res.text


class TLSSSEClient(SSEClient):
    """router_upstream.SSEClient over TLS, with a small receive buffer (a slow reader)."""

    def __init__(self, ctx, port, path, body, timeout=30.0):
        raw = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        raw.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
        raw.settimeout(timeout)
        raw.connect(("127.0.0.1", port))
        self.sock = ctx.wrap_socket(raw, server_hostname="127.0.0.1")
        self.port, self.path = port, path
        data = json.dumps(body).encode()
        self.sock.sendall((f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: "
                           f"application/json\r\nContent-Length: {len(data)}\r\n\r\n").encode()
                          + data)
        self.buf = b""
        self.status = None
        self.headers = {}
        self._body = b""
        self._chunk_left = None
        self.ended = False
        self._read_head()


def test_stream_backpressure():
    """An HTTPS client that does not read an SSE stream: the router stops reading the worker
    instead of buffering (as over TCP), and the client later gets every event in order."""
    srv = PKI.cert("srv")
    ctx = PKI.client_context()
    total = 48 << 20
    chunk = "x" * 65000
    progress = {"sent": 0, "done": False}

    def d_script(req, io):
        io.start_sse()
        i = 0
        while progress["sent"] < total:
            io.chunk(f"data: {i} {chunk}\n\n")
            progress["sent"] += len(chunk)
            i += 1
        io.event("[DONE]")
        io.end_sse()
        progress["done"] = True

    def p_script(req, io):
        io.respond(200, {"text": ""})

    gen = {"text": "hello there", "sampling_params": {"max_new_tokens": 4}, "stream": True}
    with Upstream("prefill", p_script) as p, Upstream("decode", d_script) as d, \
            Cluster("tls-bp") as c:
        r = c.router("--tls-cert", srv[0], "--tls-key", srv[1], "--prefill", p.url,
                     "--decode", d.url, "--threads", "1")
        cl = TLSSSEClient(ctx, r.port, "/generate", gen)
        try:
            time.sleep(1.5)  # the client reads nothing meanwhile
            assert not progress["done"], "decode finished while the client read nothing"
            assert progress["sent"] < total // 2, progress
            rss_kb = int([ln for ln in open(f"/proc/{r.p.pid}/status")
                          if ln.startswith("VmRSS")][0].split()[1])
            assert rss_kb < 40 * 1024, f"router RSS {rss_kb} kB: the stream was buffered"
            n = 0
            while True:
                e = cl.next_event()
                if e is None or e == "[DONE]":
                    break
                assert e.split(" ", 1)[0] == str(n), (e[:20], n)
                n += 1
        finally:
            cl.sock.close()
        assert progress["done"] and n * len(chunk) >= total, (n, progress)


def test_session_resumption():
    """Tickets: a client offering its session resumes it (client port), and the router's pool
    resumes its session when it opens another connection to a worker."""
    srv = PKI.cert("srv")
    ctx = PKI.client_context()
    ctx.maximum_version = ssl.TLSVersion.TLSv1_2
    with Cluster("tls-resume") as c:
        w = tls_worker(c, "regular", srv, "--decode-us-per-token", "20000")
        r = c.router("--tls-cert", srv[0], "--tls-key", srv[1], "--upstream-ca", PKI.ca[0],
                     "--worker", https_url(w.port), "--check-interval-ms", "0",
                     "--threads", "1")  # one loop: one pool to the worker
        s1 = tls_socket(ctx, r.port)
        sess = s1.session
        s1.close()
        raw = socket.create_connection(("127.0.0.1", r.port), timeout=10)
        s2 = ctx.wrap_socket(raw, server_hostname="127.0.0.1", session=sess)
        try:
            assert s2.session_reused, "the router did not resume the offered session"
        finally:
            s2.close()
        # The router -> worker pool: one connection first, then two requests at once (the
        # second needs a new connection, which offers the first one's session).
        assert chat(ctx, r.port, max_tokens=2).status == 200
        results = []
        ts = [threading.Thread(target=lambda: results.append(chat(ctx, r.port, max_tokens=10)))
              for _ in range(2)]
        for t in ts:
            t.start()
        for t in ts:
            t.join(timeout=60)
        assert [x.status for x in results] == [200, 200], [x.status for x in results]
        text = router_metrics(ctx, r.port)
        assert metric(text, "baton_tls_resumed_total", side="server") >= 1, text
        assert metric(text, "baton_tls_resumed_total", side="client") >= 1, text


def expect_tls_502(name, worker_cert, reason, extra_router=()):
    """A worker whose certificate fails verification: 502 naming TLS, no address in it, the
    worker never gets a request, the reason in the router's log and metrics, breaker fed."""
    with Cluster(f"tls-{name}") as c:
        w = tls_worker(c, "regular", worker_cert)
        r = c.router("--upstream-ca", PKI.ca[0], "--worker", https_url(w.port),
                     "--max-retries", "0", "--breaker-threshold", "2",
                     "--check-interval-ms", "0", *extra_router)
        from harness import get, post
        for _ in range(2):
            res = post(r.port, "/v1/chat/completions",
                       {"model": "m", "messages": MSGS, "max_tokens": 3})
            assert res.status in (502, 503), (res.status, res.text)
            msg = res.json()["error"]["message"]
            assert "TLS" in msg, msg
            assert "127.0.0.1" not in msg and str(w.port) not in msg, msg
        r.wait_log(rf"tls_failed side=client .*reason={reason}")
        text = get(r.port, "/metrics").text
        assert metric(text, "baton_tls_failures_total", side="client", reason=reason) >= 2, text
        assert metric(text, "baton_upstream_errors_total", role="regular", kind="tls") >= 2, text
        # The breaker counted the failures (threshold 2): it is open now, so the next request
        # is refused by the router itself (no worker available), still without an address.
        opened = [ln for ln in text.splitlines()
                  if ln.startswith("baton_worker_breaker_transitions_total{")
                  and 'to="open"' in ln and float(ln.split()[-1]) >= 1]
        assert opened, text
        res = post(r.port, "/v1/chat/completions",
                   {"model": "m", "messages": MSGS, "max_tokens": 3})
        assert res.status in (502, 503), (res.status, res.text)
        assert "127.0.0.1" not in res.text, res.text
        # The worker saw handshakes only: not one HTTP request reached it.
        wctx = ssl.create_default_context()
        wctx.check_hostname = False
        wctx.verify_mode = ssl.CERT_NONE
        wm = request(wctx, w.port, "GET", "/metrics").text
        served = [ln for ln in wm.splitlines()
                  if ln.startswith("baton_worker_requests_total{") and "chat" in ln]
        assert not served, served


def test_upstream_wrong_host():
    expect_tls_502("wronghost", PKI.cert("wrong", cn="other", san="DNS:other.example"),
                   "cert_wrong_host")


def test_upstream_self_signed():
    expect_tls_502("selfsigned", PKI.cert("self", ca="self"), "cert_untrusted")


def test_upstream_expired():
    expect_tls_502("expired", PKI.cert("expired", days=-1), "cert_expired")


def test_scenario_smoke():
    """loadtest/scenarios/tls.py --smoke: every path answers without an error, over keep-alive
    and a new connection per request, and the handshake table has a figure per HTTPS server."""
    from harness import BUILD_DIR, binary
    for b in ("baton", "baton-worker", "baton-bench"):
        binary(b)
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "loadtest",
                          "scenarios", "tls.py")
    r = subprocess.run([sys.executable, script, "--smoke", "--build-dir", BUILD_DIR],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300)
    assert r.returncode == 0, r.stdout
    rows = [ln for ln in r.stdout.splitlines() if ln.startswith("| ")]
    paths = ["direct", "baton http", "baton https"]
    if "SKIPPED: nginx" not in r.stdout:
        paths.append("nginx https")
    sat = [ln for ln in rows if "|" in ln and ln.split("|")[1].strip() in paths]
    for p in paths:
        mine = [ln for ln in sat if ln.split("|")[1].strip() == p]
        assert len(mine) >= 2, (p, r.stdout)
        for ln in mine[:2]:  # latency and saturation tables: the errors column is 0
            cells = [c.strip() for c in ln.strip().strip("|").split("|")]
            errs = cells[7] if len(cells) == 8 else cells[8]
            assert errs == "0", (p, ln)
    assert "handshakes/s" in r.stdout, r.stdout


def use_pki(pki):
    global PKI
    PKI = pki


def main():
    run_tests([test_https_pd_end_to_end, test_certificate_chain,
               test_keepalive_pipelining_chunked, test_mtls_both_hops,
               test_session_resumption, test_stream_backpressure, test_upstream_wrong_host,
               test_upstream_self_signed, test_upstream_expired, test_scenario_smoke], use_pki)


if __name__ == "__main__":
    main()
