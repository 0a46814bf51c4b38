"""test_cache_routing.py — cache-aware routing end to end: real baton-workers with their prefix caches
behind a router with cache_aware / consistent_hash / least_load, in regular and PD mode.
Scripted sessions assert where each turn went through what the workers report: a follow-up
turn on the worker that served the earlier one reports exactly the earlier prompt's whole pages
as cached_tokens (workers' caches are separate, so any other worker reports 0)."""

import json
import os
import re
import sys
import threading

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from harness import Cluster, TestRunner, get, post, url, wait_until  # noqa: E402

PAGE = 4
FAST = ("--prefill-us-per-token", "1", "--decode-us-per-token", "100", "--page-tokens", str(PAGE))


def session_text(s, words):
    """A prompt of `words` words unique to session s."""
    return " ".join(f"s{s}w{i}" for i in range(words))


def complete(port, text, headers=None, user=None, stream=False):
    body = {"model": "m", "prompt": text, "max_tokens": 2}
    if user:
        body["user"] = user
    r = post(port, "/v1/completions", body, headers=headers or {})
    assert r.status == 200, r.text
    return r.json()["usage"]


def metric(port, name):
    text = get(port, "/metrics").text
    total = 0.0
    for line in text.splitlines():
        m = re.match(r"^" + re.escape(name) + r"(\{[^}]*\})?\s+(\S+)$", line)
        if m:
            total += float(m.group(2))
    return total


def router_metric(port, name, labels):
    for line in get(port, "/metrics").text.splitlines():
        if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name}{labels} not found")


def two_turns(port, s, n1=30, **kw):
    """Turn 1 (n1 words), then turn 2 = turn 1 + 10 words; returns both usages."""
    t1 = session_text(s, n1)
    u1 = complete(port, t1, **kw)
    u2 = complete(port, t1 + " " + session_text(s + 1000, 10), **kw)
    return u1, u2


def test_regular_cache_aware():
    with Cluster("cache-regular") as c:
        ws = [c.worker("regular", *FAST) for _ in range(3)]
        r = c.router(*sum((["--worker", url(w.port)] for w in ws), []), "--policy", "cache_aware",
                     "--cache-block-words", str(PAGE))
        rp = r.port
        for s in range(6):
            u1, u2 = two_turns(rp, s)
            assert u1["prompt_tokens_details"]["cached_tokens"] == 0, u1
            # the follow-up found turn 1's 30 words: 7 whole pages of 4 on the same worker
            assert u2["prompt_tokens"] == 40
            assert u2["prompt_tokens_details"]["cached_tokens"] == 28, (s, u2)
        # worker-side counters agree: 6 × 28 hit tokens in all
        assert sum(metric(w.port, "baton_worker_cache_hit_tokens_total") for w in ws) == 6 * 28
        # the first turns were spread by load (no tree matched), the second by cache
        assert router_metric(rp, "baton_routing_choices_total",
                             {"role": "regular", "by": "cache"}) == 6
        assert router_metric(rp, "baton_routing_choices_total",
                             {"role": "regular", "by": "load"}) == 6
        assert router_metric(rp, "baton_routing_predicted_hit_tokens_total",
                             {"role": "regular"}) == 6 * 28
        # /workers shows the trees
        lst = get(rp, "/workers").json()["workers"]
        assert all("cache" in w for w in lst), lst
        assert sum(w["cache"]["tree_blocks"] for w in lst) > 0
        assert any(w["cache"]["hit_ratio"] > 0 for w in lst)

        # X-Baton-Target-Worker pins a request to a worker, whatever its tree says
        target = lst[0]
        port_of = {url(w.port): w for w in ws}
        tw = port_of[target["url"]]
        before = metric(tw.port, "baton_worker_prompt_tokens_total")
        for s in range(3):
            complete(rp, session_text(100 + s, 12), headers={"X-Baton-Target-Worker": target["id"]})
        assert metric(tw.port, "baton_worker_prompt_tokens_total") == before + 36
        assert router_metric(rp, "baton_routing_choices_total",
                             {"role": "regular", "by": "pin"}) == 3


