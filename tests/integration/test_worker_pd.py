"""test_worker_pd.py — baton-worker prefill/decode pairs driven directly (as the router would):
the same body with bootstrap fields to both, the KV handed off through libbaton, exact text,
batches, logprob split, ordering, timeouts, unreachable and garbage bootstrap peers.
test_worker_kv.py covers the KV side itself (transports, layer-wise, corruption, peer loss)."""

import json
import os
import random
import re
import socket
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from harness import Cluster, get, post, sse_events, wait_until  # noqa: E402
import simtext  # noqa: E402

FAST = ("--prefill-us-per-token", "10", "--decode-us-per-token", "200")
MSGS = [{"role": "user", "content": "Tell me about disaggregated serving."}]


def rooms(n=1):
    return [random.randrange(0, 2**63) for _ in range(n)]


def with_boot(body, p, room):
    b = dict(body)
    b["bootstrap_host"] = harness.HOST
    b["bootstrap_port"] = p.wait_port("bootstrap")
    b["bootstrap_room"] = room
    return b


def dual(p, d, path, body, delay_prefill=0.0, delay_decode=0.0, timeout=30.0):
    """Sends the same body to prefill and decode concurrently; returns (prefill, decode)."""
    out = {}

    def go(name, w, delay):
        if delay:
            time.sleep(delay)
        try:
            out[name] = post(w.port, path, body, timeout=timeout)
        except Exception as e:  # noqa: BLE001 - reported below
            out[name] = e

    ts = [threading.Thread(target=go, args=("p", p, delay_prefill)),
          threading.Thread(target=go, args=("d", d, delay_decode))]
    for t in ts:
        t.start()
    for t in ts:
        t.join(timeout + 5)
    for k in ("p", "d"):
        if isinstance(out.get(k), Exception) or k not in out:
            raise AssertionError(f"{k}: {out.get(k)!r}")
    return out["p"], out["d"]


def test_generate(p, d):
    prompt = "prefill and decode meet in a room"
    body = with_boot({"text": prompt, "sampling_params": {"max_new_tokens": 9},
                      "return_logprob": True}, p, rooms()[0])
    rp, rd = dual(p, d, "/generate", body)
    assert rp.status == 200 and rd.status == 200, (rp.text, rd.text)
    want = simtext.complete_text(prompt, 9)
    od, op = rd.json(), rp.json()
    # decode answers exactly what a regular worker would
    assert od["text"] == want.text and od["output_ids"] == want.ids, od
    assert od["meta_info"]["finish_reason"] == want.sglang_finish_reason()
    assert od["meta_info"]["prompt_tokens"] == want.prompt_tokens
    assert od["meta_info"]["completion_tokens"] == 9
    # logprobs split: prefill has the prompt's, decode the output's; merged = regular
    assert od["meta_info"]["input_token_logprobs"] == []
    assert od["meta_info"]["output_token_logprobs"] == want.sglang_output_token_logprobs()
    assert op["meta_info"]["input_token_logprobs"] == simtext.input_token_logprobs_text(prompt)
    # prefill's own answer: the first token only
    assert op["text"] == simtext.VOCAB[want.ids[0]] and op["output_ids"] == want.ids[:1]


def test_order_independent(p, d):
    """Either side may arrive first; the rendezvous waits for the other."""
    for dp, dd in ((0.0, 0.3), (0.3, 0.0)):
        body = with_boot({"text": f"order {dp}", "sampling_params": {"max_new_tokens": 4}}, p,
                         rooms()[0])
        rp, rd = dual(p, d, "/generate", body, delay_prefill=dp, delay_decode=dd)
        assert rp.status == 200 and rd.status == 200, (rp.text, rd.text)
        assert rd.json()["text"] == simtext.complete_text(f"order {dp}", 4).text


