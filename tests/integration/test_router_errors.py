"""test_router_errors.py — every error path of the router: bad HTTP and limits, bad JSON and
field types, unknown paths and methods, upstream failures before and during a stream (with the
other side closed at once), client disconnects, readiness transitions, /metrics."""

import json
import os
import re
import socket
import struct
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from harness import (Cluster, TestRunner, get, post, raw_exchange, request,  # noqa: E402
                     wait_until)
from router_upstream import SSEClient, Upstream, closed_port  # noqa: E402

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
GEN = {"text": "hello", "sampling_params": {"max_new_tokens": 4}}
# Generous bound for "at once" on a loaded 2-core machine; the mechanism is an immediate close.
PROMPT_S = 5.0
# One attempt per request, no active checks, no breaker: for tests of how a single upstream
# failure maps to the client's answer (retries, health checks and breakers have their own
# tests in test_resilience.py).
ONE_SHOT = ("--max-retries", "0", "--check-interval-ms", "0", "--breaker-threshold", "0")


def openai_error(res, status, code=None, param=None):
    assert res.status == status, (res.status, res.text)
    assert res.headers.get("content-type", "").startswith("application/json"), res.headers
    err = res.json()["error"]
    assert isinstance(err["message"], str) and err["message"], err
    assert "type" in err and "code" in err and "param" in err, err
    if code is not None:
        assert err["code"] == code, err
    if param is not None:
        assert err["param"] == param, err
    return err


def parse_http_response(raw):
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ")[1])
    headers = {}
    for ln in lines[1:]:
        k, _, v = ln.partition(":")
        headers[k.strip().lower()] = v.strip()
    return status, headers, body


# ---- HTTP-level errors and limits ----

def test_http_limits():
    with Cluster("router-limits") as c:
        r = c.router("--threads", "1", "--max-body-bytes", "1024", "--max-header-bytes", "2048",
                     "--header-timeout-ms", "300", "--max-connections", "3")
        port = r.port
        # malformed request line
        status, hdrs, body = parse_http_response(raw_exchange(port, b"GARBAGE\r\n\r\n"))
        assert status == 400, status
        assert "error" in json.loads(body), body
        # oversized body
        big = {"text": "x" * 2000}
        res = post(port, "/generate", big)
        openai_error(res, 413)
        # chunked body over the limit as well
        chunked = (b"POST /generate HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n" +
                   b"".join(b"100\r\n" + b"a" * 256 + b"\r\n" for _ in range(6)) + b"0\r\n\r\n")
        status, _, _ = parse_http_response(raw_exchange(port, chunked))
        assert status == 413, status
        # headers too large
        res = request(port, "GET", "/health", headers={"X-Big": "y" * 4000})
        openai_error(res, 431)
        # header timeout: the request never completes its headers
        t0 = time.monotonic()
        raw = raw_exchange(port, b"GET /health HTTP/1.1\r\nHost: x\r\n", timeout=10)
        status, _, body = parse_http_response(raw)
        assert status == 408, status
        assert time.monotonic() - t0 < 8
        # connection cap: 3 idle connections are held, the 4th is refused with 503
        held = []
        try:
            for _ in range(3):
                s = socket.create_connection(("127.0.0.1", port), timeout=5)
                held.append(s)
            # make sure the server accepted the held ones before the extra connection
            for s in held:
                s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
                assert s.recv(65536).startswith(b"HTTP/1.1 200")
            status, _, body = parse_http_response(raw_exchange(port, b"GET /health HTTP/1.1\r\n"
                                                                     b"Host: x\r\n\r\n"))
            assert status == 503, status
        finally:
            for s in held:
                s.close()
        # the router is still fine afterwards
        wait_until(lambda: get(port, "/health").status == 200, what="router healthy again")


