"""test_router.py — the router's PD protocol against recording upstreams: the same body with the
three injected fields to prefill and decode, both in flight at once, batch injection, SSE
pass-through as it arrives, logprob merging, regular workers, info endpoints."""

import json
import os
import socket
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from harness import Cluster, TestRunner, get, post, request, url, wait_until  # noqa: E402
from router_upstream import SSEClient, Upstream  # noqa: E402

ROOM_MAX = 2**63 - 1
BOOT_PORT = 8998

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hello there"}], "max_tokens": 4,
        "temperature": 0.5}
COMPL = {"model": "m", "prompt": "hello there", "max_tokens": 4, "stop": ["x"]}
GEN = {"text": "hello there", "sampling_params": {"max_new_tokens": 4}}


class Pair:
    """A prefill and a decode recording upstream that meet at a barrier before answering, so a
    request only completes when the router had both in flight at the same time."""

    def __init__(self):
        self.barrier = threading.Barrier(2, timeout=5.0)
        self.p = Upstream("prefill", self.prefill_script)
        self.d = Upstream("decode", self.decode_script)
        self.decode_events = 3
        self.gate = None  # threading.Event the decode stream waits on after its first event
        self.prefill_delay = 0.0  # prefill answers this long after meeting decode

    def meet(self, req):
        try:
            self.barrier.wait()
            req.notes["met"] = True
        except threading.BrokenBarrierError:
            req.notes["met"] = False
            self.barrier.reset()

    def prefill_script(self, req, io):
        self.meet(req)
        time.sleep(self.prefill_delay)
        body = req.json()
        if body.get("stream"):
            io.start_sse()
            io.event({"text": "", "meta_info": {"input_token_logprobs": [[-1.0, 1, None]]}})
            io.event("[DONE]")
            io.end_sse()
        else:
            io.respond(200, {"text": "", "meta_info": {"input_token_logprobs": [[-1.0, 1, None]]}})

    def decode_script(self, req, io):
        self.meet(req)
        body = req.json()
        if body.get("stream"):
            io.start_sse()
            for i in range(self.decode_events):
                io.event({"index": 0, "text": f"t{i}", "meta_info": {
                    "input_token_logprobs": [[-2.0, 2, None]] if i == 0 else None}})
                if i == 0 and self.gate is not None:
                    req.notes["gate"] = self.gate.wait(5.0)
            io.event("[DONE]")
            io.end_sse()
        else:
            io.respond(200, {"text": "decoded", "room": body.get("bootstrap_room"),
                             "meta_info": {"input_token_logprobs": [[-2.0, 2, None]]}})

    def close(self):
        self.p.close()
        self.d.close()
        errors = self.p.errors + self.d.errors  # a script's failure fails the test
        assert not errors, errors[0]


def pd_router(c, pair, *extra, boot=BOOT_PORT):
    pre = ["--prefill", pair.p.url] + ([str(boot)] if boot else [])
    return c.router(*pre, "--decode", pair.d.url, "--threads", "2", *extra)


def check_pair_bodies(pair, n_before, sent, batch=None, boot=BOOT_PORT):
    """Both upstreams got one more request, same path, byte-identical bodies, with the client's
    fields kept and the three bootstrap fields injected. Returns the injected rooms."""
    preqs = pair.p.wait_requests(n_before + 1)
    dreqs = pair.d.wait_requests(n_before + 1)
    pr, dr = preqs[n_before], dreqs[n_before]
    pair.p.wait_done(pr)  # the client may have its answer before prefill's thread is through
    pair.d.wait_done(dr)
    assert pr.path == dr.path, (pr.path, dr.path)
    assert pr.body == dr.body, "prefill and decode got different bodies"
    assert pr.notes.get("met") and dr.notes.get("met"), "the two requests were not in flight together"
    body = pr.json()
    for k, v in sent.items():
        assert body[k] == v, (k, body[k], v)
    host, port, room = body["bootstrap_host"], body["bootstrap_port"], body["bootstrap_room"]
    if batch is None:
        assert host == "127.0.0.1", host
        assert port == (boot if boot else None), port
        assert isinstance(room, int) and 0 <= room <= ROOM_MAX, room
        rooms = [room]
    else:
        assert host == ["127.0.0.1"] * batch, host
        assert port == [boot if boot else None] * batch, port
        assert isinstance(room, list) and len(room) == batch, room
        assert all(isinstance(r, int) and 0 <= r <= ROOM_MAX for r in room), room
        assert len(set(room)) == batch, f"rooms not distinct: {room}"
        rooms = room
    assert set(body) == set(sent) | {"bootstrap_host", "bootstrap_port", "bootstrap_room"}
    return rooms