def test_chat_stream(p, d):
    body = with_boot({"messages": MSGS, "max_tokens": 10, "stream": True,
                      "stream_options": {"include_usage": True}}, p, rooms()[0])
    rp, rd = dual(p, d, "/v1/chat/completions", body)
    assert rd.status == 200 and rd.headers["content-type"].startswith("text/event-stream")
    ev = sse_events(rd.body)
    assert ev[-1] == "[DONE]"
    chunks = [json.loads(e) for e in ev[:-1]]
    want = simtext.complete_chat(MSGS, 10)
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    assert text == want.text
    assert chunks[-1]["usage"]["completion_tokens"] == 10
    assert chunks[-1]["usage"]["prompt_tokens"] == want.prompt_tokens
    # prefill's stream is well-formed and ends with [DONE] (the router reads it to the end)
    assert rp.status == 200 and sse_events(rp.body)[-1] == "[DONE]"


def test_chat_nonstream_stop(p, d):
    full = simtext.complete_chat(MSGS, 20)
    stop = [full.text.split()[3]]
    body = with_boot({"messages": MSGS, "max_tokens": 20, "stop": stop}, p, rooms()[0])
    rp, rd = dual(p, d, "/v1/chat/completions", body)
    want = simtext.complete_chat(MSGS, 20, stop=stop)
    ch = rd.json()["choices"][0]
    assert ch["message"]["content"] == want.text and ch["finish_reason"] == "stop"
    assert rd.json()["usage"]["completion_tokens"] == want.completion_tokens


def test_batches(p, d):
    # completions prompt array: one room per prompt
    prompts = ["one", "two words", "three little words"]
    body = with_boot({"prompt": prompts, "max_tokens": 5}, p, rooms(3))
    body["bootstrap_host"] = [harness.HOST] * 3
    body["bootstrap_port"] = [p.wait_port("bootstrap")] * 3
    rp, rd = dual(p, d, "/v1/completions", body)
    assert rd.status == 200, rd.text
    assert [c["text"] for c in rd.json()["choices"]] == \
        [simtext.complete_text(q, 5).text for q in prompts]
    # chat n=3: arrays of 3 rooms, scalar host/port
    body = with_boot({"messages": MSGS, "max_tokens": 4, "n": 3}, p, rooms(3))
    rp, rd = dual(p, d, "/v1/chat/completions", body)
    want = simtext.complete_chat(MSGS, 4).text
    assert [c["message"]["content"] for c in rd.json()["choices"]] == [want] * 3
    # /generate batch, streaming, with different lengths (one of them 0 tokens)
    texts = ["g one", "g two", "g three"]
    body = with_boot({"text": texts, "stream": True, "sampling_params": [
        {"max_new_tokens": 3}, {"max_new_tokens": 0}, {"max_new_tokens": 1}]}, p, rooms(3))
    rp, rd = dual(p, d, "/generate", body)
    last = {}
    for e in sse_events(rd.body)[:-1]:
        c = json.loads(e)
        last[c["index"]] = c
    assert [last[i]["text"] for i in range(3)] == [simtext.complete_text(t, n).text
                                                   for t, n in zip(texts, [3, 0, 1])]


def test_many_concurrent(p, d):
    """Many rooms at once over the one decode→prefill connection, each with its own answer."""
    n = 24
    results = [None] * n

    def one(i):
        body = with_boot({"text": f"concurrent request {i}",
                          "sampling_params": {"max_new_tokens": 6}}, p, rooms()[0])
        results[i] = dual(p, d, "/generate", body)

    ts = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(60)
    for i, (rp, rd) in enumerate(results):
        assert rd.status == 200 and rp.status == 200, (i, rd.text, rp.text)
        assert rd.json()["text"] == simtext.complete_text(f"concurrent request {i}", 6).text
    info = get(d.port, "/metrics").text
    # one control connection to the one prefill carried every room
    assert 'baton_kv_peers{state="up"} 1' in info, info
    ok = re.search(r'baton_kv_rooms_total\{result="ok"\} (\d+)', info)
    assert ok and int(ok.group(1)) >= n, info


