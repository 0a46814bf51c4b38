"""test_pd_protocols.py — the router's PD protocols beside SGLang's, against scripted
upstreams that check every field as a vLLM engine reads it: vllm-nixl (two phases, the
prefill's kv_transfer_params copied verbatim to the decode, one X-Request-Id, a clean 502 when
the prefill gives none, stranded blocks released when the decode never reads them),
vllm-mooncake (one transfer_id, both legs at once, engine id and bootstrap address from the
registration), same-protocol pairing and refusals at registration, the --pd-protocol flag, and
SGLang DP attention ranks and rooms with different dp_size on each side."""

import json
import os
import re
import socket
import struct
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from harness import Cluster, TestRunner, binary, get, post, request, wait_until  # noqa: E402
from router_upstream import SSEClient, Upstream, closed_port  # noqa: E402

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8,
        "min_tokens": 2, "stream_options": {"include_usage": True}}
COMP = {"model": "m", "prompt": "hello", "max_tokens": 8, "max_completion_tokens": 8}
ONE_SHOT = ("--max-retries", "0", "--check-interval-ms", "0", "--breaker-threshold", "0")
NIXL_P_KTP = {"do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
              "remote_block_ids": None, "remote_host": None, "remote_port": None}
# What a vLLM NIXL prefill answers (fields as vLLM's NixlConnector returns them).
P_KTP = {"do_remote_prefill": True, "do_remote_decode": False, "remote_block_ids": [1, 2, 3],
         "remote_engine_id": "eng-p0", "remote_request_id": "cmpl-p-1",
         "remote_host": "10.0.0.7", "remote_port": 5600, "tp_size": 1}
PROMPT_S = 5.0


def register(port, url, role, **fields):
    res = post(port, "/workers", dict({"url": url, "worker_type": role}, **fields))
    assert res.status == 202, (res.status, res.text)
    return res.json()["id"]


def prefill_script(ktp=P_KTP):
    """A NIXL prefill: answers phase 1 with kv_transfer_params; acknowledges releases."""
    def script(req, io):
        if req.path.endswith("/abort_requests"):
            io.respond(200, {"aborted": req.json()["request_ids"]})
            return
        req.notes["t_answer"] = time.monotonic()  # before the router can have the answer
        body = {"id": "cmpl-p", "object": "chat.completion",
                "choices": [{"index": 0, "message": {"role": "assistant", "content": "x"}}]}
        if ktp is not None:
            body["kv_transfer_params"] = ktp
        io.respond(200, body)
    return script


def decode_script(req, io):
    b = req.json()
    if b.get("stream"):
        io.start_sse()
        for t in ("a", "b"):
            io.event({"choices": [{"index": 0, "delta": {"content": t}}]})
        io.event("[DONE]")
        io.end_sse()
    else:
        n = b.get("n", 1)
        io.respond(200, {"choices": [{"index": i, "message": {"content": "ab"},
                                      "logprobs": {"content": []} if b.get("logprobs") else None}
                                     for i in range(n)]})


def expected_prefill_leg(client_body, ktp):
    want = {k: v for k, v in client_body.items()
            if k not in ("stream_options", "min_tokens", "min_completion_tokens")}
    want["stream"] = False
    want["max_tokens"] = 1
    if "max_completion_tokens" in client_body:
        want["max_completion_tokens"] = 1
    want["kv_transfer_params"] = ktp
    return want


def metric(port, name, labels):
    text = get(port, "/metrics").text
    for ln in text.splitlines():
        if ln.startswith(name + "{") and all(f'{k}="{v}"' in ln for k, v in labels.items()):
            return float(ln.rsplit(" ", 1)[1])
    return 0.0


# ---- vllm-nixl ----

