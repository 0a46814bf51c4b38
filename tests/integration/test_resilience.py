"""test_resilience.py — the router's request-level resilience against scripted upstreams:
retries with a new pair and a new room (and never after a byte reached the client), abort
propagation, per-phase timeouts, admission (concurrency cap, bounded queue, 429/503, per-worker
caps), drain of removed workers, SIGTERM drain, SIGHUP reload, health checks and breakers as
seen in /workers, /readiness and /metrics."""

import json
import os
import re
import signal
import socket
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from harness import (Cluster, TestRunner, get, post, request, sse_events,  # noqa: E402
                     wait_until)
from router_upstream import SSEClient, Upstream, closed_port  # noqa: E402

GEN = {"text": "hello", "sampling_params": {"max_new_tokens": 4}}
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
# "At once" on a loaded 2-core machine: the mechanism is an immediate close.
PROMPT_S = 5.0
# Active checks off unless a test is about them: scripted upstreams answer /health themselves,
# but a test that counts on exact timing should not have checks running beside it.
NO_CHECKS = ("--check-interval-ms", "0")


def err_of(res, status, code=None):
    assert res.status == status, (res.status, res.text)
    e = res.json()["error"]
    assert isinstance(e["message"], str) and e["message"] and "type" in e, e
    if code is not None:
        assert e["code"] == code, e
    return e