def test_mismatch(p, d):
    """Prefill and decode got different prompts for one room: both refuse to guess."""
    for text_p, text_d in (("one two three", "one two"),  # a different number of tokens
                           ("one two", "one  two")):      # same tokens, different prompt bytes
        room = rooms()[0]
        bp = with_boot({"text": text_p, "sampling_params": {"max_new_tokens": 3}}, p, room)
        bd = with_boot({"text": text_d, "sampling_params": {"max_new_tokens": 3}}, p, room)
        out = {}
        t = threading.Thread(target=lambda: out.setdefault("p", post(p.port, "/generate", bp)))
        t.start()
        rd = post(d.port, "/generate", bd)
        t.join(30)
        assert rd.status == 500 and rd.json()["error"]["code"] == "bootstrap_mismatch", rd.text
        assert "prefill" in rd.json()["error"]["message"], rd.text
        if text_p.split() != text_d.split():
            # the prefill saw the offer did not fit its own KV
            rp = out["p"]
            assert rp.status == 500 and rp.json()["error"]["code"] == "bootstrap_mismatch", rp.text


def metric(port, name):
    """The value of one sample (name with its labels), or None."""
    for line in get(port, "/metrics").text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    return None


def test_garbage_then_pd(p, d):
    """Bytes that are not libbaton's control protocol close that connection only."""
    bport = p.wait_port("bootstrap")
    before = metric(p.port, "baton_kv_frames_rejected_total") or 0
    junks = (b"GET / HTTP/1.1\r\nHost: x\r\n\r\n" + b"x" * 64, bytes(range(256)),
             b"\xff" * 64)
    for junk in junks:
        got = harness.raw_exchange(bport, junk, timeout=5)
        assert got == b"", got  # closed without an answer
    # a half header then silence: closing it is harmless
    s = socket.create_connection((harness.HOST, bport), timeout=5)
    s.sendall(b"BA")
    s.close()
    p.wait_log(r"conn_closed .*reason=\"malformed frame")
    wait_until(lambda: (metric(p.port, "baton_kv_frames_rejected_total") or 0) >= before + 3,
               what="frames rejected")
    body = with_boot({"text": "after garbage", "sampling_params": {"max_new_tokens": 5}}, p,
                     rooms()[0])
    rp, rd = dual(p, d, "/generate", body)
    assert rd.status == 200 and rd.json()["text"] == simtext.complete_text("after garbage", 5).text


def test_decode_timeout():
    with Cluster("worker-pd-timeout") as c:
        p = c.worker("prefill", *FAST, "--bootstrap-timeout-ms", "400")
        d = c.worker("decode", *FAST, "--bootstrap-timeout-ms", "400")
        for stream in (False, True):
            body = with_boot({"text": "lonely decode", "stream": stream}, p, rooms()[0])
            t0 = time.monotonic()
            r = post(d.port, "/generate", body, timeout=20)  # the prefill never gets it
            assert time.monotonic() - t0 < 15
            # no stream was started: a plain JSON error with a status
            assert r.status == 504, (r.status, r.text)
            assert r.headers["content-type"].startswith("application/json")
            e = r.json()["error"]
            assert e["code"] == "bootstrap_timeout" and "400 ms" in e["message"], e
            # the decode aborted its offer; its pages came back once libbaton fenced the room
            wait_until(lambda: 'baton_kv_pool_slots{state="used"} 0' in get(d.port, "/metrics").text,
                       what="decode pages back")
            # the prefill remembers the abandoned room: a late request for it fails at once
            t0 = time.monotonic()
            r = post(p.port, "/generate", body, timeout=20)
            assert r.status == 502 and r.json()["error"]["code"] == "bootstrap_aborted", r.text
            assert time.monotonic() - t0 < 5
        # and a prefill whose decode never comes gives up too
        body = with_boot({"text": "lonely prefill"}, p, rooms()[0])
        r = post(p.port, "/generate", body, timeout=20)
        assert r.status == 504 and r.json()["error"]["code"] == "bootstrap_timeout", r.text
        # both still work
        body = with_boot({"text": "fine", "sampling_params": {"max_new_tokens": 2}}, p,
                         rooms()[0])
        rp, rd = dual(p, d, "/generate", body)
        assert rd.json()["text"] == simtext.complete_text("fine", 2).text


