"""test_responses.py — POST /v1/responses through the router: PD with each protocol's fields
injected (SGLang bootstrap fields on both legs, vLLM NIXL's two phases with max_output_tokens and
kv_transfer_params), regular mode passed through untouched, the stream's typed events relayed as
they come, a worker failing mid-stream ending the stream with the API's own error event, and bad
bodies refused in the API's error shape."""

import itertools
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from harness import Cluster, TestRunner, post, request  # noqa: E402
from router_upstream import SSEClient, Upstream  # noqa: E402

BODY = {"model": "m", "input": [{"role": "user", "content": "hello there"}],
        "instructions": "be brief", "max_output_tokens": 6, "temperature": 0.2}
ONE_SHOT = ("--max-retries", "0", "--check-interval-ms", "0", "--breaker-threshold", "0")
P_KTP = {"do_remote_prefill": True, "do_remote_decode": False, "remote_block_ids": [1, 2],
         "remote_engine_id": "eng-p0", "remote_request_id": "resp-p-1",
         "remote_host": "10.0.0.7", "remote_port": 5600, "tp_size": 1}
EVENTS = ["response.created", "response.in_progress", "response.output_item.added",
          "response.content_part.added", "response.output_text.delta",
          "response.output_text.delta", "response.output_text.done",
          "response.content_part.done", "response.output_item.done", "response.completed"]


def response_obj(text="ok"):
    return {"id": "resp_1", "object": "response", "status": "completed", "model": "m",
            "output": [{"type": "message", "id": "msg_1", "role": "assistant",
                        "status": "completed",
                        "content": [{"type": "output_text", "text": text, "annotations": []}]}],
            "usage": {"input_tokens": 3, "output_tokens": 1, "total_tokens": 4}}


def stream_events(io, die_after=None):
    io.start_sse()
    for i, ev in enumerate(EVENTS):
        if die_after is not None and i == die_after:
            io.die()
            return
        data = {"type": ev, "sequence_number": i}
        if ev.endswith(".delta"):
            data["delta"] = f"t{i}"
        io.chunk(f"event: {ev}\ndata: {json.dumps(data)}\n\n")
    io.end_sse()


def decode_script(req, io):
    body = req.json()
    if body.get("stream"):
        stream_events(io, die_after=body.get("metadata", {}).get("die_after"))
    else:
        io.respond(200, dict(response_obj("decoded"), seen=body))


def prefill_script(req, io):
    io.respond(200, dict(response_obj(""), kv_transfer_params=P_KTP))


def read_stream(cl, timeout=10.0):
    """The rest of a chunked answer, raw, up to its last chunk (the connection stays open)."""
    cl.sock.settimeout(timeout)
    while not cl.buf.endswith(b"0\r\n\r\n"):
        d = cl.sock.recv(65536)
        if not d:
            break
        cl.buf += d
    return cl.buf


def relayed_types(raw):
    return [ln.split(": ", 1)[1] for ln in raw.decode(errors="replace").splitlines()
            if ln.startswith("event: ")]


def test_sglang_pd_injects_bootstrap_fields():
    with Upstream("prefill", prefill_script) as p, Upstream("decode", decode_script) as d, \
            Cluster("responses-sglang") as c:
        r = c.router("--prefill", p.url, "8998", "--decode", d.url, *ONE_SHOT)
        res = post(r.port, "/v1/responses", BODY)
        assert res.status == 200, res.text
        assert res.json()["output"][0]["content"][0]["text"] == "decoded", res.text
        # the two legs go out together: the prefill's may arrive after the client's answer
        pr, dr = p.wait_requests(1)[0], d.requests[-1]
        assert pr.path == dr.path == "/v1/responses"
        assert pr.body == dr.body, "both legs carry one body"
        sent = pr.json()
        for k, v in BODY.items():
            assert sent[k] == v, (k, sent[k])
        assert sent["bootstrap_host"] == "127.0.0.1" and sent["bootstrap_port"] == 8998, sent
        assert isinstance(sent["bootstrap_room"], int), sent
        # streamed: every typed event reaches the client, in order, as sent
        cl = SSEClient(r.port, "/v1/responses", dict(BODY, stream=True))
        try:
            assert cl.status == 200
            raw = read_stream(cl)
        finally:
            cl.close()
        assert relayed_types(raw) == EVENTS, raw
        assert b"[DONE]" not in raw
        assert d.requests[-1].json()["stream"] is True


