"""test_worker.py — baton-worker in regular mode: every endpoint, stream and not, with the exact
text simtext.py predicts; validation errors; queueing; client disconnects; clean shutdown."""

import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from harness import Cluster, get, post, sse_events, wait_until  # noqa: E402
import simtext  # noqa: E402
from router_upstream import SSEClient  # noqa: E402

FAST = ("--prefill-us-per-token", "1", "--decode-us-per-token", "100")
MSGS = [{"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Say something about rivers."}]


def check_generate_obj(obj, want, logprobs=False, prompt=None, ids=None):
    assert obj["text"] == want.text, (obj["text"], want)
    assert obj["output_ids"] == want.ids, obj
    meta = obj["meta_info"]
    assert meta["finish_reason"] == want.sglang_finish_reason(), meta
    assert meta["prompt_tokens"] == want.prompt_tokens, meta
    assert meta["completion_tokens"] == want.completion_tokens, meta
    if logprobs:
        assert meta["output_token_logprobs"] == want.sglang_output_token_logprobs(), meta
        exp_in = (simtext.input_token_logprobs_text(prompt) if prompt is not None
                  else simtext.input_token_logprobs_ids(ids))
        assert meta["input_token_logprobs"] == exp_in, meta
    else:
        assert "output_token_logprobs" not in meta, meta


def test_generate(port):
    # text, default max_new_tokens (128)
    r = post(port, "/generate", {"text": "hello world"})
    assert r.status == 200, r.text
    assert r.headers["content-type"].startswith("application/json")
    want = simtext.complete_text("hello world", simtext.DEFAULT_MAX_TOKENS["generate"])
    check_generate_obj(r.json(), want)
    # stops, logprobs, rid
    prompt = "The quick brown fox\tjumps over\n the lazy dog"
    full = simtext.complete_text(prompt, 30)
    stop = full.text.split()[5]
    body = {"text": prompt, "sampling_params": {"max_new_tokens": 30, "stop": [stop, "zzz"]},
            "return_logprob": True, "rid": "my-rid"}
    obj = post(port, "/generate", body).json()
    want = simtext.complete_text(prompt, 30, stop=[stop, "zzz"])
    assert want.finish_reason == "stop" and want.matched == stop
    check_generate_obj(obj, want, logprobs=True, prompt=prompt)
    assert obj["meta_info"]["id"] == "my-rid"
    # input_ids, stop token ids, logprob_start_len
    ids = [101, 7, 2048, 9]
    full = simtext.complete_ids(ids, 12)
    sid = full.ids[4]
    obj = post(port, "/generate", {"input_ids": ids, "return_logprob": True,
                                   "logprob_start_len": 2,
                                   "sampling_params": {"max_new_tokens": 12,
                                                       "stop_token_ids": [sid]}}).json()
    want = simtext.complete_ids(ids, 12, stop_token_ids=[sid])
    assert want.finish_reason == "stop" and want.matched == sid
    assert obj["text"] == want.text and obj["output_ids"] == want.ids
    assert obj["meta_info"]["finish_reason"] == {"type": "stop", "matched": sid}
    assert obj["meta_info"]["input_token_logprobs"] == simtext.input_token_logprobs_ids(ids, 2)
    # max_new_tokens 0
    obj = post(port, "/generate", {"text": "x", "sampling_params": {"max_new_tokens": 0}}).json()
    assert obj["text"] == "" and obj["meta_info"]["completion_tokens"] == 0
    assert obj["meta_info"]["finish_reason"] == {"type": "length", "length": 0}


def test_generate_batch(port):
    texts = ["alpha beta", "gamma", "delta epsilon zeta"]
    r = post(port, "/generate", {"text": texts, "sampling_params": [
        {"max_new_tokens": 3}, {"max_new_tokens": 5}, {"max_new_tokens": 1}]})
    arr = r.json()
    assert isinstance(arr, list) and len(arr) == 3
    for obj, t, n in zip(arr, texts, [3, 5, 1]):
        check_generate_obj(obj, simtext.complete_text(t, n))
    # a one-element list is still a batch
    arr = post(port, "/generate", {"input_ids": [[5, 6]],
                                   "sampling_params": {"max_new_tokens": 4}}).json()
    assert isinstance(arr, list) and len(arr) == 1
    check_generate_obj(arr[0], simtext.complete_ids([5, 6], 4))


