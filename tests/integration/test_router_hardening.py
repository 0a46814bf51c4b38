"""test_router_hardening.py — the router against hostile clients and hostile workers (attacks in
router_attacks.py): every byte it holds for a peer is bounded, failures reach SSE clients as
error events a real SSE parser sees, half-closed clients are answered, and what a worker says
about itself stays with the operators."""

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import router_attacks as atk  # noqa: E402
from harness import Cluster, TestRunner, get, wait_until  # noqa: E402
from router_upstream import Upstream  # noqa: E402


def test_half_closed_client_answered():
    """A client that sends its whole request and then shuts down its sending side gets its
    answer (buffered and streamed), not an abort."""
    def script(req, io):
        if req.json().get("stream"):
            io.start_sse()
            io.event({"text": "a"})
            io.event({"text": "b"})
            io.chunk("data: [DONE]\n\n")
            io.end_sse()
        else:
            io.respond(200, {"text": "whole"})

    with Upstream("w", script) as w, Cluster("hard-halfclose") as c:
        r = c.router("--worker", w.url, "--threads", "1")
        got = atk.half_closed_request(r.port, "/v1/completions", {"prompt": "hi"})
        assert got.startswith(b"HTTP/1.1 200"), got[:200]
        assert got.endswith(b'{"text": "whole"}'), got[-200:]
        got = atk.half_closed_request(r.port, "/v1/completions", {"prompt": "hi", "stream": True})
        assert got.startswith(b"HTTP/1.1 200"), got[:200]
        assert b'data: {"text": "b"}' in got and got.endswith(b"0\r\n\r\n"), got[-300:]


GEN_LP = {"text": "hello", "stream": True, "return_logprob": True,
          "sampling_params": {"max_new_tokens": 4}}


def prefill_lp_script(req, io):
    io.respond(200, {"text": "", "meta_info": {"input_token_logprobs": [[-1.0, 1, None]]}})


def pd_or_regular(c, mode, decode_url, prefill_url, *extra):
    if mode == "pd":
        return c.router("--prefill", prefill_url, "--decode", decode_url, "--threads", "1",
                        "--max-retries", "0", *extra)
    return c.router("--worker", decode_url, "--threads", "1", "--max-retries", "0", *extra)


def test_partial_event_then_close():
    """The worker closes in the middle of an SSE event: the partial bytes never reach the
    client, and the error event that follows is an event of its own, seen by a spec parser."""
    for mode in ("pd", "regular"):
        with Upstream("prefill", prefill_lp_script) as p, \
                Upstream("decode", atk.partial_event_then_close_script(events=2)) as d, \
                Cluster(f"hard-partial-{mode}") as c:
            r = pd_or_regular(c, mode, d.url, p.url)
            status, body, complete = atk.stream_request(r.port, "/generate", GEN_LP)
            assert status == 200 and complete, (mode, status, body[-300:])
            evs = atk.whatwg_sse_events(body)
            assert len(evs) == 4, (mode, evs)
            assert json.loads(evs[1])["text"] == "t1", (mode, evs)
            err = json.loads(evs[2])["error"]
            assert err["type"] == "upstream_error", (mode, err)
            assert evs[3] == "[DONE]", (mode, evs)
            assert b"trunc" not in body, (mode, body[-300:])


def test_endless_sse_event_capped():
    """A worker streams one event that never ends (no blank line): past --max-sse-event-bytes
    the client gets an error event, the worker's connection is closed, and the router holds
    no more than about the cap meanwhile (PD with logprobs merged, and a regular worker)."""
    cap = 1 << 20
    total = 96 << 20
    for mode in ("pd", "regular"):
        with Upstream("prefill", prefill_lp_script) as p, \
                Upstream("decode", atk.endless_event_script(total=total)) as d, \
                Cluster(f"hard-endless-{mode}") as c:
            r = pd_or_regular(c, mode, d.url, p.url, "--max-sse-event-bytes", str(cap))
            rss0 = atk.rss_kb(r.p.pid)
            status, body, complete = atk.stream_request(r.port, "/generate", GEN_LP)
            rss1 = atk.rss_kb(r.p.pid)
            assert status == 200 and complete, (mode, status, body[-300:])
            evs = atk.whatwg_sse_events(body)
            assert len(evs) == 2 and evs[1] == "[DONE]", (mode, evs[-3:])
            err = json.loads(evs[0])["error"]
            assert err["code"] == "sse_event_too_large", (mode, err)
            dr = d.wait_requests(1)[0]
            d.wait_done(dr, 30)
            assert dr.notes.get("stopped_at", total) < total, (mode, dr.notes)
            # the cap, its doubling buffer and one read, with slack for the allocator
            assert rss1 - rss0 < 24 * 1024, (mode, rss0, rss1)


