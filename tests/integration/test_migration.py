"""test_migration.py — streams that survive a dead decode. baton-worker's continuations (the
rest of a stream, event for event, from what the client has) and the router's migration of a
stream whose decode dies (regular and PD, chat / completions / generate, n = 1 and n > 1)."""

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from harness import Cluster, post, sse_events  # noqa: E402
import migration_ref as mref  # noqa: E402
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


SLOW = ("--prefill-us-per-token", "100", "--decode-us-per-token", "15000")
ROUTED = [  # the last one is /generate: not for the vLLM protocols
    ("chat", {"messages": MSGS, "max_tokens": 24}),
    ("chat", {"messages": MSGS, "max_tokens": 20, "n": 2, "stream_options": {"include_usage": True}}),
    ("completions", {"prompt": "once upon a time", "max_tokens": 20, "n": 3}),
    ("generate", {"text": ["x", "y y"], "sampling_params": {"max_new_tokens": 20}}),
]


def inflight(w):
    m = mref.re.search(r"baton_worker_inflight_requests (\d+)", harness.get(w.port, "/metrics").text)
    return int(m.group(1)) if m else 0


def worker_args(mode):
    """regular, pd (SGLang's protocol), vllm-nixl, vllm-mooncake: the workers' flags."""
    return SLOW + (("--protocol", mode) if mode.startswith("vllm") else ())


def routed_cluster(c, mode, *router_args):
    """A router in front of two workers (PD: one prefill, two decodes) that can be killed."""
    argv, ws, cfg = [], [], []
    if mode != "regular":
        p = c.worker("prefill", *worker_args(mode))
        boot = p.wait_port("bootstrap")
        if mode == "vllm-mooncake":  # the prefill's engine id and bootstrap come with it
            cfg.append({"url": harness.url(p.port), "worker_type": "prefill",
                        "engine_id": "prefill-0", "bootstrap_addr": harness.url(boot)})
        elif mode == "vllm-nixl":
            argv += ["--pd-protocol", mode, "--prefill", harness.url(p.port)]
        else:
            argv += ["--prefill", harness.url(p.port), str(boot)]
    for i in range(2):
        w = c.worker("decode" if mode != "regular" else "regular", *worker_args(mode))
        ws.append(w)
        if cfg:
            cfg.append({"url": harness.url(w.port), "worker_type": "decode"})
        else:
            argv += ["--decode" if mode != "regular" else "--worker", harness.url(w.port)]
    if cfg:
        path = os.path.join(c.logdir, "baton.json")
        with open(path, "w") as f:
            json.dump({"pd_protocol": mode, "workers": cfg}, f)
        argv += ["--config", path]
    r = c.router(*argv, *mref.ROUTER_ARGS, *router_args)
    harness.wait_until(lambda: harness.get(r.port, "/readiness").status == 200, what="ready")
    return r, ws


def all_up(r, n):
    """Waits until the router's health checks see n workers up (a restarted one is back)."""
    def up():
        text = harness.get(r.port, "/metrics").text
        return len(mref.re.findall(r"^baton_worker_health\{[^}]*\} 1$", text, mref.re.M)) >= n
    harness.wait_until(up, what=f"{n} workers up")


def kill_serving(ws):
    """kill -9 the worker that serves the stream now; returns it."""
    for w in ws:
        if w.alive() and inflight(w) > 0:
            w.kill()
            return w
    raise AssertionError("no worker serves the stream")


def test_router_migration(mode, ref_port):
    """Each stream's worker is killed -9 after its 4th event: the client's stream goes on on the
    other worker, event for event the uninterrupted twin's, with one id."""
    with Cluster(f"migrate-{mode}") as c:
        r, ws = routed_cluster(c, mode)
        cases = ROUTED[:-1] if mode.startswith("vllm") else ROUTED
        for api, body in cases:
            body = dict(body, stream=True)
            _, twin = mref.stream(ref_port, mref.PATHS[api], body)
            killed = []

            def on_event(k, ev):
                if k == 4:
                    killed.append(kill_serving(ws))

            st, got = mref.stream(r.port, mref.PATHS[api], body, on_event)
            assert st == 200 and killed, (st, got)
            why = mref.check_stream(api, body, got, twin)
            assert not why, (mode, api, why)
            # the dead one back on its port for the next case
            k = ws.index(killed[0])
            ws[k] = c.worker("decode" if mode != "regular" else "regular", *worker_args(mode),
                             "--port", str(killed[0].port))
            all_up(r, len(ws) + (mode != "regular"))
        m = harness.get(r.port, "/metrics").text
        assert mref.migrations(m, "started") >= len(cases), m
        assert mref.migrations(m, "completed") >= len(cases), m
        assert mref.migrations(m, "failed") == 0, m


