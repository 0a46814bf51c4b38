"""test_router_e2e.py — PD requests end to end through the router, a baton-worker prefill and a
baton-worker decode (and a regular worker), checked against the exact text simtext.py predicts:
chat, completions and /generate, streaming and not, batches, logprobs merged from prefill."""

import json
import os
import sys
import threading

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import simtext  # noqa: E402
from harness import Cluster, TestRunner, get, post, sse_events, url  # noqa: E402

MSGS = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello world"}]
PROMPT = "the quick brown fox jumps"


def data_events(res):
    assert res.status == 200, (res.status, res.text)
    assert res.headers.get("content-type", "").startswith("text/event-stream"), res.headers
    evs = sse_events(res.body)
    assert evs and evs[-1] == "[DONE]", evs[-3:]
    out = [json.loads(e) for e in evs[:-1]]
    for e in out:
        assert "error" not in e, e
    return out


def check_chat(port, max_tokens=7, stop=None):
    want = simtext.complete_chat(MSGS, max_tokens, stop=stop)
    body = {"model": "m", "messages": MSGS, "max_tokens": max_tokens}
    if stop:
        body["stop"] = stop
    res = post(port, "/v1/chat/completions", body)
    assert res.status == 200, res.text
    j = res.json()
    ch = j["choices"][0]
    assert ch["message"]["content"] == want.text, (ch, want)
    assert ch["finish_reason"] == want.finish_reason
    assert j["usage"]["completion_tokens"] == want.completion_tokens
    evs = data_events(post(port, "/v1/chat/completions", dict(body, stream=True)))
    text = "".join(e["choices"][0]["delta"].get("content") or "" for e in evs if e["choices"])
    assert text == want.text, (text, want)


def check_completions(port, max_tokens=9):
    want = simtext.complete_text(PROMPT, max_tokens)
    body = {"model": "m", "prompt": PROMPT, "max_tokens": max_tokens}
    res = post(port, "/v1/completions", body)
    assert res.status == 200, res.text
    assert res.json()["choices"][0]["text"] == want.text, (res.json(), want)
    evs = data_events(post(port, "/v1/completions", dict(body, stream=True)))
    assert "".join(e["choices"][0]["text"] for e in evs if e["choices"]) == want.text


def check_generate(port, max_tokens=5):
    want = simtext.complete_text(PROMPT, max_tokens)
    body = {"text": PROMPT, "sampling_params": {"max_new_tokens": max_tokens}}
    res = post(port, "/generate", body)
    assert res.status == 200, res.text
    assert res.json()["text"] == want.text and res.json()["output_ids"] == want.ids
    evs = data_events(post(port, "/generate", dict(body, stream=True)))
    assert evs[-1]["text"] == want.text, (evs[-1], want)
    ids = [5, 17, 99, 3]
    want = simtext.complete_ids(ids, max_tokens)
    res = post(port, "/generate", {"input_ids": ids, "sampling_params": {"max_new_tokens":
                                                                          max_tokens}})
    assert res.status == 200 and res.json()["text"] == want.text, res.text


def test_pd_end_to_end():
    with Cluster("e2e-pd") as c:
        p, d, r = c.pd(router_args=("--threads", "2"))
        check_chat(r.port)
        check_chat(r.port, max_tokens=20, stop=[simtext.complete_chat(MSGS, 20).text.split()[3]])
        check_completions(r.port)
        check_generate(r.port)
        res = get(r.port, "/v1/models")
        assert res.status == 200 and res.json()["data"], res.text
        assert get(r.port, "/readiness").status == 200