MiB = 1 << 20


def metric(port, name, **labels):
    text = get(port, "/metrics").text
    want = name + ("{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}"
                   if labels else "")
    for ln in text.splitlines():
        if ln.startswith(want + " "):
            return float(ln.split()[-1])
    return None


def test_endless_answer_over_budget():
    """A worker whose non-streamed answer never ends: every buffered byte counts against
    --max-buffered-bytes, and past it the leg fails with a 502 naming the side, the worker's
    connection is closed and the router's memory stays near the budget."""
    budget = 32 * MiB
    total = 512 * MiB
    for mode in ("pd", "regular"):
        with Upstream("prefill", prefill_lp_script) as p, \
                Upstream("decode", atk.endless_body_script(total=total)) as d, \
                Cluster(f"hard-answer-{mode}") as c:
            r = pd_or_regular(c, mode, d.url, p.url, "--max-buffered-bytes", str(budget))
            rss0 = atk.rss_kb(r.p.pid)
            body = {"text": "hello", "sampling_params": {"max_new_tokens": 4}}
            status, got, _ = atk.stream_request(r.port, "/generate", body)
            rss1 = atk.rss_kb(r.p.pid)
            assert status == 502, (mode, status, got[:300])
            msg = json.loads(got)["error"]["message"]
            side = "decode" if mode == "pd" else "regular"
            assert msg.startswith(f"{side} worker") and "max-buffered-bytes" in msg, (mode, msg)
            dr = d.wait_requests(1)[0]
            d.wait_done(dr, 30)
            assert dr.notes["stopped_at"] < total, (mode, dr.notes)
            # the budget (the answer's buffer may double while it grows) and slack
            assert rss1 - rss0 < (2 * budget + 24 * MiB) // 1024, (mode, rss0, rss1)
            assert metric(r.port, "baton_buffered_bytes", kind="upstream_answers") == 0