def test_nixl_two_phase_fields():
    """Non-streamed chat and completions, streamed chat, n>1 with logprobs: the prefill leg
    carries exactly the phase-1 fields, the decode leg the client's body with the prefill's
    kv_transfer_params verbatim, both under one X-Request-Id; the prefill finished before the
    decode was sent; the client gets the decode's answer."""
    with Upstream("prefill", prefill_script()) as p, Upstream("decode", decode_script) as d, \
            Cluster("nixl-fields") as c:
        r = c.router("--threads", "1", *ONE_SHOT)
        register(r.port, p.url, "prefill", pd_protocol="vllm-nixl")
        register(r.port, d.url, "decode", pd_protocol="vllm-nixl")
        cases = [("/v1/chat/completions", CHAT), ("/v1/completions", COMP),
                 ("/v1/chat/completions", dict(CHAT, n=2, logprobs=True, top_logprobs=2))]
        for i, (path, body) in enumerate(cases):
            res = post(r.port, path, body, headers={"X-Request-Id": f"client-id-{i}"})
            assert res.status == 200, (res.status, res.text)
            assert len(res.json()["choices"]) == body.get("n", 1), res.text
            pr, dr = p.requests[-1], d.requests[-1]
            assert pr.path == path and dr.path == path
            assert pr.json() == expected_prefill_leg(body, NIXL_P_KTP), pr.json()
            assert dr.json() == dict(body, kv_transfer_params=P_KTP), dr.json()
            assert pr.headers["x-request-id"] == dr.headers["x-request-id"] == f"client-id-{i}"
            assert pr.notes["t_answer"] <= dr.t_start, "decode sent before prefill answered"
        # streamed: the decode leg keeps stream, stream_options and min_tokens
        n_before = len(d.requests)
        cl = SSEClient(r.port, "/v1/chat/completions", dict(CHAT, stream=True), timeout=15)
        try:
            assert cl.status == 200
            evs = cl.events()
        finally:
            cl.close()
        assert [json.loads(e)["choices"][0]["delta"]["content"] for e in evs[:2]] == ["a", "b"]
        assert evs[-1] == "[DONE]", evs
        dr = d.requests[n_before]
        assert dr.json() == dict(CHAT, stream=True, kv_transfer_params=P_KTP), dr.json()
        assert p.requests[-1].json()["stream"] is False
        # an id the router minted is the same on both legs too
        assert p.requests[-1].headers["x-request-id"] == dr.headers["x-request-id"]
        assert re.fullmatch(r"baton-[0-9a-f]{16}", dr.headers["x-request-id"]), dr.headers
        # a successful decode leaves nothing to release
        assert not any(q.path.endswith("/abort_requests") for q in p.requests)
        assert metric(r.port, "baton_pd_stranded_releases_total", {"protocol": "vllm-nixl"}) == 0


def test_nixl_prefill_without_params():
    """A prefill whose answer lacks kv_transfer_params (or is not JSON, or fails): a clean 502
    naming the prefill side; the decode is never asked (no silent recompute)."""
    def not_json(req, io):
        io.respond(200, "plain text", ctype="text/plain")

    for script, code in ((prefill_script(ktp=None), "prefill_no_kv_transfer_params"),
                         (not_json, "prefill_no_kv_transfer_params")):
        with Upstream("prefill", script) as p, Upstream("decode", decode_script) as d, \
                Cluster("nixl-noparams") as c:
            r = c.router("--threads", "1", "--pd-protocol", "vllm-nixl", "--prefill", p.url,
                         "--decode", d.url, *ONE_SHOT)
            for stream in (False, True):
                res = post(r.port, "/v1/chat/completions", dict(CHAT, stream=stream), timeout=15)
                assert res.status == 502, (res.status, res.text)
                err = res.json()["error"]
                # the worker by id, never its address (logs keep the URL)
                assert err["code"] == code and "prefill worker w-" in err["message"] and \
                    p.url not in err["message"], err
            assert d.requests == [], "decode was asked without kv_transfer_params"
    # a dead prefill: the same bounded 502 as the SGLang path, decode untouched
    with Upstream("decode", decode_script) as d, Cluster("nixl-pdead") as c:
        dead = closed_port()
        r = c.router("--threads", "1", "--pd-protocol", "vllm-nixl", "--prefill",
                     f"http://127.0.0.1:{dead}", "--decode", d.url, *ONE_SHOT)
        res = post(r.port, "/v1/completions", COMP, timeout=15)
        assert res.status == 502 and res.json()["error"]["code"] == "prefill_unavailable", \
            res.text
        assert d.requests == []