def test_regular_consistent_hash_and_least_load():
    with Cluster("cache-hash") as c:
        ws = [c.worker("regular", *FAST) for _ in range(3)]
        args = sum((["--worker", url(w.port)] for w in ws), [])
        r = c.router(*args, "--policy", "consistent_hash")
        rp = r.port
        # the session key from the `user` field, then from the header: each session's turns
        # meet their cache
        for s in range(5):
            _, u2 = two_turns(rp, 200 + s, user=f"user-{s}")
            assert u2["prompt_tokens_details"]["cached_tokens"] == 28, (s, u2)
        for s in range(5):
            _, u2 = two_turns(rp, 300 + s, headers={"X-Session-ID": f"sess-{s}"})
            assert u2["prompt_tokens_details"]["cached_tokens"] == 28, (s, u2)
        assert router_metric(rp, "baton_routing_choices_total",
                             {"role": "regular", "by": "session"}) == 20
        # a second router replica maps the same sessions to the same workers (stateless ring):
        # turn 3 through it still hits the cache of turns 1-2
        r2 = c.router(*args, "--policy", "consistent_hash", name="router2")
        for s in range(5):
            t = session_text(200 + s, 30) + " " + session_text(200 + s + 1000, 10) + " more"
            u = complete(r2.port, t, user=f"user-{s}")
            assert u["prompt_tokens_details"]["cached_tokens"] == 40, (s, u)

        # the `user` key is read decoded (the one-pass body scanner): turns 1-2 send it \u-escaped
        # (json.dumps), turn 3 as raw UTF-8, and turn 3 still meets their cache
        for s in range(5):
            two_turns(rp, 500 + s, user=f"us\u00e9r-{s}")
            t = session_text(500 + s, 30) + " " + session_text(500 + s + 1000, 10) + " more"
            raw = json.dumps({"model": "m", "prompt": t, "max_tokens": 2, "user": f"us\u00e9r-{s}"},
                             ensure_ascii=False).encode()
            assert b"\\u" not in raw and "\u00e9".encode() in raw
            r = post(rp, "/v1/completions", raw, headers={"Content-Type": "application/json"})
            assert r.status == 200, r.text
            assert r.json()["usage"]["prompt_tokens_details"]["cached_tokens"] == 40, (s, r.text)

        # least_load spreads sequential requests' first turns by the router's own counts and
        # picks every worker (ties at random) — only load decides
        r3 = c.router(*args, "--policy", "least_load", name="router3")
        for s in range(12):
            complete(r3.port, session_text(400 + s, 8))
        assert router_metric(r3.port, "baton_routing_choices_total",
                             {"role": "regular", "by": "load"}) == 12


def test_pd_cache_aware():
    with Cluster("cache-pd") as c:
        ps = [c.worker("prefill", *FAST) for _ in range(2)]
        ds = [c.worker("decode", *FAST) for _ in range(2)]
        args = []
        for p in ps:
            args += ["--prefill", url(p.port), str(p.wait_port("bootstrap"))]
        for d in ds:
            args += ["--decode", url(d.port)]
        r = c.router(*args, "--prefill-policy", "cache_aware", "--decode-policy", "cache_aware",
                     "--cache-block-words", str(PAGE))
        rp = r.port
        for s in range(4):
            u1, u2 = two_turns(rp, 500 + s)
            # the answer is the decode's: it kept turn 1's KV after it finished
            assert u1["prompt_tokens_details"]["cached_tokens"] == 0, u1
            assert u2["prompt_tokens_details"]["cached_tokens"] == 28, (s, u2)
        # the prefill side computed only what it had not cached: 4 × 28 hit tokens
        assert sum(metric(p.port, "baton_worker_cache_hit_tokens_total") for p in ps) == 4 * 28
        assert sum(metric(p.port, "baton_worker_cache_miss_tokens_total") for p in ps) == \
            4 * (30 + 40 - 28)
        for role in ("prefill", "decode"):
            assert router_metric(rp, "baton_routing_choices_total",
                                 {"role": role, "by": "cache"}) == 4