def test_idle_readers_do_not_starve_bodies():
    """Clients that start streams and never read them: the stream's worker is no longer read
    once their queues back up (and all streams together keep to half the budget), and a
    request body arriving meanwhile is not kept waiting for them."""
    budget = 8 * MiB
    event = "data: " + "z" * 16000 + "\n\n"

    def script(req, io):
        if not req.json().get("stream"):
            io.respond(200, {"text": "small", "got": len(req.body)})
            return
        io.start_sse()
        sent = 0
        try:
            while sent < 256 * MiB:
                io.chunk(event)
                sent += len(event)
        except Exception:  # noqa: BLE001 — the router closed it
            io.keep_alive = False
        req.notes["sent"] = sent

    with Upstream("w", script) as w, Cluster("hard-idle-readers") as c:
        r = c.router("--worker", w.url, "--threads", "1", "--max-buffered-bytes", str(budget),
                     "--body-timeout-ms", "3000")
        n = 60
        socks = atk.idle_stream_readers(r.port, n, "/v1/completions",
                                        {"prompt": "p", "stream": True})
        try:
            wait_until(lambda: len(w.requests) >= n, 20, what="streams started")
            # the queues fill up to what back-pressure allows, then stop growing
            wait_until(lambda: (metric(r.port, "baton_buffered_bytes", kind="client_queues")
                                or 0) >= budget // 4, 20, what="client queues filling")
            status, got, _ = atk.stream_request(
                r.port, "/v1/completions", {"prompt": "x" * (5 * MiB)}, timeout=20)
            assert status == 200, (status, got[:300])
            assert json.loads(got)["got"] > 5 * MiB
            queued = metric(r.port, "baton_buffered_bytes", kind="client_queues")
            # half the budget, plus at most one upstream read and one watermark per stream
            assert queued <= budget // 2 + n * (64 * 1024 + 16 * 1024), queued
        finally:
            atk.close_all(socks)


def test_big_batch_logprobs_merged_once():
    """A streamed /generate batch of 100 prompts with return_logprob: every index gets prefill's
    input logprobs in its first event only, above index 63 as below."""
    n = 100

    def p_script(req, io):
        io.respond(200, [{"text": "", "meta_info": {"input_token_logprobs": [[-1.0, i, None]]}}
                         for i in range(n)])

    def d_script(req, io):
        io.start_sse()
        for rnd in range(3):
            for i in range(n):
                io.event({"index": i, "text": f"t{rnd}",
                          "meta_info": {"input_token_logprobs": []}})
        io.chunk("data: [DONE]\n\n")
        io.end_sse()

    with Upstream("prefill", p_script) as p, Upstream("decode", d_script) as d, \
            Cluster("hard-batch") as c:
        r = pd_or_regular(c, "pd", d.url, p.url)
        body = {"text": ["p"] * n, "stream": True, "return_logprob": True,
                "sampling_params": {"max_new_tokens": 3}}
        status, got, complete = atk.stream_request(r.port, "/generate", body)
        assert status == 200 and complete, (status, got[-300:])
        evs = [json.loads(e) for e in atk.whatwg_sse_events(got)[:-1]]
        assert len(evs) == 3 * n, len(evs)
        for k, ev in enumerate(evs):
            lp = ev["meta_info"]["input_token_logprobs"]
            want = [[-1.0, ev["index"], None]] if k < n else []
            assert lp == want, (k, ev)


def test_models_stripped_info_admin_only():
    """What a worker says about itself stays with the operators: /v1/models passes only the
    OpenAI fields of each model (vLLM's "root" is a path on the worker), /get_server_info and
    /get_model_info need the admin token (API-key holders get 401)."""
    def script(req, io):
        if req.path == "/v1/models":
            io.respond(200, {"object": "list", "data": [
                {"id": "m1", "object": "model", "created": 5, "owned_by": "vllm",
                 "root": "/models/secret/llama", "parent": None, "max_model_len": 4096,
                 "permission": [{"id": "modelperm-1", "group": None}]}]})
        else:
            io.respond(200, {"model_path": "/models/secret/llama", "host": "10.1.2.3"})

    with Upstream("w", script) as w, Cluster("hard-info") as c:
        r = c.router("--worker", w.url, "--threads", "1", "--api-key", "k",
                     "--admin-token", "adm")
        res = get(r.port, "/v1/models", headers={"Authorization": "Bearer k"})
        assert res.status == 200, res.text
        assert res.json() == {"object": "list", "data": [
            {"id": "m1", "object": "model", "created": 5, "owned_by": "vllm",
             "max_model_len": 4096}]}, res.text
        for path in ("/get_server_info", "/get_model_info"):
            res = get(r.port, path, headers={"Authorization": "Bearer k"})
            assert res.status == 401 and "secret" not in res.text, (path, res.status, res.text)
            res = get(r.port, path, headers={"Authorization": "Bearer adm"})
            assert res.status == 200 and "secret" in res.text, (path, res.status, res.text)


def main():
    t = TestRunner()
    t.run(test_half_closed_client_answered)
    t.run(test_partial_event_then_close)
    t.run(test_endless_sse_event_capped)
    t.run(test_endless_answer_over_budget)
    t.run(test_idle_readers_do_not_starve_bodies)
    t.run(test_models_stripped_info_admin_only)
    t.run(test_big_batch_logprobs_merged_once)
    t.finish()


if __name__ == "__main__":
    main()