def test_nixl_stranded_release():
    """The decode fails (500, dies mid-stream), or the client leaves while the decode runs: the
    prefill is told to drop the request's blocks (POST /abort_requests with its id) and the
    release is counted; the client gets the usual clean error."""
    def d_fail(req, io):
        io.respond(500, {"error": {"message": "decode broke", "type": "x", "code": 500}})

    got_token = threading.Event()

    def d_die(req, io):
        io.start_sse()
        io.event({"choices": [{"index": 0, "delta": {"content": "a"}}]})
        got_token.wait(10)  # the client has the token: the router read it before the crash
        io.die()

    def d_hold(req, io):
        io.hold(15)

    with Upstream("prefill", prefill_script()) as p, Upstream("decode", d_fail) as d, \
            Cluster("nixl-release") as c:
        r = c.router("--threads", "1", "--pd-protocol", "vllm-nixl", "--prefill", p.url,
                     "--decode", d.url, *ONE_SHOT)
        res = post(r.port, "/v1/chat/completions", CHAT, headers={"X-Request-Id": "rq-1"})
        assert res.status == 500, res.text
        rel = wait_until(lambda: [q for q in p.requests if q.path.endswith("/abort_requests")],
                         PROMPT_S, what="release")
        assert rel[0].json() == {"request_ids": ["rq-1", "cmpl-p-1"]}, rel[0].json()
        assert rel[0].headers["x-request-id"] == "rq-1"
        wait_until(lambda: metric(r.port, "baton_pd_stranded_releases_total",
                                  {"protocol": "vllm-nixl", "result": "released"}) == 1,
                   PROMPT_S, what="release metric")

        # mid-stream death after a token: decode had read the blocks, nothing to release
        d.reset(d_die)
        n_rel = len(rel)
        cl = SSEClient(r.port, "/v1/chat/completions", dict(CHAT, stream=True), timeout=15)
        try:
            first = cl.next_event()
            got_token.set()
            evs = [first] + cl.events()
        finally:
            cl.close()
        assert json.loads(first)["choices"][0]["delta"]["content"] == "a", first
        assert "error" in json.loads(evs[-2]) and evs[-1] == "[DONE]", evs
        time.sleep(0.3)
        assert len([q for q in p.requests if q.path.endswith("/abort_requests")]) == n_rel

        # the client leaves between the phases (the decode holds): released
        d.reset(d_hold)
        s = socket.create_connection(("127.0.0.1", r.port))
        body = json.dumps(CHAT).encode()
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nX-Request-Id: rq-gone\r\n"
                  b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                  % (len(body), body))
        dr = d.wait_requests(1)[0]
        # a reset: a FIN alone is a half-close, which the router answers
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        s.close()
        assert d.wait_closed(dr, PROMPT_S), "decode not closed after the client left"
        rel = wait_until(lambda: [q for q in p.requests if q.path.endswith("/abort_requests")
                                  and q.json() == {"request_ids": ["rq-gone", "cmpl-p-1"]}],
                         PROMPT_S, what="release after client left")
        wait_until(lambda: metric(r.port, "baton_pd_stranded_releases_total",
                                  {"protocol": "vllm-nixl", "result": "released"}) == 2,
                   PROMPT_S, what="release metric 2")


def test_nixl_release_refused_counted():
    """An engine without the abort endpoint (a stock vLLM answers 404): counted as refused."""
    def p_script(req, io):
        if req.path.endswith("/abort_requests"):
            io.respond(404, {"detail": "Not Found"})
        else:
            prefill_script()(req, io)

    def d_fail(req, io):
        io.respond(503, {"error": "busy"})

    with Upstream("prefill", p_script) as p, Upstream("decode", d_fail) as d, \
            Cluster("nixl-refused") as c:
        r = c.router("--threads", "1", "--pd-protocol", "vllm-nixl", "--prefill", p.url,
                     "--decode", d.url, *ONE_SHOT)
        res = post(r.port, "/v1/completions", COMP)
        assert res.status == 503, res.text
        wait_until(lambda: metric(r.port, "baton_pd_stranded_releases_total",
                                  {"protocol": "vllm-nixl", "result": "refused"}) == 1,
                   PROMPT_S, what="refused release counted")