def test_request_errors():
    with Cluster("router-reqerr") as c:
        r = c.router("--threads", "1")
        port = r.port
        # broken JSON
        res = request(port, "POST", "/v1/chat/completions", body=b"{\"messages\": [",
                      headers={"Content-Type": "application/json"})
        err = openai_error(res, 400, code="invalid_json")
        assert err["type"] == "invalid_request_error"
        res = request(port, "POST", "/generate", body=b"", headers={})
        openai_error(res, 400)
        res = request(port, "POST", "/generate", body=b"[1,2]", headers={})
        openai_error(res, 400)
        # wrong field types, each naming its parameter
        openai_error(post(port, "/v1/chat/completions", dict(CHAT, stream="yes")), 400,
                     param="stream")
        openai_error(post(port, "/v1/chat/completions", dict(CHAT, max_tokens=-5)), 400,
                     param="max_tokens")
        openai_error(post(port, "/v1/chat/completions", dict(CHAT, n=0)), 400, param="n")
        openai_error(post(port, "/v1/chat/completions", dict(CHAT, stop=[1])), 400, param="stop")
        openai_error(post(port, "/v1/chat/completions", dict(CHAT, temperature="hot")), 400,
                     param="temperature")
        openai_error(post(port, "/v1/chat/completions", {"messages": []}), 400, param="messages")
        openai_error(post(port, "/v1/chat/completions", {"messages": [{"content": "x"}]}), 400,
                     param="messages")
        openai_error(post(port, "/v1/completions", {"prompt": 5}), 400, param="prompt")
        openai_error(post(port, "/v1/completions", {"max_tokens": 3}), 400, param="prompt")
        openai_error(post(port, "/generate", {"sampling_params": {}}), 400, param="text")
        openai_error(post(port, "/generate", dict(GEN, return_logprob="yes")), 400,
                     param="return_logprob")
        # unknown path, wrong method (with Allow)
        openai_error(get(port, "/v2/nothing"), 404, code="not_found")
        res = get(port, "/v1/chat/completions")
        openai_error(res, 405)
        assert res.headers.get("allow") == "POST", res.headers
        res = post(port, "/metrics", {})
        openai_error(res, 405)
        assert res.headers.get("allow") == "GET"
        # no worker at all: 503
        openai_error(post(port, "/v1/chat/completions", CHAT), 503)
        # keep-alive survives a 400: two requests on one connection
        s = socket.create_connection(("127.0.0.1", port), timeout=5)
        try:
            bad = b"{"
            s.sendall(b"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\n\r\n" + bad)
            s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
            data = b""
            deadline = time.monotonic() + 5
            while data.count(b"HTTP/1.1 ") < 2 and time.monotonic() < deadline:
                data += s.recv(65536)
            assert data.startswith(b"HTTP/1.1 400") and b"HTTP/1.1 200" in data, data
        finally:
            s.close()


# ---- upstream failures ----

def hold_script(req, io):
    io.hold(20.0)


def test_prefill_down():
    """Prefill refuses connections: 502 naming prefill; decode's request is closed at once."""
    with Upstream("decode", hold_script) as d, Cluster("router-pdown") as c:
        dead = closed_port()
        r = c.router("--prefill", f"http://127.0.0.1:{dead}", "9000", "--decode", d.url,
                     "--threads", "1", *ONE_SHOT)
        for stream in (False, True):
            d.reset()
            res = post(r.port, "/v1/chat/completions", dict(CHAT, stream=stream), timeout=15)
            err = openai_error(res, 502, code="prefill_unavailable")
            # the role and the worker id, never the worker's address (clients must not learn it)
            wid = [w["id"] for w in get(r.port, "/workers").json()["workers"]
                   if w["worker_type"] == "prefill"][0]
            assert "prefill" in err["message"] and wid in err["message"], err
            assert str(dead) not in err["message"] and "127.0.0.1" not in err["message"], err
            assert err["type"] == "upstream_error"
            # decode's request is cancelled at once: it may not even have reached decode; if
            # it did, its connection was closed
            time.sleep(0.3)
            for dr in list(d.requests):
                assert d.wait_closed(dr, PROMPT_S), "decode not closed after prefill failed"
            assert get(r.port, "/health").status == 200


def test_prefill_error_status():
    """Prefill answers 500: the client gets 500 naming prefill, decode is closed at once."""
    def p_script(req, io):
        io.respond(500, {"error": "engine exploded"})

    with Upstream("prefill", p_script) as p, Upstream("decode", hold_script) as d, \
            Cluster("router-p500") as c:
        r = c.router("--prefill", p.url, "--decode", d.url, "--threads", "1")
        res = post(r.port, "/generate", GEN, timeout=15)
        err = openai_error(res, 500, code="prefill_error")
        assert "prefill" in err["message"] and "engine exploded" in err["message"], err
        dr = d.wait_requests(1)[0]
        assert d.wait_closed(dr, PROMPT_S), "decode request not closed after prefill's 500"