def test_prefill_dead_in_migration(ref_port):
    """A migration's pair whose prefill is down: the decode would wait for a KV that never
    comes; the pair is given up at once and the stream goes on with another one."""
    from router_upstream import closed_port
    with Cluster("migrate-prefill") as c:
        p = c.worker("prefill", *SLOW)
        ds = [c.worker("decode", *SLOW, "--bootstrap-timeout-ms", "60000") for _ in range(2)]
        argv = ["--prefill", harness.url(p.port), str(p.wait_port("bootstrap")),
                "--prefill", harness.url(closed_port()), str(closed_port())]
        for d in ds:
            argv += ["--decode", harness.url(d.port)]
        # no health checks nor breakers: the dead prefill stays a candidate for every pick;
        # a decode waiting for its KV would wait a minute
        r = c.router(*argv, *mref.ROUTER_ARGS, "--check-interval-ms", "0", "--breaker-threshold",
                     "0", "--first-byte-timeout-ms", "60000", "--max-retries", "5")
        api, body = ROUTED[0]
        body = dict(body, stream=True)
        _, twin = mref.stream(ref_port, mref.PATHS[api], body)
        hit = 0
        for _ in range(8):
            killed = []
            st, got = mref.stream(r.port, mref.PATHS[api], body,
                                  lambda k, ev: k == 4 and killed.append(kill_serving(ds)),
                                  timeout=20)
            why = mref.check_stream(api, body, got, twin)
            assert st == 200 and not why, why
            k = ds.index(killed[0])
            ds[k] = c.worker("decode", *SLOW, "--bootstrap-timeout-ms", "60000", "--port",
                             str(killed[0].port))
            hit = len([ln for ln in r.tail(400).splitlines()
                       if "upstream_failed" in ln and "side=prefill" in ln and "streaming=1" in ln])
            if hit:
                break
        assert hit, "no migration met the dead prefill"


CONT = (("X-Baton-Continuation", "1"),)


def chunk_ev(wid, created, delta=None, finish=None):
    d = {} if delta is None else {"content": delta}
    return {"id": wid, "object": "chat.completion.chunk", "created": created, "model": "m",
            "choices": [{"index": 0, "delta": d, "finish_reason": finish}]}


def scripted(first, second):
    """A worker script: a body without baton_continuation gets first(io, body), one with it
    second(io, body)."""
    def script(req, io):
        body = req.json()
        (second if "baton_continuation" in body else first)(io, body)
    return script


def test_continuation_wire():
    """Against scripted workers: the continuation the router sends (the client's body plus what
    the client has), the first stream's id and created on the continued events, a stream that
    lost only its [DONE] ended by the router, and a worker that does not take continuations
    never reaching the client."""
    from router_upstream import Upstream
    body = {"model": "m", "messages": MSGS, "max_tokens": 5, "stream": True,
            "stream_options": {"include_usage": True}}
    seen = []

    def first(io, b):
        io.start_sse(headers=CONT)
        io.event(chunk_ev("chatcmpl-A", 100, ""))
        io.event(chunk_ev("chatcmpl-A", 100, "hello"))
        io.die()

    def second(io, b):
        seen.append(b)
        io.start_sse(headers=CONT)
        io.event(chunk_ev("chatcmpl-B", 200, " world", "length"))
        io.event("[DONE]")
        io.end_sse()

    with Upstream("a", scripted(first, second)) as a, Upstream("b", scripted(first, second)) as b, \
            Cluster("migrate-wire") as c:
        r = c.router("--worker", a.url, "--worker", b.url, *mref.ROUTER_ARGS)
        harness.wait_until(lambda: harness.get(r.port, "/readiness").status == 200, what="ready")
        st, got = mref.stream(r.port, "/v1/chat/completions", body)
        assert st == 200, got
        evs = [json.loads(e) for e in got[:-1]]
        assert got[-1] == "[DONE]" and all("error" not in e for e in evs), got
        assert {(e["id"], e["created"]) for e in evs} == {("chatcmpl-A", 100)}, got
        assert "".join(e["choices"][0]["delta"].get("content", "") for e in evs) == "hello world"
        want = dict(body, baton_continuation={"choices": [{"text": "hello", "finished": False}]})
        assert seen == [want], seen

    # everything but [DONE] went out: the router ends the stream itself
    def all_but_done(io, b):
        io.start_sse(headers=CONT)
        io.event(chunk_ev("chatcmpl-A", 100, "hi", "stop"))
        io.event({"id": "chatcmpl-A", "object": "chat.completion.chunk", "created": 100,
                  "model": "m", "choices": [], "usage": {"prompt_tokens": 3,
                                                         "completion_tokens": 1}})
        io.die()

    with Upstream("a", scripted(all_but_done, second)) as a, Cluster("migrate-done") as c:
        r = c.router("--worker", a.url, *mref.ROUTER_ARGS)
        harness.wait_until(lambda: harness.get(r.port, "/readiness").status == 200, what="ready")
        st, got = mref.stream(r.port, "/v1/chat/completions", body)
        assert st == 200 and got[-1] == "[DONE]" and len(got) == 3, got
        assert mref.migrations(harness.get(r.port, "/metrics").text, "finished") == 1

    # a worker without the header would start over: nothing of it reaches the client
    def starts_over(io, b):
        io.start_sse()
        io.event(chunk_ev("chatcmpl-C", 300, "hello again"))
        io.event("[DONE]")
        io.end_sse()

    with Upstream("a", scripted(first, starts_over)) as a, \
            Upstream("b", scripted(first, starts_over)) as b, Cluster("migrate-refused") as c:
        r = c.router("--worker", a.url, "--worker", b.url, *mref.ROUTER_ARGS)
        harness.wait_until(lambda: harness.get(r.port, "/readiness").status == 200, what="ready")
        st, got = mref.stream(r.port, "/v1/chat/completions", body)
        assert st == 200 and got[-1] == "[DONE]" and "error" in json.loads(got[-2]), got
        assert "hello again" not in "".join(got), got