def test_unreachable():
    with Cluster("worker-pd-unreach") as c:
        d = c.worker("decode", *FAST)
        s = socket.socket()
        s.bind((harness.HOST, 0))
        dead_port = s.getsockname()[1]
        s.close()  # nothing listens there now
        body = {"text": "x", "bootstrap_host": harness.HOST, "bootstrap_port": dead_port,
                "bootstrap_room": 1}
        r = post(d.port, "/generate", body, timeout=20)
        assert r.status == 502 and r.json()["error"]["code"] == "bootstrap_unreachable", r.text


def test_prefill_abort_reaches_decode():
    """The client of the prefill request goes away before the decode asks: the decode fails at
    once with bootstrap_aborted instead of waiting for its timeout."""
    with Cluster("worker-pd-abort") as c:
        p = c.worker("prefill", "--prefill-us-per-token", "200000")  # a slow prefill
        d = c.worker("decode", *FAST, "--bootstrap-timeout-ms", "20000")
        body = with_boot({"text": "a b c d e f g h i j", "sampling_params": {"max_new_tokens": 2}},
                         p, rooms()[0])
        s = socket.create_connection((harness.HOST, p.port), timeout=5)
        data = json.dumps(body).encode()
        s.sendall(b"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: " + str(len(data)).encode() + b"\r\n\r\n" + data)
        wait_until(lambda: get(p.port, "/get_load").json()[0]["num_reqs"] == 1)
        s.close()
        p.wait_log(r"request_aborted")
        t0 = time.monotonic()
        r = post(d.port, "/generate", body, timeout=30)
        assert r.status == 502 and r.json()["error"]["code"] == "bootstrap_aborted", r.text
        assert time.monotonic() - t0 < 10


def test_prefill_refusal_reaches_decode():
    """A prefill that refuses a request outright (queue full) remembers its room: the decode's
    offer for it fails at once with bootstrap_aborted, not after its timeout."""
    with Cluster("worker-pd-refuse") as c:
        p = c.worker("prefill", *FAST, "--max-queue", "1", "--bootstrap-timeout-ms", "1500")
        d = c.worker("decode", *FAST, "--bootstrap-timeout-ms", "20000")
        # A waits for its decode (which never comes) and fills the prefill's queue
        out = {}
        a = with_boot({"text": "a waits alone"}, p, rooms()[0])
        t = threading.Thread(target=lambda: out.setdefault("a", post(p.port, "/generate", a,
                                                                        timeout=20)))
        t.start()
        wait_until(lambda: get(p.port, "/get_load").json()[0]["num_waiting_reqs"] == 1)
        b = with_boot({"text": "b is refused", "sampling_params": {"max_new_tokens": 2}}, p,
                      rooms()[0])
        r = post(p.port, "/generate", b)
        assert r.status == 503 and r.json()["error"]["code"] == "queue_full", r.text
        t0 = time.monotonic()
        r = post(d.port, "/generate", b, timeout=30)
        assert r.status == 502 and r.json()["error"]["code"] == "bootstrap_aborted", r.text
        assert time.monotonic() - t0 < 10
        t.join(20)
        assert out["a"].status == 504, out["a"].text


def main():
    t = harness.TestRunner()
    random.seed(os.getpid())
    with Cluster("worker-pd") as c:
        p = c.worker("prefill", *FAST)
        d = c.worker("decode", *FAST)
        for fn in (test_generate, test_order_independent, test_chat_stream,
                   test_chat_nonstream_stop, test_batches, test_many_concurrent, test_mismatch,
                   test_garbage_then_pd):
            t.run(fn, p, d)
    for fn in (test_decode_timeout, test_unreachable, test_prefill_abort_reaches_decode,
               test_prefill_refusal_reaches_decode):
        t.run(fn)
    t.finish()


if __name__ == "__main__":
    main()