def test_decode_error_passthrough():
    """Decode answers 429 with its own body: passed through as is; prefill is closed."""
    body = {"error": {"message": "too many", "type": "rate_limit", "code": 429}}

    def d_script(req, io):
        io.respond(429, body)

    with Upstream("prefill", hold_script) as p, Upstream("decode", d_script) as d, \
            Cluster("router-d429") as c:
        r = c.router("--prefill", p.url, "--decode", d.url, "--threads", "1")
        res = post(r.port, "/v1/completions", {"prompt": "x", "stream": True}, timeout=15)
        assert res.status == 429 and res.json() == body, (res.status, res.text)
        pr = p.wait_requests(1)[0]
        assert p.wait_closed(pr, PROMPT_S), "prefill request not closed after decode's error"


def test_decode_dies_midstream():
    """Decode sends two events and crashes: the client gets them, then a JSON error event and
    [DONE]; prefill's request is closed at once."""
    def d_script(req, io):
        io.start_sse()
        io.event({"text": "a"})
        io.event({"text": "b"})
        time.sleep(0.1)
        io.die()

    with Upstream("prefill", hold_script) as p, Upstream("decode", d_script) as d, \
            Cluster("router-ddie") as c:
        r = c.router("--prefill", p.url, "--decode", d.url, "--threads", "1")
        cl = SSEClient(r.port, "/v1/chat/completions", dict(CHAT, stream=True), timeout=15)
        try:
            assert cl.status == 200
            evs = cl.events()
        finally:
            cl.close()
        assert [json.loads(e)["text"] for e in evs[:2]] == ["a", "b"], evs
        assert len(evs) == 4 and evs[3] == "[DONE]", evs
        err = json.loads(evs[2])["error"]  # valid JSON, not Python repr
        assert "decode" in err["message"] and err["type"] == "upstream_error", err
        assert err["code"].startswith("decode_"), err
        pr = p.wait_requests(1)[0]
        assert p.wait_closed(pr, PROMPT_S), "prefill request not closed after decode died"


def test_client_disconnect():
    """A client that goes away mid-stream makes the router close both upstream requests."""
    def d_script(req, io):
        io.start_sse()
        for i in range(200):
            io.event({"text": f"t{i}"})
            if io.peer_closed(0.05):
                return

    with Upstream("prefill", hold_script) as p, Upstream("decode", d_script) as d, \
            Cluster("router-cdisc") as c:
        r = c.router("--prefill", p.url, "--decode", d.url, "--threads", "1")
        for _ in range(2):
            p.reset()
            d.reset()
            cl = SSEClient(r.port, "/generate", dict(GEN, stream=True), timeout=15)
            assert json.loads(cl.next_event())["text"] == "t0"
            cl.close()
            pr, dr = p.wait_requests(1)[0], d.wait_requests(1)[0]
            assert p.wait_closed(pr, PROMPT_S), "prefill not closed after client disconnect"
            assert d.wait_closed(dr, PROMPT_S), "decode not closed after client disconnect"
            assert dr.t_end is not None or dr.closed_by_peer
        # non-streaming: the client gives up while both are still working. A FIN alone is a
        # half-close, which is answered (test_router_hardening.py); a reset is the abort.
        p.reset(hold_script)
        d.reset(hold_script)
        s = socket.create_connection(("127.0.0.1", r.port), timeout=5)
        data = json.dumps(CHAT).encode()
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n"
                  % len(data) + data)
        pr, dr = p.wait_requests(1)[0], d.wait_requests(1)[0]
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        s.close()
        assert p.wait_closed(pr, PROMPT_S) and d.wait_closed(dr, PROMPT_S)
        # the router is fine afterwards
        assert get(r.port, "/health").status == 200


def test_upstream_timeouts():
    """A decode that never answers hits the first-byte timeout: 504 naming decode."""
    def p_script(req, io):
        io.respond(200, {"text": ""})

    with Upstream("prefill", p_script) as p, Upstream("decode", hold_script) as d, \
            Cluster("router-timeout") as c:
        r = c.router("--prefill", p.url, "--decode", d.url, "--threads", "1",
                     "--first-byte-timeout-ms", "300")
        t0 = time.monotonic()
        res = post(r.port, "/v1/completions", {"prompt": "x"}, timeout=15)
        err = openai_error(res, 504, code="decode_timeout")
        assert "decode" in err["message"], err
        assert time.monotonic() - t0 < 10
        dr = d.wait_requests(1)[0]
        assert d.wait_closed(dr, PROMPT_S)


# ---- readiness, registration at run time, metrics ----