def test_nixl_retry_releases_first_prefill():
    """With retries on, a decode 503 makes a new attempt with a new prefill run; the first
    prefill's blocks are released."""
    calls = {"n": 0}

    def d_script(req, io):
        calls["n"] += 1
        if calls["n"] == 1:
            io.respond(503, {"error": "busy"})
        else:
            decode_script(req, io)

    with Upstream("prefill", prefill_script()) as p, Upstream("decode", d_script) as d, \
            Cluster("nixl-retry") as c:
        r = c.router("--threads", "1", "--pd-protocol", "vllm-nixl", "--prefill", p.url,
                     "--decode", d.url, "--check-interval-ms", "0", "--breaker-threshold", "0",
                     "--retry-backoff-ms", "1")
        res = post(r.port, "/v1/completions", COMP)
        assert res.status == 200, res.text
        wait_until(lambda: any(q.path.endswith("/abort_requests") for q in p.requests),
                   PROMPT_S, what="first attempt released")
        assert len([q for q in p.requests if not q.path.endswith("/abort_requests")]) == 2


# ---- vllm-mooncake ----

def test_mooncake_transfer_id():
    """Both legs at once with one minted transfer_id; the decode gets the prefill's engine id and
    bootstrap address from its registration; the client gets the decode's answer."""
    def p_script(req, io):
        # Answers only once the decode leg has arrived too: legs sent one after the other
        # would never see it (bounded wait) and the check below fails.
        try:
            d.wait_requests(len(p.requests), timeout=5)
            req.notes["decode_seen"] = True
        except AssertionError:
            req.notes["decode_seen"] = False
        io.respond(200, {"choices": [{"index": 0, "text": "x"}]})

    def d_script(req, io):
        decode_script(req, io)

    with Upstream("prefill", p_script) as p, Upstream("decode", d_script) as d, \
            Cluster("mooncake") as c:
        r = c.router("--threads", "1", *ONE_SHOT)
        register(r.port, p.url, "prefill", pd_protocol="vllm-mooncake", engine_id="eng-A",
                 bootstrap_addr="http://10.1.2.3:8998")
        register(r.port, d.url, "decode", pd_protocol="vllm-mooncake")
        ids = set()
        for i, (path, body) in enumerate((("/v1/completions", COMP),
                                          ("/v1/chat/completions", CHAT),
                                          ("/v1/chat/completions", dict(CHAT, stream=True)))):
            res = post(r.port, path, body)
            assert res.status == 200, res.text
            pr, dr = p.wait_requests(i + 1)[i], d.wait_requests(i + 1)[i]
            xid = dr.json()["kv_transfer_params"]["transfer_id"]
            assert pr.json() == expected_prefill_leg(
                body, {"do_remote_decode": True, "do_remote_prefill": False, "transfer_id": xid})
            assert dr.json() == dict(body, kv_transfer_params={
                "do_remote_decode": False, "do_remote_prefill": True, "transfer_id": xid,
                "remote_engine_id": "eng-A", "remote_bootstrap_addr": "http://10.1.2.3:8998"})
            assert pr.headers["x-request-id"] == dr.headers["x-request-id"]
            wait_until(lambda: "decode_seen" in pr.notes, PROMPT_S, what="prefill answered")
            assert pr.notes["decode_seen"], "the legs were not sent concurrently"
            ids.add(xid)
        assert len(ids) == 3, ids  # one per request


def test_mooncake_failures():
    """Either leg failing gives the SGLang path's bounded errors and closes the other leg."""
    def hold(req, io):
        io.hold(15)

    def p500(req, io):
        io.respond(500, {"error": "prefill exploded"})

    with Upstream("prefill", p500) as p, Upstream("decode", hold) as d, Cluster("mc-fail") as c:
        r = c.router("--threads", "1", "--pd-protocol", "vllm-mooncake", *ONE_SHOT)
        register(r.port, p.url, "prefill", engine_id="E", bootstrap_addr="http://h:1")
        register(r.port, d.url, "decode")
        res = post(r.port, "/v1/completions", COMP, timeout=15)
        assert res.status == 500 and res.json()["error"]["code"] == "prefill_error", res.text
        assert d.wait_closed(d.wait_requests(1)[0], PROMPT_S), "decode not closed"


# ---- selection and registration ----

