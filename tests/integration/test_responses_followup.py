"""test_responses_followup.py — previous_response_id through the router: a follow-up reaches
its workers with the whole conversation as input (the router keeps each relayed answer's
conversation), so it works in PD (the prefill never answered the earlier response) and across
regular workers, streamed or not, over several turns, and gives the same text a single worker
gives when it continues its own response."""

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from harness import Cluster, TestRunner, get, post, sse_events, url, wait_until  # noqa: E402

FAST = ("--prefill-us-per-token", "1", "--decode-us-per-token", "100")
TURNS = ["Tell me about rivers.", "And lakes?", "Which is deeper?"]


def text_of(resp):
    return "".join(p["text"] for it in resp["output"] if it["type"] == "message"
                   for p in it["content"] if p["type"] == "output_text")


def ask(port, body, stream):
    r = post(port, "/v1/responses", dict(body, stream=stream))
    assert r.status == 200, (r.status, r.body)
    if not stream:
        return r.json()
    for ev in sse_events(r.body):
        d = json.loads(ev)
        if d.get("type") in ("response.completed", "response.incomplete"):
            return d["response"]
    raise AssertionError(f"no final event: {r.body[-400:]}")


def conversation(port, streams):
    """The three turns, each naming the one before; their texts."""
    prev, texts = None, []
    for turn, stream in zip(TURNS, streams):
        body = {"input": turn, "max_output_tokens": 7, "instructions": "be brief"}
        if prev:
            body["previous_response_id"] = prev
        resp = ask(port, body, stream)
        prev = resp["id"]
        texts.append(text_of(resp))
    return texts


def test_followups(reference):
    with Cluster("resp-followup") as c:
        p = c.worker("prefill", *FAST)
        d1 = c.worker("decode", *FAST)
        d2 = c.worker("decode", *FAST)
        pd = c.router("--prefill", url(p.port), str(p.wait_port("bootstrap")), "--decode",
                      url(d1.port), "--decode", url(d2.port))
        w1 = c.worker("regular", *FAST)
        w2 = c.worker("regular", *FAST)
        reg = c.router("--worker", url(w1.port), "--worker", url(w2.port), name="router-regular")
        for r in (pd, reg):
            wait_until(lambda: get(r.port, "/readiness").status == 200, what="ready")
        for streams in ((False, False, False), (True, True, True), (True, False, True)):
            for r in (pd, reg):
                got = conversation(r.port, streams)
                assert got == reference, (streams, got, reference)


def test_unknown_id_passes_through():
    """An id the router never relayed goes as it came: the worker's own 404."""
    with Cluster("resp-followup-unknown") as c:
        w = c.worker("regular", *FAST)
        r = c.router("--worker", url(w.port))
        wait_until(lambda: get(r.port, "/readiness").status == 200, what="ready")
        res = post(r.port, "/v1/responses", {"input": "x", "previous_response_id": "resp_nope"})
        assert res.status == 404, res.body
        assert res.json()["error"]["code"] == "previous_response_not_found", res.body


def main():
    t = TestRunner()
    with Cluster("resp-followup-ref") as c:
        w = c.worker("regular", *FAST)
        reference = conversation(w.port, (False, False, False))
        assert len(set(reference)) == 3, reference  # each turn a text of its own
    t.run(test_followups, reference)
    t.run(test_unknown_id_passes_through)
    t.finish()


if __name__ == "__main__":
    main()