def test_generate_stream(port):
    prompt = "stream me please"
    r = post(port, "/generate", {"text": prompt, "stream": True, "return_logprob": True,
                                 "sampling_params": {"max_new_tokens": 6}})
    assert r.status == 200
    assert r.headers["content-type"].startswith("text/event-stream")
    ev = sse_events(r.body)
    assert ev[-1] == "[DONE]", ev
    chunks = [json.loads(e) for e in ev[:-1]]
    want = simtext.complete_text(prompt, 6)
    assert len(chunks) == 6  # one per token
    for k, c in enumerate(chunks):
        # cumulative text, growing token by token
        assert c["text"] == " ".join(simtext.VOCAB[t] for t in want.ids[:k + 1]), c
        assert c["meta_info"]["completion_tokens"] == k + 1
        assert c["meta_info"]["finish_reason"] is None or k == 5
    check_generate_obj(chunks[-1], want, logprobs=True, prompt=prompt)
    # batch stream: chunks carry "index"
    r = post(port, "/generate", {"text": ["a", "b b"], "stream": True,
                                 "sampling_params": {"max_new_tokens": 2}})
    ev = sse_events(r.body)
    assert ev[-1] == "[DONE]"
    last = {}
    for e in ev[:-1]:
        c = json.loads(e)
        last[c["index"]] = c
    assert last[0]["text"] == simtext.complete_text("a", 2).text
    assert last[1]["text"] == simtext.complete_text("b b", 2).text


def test_chat(port):
    full = simtext.complete_chat(MSGS, 40)
    stop = full.text.split()[6][1:] + " "  # a stop that starts inside a word
    body = {"model": "whatever", "messages": MSGS, "max_tokens": 40, "stop": stop, "n": 2}
    r = post(port, "/v1/chat/completions", body)
    assert r.status == 200, r.text
    obj = r.json()
    want = simtext.complete_chat(MSGS, 40, stop=stop)
    assert obj["object"] == "chat.completion"
    assert obj["id"].startswith("chatcmpl-")
    assert obj["model"] == "whatever"
    assert len(obj["choices"]) == 2
    for i, ch in enumerate(obj["choices"]):
        assert ch["index"] == i
        assert ch["message"] == {"role": "assistant", "content": want.text}, ch
        assert ch["finish_reason"] == want.finish_reason
        assert ch["matched_stop"] == (want.matched if want.finish_reason == "stop" else None)
        assert ch["logprobs"] is None
    assert obj["usage"] == {"prompt_tokens": want.prompt_tokens,
                            "completion_tokens": 2 * want.completion_tokens,
                            "total_tokens": want.prompt_tokens + 2 * want.completion_tokens,
                            # 9 prompt tokens, less than one KV page: nothing can be cached
                            "prompt_tokens_details": {"cached_tokens": 0}}
    # max_completion_tokens, default model name, logprobs with alternatives
    obj = post(port, "/v1/chat/completions",
               {"messages": MSGS, "max_completion_tokens": 4, "logprobs": True,
                "top_logprobs": 3}).json()
    want = simtext.complete_chat(MSGS, 4)
    assert obj["model"] == "baton-sim"
    ch = obj["choices"][0]
    assert ch["message"]["content"] == want.text and ch["finish_reason"] == "length"
    content = ch["logprobs"]["content"]
    assert [c["token"] for c in content] == [want.token_text(i) for i in range(4)]
    assert [c["logprob"] for c in content] == want.output_logprobs()
    assert content[1]["bytes"] == list(want.token_text(1).encode())
    top = content[0]["top_logprobs"]
    assert len(top) == 3 and top[0]["token"] == want.token_text(0)
    assert top[1]["token"] == simtext.VOCAB[(want.ids[0] + 1) % 64]
    assert top[1]["logprob"] == want.output_logprobs()[0] - 1


def chat_stream_text(body):
    ev = sse_events(body)
    assert ev[-1] == "[DONE]", ev
    chunks = [json.loads(e) for e in ev[:-1]]
    return chunks