def test_nixl_two_phases():
    with Upstream("prefill", prefill_script) as p, Upstream("decode", decode_script) as d, \
            Cluster("responses-nixl") as c:
        r = c.router("--prefill", p.url, "--decode", d.url, "--pd-protocol", "vllm-nixl",
                     *ONE_SHOT)
        for stream in (False, True):
            body = dict(BODY, stream=True) if stream else BODY
            if stream:
                cl = SSEClient(r.port, "/v1/responses", body)
                try:
                    assert cl.status == 200
                    assert relayed_types(read_stream(cl)) == EVENTS
                finally:
                    cl.close()
            else:
                res = post(r.port, "/v1/responses", body)
                assert res.status == 200, res.text
            pr, dr = p.requests[-1], d.requests[-1]
            want = {k: v for k, v in body.items() if k not in ("max_output_tokens",)}
            want.update(stream=False, max_output_tokens=1)
            got = pr.json()
            ktp = got.pop("kv_transfer_params")
            assert got == want, got
            assert ktp["do_remote_decode"] is True, ktp
            assert dr.json() == dict(body, kv_transfer_params=P_KTP), dr.json()


def test_regular_passes_through():
    with Upstream("w", decode_script) as w, Cluster("responses-regular") as c:
        r = c.router("--worker", w.url, *ONE_SHOT)
        raw = json.dumps(BODY, indent=2).encode()
        res = request(r.port, "POST", "/v1/responses", body=raw,
                      headers={"Content-Type": "application/json"})
        assert res.status == 200, res.text
        assert w.requests[-1].body == raw, "regular mode must not rewrite the body"


def test_stream_failure_ends_with_error_event():
    with Upstream("prefill", prefill_script) as p, Upstream("decode", decode_script) as d, \
            Cluster("responses-fail") as c:
        r = c.router("--prefill", p.url, "8998", "--decode", d.url, *ONE_SHOT)
        cl = SSEClient(r.port, "/v1/responses",
                       dict(BODY, stream=True, metadata={"die_after": 5}))
        try:
            assert cl.status == 200
            raw = read_stream(cl)
        finally:
            cl.close()
        types = relayed_types(raw)
        assert types == EVENTS[:5] + ["error"], types
        text = raw.decode(errors="replace")
        data = text[text.index("event: error\ndata: ") + len("event: error\ndata: "):]
        err = json.loads(data.split("\n", 1)[0])
        assert err["type"] == "error" and err["sequence_number"] == 5 and err["message"], err
        assert "[DONE]" not in text


def test_bad_bodies():
    with Upstream("w", decode_script) as w, Cluster("responses-bad") as c:
        r = c.router("--worker", w.url, *ONE_SHOT)
        for body, param in (({"model": "m"}, "input"), ({"input": 5}, "input"),
                            ({"input": []}, "input"), ({"input": ["x"]}, "input"),
                            ({"input": "x", "max_output_tokens": -1}, "max_output_tokens"),
                            ({"input": "x", "previous_response_id": 3},
                             "previous_response_id")):
            res = post(r.port, "/v1/responses", body)
            assert res.status == 400, (body, res.status, res.text)
            assert res.json()["error"]["param"] == param, res.text
        assert not w.requests
        assert request(r.port, "PUT", "/v1/responses").status == 405


