"""test_worker_responses.py — baton-worker's Responses API, alone and behind the router in PD: the
output text and usage the simulated engine's reference gives for the same conversation, the
stream's typed events adding up to that text, max_output_tokens (status incomplete), and
previous_response_id continuing a stored response on the worker that holds it."""

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import simtext  # noqa: E402
from harness import Cluster, TestRunner, post, url  # noqa: E402
from router_upstream import SSEClient  # noqa: E402


def text_of(resp):
    return "".join(part["text"] for item in resp["output"] for part in item["content"])


def ask(port, body):
    res = post(port, "/v1/responses", body)
    assert res.status == 200, res.text
    return res.json()


def stream(port, body):
    cl = SSEClient(port, "/v1/responses", dict(body, stream=True))
    try:
        assert cl.status == 200
        cl.sock.settimeout(10.0)
        while not cl.buf.endswith(b"0\r\n\r\n"):
            d = cl.sock.recv(65536)
            if not d:
                break
            cl.buf += d
        raw = cl.buf.decode()
    finally:
        cl.close()
    events = []
    for block in raw.split("\n\n"):
        lines = [ln for ln in block.splitlines() if ln.startswith(("event: ", "data: "))]
        if len(lines) == 2:
            events.append((lines[0][7:], json.loads(lines[1][6:])))
    return events


def check_against_reference(port, label):
    msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello there"}]
    want = simtext.complete_chat(msgs, 6)
    body = {"model": "m", "instructions": "be brief", "input": "hello there",
            "max_output_tokens": 6}
    r = ask(port, body)
    assert r["object"] == "response" and r["id"].startswith("resp_"), (label, r)
    assert text_of(r) == want.text, (label, r, want.text)
    assert r["usage"]["output_tokens"] == want.completion_tokens, (label, r)
    assert r["usage"]["total_tokens"] == r["usage"]["input_tokens"] + want.completion_tokens
    assert r["status"] == ("incomplete" if want.finish_reason == "length" else "completed"), r
    evs = stream(port, body)
    types = [t for t, _ in evs]
    assert types[:4] == ["response.created", "response.in_progress",
                         "response.output_item.added", "response.content_part.added"], types
    assert types[-1] in ("response.completed", "response.incomplete"), types
    assert [d["sequence_number"] for _, d in evs] == list(range(len(evs))), evs
    deltas = "".join(d["delta"] for t, d in evs if t == "response.output_text.delta")
    assert deltas == want.text, (label, deltas, want.text)
    final = evs[-1][1]["response"]
    assert text_of(final) == want.text and final["usage"]["output_tokens"] == \
        want.completion_tokens, final
    # items with text parts are the same conversation
    r2 = ask(port, {"model": "m", "instructions": "be brief", "max_output_tokens": 6,
                    "input": [{"role": "user", "content": [{"type": "input_text",
                                                            "text": "hello there"}]}]})
    assert text_of(r2) == want.text, r2


def test_worker_alone():
    with Cluster("wresp-alone") as c:
        w = c.worker("regular")
        check_against_reference(w.port, "regular")
        # previous_response_id: the stored conversation goes on
        first = ask(w.port, {"model": "m", "input": "one two", "max_output_tokens": 4})
        second = ask(w.port, {"model": "m", "input": "three", "max_output_tokens": 5,
                              "previous_response_id": first["id"]})
        msgs = [{"role": "user", "content": "one two"},
                {"role": "assistant", "content": text_of(first)},
                {"role": "user", "content": "three"}]
        assert text_of(second) == simtext.complete_chat(msgs, 5).text, second
        assert second["previous_response_id"] == first["id"], second
        res = post(w.port, "/v1/responses", {"input": "x", "previous_response_id": "resp_nope"})
        assert res.status == 404, res.text
        assert res.json()["error"]["code"] == "previous_response_not_found", res.text
        for bad in ({"input": 3}, {"input": [{"role": "user", "content": [{"type": "input_image"}]}]},
                    {"input": "x", "max_output_tokens": -2}):
            res = post(w.port, "/v1/responses", bad)
            assert res.status == 400, (bad, res.text)


def test_through_the_router_in_pd():
    with Cluster("wresp-pd") as c:
        p, d, r = c.pd()
        check_against_reference(r.port, "pd")
        # a stored response is read back from the decode that answered it
        first = ask(r.port, {"model": "m", "input": "one two", "max_output_tokens": 4})
        assert first["id"].startswith("resp_")


def test_through_the_router_regular():
    with Cluster("wresp-regular") as c:
        w1, w2 = c.worker("regular"), c.worker("regular")
        r = c.router("--worker", url(w1.port), "--worker", url(w2.port))
        check_against_reference(r.port, "regular via router")


if __name__ == "__main__":
    t = TestRunner()
    t.run(test_worker_alone)
    t.run(test_through_the_router_in_pd)
    t.run(test_through_the_router_regular)
    t.finish()