def test_chat_stream(port):
    want = simtext.complete_chat(MSGS, 12)
    r = post(port, "/v1/chat/completions", {"messages": MSGS, "max_tokens": 12, "stream": True,
                                            "stream_options": {"include_usage": True}})
    assert r.status == 200
    assert r.headers["content-type"].startswith("text/event-stream")
    chunks = chat_stream_text(r.body)
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert len({c["id"] for c in chunks}) == 1
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    usage = chunks[-1]
    assert usage["choices"] == [] and usage["usage"] == {
        "prompt_tokens": want.prompt_tokens, "completion_tokens": 12,
        "total_tokens": want.prompt_tokens + 12, "prompt_tokens_details": {"cached_tokens": 0}}
    body = chunks[1:-1]
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in body)
    assert text == want.text
    assert [c["choices"][0]["finish_reason"] for c in body] == [None] * (len(body) - 1) + ["length"]
    # without include_usage: no usage chunk
    r = post(port, "/v1/chat/completions", {"messages": MSGS, "max_tokens": 2, "stream": True})
    chunks = chat_stream_text(r.body)
    assert all("usage" not in c for c in chunks)
    # n=2: both choices stream, each ends once
    r = post(port, "/v1/chat/completions", {"messages": MSGS, "max_tokens": 3, "stream": True,
                                            "n": 2})
    chunks = chat_stream_text(r.body)
    texts, ends = {0: "", 1: ""}, {0: 0, 1: 0}
    for c in chunks:
        ch = c["choices"][0]
        texts[ch["index"]] += ch["delta"].get("content", "")
        ends[ch["index"]] += ch["finish_reason"] is not None
    want = simtext.complete_chat(MSGS, 3).text
    assert texts == {0: want, 1: want} and ends == {0: 1, 1: 1}


def test_stream_stop_holdback(port):
    """A stop string spanning tokens: no chunk ever shows text that the stop later removes."""
    prompt = "hold back test"
    full = simtext.complete_text(prompt, 30)
    w = full.text.split()
    stop = w[7][-1:] + " " + w[8][:2]
    want = simtext.complete_text(prompt, 30, stop=stop)
    assert want.finish_reason == "stop"
    r = post(port, "/v1/completions", {"prompt": prompt, "max_tokens": 30, "stop": [stop],
                                       "stream": True})
    chunks = chat_stream_text(r.body)
    seen = ""
    for c in chunks:
        seen += c["choices"][0]["text"]
        assert want.text.startswith(seen), (seen, want.text)
    assert seen == want.text
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
    assert chunks[-1]["choices"][0]["matched_stop"] == stop


def test_completions(port):
    prompts = ["first prompt", "second one here"]
    r = post(port, "/v1/completions", {"prompt": prompts, "max_tokens": 5, "logprobs": 2})
    obj = r.json()
    assert obj["object"] == "text_completion" and obj["id"].startswith("cmpl-")
    wants = [simtext.complete_text(p, 5) for p in prompts]
    assert [c["text"] for c in obj["choices"]] == [w.text for w in wants]
    assert [c["index"] for c in obj["choices"]] == [0, 1]
    lp = obj["choices"][1]["logprobs"]
    assert lp["tokens"] == [wants[1].token_text(i) for i in range(5)]
    assert lp["token_logprobs"] == wants[1].output_logprobs()
    assert lp["text_offset"] == [0] + wants[1].tok_end[:-1]
    assert len(lp["top_logprobs"][0]) == 2
    assert obj["usage"]["prompt_tokens"] == 2 + 3
    assert obj["usage"]["completion_tokens"] == 10
    # token-id prompts: a flat list is one prompt, a list of lists a batch
    obj = post(port, "/v1/completions", {"prompt": [3, 1, 4], "max_tokens": 4}).json()
    assert [c["text"] for c in obj["choices"]] == [simtext.complete_ids([3, 1, 4], 4).text]
    obj = post(port, "/v1/completions", {"prompt": [[3], [1, 4]], "max_tokens": 4}).json()
    assert [c["text"] for c in obj["choices"]] == [simtext.complete_ids([3], 4).text,
                                                   simtext.complete_ids([1, 4], 4).text]
    # default max_tokens 16; stream
    r = post(port, "/v1/completions", {"prompt": "defaults", "stream": True,
                                       "stream_options": {"include_usage": True}})
    chunks = chat_stream_text(r.body)
    assert chunks[-1]["usage"]["completion_tokens"] == 16
    assert "".join(c["choices"][0]["text"] for c in chunks[:-1]) == \
        simtext.complete_text("defaults", 16).text