def test_pd_same_body_concurrent():
    pair = Pair()
    try:
        with Cluster("router-pd") as c:
            r = pd_router(c, pair)
            seen_rooms = set()
            n = 0
            for path, body in (("/v1/chat/completions", CHAT), ("/v1/completions", COMPL),
                               ("/generate", GEN)):
                res = post(r.port, path, body)
                assert res.status == 200, (path, res.status, res.text)
                rooms = check_pair_bodies(pair, n, body)
                assert pair.p.requests[n].path == path
                n += 1
                # the client gets decode's body
                assert res.json()["text"] == "decoded" and res.json()["room"] == rooms[0]
                seen_rooms.update(rooms)
            assert len(seen_rooms) == 3, "a room was reused across requests"
    finally:
        pair.close()


def test_pd_null_bootstrap_port():
    pair = Pair()
    try:
        with Cluster("router-pd-null") as c:
            r = pd_router(c, pair, boot=None)
            res = post(r.port, "/generate", GEN)
            assert res.status == 200, res.text
            check_pair_bodies(pair, 0, GEN, boot=None)
    finally:
        pair.close()


def test_pd_batches():
    pair = Pair()
    cases = [
        ("/v1/chat/completions", dict(CHAT, n=3), 3),
        ("/v1/completions", dict(COMPL, prompt=["a b", "c d"]), 2),
        ("/v1/completions", dict(COMPL, prompt=[[1, 2], [3], [4, 5, 6], [7]]), 4),
        ("/v1/completions", dict(COMPL, prompt=["a", "b"], n=2), 4),  # one room per sequence
        ("/v1/completions", dict(COMPL, n=3), 3),
        ("/generate", dict(GEN, text=["one", "two", "three"]), 3),
        ("/generate", {"input_ids": [[1, 2], [3, 4]], "sampling_params": {}}, 2),
        # not batches: one token-id prompt
        ("/v1/completions", dict(COMPL, prompt=[1, 2, 3]), None),
        ("/generate", {"input_ids": [5, 6, 7]}, None),
    ]
    try:
        with Cluster("router-batch") as c:
            r = pd_router(c, pair)
            for i, (path, body, batch) in enumerate(cases):
                res = post(r.port, path, body)
                assert res.status == 200, (path, res.status, res.text)
                check_pair_bodies(pair, i, body, batch=batch)
    finally:
        pair.close()


def test_pd_stream_passthrough():
    """Decode's first event reaches the client while decode is still waiting: no buffering."""
    pair = Pair()
    try:
        with Cluster("router-stream") as c:
            r = pd_router(c, pair)
            for path, body in (("/v1/chat/completions", CHAT), ("/v1/completions", COMPL),
                               ("/generate", GEN)):
                pair.gate = threading.Event()
                sent = dict(body, stream=True)
                cl = SSEClient(r.port, path, sent)
                try:
                    assert cl.status == 200, cl.status
                    assert cl.headers.get("content-type", "").startswith("text/event-stream")
                    first = json.loads(cl.next_event())
                    assert first["text"] == "t0"
                    pair.gate.set()  # decode continues only now
                    rest = cl.events()
                finally:
                    cl.close()
                assert [json.loads(e)["text"] for e in rest[:-1]] == ["t1", "t2"], rest
                assert rest[-1] == "[DONE]"
                dreq = pair.d.requests[-1]
                pair.d.wait_done(dreq)
                assert dreq.notes.get("gate") is True, "decode's stream was held back by the router"
                # no logprobs asked: the event passes untouched
                assert first["meta_info"]["input_token_logprobs"] == [[-2.0, 2, None]]
                check_pair_bodies(pair, len(pair.p.requests) - 1, sent)
    finally:
        pair.close()