def test_readiness_transitions():
    with Upstream("p") as p, Upstream("d") as d, Upstream("w") as w, \
            Cluster("router-ready") as c:
        r = c.router("--threads", "1")
        port = r.port
        assert get(port, "/health").status == 200
        assert get(port, "/liveness").status == 200
        openai_error(get(port, "/readiness"), 503, code="not_ready")
        res = post(port, "/workers", {"url": p.url, "worker_type": "prefill",
                                      "bootstrap_port": 9100})
        assert res.status == 202, res.text
        openai_error(get(port, "/readiness"), 503)
        res = post(port, "/workers", {"url": d.url, "worker_type": "decode"})
        assert res.status == 202, res.text
        dec_id = res.json()["id"]
        assert get(port, "/readiness").status == 200
        # the pair added at run time gets traffic
        res = post(port, "/generate", GEN)
        assert res.status == 200, res.text
        # prefill's answer is not waited for: it may still be on its way
        assert len(p.wait_requests(1)) == 1 and len(d.requests) == 1
        assert p.requests[0].json()["bootstrap_port"] == 9100
        res = request(port, "DELETE", f"/workers/{dec_id}")
        assert res.status in (200, 202), res.text
        openai_error(get(port, "/readiness"), 503)
        openai_error(post(port, "/generate", GEN), 503, code="no_decode_worker")
        res = post(port, "/workers", {"url": w.url})
        assert res.status == 202, res.text
        assert get(port, "/readiness").status == 200
        assert post(port, "/generate", GEN).status == 200
        assert len(w.requests) == 1


SAMPLE_RE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(?:[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\]|\\.)*"'
                       r'(?:,[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\]|\\.)*")*,?)?\})? '
                       r'(-?[0-9.eE+-]+|NaN|\+Inf|-Inf)( -?[0-9]+)?$')


def parse_metrics(text):
    """Every line must be a comment or a valid sample. Returns {(name, labels-str): value} and
    the declared TYPEs."""
    samples, types = {}, {}
    for ln in text.split("\n"):
        if not ln:
            continue
        if ln.startswith("#"):
            parts = ln.split(" ", 3)
            assert parts[1] in ("HELP", "TYPE"), ln
            if parts[1] == "TYPE":
                assert parts[3] in ("counter", "gauge", "histogram", "summary", "untyped"), ln
                types[parts[2]] = parts[3]
            continue
        m = SAMPLE_RE.match(ln)
        assert m, f"invalid metrics line: {ln!r}"
        samples[(m.group(1), m.group(2) or "")] = float(m.group(3))
    return samples, types