def test_info_endpoints(port):
    for path in ("/health", "/health_generate"):
        r = get(port, path)
        assert r.status == 200, (path, r.status)
    info = get(port, "/get_server_info").json()
    assert info["disaggregation_mode"] == "null"
    assert info["max_running_requests"] == 32 and info["model_path"] == "baton-sim"
    mi = get(port, "/get_model_info").json()
    assert mi["model_path"] == "baton-sim" and mi["is_generation"] is True
    models = get(port, "/v1/models").json()
    assert models["object"] == "list" and models["data"][0]["id"] == "baton-sim"
    load = get(port, "/get_load").json()
    assert load[0]["num_reqs"] == 0
    m = get(port, "/metrics")
    assert m.status == 200 and m.headers["content-type"].startswith("text/plain")
    assert 'baton_worker_requests_total{route="generate",status="200"}' in m.text, m.text
    assert "baton_worker_generation_tokens_total" in m.text
    assert "# TYPE baton_worker_queue_depth gauge" in m.text


def test_errors(port):
    def err(r, status, param=None):
        assert r.status == status, (r.status, r.text)
        e = r.json()["error"]
        assert set(e) == {"message", "type", "param", "code"}, e
        assert e["message"]
        if param is not None:
            assert e["param"] == param, e
        return e

    err(post(port, "/generate", b"{not json"), 400)
    err(post(port, "/v1/chat/completions", b"[1,2,3]"), 400)
    err(post(port, "/v1/chat/completions", {"messages": []}), 400, "messages")
    err(post(port, "/v1/chat/completions", {"messages": MSGS, "max_tokens": "3"}), 400,
        "max_tokens")
    err(post(port, "/v1/completions", {"prompt": "a", "stop": 7}), 400, "stop")
    err(post(port, "/generate", {"text": "a", "input_ids": [1]}), 400, "text")
    err(post(port, "/generate", {"text": ["a", "b"], "bootstrap_room": 5}), 400, "bootstrap_room")
    err(get(port, "/nope"), 404)
    err(get(port, "/v1/chat/completions"), 405)
    err(post(port, "/health", {}), 405)
    # the worker is fine afterwards
    assert post(port, "/generate", {"text": "ok", "sampling_params": {"max_new_tokens": 1}}
                ).json()["text"] == simtext.complete_text("ok", 1).text


def test_modes_require_bootstrap():
    with Cluster("worker-modes") as c:
        p = c.worker("prefill", *FAST)
        d = c.worker("decode", *FAST)
        for w, mode in ((p, "prefill"), (d, "decode")):
            r = post(w.port, "/generate", {"text": "a"})
            assert r.status == 400 and r.json()["error"]["code"] == "bootstrap_required", r.text
            info = get(w.port, "/get_server_info").json()
            assert info["disaggregation_mode"] == mode
        assert get(p.port, "/get_server_info").json()["disaggregation_bootstrap_port"] == \
            p.wait_port("bootstrap")
        # decode needs host and port, not only a room
        r = post(d.port, "/generate", {"text": "a", "bootstrap_room": 1})
        assert r.status == 400, r.text


def test_queue_full():
    with Cluster("worker-queue") as c:
        w = c.worker("regular", "--max-batch", "1", "--max-queue", "1",
                     "--decode-us-per-token", "20000")
        results = {}

        def send(name, n):
            results[name] = post(w.port, "/generate", {"text": name,
                                                       "sampling_params": {"max_new_tokens": n}})

        ta = threading.Thread(target=send, args=("a", 100))
        ta.start()
        wait_until(lambda: get(w.port, "/get_load").json()[0]["num_running_reqs"] == 1,
                   what="a running")
        tb = threading.Thread(target=send, args=("b", 2))
        tb.start()
        wait_until(lambda: get(w.port, "/get_load").json()[0]["num_waiting_reqs"] == 1,
                   what="b waiting")
        r = post(w.port, "/generate", {"text": "c"})
        assert r.status == 503, r.text
        assert r.json()["error"]["code"] == "queue_full"
        ta.join(30)
        tb.join(30)
        assert results["a"].json()["text"] == simtext.complete_text("a", 100).text
        assert results["b"].json()["text"] == simtext.complete_text("b", 2).text