def test_registration_and_pairing():
    with Upstream("a") as a, Upstream("b") as b, Cluster("pd-reg") as c:
        r = c.router("--threads", "1", *ONE_SHOT)
        bad = [
            {"url": a.url, "worker_type": "prefill", "pd_protocol": "vllm-magic"},
            {"url": a.url, "worker_type": "prefill", "pd_protocol": "vllm-mooncake"},
            {"url": a.url, "worker_type": "prefill", "pd_protocol": "vllm-mooncake",
             "engine_id": "E", "bootstrap_addr": "10.0.0.1:8998"},
            {"url": a.url, "worker_type": "decode", "pd_protocol": "vllm-mooncake",
             "engine_id": "E", "bootstrap_addr": "http://h:1"},
            {"url": a.url, "worker_type": "prefill", "pd_protocol": "vllm-nixl",
             "bootstrap_port": 8998},
            {"url": a.url, "worker_type": "decode", "pd_protocol": "vllm-nixl", "dp_size": 2},
            {"url": a.url, "worker_type": "regular", "pd_protocol": "vllm-nixl"},
            {"url": a.url, "worker_type": "prefill", "engine_id": "E"},
            {"url": a.url, "worker_type": "prefill", "dp_size": -1},
        ]
        for body in bad:
            res = post(r.port, "/workers", body)
            assert res.status == 400 and res.json()["error"]["code"] == "BAD_REQUEST", \
                (body, res.text)
        # a nixl prefill and an sglang decode never make a pair
        pid = register(r.port, a.url, "prefill", pd_protocol="vllm-nixl")
        register(r.port, b.url, "decode")
        w = get(r.port, f"/workers/{pid}").json()
        assert w["pd_protocol"] == "vllm-nixl" and w["dp_size"] == 0, w
        res = post(r.port, "/v1/completions", COMP)
        assert res.status == 503 and res.json()["error"]["code"] == "no_decode_worker", res.text
        assert a.requests == [] and b.requests == []


def test_mixed_pools():
    """One router fronts an SGLang pair and a NIXL pair: every request's pair speaks one
    protocol (SGLang legs get bootstrap fields, NIXL legs kv_transfer_params)."""
    def sg(req, io):
        decode_script(req, io) if "bootstrap_room" in req.json() else io.respond(400, {})

    with Upstream("sp", sg) as sp, Upstream("sd", sg) as sd, \
            Upstream("np", prefill_script()) as np_, Upstream("nd", decode_script) as nd, \
            Cluster("pd-mixed") as c:
        r = c.router("--threads", "1", *ONE_SHOT)
        register(r.port, sp.url, "prefill", bootstrap_port=8998)
        register(r.port, np_.url, "prefill", pd_protocol="vllm-nixl")
        register(r.port, sd.url, "decode")
        register(r.port, nd.url, "decode", pd_protocol="vllm-nixl")
        for _ in range(6):
            res = post(r.port, "/v1/completions", COMP)
            assert res.status == 200, res.text
        assert len(sp.requests) == len(sd.requests) >= 1
        assert len(np_.requests) == len(nd.requests) >= 1
        assert all("kv_transfer_params" not in q.json() for q in sp.requests + sd.requests)
        assert all("bootstrap_room" not in q.json() for q in np_.requests + nd.requests)