def test_metrics():
    # Decode answers only once the live prefill has answered the same bootstrap room, as a
    # real decode waits for its KV: a request whose prefill leg hits the dead worker then
    # always ends 502 (the router closes its decode leg), never 200 by racing the connect error.
    rooms_prefilled = set()
    prefilled = threading.Condition()

    def p_script(req, io):
        with prefilled:
            rooms_prefilled.add(json.loads(req.body).get("bootstrap_room"))
            prefilled.notify_all()
        io.respond(200, {"text": "ok"})

    def d_script(req, io):
        room = json.loads(req.body).get("bootstrap_room") if req.body else None
        deadline = time.monotonic() + PROMPT_S
        while time.monotonic() < deadline:
            with prefilled:
                if room is None or room in rooms_prefilled:
                    break
                prefilled.wait(0.05)
            if io.peer_closed(0):
                return
        io.respond(200, {"text": "ok"})

    dead = closed_port()
    with Upstream("prefill", p_script) as p, Upstream("decode", d_script) as d, \
            Cluster("router-metrics") as c:
        r = c.router("--prefill", p.url, "--decode", d.url, "--threads", "2", *ONE_SHOT)
        port = r.port
        res = get(port, "/metrics")
        assert res.status == 200
        assert res.headers["content-type"].startswith("text/plain; version=0.0.4"), res.headers
        before, _ = parse_metrics(res.text)
        for _ in range(5):
            assert post(port, "/v1/chat/completions", CHAT).status == 200
        assert post(port, "/v1/chat/completions", {"messages": 1}).status == 400
        assert get(port, "/nope").status == 404
        # an upstream error: a prefill that is down
        res = post(port, "/workers", {"url": f"http://127.0.0.1:{dead}", "worker_type": "prefill"})
        assert res.status == 202
        for _ in range(4):  # round robin over two prefills: every other one hits the dead one
            if post(port, "/generate", GEN).status == 502:
                break
        res = get(port, "/metrics")
        samples, types = parse_metrics(res.text)
        for fam, typ in (("baton_requests_total", "counter"),
                         ("baton_request_duration_seconds", "histogram"),
                         ("baton_time_to_first_byte_seconds", "histogram"),
                         ("baton_worker_in_flight_requests", "gauge"),
                         ("baton_workers", "gauge"),
                         ("baton_upstream_errors_total", "counter")):
            assert types.get(fam) == typ, (fam, types.get(fam))

        def val(name, **labels):
            want = set(f'{k}="{v}"' for k, v in labels.items())
            tot = 0.0
            found = False
            for (n, lab), v in samples.items():
                if n != name:
                    continue
                have = set(lab.strip("{}").split(",")) if lab else set()
                if want <= have:
                    tot += v
                    found = True
            return tot if found else None

        assert val("baton_requests_total", route="/v1/chat/completions", status="200") >= 5
        assert val("baton_requests_total", route="/v1/chat/completions", status="400") >= 1
        assert val("baton_requests_total", status="404") >= 1
        assert val("baton_requests_total", route="/generate", status="502") >= 1
        assert val("baton_request_duration_seconds_count", route="/v1/chat/completions") >= 6
        assert val("baton_time_to_first_byte_seconds_count", route="/v1/chat/completions") >= 5
        assert val("baton_upstream_errors_total", role="prefill", kind="connect") >= 1
        assert val("baton_workers", role="prefill") == 2
        assert val("baton_workers", role="decode") == 1
        # the decode leg of the request that failed on its prefill is cancelled after the
        # client's 502 went out: its in-flight count drops a moment later
        def in_flight_zero():
            nonlocal samples
            samples = parse_metrics(get(port, "/metrics").text)[0]
            return val("baton_worker_in_flight_requests") == 0
        wait_until(in_flight_zero, 10, what="no request in flight")


def test_sigterm_exit():
    """SIGTERM with requests in flight: the router closes them and exits 0 (under the
    sanitizers, a leak or memory error makes this fail)."""
    def d_script(req, io):
        body = req.json()
        if body.get("stream"):
            io.start_sse()
            for i in range(3):
                io.event({"text": f"t{i}"})
            io.event("[DONE]")
            io.end_sse()
        elif body.get("text") == "hold":
            io.hold(20.0)
        else:
            io.respond(200, {"text": "ok", "meta_info": {"input_token_logprobs": [[-1, 1, None]]}})

    with Upstream("prefill", d_script) as p, Upstream("decode", d_script) as d, \
            Cluster("router-sigterm") as c:
        r = c.router("--prefill", p.url, "--decode", d.url, "--threads", "2")
        for body in (GEN, dict(GEN, stream=True), dict(GEN, return_logprob=True),
                     dict(GEN, return_logprob=True, stream=True), {"text": ["a", "b"]}):
            assert post(r.port, "/generate", body).status == 200
        assert get(r.port, "/metrics").status == 200
        res = post(r.port, "/workers", {"url": "http://127.0.0.1:1", "worker_type": "decode"})
        assert res.status == 202
        for _ in range(2):  # round robin: one of them fails against the dead decode
            post(r.port, "/generate", GEN)
        assert request(r.port, "DELETE", f"/workers/{res.json()['id']}").status in (200, 202)
        # one request left hanging in flight
        s = socket.create_connection(("127.0.0.1", r.port), timeout=5)
        data = json.dumps({"text": "hold"}).encode()
        s.sendall(b"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n"
                  % len(data) + data)
        wait_until(lambda: any(q.json().get("text") == "hold" for q in d.requests),
                   what="held request at decode")
        rc = r.stop(timeout=20)
        s.close()
        assert rc == 0, f"router exited with {rc}\n{r.tail()}"
        assert "ERROR: AddressSanitizer" not in r.tail(200)
        assert "LeakSanitizer" not in r.tail(200)


def main():
    t = TestRunner()
    t.run(test_http_limits)
    t.run(test_request_errors)
    t.run(test_prefill_down)
    t.run(test_prefill_error_status)
    t.run(test_decode_error_passthrough)
    t.run(test_decode_dies_midstream)
    t.run(test_client_disconnect)
    t.run(test_upstream_timeouts)
    t.run(test_readiness_transitions)
    t.run(test_metrics)
    t.run(test_sigterm_exit)
    t.finish()


if __name__ == "__main__":
    main()