def test_client_disconnect():
    with Cluster("worker-abort") as c:
        w = c.worker("regular", "--decode-us-per-token", "20000")
        conn = http.client.HTTPConnection(harness.HOST, w.port, timeout=10)
        conn.request("POST", "/v1/chat/completions",
                     body=json.dumps({"messages": MSGS, "max_tokens": 1000, "stream": True}),
                     headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        assert resp.status == 200
        first = resp.fp.readline()
        assert first.strip(), first
        conn.sock.close()  # go away mid-stream
        conn.close()
        # the sequence leaves the scheduler at once, long before its 1000 tokens (20 s)
        wait_until(lambda: get(w.port, "/get_load").json()[0]["num_reqs"] == 0, timeout=5,
                   what="request removed")
        w.wait_log(r"request_aborted .*reason=client_gone", timeout=5)
        m = get(w.port, "/metrics").text
        assert 'baton_worker_requests_total{route="chat",status="aborted"} 1' in m, m
        # and the worker still serves
        r = post(w.port, "/generate", {"text": "after", "sampling_params": {"max_new_tokens": 2}})
        assert r.json()["text"] == simtext.complete_text("after", 2).text


def test_zero_cost_many():
    """Zero timing costs (the benchmark fast path) with many concurrent requests."""
    with Cluster("worker-zero") as c:
        w = c.worker("regular", "--prefill-us-per-token", "0", "--decode-us-per-token", "0",
                     "--max-batch", "4")
        out = [None] * 24

        def one(i):
            out[i] = post(w.port, "/v1/completions", {"prompt": f"p {i}", "max_tokens": 50,
                                                      "stream": i % 2 == 0})

        ts = [threading.Thread(target=one, args=(i,)) for i in range(24)]
        for t in ts:
            t.start()
        for t in ts:
            t.join(30)
        for i, r in enumerate(out):
            want = simtext.complete_text(f"p {i}", 50).text
            if i % 2 == 0:
                got = "".join(json.loads(e)["choices"][0]["text"] for e in sse_events(r.body)[:-1])
            else:
                got = r.json()["choices"][0]["text"]
            assert got == want, (i, got, want)


def test_cli_and_signals():
    exe = harness.binary("baton-worker")
    r = subprocess.run([exe, "--help"], capture_output=True, timeout=10)
    assert r.returncode == 0 and b"--bootstrap-timeout-ms" in r.stdout
    for bad in (["--mode", "both"], ["--port", "70000"], ["--max-batch", "0"], ["--nope"],
                ["--port"], ["extra"]):
        r = subprocess.run([exe] + bad, capture_output=True, timeout=10)
        assert r.returncode != 0 and r.stderr, (bad, r.returncode)
    with Cluster("worker-signals") as c:
        w = c.worker("regular", *FAST)
        assert w.stop() == 0
        # SIGINT with a request in flight still exits cleanly
        w = c.worker("regular", "--decode-us-per-token", "20000")
        def inflight():
            try:
                post(w.port, "/generate", {"text": "x"})
            except OSError:
                pass  # the worker closes it on the way out

        t = threading.Thread(target=inflight)
        t.start()
        wait_until(lambda: get(w.port, "/get_load").json()[0]["num_reqs"] == 1)
        w.signal(2)
        w.p.wait(timeout=10)
        assert w.p.returncode == 0, w.p.returncode
        t.join(10)


def test_sigterm_drains():
    """SIGTERM drains like the router: the listener closes, a request begun on an open
    connection gets 503 shutting_down, the stream in flight completes intact (every token, its
    [DONE]), then exit 0. Past --drain-timeout-ms what is left is answered (an SSE error event,
    a 503) instead of cut."""
    n, prompt = 300, "drain me"
    with Cluster("worker-drain") as c:
        w = c.worker("regular", "--decode-us-per-token", "20000", "--drain-timeout-ms", "120000")
        port = w.port
        cl = SSEClient(port, "/generate", {"text": prompt, "stream": True,
                                           "sampling_params": {"max_new_tokens": n}}, timeout=60)
        evs = [cl.next_event()]
        # a request whose body is still being read when the signal comes (its bytes show in
        # baton_worker_buffered_bytes once the worker reads them)
        body = json.dumps({"text": "too late " * 4000}).encode()
        late = socket.create_connection(("127.0.0.1", port), timeout=30)
        late.sendall(b"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n" % len(body) + body[:16384])
        wait_until(lambda: (worker_metric(port, "baton_worker_buffered_bytes") or 0) >= 16384,
                   what="the late body being read")
        w.signal(signal.SIGTERM)
        # the stream is in flight when the drain starts
        w.wait_log(r"shutdown signal=SIGTERM drain_timeout_ms=120000 in_flight=1")

        def refused():
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                return False
            except OSError:
                return True
        wait_until(refused, timeout=10, what="listener closed")
        late.sendall(body[16384:])
        got = b""
        while True:
            d = late.recv(65536)
            if not d:
                break
            got += d
        late.close()
        head, _, rbody = got.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 503"), got
        assert json.loads(rbody)["error"]["code"] == "shutting_down", got
        evs += cl.events()
        cl.close()
        assert evs[-1] == "[DONE]" and len(evs) == n + 1, evs[-3:]
        want = simtext.complete_text(prompt, n)
        check_generate_obj(json.loads(evs[-2]), want, prompt=prompt)
        w.p.wait(timeout=60)
        assert w.p.returncode == 0, w.tail()
    # the deadline: the stream gets an error event, a plain request a 503, both well formed
    with Cluster("worker-drain-deadline") as c:
        w = c.worker("regular", "--decode-us-per-token", "20000", "--drain-timeout-ms", "300")
        cl = SSEClient(w.port, "/generate", {"text": "long", "stream": True,
                                             "sampling_params": {"max_new_tokens": 5000}},
                       timeout=60)
        assert cl.next_event() is not None
        got = {}

        def plain():
            got["res"] = post(w.port, "/generate", {"text": "long too", "sampling_params":
                                                   {"max_new_tokens": 5000}}, timeout=60)

        t = threading.Thread(target=plain)
        t.start()
        wait_until(lambda: get(w.port, "/get_load").json()[0]["num_reqs"] == 2)
        w.signal(signal.SIGTERM)
        evs = cl.events()
        cl.close()
        assert evs[-1] == "[DONE]", evs[-3:]
        assert json.loads(evs[-2])["error"]["code"] == "shutting_down", evs[-3:]
        t.join(60)
        assert got["res"].status == 503, got
        assert got["res"].json()["error"]["code"] == "shutting_down", got["res"].text
        w.p.wait(timeout=60)
        assert w.p.returncode == 0, w.tail()


def worker_metric(port, name):
    for line in get(port, "/metrics").text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    return None


def test_body_flood_budget():
    """Clients announcing 8 MiB bodies, sending 2 MiB and stalling: the worker holds at most
    --max-buffered-bytes of them (baton_worker_buffered_bytes), the rest wait in the kernel,
    and a small request is still answered; a body over --max-body-bytes gets 413."""
    import socket
    mib = 1 << 20
    with Cluster("worker-bodies") as c:
        w = c.worker("regular", *FAST, "--max-buffered-bytes", str(16 * mib),
                     "--max-body-bytes", str(32 * mib))
        socks = []
        try:
            for _ in range(12):
                s = socket.create_connection((harness.HOST, w.port), timeout=10)
                s.sendall(b"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Type: "
                          b"application/json\r\nContent-Length: %d\r\n\r\n" % (8 * mib))
                s.setblocking(False)
                try:
                    s.send(b" " * (2 * mib))
                except BlockingIOError:
                    pass
                socks.append(s)
            wait_until(lambda: (worker_metric(w.port, "baton_worker_buffered_bytes") or 0) > 0,
                       what="bodies charged to the budget")
            held = worker_metric(w.port, "baton_worker_buffered_bytes")
            assert held <= 16 * mib + 2 * mib + 64 * 1024, held  # budget + its reserve + a read
            res = post(w.port, "/generate", {"text": "small", "sampling_params":
                                             {"max_new_tokens": 2}})
            assert res.status == 200, res.text
            assert get(w.port, "/health").status == 200
            big = harness.request(w.port, "POST", "/generate", body=b"x" * (33 * mib),
                                  headers={"Content-Type": "application/json"})
            assert big.status == 413, big.status
        finally:
            for s in socks:
                s.close()


def main():
    t = harness.TestRunner()
    with Cluster("worker") as c:
        w = c.worker("regular", *FAST)
        for fn in (test_generate, test_generate_batch, test_generate_stream, test_chat,
                   test_chat_stream, test_stream_stop_holdback, test_completions,
                   test_info_endpoints, test_errors):
            t.run(fn, w.port)
    for fn in (test_modes_require_bootstrap, test_queue_full, test_client_disconnect,
               test_zero_cost_many, test_cli_and_signals, test_sigterm_drains,
               test_body_flood_budget):
        t.run(fn)
    t.finish()


if __name__ == "__main__":
    main()