def metrics(port):
    """{(name, frozenset(label pairs)): value} from /metrics."""
    out = {}
    for ln in get(port, "/metrics").text.split("\n"):
        if not ln or ln.startswith("#"):
            continue
        m = re.match(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$', ln)
        assert m, ln
        labels = frozenset(re.findall(r'([a-zA-Z_]+)="((?:[^"\\]|\\.)*)"', m.group(2) or ""))
        out[(m.group(1), labels)] = float(m.group(3))
    return out


def mval(ms, name, **labels):
    want = set(labels.items())
    tot, found = 0.0, False
    for (n, lab), v in ms.items():
        if n == name and want <= set(lab):
            tot += v
            found = True
    return tot if found else None


def workers(port):
    return {w["url"]: w for w in get(port, "/workers").json()["workers"]}


def json_answer(text="ok", delay=0.0):
    def script(req, io):
        if delay:
            if io.hold(delay):
                return
        io.respond(200, {"text": text, "meta_info": {}})
    return script


def status_answer(status, delay=0.0):
    def script(req, io):
        if delay and io.hold(delay):
            return
        io.respond(status, {"error": {"message": f"busy {status}", "type": "x", "code": status}})
    return script


def hold_script(req, io):
    io.hold(20.0)


# ---- retries ----

def test_retry_new_pair_new_room():
    """Prefill A answers 503: decode of that attempt is closed at once, the retry goes to the
    other prefill and the other decode with a new room, and the client gets the answer."""
    def d_script(name):
        def script(req, io):
            # paired with the failing prefill (9001): wait long, so that only the router's
            # close can end it early; paired with the good one: answer at once
            if req.json()["bootstrap_port"] == 9001 and io.hold(5.0):
                return
            io.respond(200, {"text": f"from {name}"})
        return script

    with Upstream("pA", status_answer(503, 0.2)) as pa, Upstream("pB", json_answer("")) as pb, \
            Upstream("d1", d_script("d1")) as d1, Upstream("d2", d_script("d2")) as d2, \
            Cluster("res-retry") as c:
        r = c.router("--prefill", pa.url, "9001", "--prefill", pb.url, "9002",
                     "--decode", d1.url, "--decode", d2.url, "--threads", "1",
                     "--retry-backoff-ms", "20", *NO_CHECKS)
        res = post(r.port, "/generate", GEN, timeout=20)
        assert res.status == 200, res.text
        first_d = d1 if d1.requests else d2
        other_d = d2 if first_d is d1 else d1
        assert res.json()["text"] == ("from d2" if other_d is d2 else "from d1"), res.text
        a, b = pa.wait_requests(1)[0].json(), pb.wait_requests(1)[0].json()
        fd, od = first_d.wait_requests(1)[0], other_d.wait_requests(1)[0]
        # the first attempt's decode was closed as soon as prefill failed (it would hold 5 s)
        assert first_d.wait_closed(fd, PROMPT_S), "first attempt's decode not closed"
        assert fd.t_closed - fd.t_start < 4.0, fd.t_closed - fd.t_start
        # pairs: same room on both sides of an attempt, a new room for the retry, and the
        # bootstrap fields of the prefill actually paired
        assert fd.json()["bootstrap_room"] == a["bootstrap_room"]
        assert od.json()["bootstrap_room"] == b["bootstrap_room"]
        assert a["bootstrap_room"] != b["bootstrap_room"]
        assert (a["bootstrap_port"], b["bootstrap_port"]) == (9001, 9002)
        assert od.json()["bootstrap_port"] == 9002
        assert len(pa.requests) == 1 and len(pb.requests) == 1
        ms = metrics(r.port)
        assert mval(ms, "baton_retries_total", role="prefill", reason="status") == 1, ms
        assert mval(ms, "baton_upstream_aborts_total", role="decode", reason="peer_failed") >= 1


def test_retry_exhausted_bound():
    """Every prefill fails: 1 + max_retries attempts, with back-off, then the last failure."""
    with Upstream("p", status_answer(502, 0.1)) as p, Upstream("d", hold_script) as d, \
            Cluster("res-exhaust") as c:
        r = c.router("--prefill", p.url, "--decode", d.url, "--threads", "1", "--max-retries", "3",
                     "--retry-backoff-ms", "100", "--retry-backoff-max-ms", "150",
                     "--breaker-threshold", "0", *NO_CHECKS)
        t0 = time.monotonic()
        res = post(r.port, "/v1/chat/completions", CHAT, timeout=20)
        took = time.monotonic() - t0
        e = err_of(res, 502, "prefill_error")
        assert "busy 502" in e["message"], e
        assert len(p.requests) == 4, len(p.requests)
        # back-offs of at least 50, 75 and 75 ms (b/2) were waited
        assert took >= 0.2, took
        for dr in d.wait_requests(4):
            assert d.wait_closed(dr, PROMPT_S)
        ms = metrics(r.port)
        assert mval(ms, "baton_retries_total", reason="status") == 3
        assert mval(ms, "baton_retries_exhausted_total", reason="max_retries") == 1
        # a retry budget that is already spent: no retry at all
        r2 = c.router("--prefill", p.url, "--decode", d.url, "--threads", "1",
                      "--retry-budget-ms", "1", "--retry-backoff-ms", "50",
                      "--breaker-threshold", "0", *NO_CHECKS, name="router2")
        p.reset()
        err_of(post(r2.port, "/generate", GEN, timeout=20), 502)
        assert len(p.requests) == 1
        assert mval(metrics(r2.port), "baton_retries_exhausted_total", reason="out_of_time") == 1


def test_no_retry_for_4xx_nor_after_first_byte():
    """A 4xx is the request's fault: passed through, no retry, no breaker count. A stream that
    broke after its first byte is never retried: an SSE error event ends it."""
    def d_script(req, io):
        if req.json().get("stream"):
            io.start_sse()
            io.event({"text": "a"})
            time.sleep(0.05)
            io.die()
        else:
            io.respond(400, {"error": {"message": "bad prompt", "type": "invalid", "code": 400}})

    with Upstream("p", json_answer("")) as p, Upstream("d", d_script) as d, \
            Cluster("res-noretry") as c:
        r = c.router("--prefill", p.url, "--decode", d.url, "--threads", "1",
                     "--breaker-threshold", "2", *NO_CHECKS)
        for _ in range(5):
            res = post(r.port, "/generate", GEN)
            assert res.status == 400 and res.json()["error"]["message"] == "bad prompt", res.text
        # one request each (prefill's may have been closed before it arrived: decode's error
        # cancels it at once)
        assert len(d.requests) == 5 and len(p.requests) <= 5
        assert workers(r.port)[d.url]["breaker"] == "closed"  # 4xx never counts
        d.reset()
        res = post(r.port, "/generate", dict(GEN, stream=True))
        evs = sse_events(res.body)
        assert res.status == 200 and evs[0] == '{"text": "a"}', evs
        assert evs[-1] == "[DONE]" and json.loads(evs[-2])["error"]["code"].startswith("decode_")
        assert len(d.requests) == 1, "a stream that started must not be retried"
        assert mval(metrics(r.port), "baton_retries_total") is None


# ---- abort propagation and phase timeouts ----

def test_prefill_timeout_closes_decode():
    """Prefill hangs past --prefill-timeout-ms: decode is closed at that moment, not at its own
    (much longer) bootstrap timeout; the client gets 504 naming prefill."""
    with Upstream("p", hold_script) as p, Upstream("d", hold_script) as d, \
            Cluster("res-ptimeout") as c:
        r = c.router("--prefill", p.url, "--decode", d.url, "--threads", "1", "--max-retries",
                     "0", "--prefill-timeout-ms", "400", "--first-byte-timeout-ms", "30000",
                     *NO_CHECKS)
        t0 = time.monotonic()
        e = err_of(post(r.port, "/generate", GEN, timeout=20), 504, "prefill_timeout")
        assert "prefill" in e["message"]
        assert time.monotonic() - t0 < PROMPT_S
        pr, dr = p.wait_requests(1)[0], d.wait_requests(1)[0]
        assert d.wait_closed(dr, PROMPT_S) and p.wait_closed(pr, PROMPT_S)
        assert dr.t_closed - dr.t_start < 0.4 + PROMPT_S
        ms = metrics(r.port)
        assert mval(ms, "baton_upstream_aborts_total", role="prefill", reason="timeout") == 1
        assert mval(ms, "baton_upstream_aborts_total", role="decode", reason="peer_failed") == 1


def test_idle_timeout_mid_stream():
    """Decode stops sending mid-stream: after --idle-timeout-ms the client gets an SSE error
    event and [DONE], and decode's connection is closed."""
    def d_script(req, io):
        io.start_sse()
        io.event({"text": "a"})
        io.hold(20.0)

    with Upstream("p", json_answer("")) as p, Upstream("d", d_script) as d, \
            Cluster("res-idle") as c:
        r = c.router("--prefill", p.url, "--decode", d.url, "--threads", "1",
                     "--idle-timeout-ms", "300", *NO_CHECKS)
        t0 = time.monotonic()
        cl = SSEClient(r.port, "/generate", dict(GEN, stream=True), timeout=15)
        try:
            evs = cl.events()
        finally:
            cl.close()
        assert time.monotonic() - t0 < PROMPT_S
        assert evs[0] == '{"text": "a"}' and evs[-1] == "[DONE]", evs
        assert json.loads(evs[1])["error"]["code"] == "decode_timeout", evs
        assert d.wait_closed(d.wait_requests(1)[0], PROMPT_S)


def test_request_deadline_across_retries():
    """--request-timeout-ms bounds the whole request, retries included."""
    with Upstream("p", status_answer(503, 0.25)) as p, Upstream("d", hold_script) as d, \
            Cluster("res-deadline") as c:
        r = c.router("--prefill", p.url, "--decode", d.url, "--threads", "1", "--max-retries",
                     "50", "--retry-backoff-ms", "10", "--retry-backoff-max-ms", "10",
                     "--request-timeout-ms", "1200", "--breaker-threshold", "0", *NO_CHECKS)
        t0 = time.monotonic()
        res = post(r.port, "/generate", GEN, timeout=20)
        took = time.monotonic() - t0
        # either the last attempt ran into the deadline (504) or no attempt fitted any more and
        # the last failure (503) was answered
        assert res.status in (503, 504), res.text
        assert took < 1.2 + PROMPT_S, took
        assert 2 <= len(p.requests) <= 6, len(p.requests)  # ~0.26 s per attempt in 1.2 s
        if res.status == 503:
            assert mval(metrics(r.port), "baton_retries_exhausted_total",
                        reason="out_of_time") == 1


# ---- admission ----

def test_admission_queue():
    """One slot, a queue of one: the second request waits, the third gets 429 (with
    Retry-After); a waiter that outlives --queue-timeout-ms gets 408; a waiter is served as
    soon as the slot frees up."""
    def d_script(req, io):
        t = req.json().get("text")
        if t == "slow":
            if io.hold(1.5):
                return
        io.respond(200, {"text": t})

    with Upstream("p", json_answer("")) as p, Upstream("d", d_script) as d, \
            Cluster("res-queue") as c:
        r = c.router("--prefill", p.url, "--decode", d.url, "--threads", "2",
                     "--max-concurrent-requests", "1", "--queue-size", "1",
                     "--queue-timeout-ms", "700", *NO_CHECKS)
        out = {}

        def go(name, text, delay=0.0):
            time.sleep(delay)
            t0 = time.monotonic()
            out[name] = (post(r.port, "/generate", {"text": text}, timeout=20),
                         time.monotonic() - t0)

        ts = [threading.Thread(target=go, args=("a", "slow")),
              threading.Thread(target=go, args=("b", "queued", 0.3)),
              threading.Thread(target=go, args=("c", "refused", 0.6))]
        for t in ts:
            t.start()
        for t in ts:
            t.join(30)
        assert out["a"][0].status == 200 and out["a"][0].json()["text"] == "slow"
        err_of(out["b"][0], 408, "queue_timeout")
        assert 0.5 < out["b"][1] < 0.7 + PROMPT_S, out["b"][1]
        res_c = out["c"][0]
        err_of(res_c, 429, "queue_full")
        assert res_c.headers.get("retry-after") == "1", res_c.headers
        assert [q.json()["text"] for q in d.requests] == ["slow"]  # nothing else got through
        # a waiter gets the slot when it frees up
        r2 = c.router("--prefill", p.url, "--decode", d.url, "--threads", "2",
                      "--max-concurrent-requests", "1", "--queue-timeout-ms", "10000",
                      *NO_CHECKS, name="router2")
        out.clear()
        r = r2
        ts = [threading.Thread(target=go, args=("a", "slow")),
              threading.Thread(target=go, args=("b", "second", 0.3))]
        for t in ts:
            t.start()
        for t in ts:
            t.join(30)
        assert out["a"][0].status == 200 and out["b"][0].status == 200, out
        assert out["b"][0].json()["text"] == "second"
        assert out["b"][1] > 1.0, "the second request did not wait for the slot"
        # a request's slot is given back once its upstream requests reported too (a moment
        # after its client got the answer)
        wait_until(lambda: mval(metrics(r2.port), "baton_active_requests") == 0, timeout=5,
                   what="slots given back")
        ms = metrics(r2.port)
        assert mval(ms, "baton_queue_depth") == 0
        assert mval(ms, "baton_queue_time_seconds_count") == 1
        ms1 = metrics(c.procs[0].port)
        assert mval(ms1, "baton_admission_rejected_total", reason="queue_full") == 1
        assert mval(ms1, "baton_admission_rejected_total", reason="queue_timeout") == 1


def test_per_worker_cap():
    """--max-worker-requests 1: a decode at its cap is not picked; with both at their cap the
    third request waits, then is served."""
    live = {"n": 0, "max": 0}
    lock = threading.Lock()

    def d_script(req, io):
        with lock:
            live["n"] += 1
            live["max"] = max(live["max"], live["n"])
        try:
            time.sleep(1.0)
            io.respond(200, {"text": req.json()["text"]})
        finally:
            with lock:
                live["n"] -= 1

    with Upstream("p1", json_answer("")) as p1, Upstream("p2", json_answer("")) as p2, \
            Upstream("d1", d_script) as d1, Upstream("d2", d_script) as d2, \
            Cluster("res-cap") as c:
        r = c.router("--prefill", p1.url, "--prefill", p2.url, "--decode", d1.url, "--decode",
                     d2.url, "--threads", "2", "--max-worker-requests", "1",
                     "--queue-timeout-ms", "20000", *NO_CHECKS)
        out = {}

        def go(i):
            t0 = time.monotonic()
            out[i] = (post(r.port, "/generate", {"text": f"r{i}"}, timeout=30),
                      time.monotonic() - t0)

        ts = [threading.Thread(target=go, args=(i,)) for i in range(3)]
        for t in ts:
            t.start()
            time.sleep(0.1)
        seen = []
        deadline = time.monotonic() + 10
        while any(t.is_alive() for t in ts) and time.monotonic() < deadline:
            ws = workers(r.port)
            seen.append((ws[d1.url]["in_flight"], ws[d2.url]["in_flight"]))
            time.sleep(0.05)
        for t in ts:
            t.join(30)
        for i in range(3):
            assert out[i][0].status == 200 and out[i][0].json()["text"] == f"r{i}", out[i]
        assert max(out[i][1] for i in range(3)) > 1.5, "one request must have waited"
        assert len(d1.requests) + len(d2.requests) == 3
        assert max(max(a, b) for a, b in seen) <= 1, seen
        assert live["max"] <= 2
        # the third request waited once (however often it was woken and went back to the head)
        ms = metrics(r.port)
        assert mval(ms, "baton_queue_time_seconds_count") == 1, ms
        assert mval(ms, "baton_queue_depth") == 0


# ---- removal drain, SIGTERM drain, SIGHUP reload ----

def stream_script(n, gap):
    def script(req, io):
        io.start_sse()
        for i in range(n):
            io.event({"text": f"t{i}"})
            if io.peer_closed(gap):
                return
        io.event("[DONE]")
        io.end_sse()
    return script


def test_remove_worker_drains():
    """DELETE of a busy decode: its stream finishes (within the drain deadline) and new
    requests go elsewhere; past the deadline a stream is cut with an SSE error and a request
    that had not started is retried on another decode."""
    with Upstream("p", json_answer("")) as p, Upstream("d1", stream_script(15, 0.1)) as d1, \
            Upstream("d2", stream_script(3, 0.01)) as d2, Cluster("res-drain") as c:
        r = c.router("--prefill", p.url, "--decode", d1.url, "--threads", "1",
                     "--worker-drain-timeout-ms", "8000", *NO_CHECKS)
        cl = SSEClient(r.port, "/generate", dict(GEN, stream=True), timeout=15)
        assert cl.next_event() == '{"text": "t0"}'
        wid = workers(r.port)[d1.url]["id"]
        assert post(r.port, "/workers", {"url": d2.url, "worker_type": "decode"}).status == 202
        assert request(r.port, "DELETE", f"/workers/{wid}").status in (200, 202)
        assert d1.url not in workers(r.port)
        for _ in range(3):  # new requests never reach the draining worker
            res = post(r.port, "/generate", dict(GEN, stream=True))
            assert res.status == 200 and sse_events(res.body)[-1] == "[DONE]"
        assert len(d1.requests) == 1 and len(d2.requests) == 3
        evs = [e for e in iter(cl.next_event, None)]
        cl.close()
        assert evs[-1] == "[DONE]" and len(evs) == 15, evs  # t1..t14 + [DONE]: finished

    def held_then_answer(req, io):
        io.hold(20.0)

    with Upstream("p", json_answer("")) as p, Upstream("d1", stream_script(200, 0.05)) as d1, \
            Upstream("d2", json_answer("from d2")) as d2, Upstream("d3", held_then_answer) as d3, \
            Cluster("res-drain2") as c:
        r = c.router("--prefill", p.url, "--decode", d1.url, "--decode", d3.url, "--threads",
                     "1", "--worker-drain-timeout-ms", "500", *NO_CHECKS)
        cl = SSEClient(r.port, "/generate", dict(GEN, stream=True), timeout=15)
        assert cl.next_event() == '{"text": "t0"}'
        got = {}
        t = threading.Thread(target=lambda: got.update(res=post(r.port, "/generate", GEN,
                                                                timeout=20)))
        t.start()
        d3.wait_requests(1)  # round robin: the second request holds at d3
        assert post(r.port, "/workers", {"url": d2.url, "worker_type": "decode"}).status == 202
        for u in (d1.url, d3.url):
            assert request(r.port, "DELETE", f"/workers/{workers(r.port)[u]['id']}").status \
                in (200, 202)
        t0 = time.monotonic()
        evs = [e for e in iter(cl.next_event, None)]
        cl.close()
        assert time.monotonic() - t0 < 0.5 + PROMPT_S
        assert evs[-1] == "[DONE]" and "error" in json.loads(evs[-2]), evs[-3:]
        assert json.loads(evs[-2])["error"]["code"] == "decode_unavailable"
        t.join(20)
        assert got["res"].status == 200 and got["res"].json()["text"] == "from d2", got
        assert d3.wait_closed(d3.requests[0], PROMPT_S)
        ms = metrics(r.port)
        assert mval(ms, "baton_upstream_aborts_total", reason="drain_timeout") == 2
        assert mval(ms, "baton_retries_total", role="decode", reason="drained") == 1


def test_sigterm_drains():
    """SIGTERM: new connections are refused, the request in flight completes, exit 0 well
    before the drain deadline; a request longer than the deadline gets an SSE error at the
    deadline, and the router still exits 0."""
    with Upstream("p", json_answer("")) as p, Upstream("d", stream_script(10, 0.1)) as d, \
            Cluster("res-term") as c:
        r = c.router("--prefill", p.url, "--decode", d.url, "--threads", "2",
                     "--drain-timeout-ms", "20000", *NO_CHECKS)
        port = r.port
        cl = SSEClient(port, "/generate", dict(GEN, stream=True), timeout=15)
        assert cl.next_event() == '{"text": "t0"}'
        t0 = time.monotonic()
        r.signal(signal.SIGTERM)
        r.wait_log(r"shutdown signal=SIGTERM")

        def refused():
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                return False
            except OSError:
                return True
        wait_until(refused, timeout=5, what="listener closed")
        evs = [e for e in iter(cl.next_event, None)]
        cl.close()
        assert evs[-1] == "[DONE]" and len(evs) == 10, evs
        r.p.wait(timeout=15)
        assert r.p.returncode == 0, r.tail()
        assert time.monotonic() - t0 < 15, "exit did not follow the last request"
        assert "AddressSanitizer" not in r.tail(200) and "LeakSanitizer" not in r.tail(200)

    with Upstream("p", json_answer("")) as p, Upstream("d", stream_script(400, 0.05)) as d, \
            Cluster("res-term2") as c:
        r = c.router("--prefill", p.url, "--decode", d.url, "--threads", "2",
                     "--drain-timeout-ms", "600", *NO_CHECKS)
        cl = SSEClient(r.port, "/generate", dict(GEN, stream=True), timeout=15)
        assert cl.next_event() == '{"text": "t0"}'
        t0 = time.monotonic()
        r.signal(signal.SIGTERM)
        evs = [e for e in iter(cl.next_event, None)]
        cl.close()
        assert evs[-1] == "[DONE]" and json.loads(evs[-2])["error"]["code"] == "shutting_down"
        assert time.monotonic() - t0 < 0.6 + PROMPT_S
        assert d.wait_closed(d.requests[0], PROMPT_S)
        r.p.wait(timeout=15)
        assert r.p.returncode == 0, r.tail()
        assert "AddressSanitizer" not in r.tail(200) and "LeakSanitizer" not in r.tail(200)


def test_sighup_reload():
    """SIGHUP re-reads --config: a removed decode drains (its stream in flight is not
    dropped), an added one takes traffic, the policy changes; a bad file changes nothing."""
    with Upstream("p", json_answer("")) as p, Upstream("d1", stream_script(12, 0.1)) as d1, \
            Upstream("d2", stream_script(2, 0.01)) as d2, Cluster("res-hup") as c:
        fd, path = tempfile.mkstemp(prefix="baton-hup-", suffix=".json")
        os.close(fd)
        try:
            def write(decodes, policy="round_robin"):
                with open(path, "w") as f:
                    json.dump({"decode_policy": policy, "workers":
                               [{"url": p.url, "worker_type": "prefill"}] +
                               [{"url": u, "worker_type": "decode"} for u in decodes]}, f)
            write([d1.url])
            r = c.router("--config", path, "--threads", "2", *NO_CHECKS)
            cl = SSEClient(r.port, "/generate", dict(GEN, stream=True), timeout=15)
            assert cl.next_event() == '{"text": "t0"}'
            write([d2.url], policy="power_of_two")
            r.signal(signal.SIGHUP)
            r.wait_log(r"reloaded added=1 removed=1 changed=0 unchanged=1 .*"
                       r"decode_policy=power_of_two")
            ws = workers(r.port)
            assert d2.url in ws and d1.url not in ws and p.url in ws, ws
            for _ in range(3):
                res = post(r.port, "/generate", dict(GEN, stream=True))
                assert res.status == 200 and sse_events(res.body)[-1] == "[DONE]"
            assert len(d2.requests) == 3 and len(d1.requests) == 1
            evs = [e for e in iter(cl.next_event, None)]
            cl.close()
            assert evs[-1] == "[DONE]" and len(evs) == 12, evs  # not dropped by the reload
            # a broken file: logged, nothing changes, the router keeps serving
            with open(path, "w") as f:
                f.write("{ not json")
            r.signal(signal.SIGHUP)
            r.wait_log(r"reload_failed")
            assert set(workers(r.port)) == {p.url, d2.url}
            assert post(r.port, "/generate", dict(GEN, stream=True)).status == 200
            assert r.alive()
        finally:
            os.unlink(path)


# ---- health, breakers, readiness, /workers ----

def test_health_checks_and_readiness():
    """A decode whose /health fails goes down after --check-fall checks: it gets no traffic,
    /readiness says not ready; when /health passes again it comes back within two check
    intervals. /workers and /metrics show it."""
    state = {"ok": True}

    def d_script(req, io):
        if req.method == "GET":
            io.respond(200 if state["ok"] else 503, b"")
        else:
            io.respond(200, {"text": "d"})

    with Upstream("p", json_answer("")) as p, Upstream("d", d_script, scripted_health=True) as d, \
            Cluster("res-health") as c:
        interval = 0.6
        r = c.router("--prefill", p.url, "--decode", d.url, "--threads", "1",
                     "--check-interval-ms", str(int(interval * 1000)), "--check-fast-interval-ms",
                     "100", "--check-down-interval-ms", str(int(interval * 1000)),
                     "--check-timeout-ms", "300", "--check-rise", "2", "--check-fall", "2")
        assert get(r.port, "/readiness").status == 200
        wait_until(lambda: any(q.method == "GET" for q in d.requests), timeout=5,
                   what="first active check")
        state["ok"] = False
        wait_until(lambda: workers(r.port)[d.url]["health"] == "unhealthy", timeout=10,
                   what="decode marked unhealthy")
        err_of(get(r.port, "/readiness"), 503, "not_ready")
        err_of(post(r.port, "/generate", GEN), 503, "no_decode_worker")
        wid = workers(r.port)[d.url]["id"]
        # the registry (routing) changes first, the gauges a moment later
        wait_until(lambda: mval(metrics(r.port), "baton_worker_health", worker=wid) == 0,
                   timeout=5, what="health gauge down")
        ms = metrics(r.port)
        assert mval(ms, "baton_worker_health_transitions_total", worker=wid, to="down") == 1
        state["ok"] = True
        t0 = time.monotonic()
        wait_until(lambda: workers(r.port)[d.url]["health"] == "healthy", timeout=10,
                   interval=0.02, what="decode healthy again")
        back = time.monotonic() - t0
        assert back <= 2 * interval + 0.5, f"took {back:.2f}s to come back"
        assert get(r.port, "/readiness").status == 200
        assert post(r.port, "/generate", GEN).status == 200
        w = workers(r.port)[d.url]
        assert {"health", "breaker", "in_flight", "draining"} <= set(w), w
        print(f"    decode back in service {back:.2f}s after its health returned "
              f"(interval {interval}s)")


def test_breaker_opens_and_recovers():
    """Consecutive 5xx from one decode open its breaker: it gets no traffic (the other decode
    serves, nothing fails); after the cool-down one probe closes it again."""
    state = {"fail": True}

    def bad_script(req, io):
        if state["fail"]:
            io.respond(500, {"error": {"message": "boom", "type": "x", "code": 500}})
        else:
            io.respond(200, {"text": "bad-fixed"})

    with Upstream("p", json_answer("")) as p, Upstream("bad", bad_script) as bad, \
            Upstream("good", json_answer("good")) as good, Cluster("res-breaker") as c:
        r = c.router("--prefill", p.url, "--decode", bad.url, "--decode", good.url, "--threads",
                     "1", "--breaker-threshold", "3", "--breaker-cooldown-ms", "800",
                     "--retry-backoff-ms", "1", *NO_CHECKS)
        for _ in range(10):
            res = post(r.port, "/generate", GEN)
            assert res.status == 200 and res.json()["text"] == "good", res.text  # retried
        assert workers(r.port)[bad.url]["breaker"] == "open"
        assert len(bad.requests) == 3, len(bad.requests)
        state["fail"] = False
        n_before = len(bad.requests)
        wait_until(lambda: workers(r.port)[bad.url]["breaker"] != "open", timeout=10,
                   what="cool-down over")
        wait_until(lambda: post(r.port, "/generate", GEN).json()["text"] == "bad-fixed",
                   timeout=10, what="probe sent to the recovered decode")
        assert workers(r.port)[bad.url]["breaker"] == "closed"
        assert len(bad.requests) == n_before + 1
        wid = workers(r.port)[bad.url]["id"]
        ms = metrics(r.port)
        assert mval(ms, "baton_worker_breaker_transitions_total", worker=wid, to="open") == 1
        assert mval(ms, "baton_worker_breaker_transitions_total", worker=wid, to="closed") == 1
        assert mval(ms, "baton_worker_breaker_state", worker=wid) == 0


def test_peer_failures_not_charged_to_decode():
    """A decode answering 502 bootstrap_* (its prefill peer failed it) is not the broken one:
    its breaker stays closed however often that happens, while the same status without that
    reason opens it."""
    def peer_down(req, io):
        io.respond(502, {"error": {"message": "decode: the KV transfer peer went down",
                                   "type": "server_error", "code": "bootstrap_peer_down"}})

    with Upstream("p", json_answer("")) as p, Upstream("d", peer_down) as d, \
            Cluster("res-blame") as c:
        r = c.router("--prefill", p.url, "--decode", d.url, "--threads", "1",
                     "--breaker-threshold", "2", "--retry-backoff-ms", "1", *NO_CHECKS)
        for _ in range(4):
            e = err_of(post(r.port, "/generate", GEN), 502)
            assert "peer went down" in json.dumps(e) or e["code"] == "bootstrap_peer_down", e
        assert len(d.requests) == 12  # 1 + 2 retries each, none refused by a breaker
        ws = workers(r.port)
        assert ws[d.url]["breaker"] == "closed" and ws[p.url]["breaker"] == "closed", ws
        d.reset(status_answer(502))
        err_of(post(r.port, "/generate", GEN), 502)  # two failed attempts open it
        assert workers(r.port)[d.url]["breaker"] == "open"
        assert len(d.requests) == 2, len(d.requests)  # the third attempt found no decode


def main():
    t = TestRunner()
    t.run(test_retry_new_pair_new_room)
    t.run(test_retry_exhausted_bound)
    t.run(test_no_retry_for_4xx_nor_after_first_byte)
    t.run(test_prefill_timeout_closes_decode)
    t.run(test_idle_timeout_mid_stream)
    t.run(test_request_deadline_across_retries)
    t.run(test_admission_queue)
    t.run(test_per_worker_cap)
    t.run(test_remove_worker_drains)
    t.run(test_sigterm_drains)
    t.run(test_sighup_reload)
    t.run(test_health_checks_and_readiness)
    t.run(test_breaker_opens_and_recovers)
    t.run(test_peer_failures_not_charged_to_decode)
    t.finish()


if __name__ == "__main__":
    main()