def test_migration_off(ref_port):
    """--migration-limit 0: a dead worker ends the stream with the error event, as without
    migration; the text before it is the twin's beginning."""
    with Cluster("migrate-off") as c:
        r, ws = routed_cluster(c, "regular", "--migration-limit", "0")
        api, body = ROUTED[0]
        body = dict(body, stream=True)
        st, got = mref.stream(r.port, mref.PATHS[api], body,
                              lambda k, ev: k == 4 and kill_serving(ws))
        assert st == 200 and got[-1] == "[DONE]", got
        assert "error" in json.loads(got[-2]), got[-2:]
        m = harness.get(r.port, "/metrics").text
        assert mref.migrations(m, "started") == 0, m


def test_migration_limit(ref_port):
    """--migration-limit 1: the first dead worker is survived, the second ends the stream with
    the error event; the text before it is still the twin's."""
    with Cluster("migrate-limit") as c:
        r, ws = routed_cluster(c, "regular", "--migration-limit", "1")
        api, body = ROUTED[0]
        body = dict(body, stream=True)
        _, twin = mref.stream(ref_port, mref.PATHS[api], body)
        st, got = mref.stream(r.port, mref.PATHS[api], body,
                              lambda k, ev: k in (4, 10) and kill_serving(ws))
        assert st == 200 and got[-1] == "[DONE]" and "error" in json.loads(got[-2]), got[-3:]
        assert [mref.masked(e) for e in got[:-2]] == [mref.masked(e) for e in twin[:len(got) - 2]]
        assert len(got) - 2 >= 10, got  # the first migration carried it past the 4th event
        m = harness.get(r.port, "/metrics").text
        assert mref.migrations(m, "started") == 1 and mref.migrations(m, "limit") == 1, m
        assert mref.migrations(m, "failed") == 1, m  # a migrated stream that ended in error


def test_chaos_smoke(mode):
    """kill -9 at random points of many streams (chat, completions, generate; n = 1 and n > 1):
    every stream completes and equals its uninterrupted twin."""
    with Cluster(f"migrate-chaos-{mode}") as c:
        failures, m = mref.chaos_run(c, mode, n_streams=30, concurrency=6, seed=7,
                                     worker_args=("--prefill-us-per-token", "100",
                                                  "--decode-us-per-token", "4000"))
        assert not failures, failures[:3]
        assert mref.migrations(m, "started") > 0, m


def main():
    t = harness.TestRunner()
    with Cluster("migration") as c:
        w = c.worker("regular", *FAST)
        t.run(test_worker_continuation, w.port)
        t.run(test_worker_continuation_refused, w.port)
        for mode in ("regular", "pd", "vllm-nixl", "vllm-mooncake"):
            t.run(test_router_migration, mode, w.port)
        t.run(test_prefill_dead_in_migration, w.port)
        t.run(test_continuation_wire)
        t.run(test_migration_off, w.port)
        t.run(test_migration_limit, w.port)
        for mode in ("regular", "pd", "vllm-nixl"):
            t.run(test_chaos_smoke, mode)
    t.finish()


if __name__ == "__main__":
    main()