def test_pd_protocol_flag():
    """--pd-protocol sets the protocol of CLI workers; an unknown one is refused at start."""
    out = subprocess.run([binary("baton"), "--pd-protocol", "vllm-foo", "--port", "0"],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 2 and "vllm-foo" in out.stderr, (out.returncode, out.stderr)
    with Upstream("p", prefill_script()) as p, Upstream("d", decode_script) as d, \
            Cluster("pd-flag") as c:
        r = c.router("--threads", "1", "--pd-protocol", "vllm-nixl", "--prefill", p.url,
                     "--decode", d.url, *ONE_SHOT)
        ws = get(r.port, "/workers").json()["workers"]
        assert {w["pd_protocol"] for w in ws} == {"vllm-nixl"}, ws
        res = post(r.port, "/v1/completions", COMP)
        assert res.status == 200, (res.status, res.text)
        assert d.requests and d.requests[-1].json()["kv_transfer_params"] == P_KTP, \
            [q.json() for q in d.requests]


# ---- SGLang DP attention ----

def test_dp_attention_ranks():
    """Prefill dp_size 4, decode dp_size 2: both legs get routed_dp_rank (each its own side's),
    the decode also disagg_prefill_dp_rank; the room is the same on both legs and agrees with
    both ranks (room % dp_size == rank); ranks go round robin over all of the prefill's."""
    with Upstream("p", decode_script) as p, Upstream("d", decode_script) as d, \
            Cluster("dp") as c:
        r = c.router("--threads", "1", *ONE_SHOT)
        register(r.port, p.url, "prefill", bootstrap_port=8998, dp_size=4)
        register(r.port, d.url, "decode", dp_size=2)
        seen_p, seen_d = set(), set()
        for i in range(8):
            body = dict(COMP, n=2) if i == 7 else COMP
            res = post(r.port, "/v1/completions", body)
            assert res.status == 200, res.text
            pj, dj = p.wait_requests(i + 1)[i].json(), d.wait_requests(i + 1)[i].json()
            rp, rd = pj["routed_dp_rank"], dj["routed_dp_rank"]
            assert "disagg_prefill_dp_rank" not in pj and dj["disagg_prefill_dp_rank"] == rp
            assert pj["bootstrap_room"] == dj["bootstrap_room"]
            rooms = pj["bootstrap_room"] if isinstance(pj["bootstrap_room"], list) else \
                [pj["bootstrap_room"]]
            for room in rooms:
                assert 0 <= room < 2 ** 63 and room % 4 == rp and room % 2 == rd, (room, rp, rd)
            seen_p.add(rp)
            seen_d.add(rd)
        assert seen_p == {0, 1, 2, 3} and seen_d == {0, 1}, (seen_p, seen_d)
    # dp_size 3 and 2 (coprime): any pair of ranks shares a room
    with Upstream("p", decode_script) as p, Upstream("d", decode_script) as d, \
            Cluster("dp32") as c:
        r = c.router("--threads", "1", *ONE_SHOT)
        register(r.port, p.url, "prefill", dp_size=3)
        register(r.port, d.url, "decode", dp_size=2)
        for i in range(6):
            assert post(r.port, "/v1/chat/completions", CHAT).status == 200
            pj, dj = p.wait_requests(i + 1)[i].json(), d.wait_requests(i + 1)[i].json()
            room = pj["bootstrap_room"]
            assert room == dj["bootstrap_room"] and room % 3 == pj["routed_dp_rank"] and \
                room % 2 == dj["routed_dp_rank"], (room, pj["routed_dp_rank"],
                                                  dj["routed_dp_rank"])


def test_dp_least_loaded_ranks():
    """Least loaded (the default): requests held on three of a prefill's four DP ranks send
    every later request to the fourth, idle one; the router's per-rank in-flight counts
    (GET /workers/{id} dp_in_flight) follow the requests and are given back when a leg fails and
    when the held ones end. With --dp-round-robin the ranks cycle regardless of load."""
    release = threading.Event()
    fail_at = {}  # the prefill request count when the "fail" request is sent

    def p_script(req, io):
        prompt = req.json().get("prompt")
        if prompt == "slow":
            release.wait(15)
        if prompt == "fail":
            io.hold(10)  # until the router gives up on it: its decode failed
            return
        io.respond(200, {"choices": [{"index": 0, "text": "x"}]})

    def d_script(req, io):
        if req.json().get("prompt") == "fail":
            # its prefill leg took its rank (the router's HTTP client sends this leg once more,
            # fresh, when a reused connection dies before any answer byte: the same wait holds)
            p.wait_requests(fail_at["n"] + 1, timeout=5)
            io.die()  # a crashed decode: the attempt fails and the prefill leg is cancelled
            return
        decode_script(req, io)

    def ranks(up, first):
        return [q.json()["routed_dp_rank"] for q in up.requests[first:]]

    for round_robin in (False, True):
        release.clear()
        with Upstream("p", p_script) as p, Upstream("d", d_script) as d, \
                Cluster("dp-load") as c:
            extra = ("--dp-round-robin",) if round_robin else ()
            r = c.router("--threads", "1", *ONE_SHOT, *extra)
            pid = register(r.port, p.url, "prefill", bootstrap_port=8998, dp_size=4)
            register(r.port, d.url, "decode")

            def in_flight():
                return get(r.port, f"/workers/{pid}").json()["dp_in_flight"]

            slow = [threading.Thread(target=post, args=(r.port, "/v1/completions",
                                                         dict(COMP, prompt="slow")),
                                     kwargs={"timeout": 30}) for _ in range(3)]
            for i, t in enumerate(slow):
                t.start()
                p.wait_requests(i + 1)  # one at a time: each pick sees the previous ones
            busy = ranks(p, 0)
            assert len(set(busy)) == 3, busy
            assert sorted(in_flight()) == [0, 1, 1, 1], in_flight()
            idle = ({0, 1, 2, 3} - set(busy)).pop()
            for i in range(4):
                # the previous one's prefill leg may settle just after the client's answer
                wait_until(lambda: sum(in_flight()) == 3, PROMPT_S, what="previous leg settled")
                res = post(r.port, "/v1/completions", COMP)
                assert res.status == 200, res.text
            p.wait_requests(7)
            fast = ranks(p, 3)
            if round_robin:
                assert len(set(fast)) == 4, fast  # 0, 1, 2, 3 in turn, busy or not
            else:
                assert fast == [idle] * 4, (busy, fast)
            fail_at["n"] = len(p.requests)
            res = post(r.port, "/v1/completions", dict(COMP, prompt="fail"), timeout=15)
            assert res.status >= 500, res.text
            failed_rank = ranks(p, 7)[0]
            assert round_robin or failed_rank == idle, (failed_rank, idle)
            wait_until(lambda: sum(in_flight()) == 3, PROMPT_S, what="failed leg's rank back")
            assert in_flight()[failed_rank] == (1 if failed_rank in busy else 0), in_flight()
            release.set()
            for t in slow:
                t.join(30)
            wait_until(lambda: in_flight() == [0, 0, 0, 0], PROMPT_S, what="ranks released")


def test_mooncake_dp_rank():
    """A vllm-mooncake prefill registered with dp_size: the router picks the rank, sends it to
    the prefill as X-data-parallel-rank (vLLM's API server routes by it) and names that rank's
    engine to the decode, {engine_id}_dp{rank} (what vLLM's DP engine cores register with the
    Mooncake bootstrap server)."""
    with Upstream("p") as p, Upstream("d", decode_script) as d, Cluster("mc-dp") as c:
        r = c.router("--threads", "1", *ONE_SHOT)
        pid = register(r.port, p.url, "prefill", pd_protocol="vllm-mooncake", engine_id="eng-A",
                       bootstrap_addr="http://10.1.2.3:8998", dp_size=2)
        register(r.port, d.url, "decode", pd_protocol="vllm-mooncake")
        seen = set()
        for i in range(4):
            assert post(r.port, "/v1/completions", COMP).status == 200
            pr, dr = p.wait_requests(i + 1)[i], d.wait_requests(i + 1)[i]
            rank = int(pr.headers["x-data-parallel-rank"])
            ktp = dr.json()["kv_transfer_params"]
            assert ktp["remote_engine_id"] == f"eng-A_dp{rank}", (rank, ktp)
            assert ktp["remote_bootstrap_addr"] == "http://10.1.2.3:8998", ktp
            assert "x-data-parallel-rank" not in dr.headers, dr.headers
            seen.add(rank)
        assert seen == {0, 1}, seen
        w = get(r.port, f"/workers/{pid}").json()
        assert w["dp_size"] == 2 and w["dp_in_flight"] == [0, 0], w


if __name__ == "__main__":
    t = TestRunner()
    for fn in (test_nixl_two_phase_fields, test_nixl_prefill_without_params,
               test_nixl_stranded_release, test_nixl_release_refused_counted,
               test_nixl_retry_releases_first_prefill, test_mooncake_transfer_id,
               test_mooncake_failures, test_registration_and_pairing, test_mixed_pools,
               test_pd_protocol_flag, test_dp_attention_ranks, test_dp_least_loaded_ranks,
               test_mooncake_dp_rank):
        t.run(fn)
    t.finish()