def test_pd_batches_end_to_end():
    with Cluster("e2e-batch") as c:
        p, d, r = c.pd(router_args=("--threads", "1"))
        prompts = ["alpha beta", "gamma", "delta epsilon zeta"]
        res = post(r.port, "/generate", {"text": prompts, "sampling_params": {"max_new_tokens": 4}})
        assert res.status == 200, res.text
        got = [o["text"] for o in res.json()]
        assert got == [simtext.complete_text(q, 4).text for q in prompts], got
        # streaming batch: the last event of each index carries its whole text
        evs = data_events(post(r.port, "/generate", {"text": prompts, "stream": True,
                                                     "sampling_params": {"max_new_tokens": 4}}))
        last = {}
        for e in evs:
            last[e.get("index", 0)] = e["text"]
        assert [last[i] for i in range(3)] == [simtext.complete_text(q, 4).text for q in prompts]
        # completions: a prompt list with n=2 (one room per sequence)
        res = post(r.port, "/v1/completions", {"prompt": prompts[:2], "max_tokens": 3, "n": 2})
        assert res.status == 200, res.text
        texts = [ch["text"] for ch in sorted(res.json()["choices"], key=lambda ch: ch["index"])]
        want = [simtext.complete_text(q, 3).text for q in prompts[:2] for _ in range(2)]
        assert texts == want, (texts, want)
        # chat n=3
        res = post(r.port, "/v1/chat/completions", {"messages": MSGS, "max_tokens": 3, "n": 3})
        assert res.status == 200, res.text
        assert [ch["message"]["content"] for ch in res.json()["choices"]] == \
            [simtext.complete_chat(MSGS, 3).text] * 3


def test_pd_logprobs_end_to_end():
    """Prefill's input-token logprobs end up in front of decode's (decode reports none)."""
    with Cluster("e2e-logprobs") as c:
        p, d, r = c.pd(router_args=("--threads", "1"))
        want_in = simtext.input_token_logprobs_text(PROMPT)
        body = {"text": PROMPT, "sampling_params": {"max_new_tokens": 4}, "return_logprob": True}
        res = post(r.port, "/generate", body)
        assert res.status == 200, res.text
        meta = res.json()["meta_info"]
        assert meta["input_token_logprobs"] == want_in, meta
        want = simtext.complete_text(PROMPT, 4)
        assert meta["output_token_logprobs"] == want.sglang_output_token_logprobs()
        evs = data_events(post(r.port, "/generate", dict(body, stream=True)))
        firsts = [e for e in evs if e["meta_info"].get("input_token_logprobs")]
        assert firsts and firsts[0]["meta_info"]["input_token_logprobs"] == want_in, evs[0]
        assert evs[-1]["text"] == want.text


def test_regular_end_to_end():
    with Cluster("e2e-regular") as c:
        w = c.worker("regular")
        r = c.router("--worker", url(w.port), "--threads", "2")
        check_chat(r.port)
        check_completions(r.port)
        check_generate(r.port)


def test_concurrent_requests():
    """Many requests at once over both router threads: each gets its own exact answer."""
    with Cluster("e2e-conc") as c:
        p, d, r = c.pd(router_args=("--threads", "2"))
        errors = []

        def one(i):
            try:
                prompt = f"request number {i} " + "word " * (i % 5)
                stream = i % 2 == 0
                res = post(r.port, "/v1/completions", {"prompt": prompt, "max_tokens": 6,
                                                       "stream": stream}, timeout=60)
                want = simtext.complete_text(prompt, 6).text
                if stream:
                    got = "".join(e["choices"][0]["text"] for e in data_events(res)
                                  if e["choices"])
                else:
                    assert res.status == 200, res.text
                    got = res.json()["choices"][0]["text"]
                assert got == want, (i, got, want)
            except Exception as e:  # noqa: BLE001 - collected and reported below
                errors.append(repr(e))

        threads = [threading.Thread(target=one, args=(i,)) for i in range(24)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(90)
        assert not errors, errors[:3]


def main():
    t = TestRunner()
    t.run(test_pd_end_to_end)
    t.run(test_pd_batches_end_to_end)
    t.run(test_pd_logprobs_end_to_end)
    t.run(test_regular_end_to_end)
    t.run(test_concurrent_requests)
    t.finish()


if __name__ == "__main__":
    main()