def test_pd_logprob_merge():
    pair = Pair()
    try:
        with Cluster("router-logprobs") as c:
            r = pd_router(c, pair)
            res = post(r.port, "/generate", dict(GEN, return_logprob=True))
            assert res.status == 200, res.text
            lp = res.json()["meta_info"]["input_token_logprobs"]
            assert lp == [[-1.0, 1, None], [-2.0, 2, None]], lp
            # streaming: merged into decode's first event that carries them
            cl = SSEClient(r.port, "/generate", dict(GEN, return_logprob=True, stream=True))
            try:
                evs = cl.events()
            finally:
                cl.close()
            first = json.loads(evs[0])
            assert first["meta_info"]["input_token_logprobs"] == [[-1.0, 1, None],
                                                                  [-2.0, 2, None]], first
            assert [json.loads(e)["text"] for e in evs[:-1]] == ["t0", "t1", "t2"]
            assert evs[-1] == "[DONE]"
            # not asked: untouched
            res = post(r.port, "/generate", GEN)
            assert res.json()["meta_info"]["input_token_logprobs"] == [[-2.0, 2, None]]
            # prefill answers after decode's first event: that event waits for prefill's
            # logprobs, and nothing is reordered or lost
            pair.prefill_delay = 0.3
            for stream in (True, False):
                body = dict(GEN, return_logprob=True, stream=stream)
                if stream:
                    cl = SSEClient(r.port, "/generate", body)
                    try:
                        evs = [json.loads(e) for e in cl.events()[:-1]]
                    finally:
                        cl.close()
                else:
                    evs = [post(r.port, "/generate", body).json()]
                assert evs[0]["meta_info"]["input_token_logprobs"] == [[-1.0, 1, None],
                                                                       [-2.0, 2, None]], evs[0]
                if stream:
                    assert [e["text"] for e in evs] == ["t0", "t1", "t2"], evs
                    pr, dr = pair.p.requests[-1], pair.d.requests[-1]
                    pair.d.wait_done(dr)
                    pair.p.wait_done(pr)
                    assert dr.t_end < pr.t_end, "decode was not ahead of prefill"
    finally:
        pair.close()


def test_regular_worker():
    seen = []

    def script(req, io):
        seen.append(req)
        if req.method == "GET":
            io.respond(200, {"object": "list", "data": [{"id": "reg-model", "object": "model"}]})
            return
        body = req.json()
        if body.get("stream"):
            io.start_sse()
            for i in range(3):
                io.event({"text": f"r{i}"})
            io.event("[DONE]")
            io.end_sse()
        else:
            io.respond(200, {"text": "regular", "echo": body})

    with Upstream("regular", script) as w, Cluster("router-regular") as c:
        r = c.router("--worker", w.url, "--threads", "1")
        raw = json.dumps(CHAT, indent=1).encode()  # not compact: must arrive byte-identical
        res = request(r.port, "POST", "/v1/chat/completions", body=raw,
                      headers={"Content-Type": "application/json"})
        assert res.status == 200, res.text
        assert res.json()["text"] == "regular"
        assert seen[-1].body == raw, "regular proxying must not rewrite the body"
        assert "bootstrap_room" not in seen[-1].json()
        cl = SSEClient(r.port, "/v1/completions", dict(COMPL, stream=True))
        try:
            evs = cl.events()
        finally:
            cl.close()
        assert [json.loads(e)["text"] for e in evs[:-1]] == ["r0", "r1", "r2"] and evs[-1] == "[DONE]"
        res = get(r.port, "/v1/models")
        assert res.status == 200 and res.json()["data"][0]["id"] == "reg-model", res.text
        assert seen[-1].method == "GET" and seen[-1].path == "/v1/models"
        res = get(r.port, "/get_server_info")
        assert res.status == 200 and seen[-1].path == "/get_server_info"
        # connections are reused (keep-alive pool): far fewer connections than requests
        for _ in range(10):
            assert post(r.port, "/generate", GEN).status == 200
        assert w.connections <= 3, w.connections