def test_embeddings_rerank_score_regular_only():
    """Passed to a regular worker untouched, never to a PD pair; a PD-only router refuses them
    (501) without calling a worker."""
    def echo(req, io):
        io.respond(200, {"object": "list", "path": req.path, "data": []})

    with Upstream("prefill", prefill_script) as p, Upstream("decode", decode_script) as d, \
            Upstream("w", echo) as w, Cluster("regular-only") as c:
        r = c.router("--prefill", p.url, "8998", "--decode", d.url, "--worker", w.url, *ONE_SHOT)
        for path, body in (("/v1/embeddings", {"model": "m", "input": ["a", "b"]}),
                           ("/v1/rerank", {"query": "q", "documents": ["a", "b"]}),
                           ("/v1/score", {"text_1": "a", "text_2": ["b"]})):
            raw = json.dumps(body, indent=1).encode()
            res = request(r.port, "POST", path, body=raw,
                          headers={"Content-Type": "application/json"})
            assert res.status == 200 and res.json()["path"] == path, res.text
            assert w.requests[-1].body == raw
        assert not p.requests and not d.requests
        # PD-only: refused clearly
        r2 = c.router("--prefill", p.url, "8998", "--decode", d.url, *ONE_SHOT, name="pd-only")
        res = post(r2.port, "/v1/embeddings", {"input": "a"})
        assert res.status == 501, res.text
        err = res.json()["error"]
        assert err["code"] == "unsupported_in_pd_mode" and "regular" in err["message"], err
        assert not p.requests and not d.requests
        res = post(r2.port, "/v1/embeddings", [1, 2])
        assert res.status == 400, res.text


def test_get_and_delete_go_to_the_worker_that_answered():
    """Two regular workers round robin: each stored response's GET and DELETE reach the worker
    that answered it (non-streamed: the body's id; streamed: response.created's response.id)."""
    def holder(name):
        counter = itertools.count()

        def script(req, io):
            if req.method in ("GET", "DELETE"):
                io.respond(200, {"id": req.path.rsplit("/", 1)[1], "holder": name,
                                 "deleted": req.method == "DELETE"})
                return
            rid = f"resp_{name}_{next(counter)}"
            if req.json().get("stream"):
                io.start_sse()
                io.chunk("event: response.created\ndata: " + json.dumps(
                    {"type": "response.created", "sequence_number": 0,
                     "response": {"id": rid, "object": "response", "status": "in_progress"}})
                    + "\n\n")
                io.chunk("event: response.completed\ndata: " + json.dumps(
                    {"type": "response.completed", "sequence_number": 1,
                     "response": {"id": rid, "object": "response", "status": "completed"}})
                    + "\n\n")
                io.end_sse()
            else:
                io.respond(200, dict(response_obj(), id=rid))
        return script

    with Upstream("a") as a, Upstream("b") as b, Cluster("responses-sticky") as c:
        for up, name in ((a, "a"), (b, "b")):
            up.reset(holder(name))
        r = c.router("--worker", a.url, "--worker", b.url, *ONE_SHOT)
        ids = []
        for i in range(4):
            if i % 2:
                cl = SSEClient(r.port, "/v1/responses", dict(BODY, stream=True))
                try:
                    raw = read_stream(cl).decode()
                finally:
                    cl.close()
                ids.append(raw.split('"id": "', 1)[1].split('"', 1)[0])
            else:
                res = post(r.port, "/v1/responses", BODY)
                assert res.status == 200, res.text
                ids.append(res.json()["id"])
        assert {i.split("_")[1] for i in ids} == {"a", "b"}, ids
        for rid in ids:
            for method in ("GET", "DELETE"):
                res = request(r.port, method, f"/v1/responses/{rid}")
                assert res.status == 200, res.text
                assert res.json()["holder"] == rid.split("_")[1], (rid, res.text)
                assert res.json()["id"] == rid and res.json()["deleted"] == (method == "DELETE")
        res = request(r.port, "GET", "/v1/responses/resp_unknown")
        assert res.status == 404 and res.json()["error"]["code"] == "not_found", res.text
        res = request(r.port, "PUT", f"/v1/responses/{ids[0]}")
        assert res.status == 405 and "DELETE" in res.headers.get("allow", ""), res.text


if __name__ == "__main__":
    t = TestRunner()
    t.run(test_sglang_pd_injects_bootstrap_fields)
    t.run(test_nixl_two_phases)
    t.run(test_regular_passes_through)
    t.run(test_stream_failure_ends_with_error_event)
    t.run(test_bad_bodies)
    t.run(test_embeddings_rerank_score_regular_only)
    t.run(test_get_and_delete_go_to_the_worker_that_answered)
    t.finish()