def test_pd_turn2_moves_only_uncached_pages():
    """One prefill, one decode: turn 2 of a session lands on the decode that kept turn 1's KV,
    which offers only the pages its cache lacks. The decode's metrics show the skipped pages
    and exactly the uncached tokens' bytes received, and the answer is the same text a regular
    worker (no hand-off at all) gives for that prompt."""
    with Cluster("cache-pd-skip") as c:
        p = c.worker("prefill", *FAST)
        d = c.worker("decode", *FAST)
        ref = c.worker("regular", *FAST, "--cache-tokens", "0")
        r = c.router("--prefill", url(p.port), str(p.wait_port("bootstrap")),
                     "--decode", url(d.port))
        layers = get(d.port, "/get_server_info").json()["kv"]["layers"]
        recv = 'baton_kv_bytes_total{direction="received"}'

        def turn(text):
            before = metric(d.port, recv)
            body = {"model": "m", "prompt": text, "max_tokens": 4}
            res = post(r.port, "/v1/completions", body)
            assert res.status == 200, res.text
            return res.json(), metric(d.port, recv) - before

        t1 = session_text(77, 30)
        t2 = t1 + " " + session_text(1077, 10)
        a1, b1 = turn(t1)
        a2, b2 = turn(t2)
        n1 = a1["usage"]["prompt_tokens"]
        n2 = a2["usage"]["prompt_tokens"]
        cached = a2["usage"]["prompt_tokens_details"]["cached_tokens"]
        assert cached == 28 and n2 > cached, a2["usage"]
        # turn 1 moved every token's KV, turn 2 only the tokens after the cached pages
        assert b1 > 0 and b2 > 0 and b2 < b1, (b1, b2)
        assert b1 * (n2 - cached) == b2 * n1, (b1, b2, n1, n2, cached)
        skipped = (cached // PAGE) * layers
        assert metric(d.port, "baton_kv_pages_skipped_total") == skipped
        assert metric(p.port, "baton_kv_pages_skipped_total") == skipped
        assert metric(d.port, "baton_kv_corrupted_total") == 0
        # the answer is exact: the same text as a worker that computed everything itself
        want = post(ref.port, "/v1/completions", {"model": "m", "prompt": t2, "max_tokens": 4})
        assert want.status == 200, want.text
        assert a2["choices"][0]["text"] == want.json()["choices"][0]["text"], (a2, want.json())


def test_least_load_reported_load():
    """least_load with --load-poll-interval-ms: a worker kept busy by another client (requests
    this router never saw, so its own in-flight counts are equal) reports its load through
    /get_load, and every request through the router goes to the idle worker. Without the
    poller the router sees two idle workers and spreads the same requests over both."""
    def run(poll):
        with Cluster("least-load-poll") as c:
            busy = c.worker("regular", "--decode-us-per-token", "20000", "--page-tokens", "4")
            idle = c.worker("regular", *FAST)
            extra = ["--load-poll-interval-ms", "50"] if poll else []
            r = c.router("--worker", url(busy.port), "--worker", url(idle.port),
                         "--policy", "least_load", *extra)
            hogs = []
            for i in range(3):  # about 20 s each at 20 ms a token; they die with the cluster
                t = threading.Thread(target=lambda i=i: post(
                    busy.port, "/v1/completions",
                    {"model": "m", "prompt": f"hog {i}", "max_tokens": 1000}, timeout=60.0),
                    daemon=True)
                t.start()
                hogs.append(t)
            wait_until(lambda: get(busy.port, "/get_load").json()[0]["num_reqs"] >= 3,
                       what="the busy worker has 3 requests")

            def seen():  # what the router's /workers shows for the busy worker
                for w in get(r.port, "/workers").json()["workers"]:
                    if w["url"] == url(busy.port):
                        return w["cache"]
                raise AssertionError("busy worker not listed")
            if poll:
                wait_until(lambda: seen()["reported_load"] == 3, what="the report reached us")
                assert seen()["load"] == 3
            else:
                assert seen()["reported_load"] is None and seen()["load"] == 0
            before = metric(busy.port, "baton_worker_prompt_tokens_total")
            for i in range(20):
                complete(r.port, session_text(3000 + i, 6))
            return metric(busy.port, "baton_worker_prompt_tokens_total") - before

    assert run(True) == 0  # nothing of ours went to the busy worker
    assert run(False) > 0  # least_load on in-flight counts alone cannot see its load


def test_cache_off():
    with Cluster("cache-off") as c:
        w = c.worker("regular", *FAST, "--cache-tokens", "0")
        r = c.router("--worker", url(w.port), "--policy", "cache_aware")
        _, u2 = two_turns(r.port, 900)
        assert u2["prompt_tokens_details"]["cached_tokens"] == 0
        assert metric(w.port, "baton_worker_cache_hit_tokens_total") == 0


def test_pin_needs_admin_token():
    """With an admin token configured, X-Baton-Target-Worker is an admin's tool: a pin without
    X-Baton-Admin-Token (or with a wrong one) is ignored and the policy decides; with the token
    the request goes to the pinned worker."""
    with Cluster("cache-pin-auth") as c:
        ws = [c.worker("regular", *FAST) for _ in range(2)]
        r = c.router("--worker", url(ws[0].port), "--worker", url(ws[1].port), "--policy",
                     "round_robin", "--admin-token", "sekret")
        rp = r.port
        lst = get(rp, "/workers", headers={"Authorization": "Bearer sekret"}).json()["workers"]
        target = next(w for w in lst if w["url"] == url(ws[0].port))
        pin = {"X-Baton-Target-Worker": target["id"]}
        before = [metric(w.port, "baton_worker_prompt_tokens_total") for w in ws]
        for s in range(4):  # round robin: two to each worker, the pin ignored
            complete(rp, session_text(500 + s, 12), headers=dict(pin))
            complete(rp, session_text(510 + s, 12),
                     headers=dict(pin, **{"X-Baton-Admin-Token": "wrong"}))
        mid = [metric(w.port, "baton_worker_prompt_tokens_total") for w in ws]
        assert mid[0] - before[0] == 4 * 12 and mid[1] - before[1] == 4 * 12, (before, mid)
        for s in range(4):  # with the token: all four to the pinned worker
            complete(rp, session_text(520 + s, 12),
                     headers=dict(pin, **{"X-Baton-Admin-Token": "sekret"}))
        after = [metric(w.port, "baton_worker_prompt_tokens_total") for w in ws]
        assert after[0] - mid[0] == 4 * 12 and after[1] == mid[1], (mid, after)
        assert router_metric(rp, "baton_routing_choices_total",
                             {"role": "regular", "by": "pin"}) == 4
        r.wait_log(r"pin_refused")


def main():
    t = TestRunner()
    t.run(test_regular_cache_aware)
    t.run(test_regular_consistent_hash_and_least_load)
    t.run(test_pd_cache_aware)
    t.run(test_pd_turn2_moves_only_uncached_pages)
    t.run(test_least_load_reported_load)
    t.run(test_cache_off)
    t.run(test_pin_needs_admin_token)
    t.finish()


if __name__ == "__main__":
    main()