def test_pd_prefers_pair_else_regular():
    """With a PD pair and a regular worker, inference goes to the pair; without a decode it
    falls back to the regular worker; with nothing suitable it is 503."""
    pair = Pair()
    with Upstream("regular") as w, Cluster("router-mixed") as c:
        try:
            r = c.router("--prefill", pair.p.url, "--worker", w.url, "--threads", "1")
            res = post(r.port, "/generate", GEN)
            assert res.status == 200, res.text
            assert len(w.requests) == 1 and len(pair.p.requests) == 0
            res = post(r.port, "/admin-nothing", {})
            assert res.status == 404
        finally:
            pair.close()
    with Cluster("router-none") as c:
        r = c.router("--threads", "1")
        res = post(r.port, "/v1/chat/completions", CHAT)
        assert res.status == 503, res.status
        assert res.json()["error"]["code"] == "no_worker"
        # info endpoints without workers
        res = get(r.port, "/v1/models")
        assert res.status == 200 and res.json()["data"] == [], res.text
        assert get(r.port, "/get_model_info").status == 503


def test_prefix_and_api_key():
    """A worker URL with a path prefix and an api_key: the router calls prefix + path and
    sends the key as a bearer token."""
    pair = Pair()
    try:
        with Cluster("router-prefix") as c:
            r = c.router("--threads", "1")
            for role, up, extra in (("prefill", pair.p, {"bootstrap_port": 7000}),
                                    ("decode", pair.d, {})):
                res = post(r.port, "/workers", dict({"url": up.url + "/api", "worker_type": role,
                                                     "api_key": "sekret"}, **extra))
                assert res.status in (200, 201, 202), res.text
            res = post(r.port, "/v1/completions", COMPL)
            assert res.status == 200, res.text
            pr, dr = pair.p.requests[0], pair.d.requests[0]
            assert pr.path == dr.path == "/api/v1/completions", (pr.path, dr.path)
            assert pr.headers.get("authorization") == "Bearer sekret"
            assert pr.json()["bootstrap_port"] == 7000
    finally:
        pair.close()


def test_stream_backpressure():
    """A client that does not read: the router stops reading decode (decode's writes block)
    instead of buffering the stream, and the client later gets every byte in order."""
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

    with Upstream("prefill", p_script) as p, Upstream("decode", d_script) as d, \
            Cluster("router-bp") as c:
        r = c.router("--prefill", p.url, "--decode", d.url, "--threads", "1")
        cl = SSEClient(r.port, "/generate", dict(GEN, stream=True), timeout=30)
        try:
            cl.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
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
            cl.close()
        assert progress["done"] and n * len(chunk) >= total, (n, progress)


def test_client_auth_forwarded():
    """The client's Authorization reaches the workers only with --forward-authorization (issue
    11: by default it is the router's credential, not the workers')."""
    pair = Pair()
    try:
        with Cluster("router-auth") as c:
            r = pd_router(c, pair, "--forward-authorization")
            res = request(r.port, "POST", "/generate", body=json.dumps(GEN),
                          headers={"Authorization": "Bearer client-key",
                                   "Content-Type": "application/json"})
            assert res.status == 200, res.text
            assert pair.p.requests[0].headers.get("authorization") == "Bearer client-key"
            assert pair.d.requests[0].headers.get("authorization") == "Bearer client-key"
            r.kill()
            r = pd_router(c, pair)
            res = request(r.port, "POST", "/generate", body=json.dumps(GEN),
                          headers={"Authorization": "Bearer client-key",
                                   "Content-Type": "application/json"})
            assert res.status == 200, res.text
            assert "authorization" not in pair.p.requests[1].headers, pair.p.requests[1].headers
            assert "authorization" not in pair.d.requests[1].headers, pair.d.requests[1].headers
    finally:
        pair.close()


def main():
    t = TestRunner()
    t.run(test_pd_same_body_concurrent)
    t.run(test_pd_null_bootstrap_port)
    t.run(test_pd_batches)
    t.run(test_pd_stream_passthrough)
    t.run(test_pd_logprob_merge)
    t.run(test_regular_worker)
    t.run(test_pd_prefers_pair_else_regular)
    t.run(test_prefix_and_api_key)
    t.run(test_stream_backpressure)
    t.run(test_client_auth_forwarded)
    t.finish()


if __name__ == "__main__":
    main()
