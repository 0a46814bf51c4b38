"""test_migration.py — streams that survive a dead decode. baton-worker's continuations (the
rest of a stream, event for event, from what the client has) and the router's migration of a
stream whose decode dies (regular and PD, chat / completions / generate, n = 1 and n > 1)."""

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from harness import Cluster, post, sse_events  # noqa: E402
from migration_ref import continuation, normalize  # noqa: E402

FAST = ("--prefill-us-per-token", "1", "--decode-us-per-token", "100")
MSGS = [{"role": "user", "content": "Say something about rivers."}]

# Streams whose every cut point is checked: APIs, n > 1, batches, stop strings (held back text).
CASES = [
    ("chat", {"messages": MSGS, "max_tokens": 9}),
    ("chat", {"messages": MSGS, "max_tokens": 7, "n": 3, "stream_options": {"include_usage": True}}),
    ("completions", {"prompt": "once upon a time", "max_tokens": 8}),
    ("completions", {"prompt": ["a b", "c"], "max_tokens": 5, "n": 2,
                     "stream_options": {"include_usage": True}}),
    ("generate", {"text": "stream me please", "sampling_params": {"max_new_tokens": 6}}),
    ("generate", {"text": ["x", "y y"], "sampling_params": {"max_new_tokens": 4}}),
]
PATHS = {"chat": "/v1/chat/completions", "completions": "/v1/completions", "generate": "/generate"}


def with_stop(api, body, port):
    """The case with a stop string taken from its own text (so text is held back, then cut)."""
    r = post(port, PATHS[api], dict(body, stream=False))
    j = r.json()
    text = (j[0] if isinstance(j, list) else j)["text"] if api == "generate" else (
        j["choices"][0].get("text") or j["choices"][0]["message"]["content"])
    words = text.split(" ")
    stop = " ".join(words[len(words) // 2:len(words) // 2 + 2])[:-1] if len(words) > 3 else None
    if not stop:
        return None
    b = json.loads(json.dumps(body))
    if api == "generate":
        b["sampling_params"]["stop"] = [stop]
    else:
        b["stop"] = [stop]
    return b


def test_worker_continuation(port):
    """Every cut point of every case: the continuation's events are the uninterrupted stream's
    events after the cut, byte for byte but for id and created."""
    checked = 0
    cases = list(CASES)
    for api, body in CASES:
        s = with_stop(api, body, port)
        if s:
            cases.append((api, s))
    for api, body in cases:
        body = dict(body, stream=True)
        full = sse_events(post(port, PATHS[api], body).body)
        assert full[-1] == "[DONE]", full
        # after the usage chunk only [DONE] is missing: the router ends such a stream itself
        cuts = [k for k in range(len(full)) if '"usage"' not in "".join(full[:k])]
        for cut in cuts:
            got = post(port, PATHS[api], continuation(api, body, full[:cut]))
            assert got.status == 200, (got.status, got.body)
            rest = sse_events(got.body)
            assert [normalize(e) for e in rest] == [normalize(e) for e in full[cut:]], (
                api, body, cut, rest, full[cut:])
            checked += 1
    assert checked > 60, checked


def test_worker_continuation_refused(port):
    body = {"messages": MSGS, "max_tokens": 5, "stream": True}
    bad = dict(body, baton_continuation={"choices": [{"text": "not what it says"}]})
    r = post(port, PATHS["chat"], bad)
    assert r.status == 400 and r.json()["error"]["code"] == "continuation_mismatch", r.body
    for b in (dict(bad, stream=False), dict(body, logprobs=True,
                                                baton_continuation={"choices": [None]}),
              dict(body, baton_continuation={"choices": [None, None]}),
              dict(body, baton_continuation={"choices": [{"text": 3}]}),
              dict(body, baton_continuation=[])):
        r = post(port, PATHS["chat"], b)
        assert r.status == 400, (b, r.status, r.body)
        assert r.json()["error"]["param"] == "baton_continuation", r.body


def main():
    t = harness.TestRunner()
    with Cluster("migration") as c:
        w = c.worker("regular", *FAST)
        t.run(test_worker_continuation, w.port)
        t.run(test_worker_continuation_refused, w.port)
    t.finish()


if __name__ == "__main__":
    main()
