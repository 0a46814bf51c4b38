"""test_router_admin.py — the worker registration API over HTTP (PROTOCOLS.md §1): POST /workers,
409 on a duplicate, GET /workers and /workers/{id}, DELETE, the legacy endpoints, and workers
added at run time taking traffic (through real baton-worker processes, exact text)."""

import os
import sys
import urllib.parse

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import simtext  # noqa: E402
from harness import Cluster, TestRunner, get, post, request, url  # noqa: E402
from router_upstream import Upstream  # noqa: E402


def test_workers_api():
    with Upstream("a") as a, Upstream("b") as b, Cluster("admin-api") as c:
        r = c.router("--threads", "1")
        port = r.port
        res = get(port, "/workers")
        assert res.status == 200, res.text
        j = res.json()
        assert j["workers"] == [] and j["total"] == 0, j
        assert j["stats"] == {"prefill_count": 0, "decode_count": 0, "regular_count": 0}, j

        res = post(port, "/workers", {"url": a.url, "worker_type": "prefill",
                                      "bootstrap_port": 8999, "model_id": "m1"})
        assert res.status == 202, res.text
        wid = res.json()["id"]
        assert res.headers.get("location") == f"/workers/{wid}", res.headers
        # duplicate URL
        res = post(port, "/workers", {"url": a.url, "worker_type": "decode"})
        assert res.status == 409, res.text
        assert res.json()["error"]["code"] == "WORKER_ALREADY_EXISTS", res.text
        # bad input
        for bad in ({"worker_type": "decode"}, {"url": "ftp://x", "worker_type": "decode"},
                    {"url": b.url, "worker_type": "sideways"},
                    {"url": b.url, "worker_type": "decode", "bootstrap_port": 9000},
                    {"url": b.url, "worker_type": "prefill", "bootstrap_port": 70000},
                    # api_key becomes a header on every request: control bytes are refused
                    {"url": b.url, "worker_type": "decode", "api_key": "k\r\nX-Evil: 1"},
                    {"url": b.url, "worker_type": "decode", "api_key": "k\tk"},
                    {"url": b.url, "worker_type": "decode", "api_key": "k\u0000"},
                    # KV-event endpoints are ZMQ URLs the router connects to
                    {"url": b.url, "worker_type": "decode", "kv_events_endpoint": "http://h:1"},
                    {"url": b.url, "worker_type": "decode", "kv_events_endpoint": "tcp://h"},
                    {"url": b.url, "worker_type": "decode", "kv_events_endpoint": "tcp://h:0"},
                    {"url": b.url, "worker_type": "decode", "kv_events_endpoint": "tcp://h:1 x"},
                    {"url": b.url, "worker_type": "decode", "kv_events_replay_endpoint": 5}):
            res = post(port, "/workers", bad)
            assert res.status == 400, (bad, res.status, res.text)
            assert res.json()["error"]["code"] == "BAD_REQUEST", res.text
        res = request(port, "POST", "/workers", body=b"{not json",
                      headers={"Content-Type": "application/json"})
        assert res.status == 400
        res = post(port, "/workers", {"url": b.url, "worker_type": "decode", "api_key": "k",
                                      "kv_events_endpoint": "tcp://127.0.0.1:5557",
                                      "kv_events_replay_endpoint": "ipc:///run/kv-replay"})
        assert res.status == 202, res.text
        bid = res.json()["id"]
        w = get(port, f"/workers/{bid}").json()
        assert w["kv_events_endpoint"] == "tcp://127.0.0.1:5557" and \
            w["kv_events_replay_endpoint"] == "ipc:///run/kv-replay", w

        res = get(port, "/workers")
        j = res.json()
        assert j["total"] == 2 and j["stats"]["prefill_count"] == 1 and \
            j["stats"]["decode_count"] == 1, j
        res = get(port, f"/workers/{wid}")
        assert res.status == 200, res.text
        w = res.json()
        assert w["url"] == a.url and w["worker_type"] == "prefill" and \
            w["bootstrap_port"] == 8999 and w["model_id"] == "m1", w
        assert w["kv_events_endpoint"] is None and w["kv_events_replay_endpoint"] is None, w
        assert "api_key" not in get(port, f"/workers/{bid}").text
        assert get(port, "/workers/w-00000000").status == 404
        # the registered pair serves (recording upstreams answer with default JSON)
        assert get(port, "/readiness").status == 200
        res = post(port, "/generate", {"text": "x"})
        assert res.status == 200, res.text
        assert a.wait_requests(1)[-1].json()["bootstrap_port"] == 8999
        assert b.requests[-1].headers.get("authorization") == "Bearer k"
        # the model list: the router's own, from the registered model ids
        n = len(b.requests)
        res = get(port, "/v1/models")
        assert res.status == 200 and [m["id"] for m in res.json()["data"]] == ["m1"], res.text
        assert len(b.requests) == n

        res = request(port, "DELETE", f"/workers/{bid}")
        assert res.status == 202, res.text
        assert get(port, f"/workers/{bid}").status == 404
        assert request(port, "DELETE", f"/workers/{bid}").status == 404
        assert get(port, "/readiness").status == 503
        assert get(port, "/workers").json()["total"] == 1
        # wrong method on an admin path
        assert request(port, "PATCH", "/workers").status == 405


def test_legacy_endpoints():
    with Upstream("a") as a, Cluster("admin-legacy") as c:
        r = c.router("--threads", "1")
        port = r.port
        q = urllib.parse.urlencode({"url": a.url})
        res = post(port, f"/add_worker?{q}", None)
        assert res.status == 200, res.text
        assert post(port, f"/add_worker?{q}", None).status == 409
        res = get(port, "/list_workers")
        assert res.status == 200 and res.json()["urls"] == [a.url], res.text
        # a regular worker added the legacy way gets traffic
        assert post(port, "/v1/completions", {"prompt": "x"}).status == 200
        assert len(a.requests) == 1 and "bootstrap_room" not in a.requests[0].json()
        res = post(port, f"/remove_worker?{q}", None)
        assert res.status == 200, res.text
        assert get(port, "/list_workers").json()["urls"] == []
        assert post(port, f"/remove_worker?{q}", None).status == 404
        assert post(port, "/v1/completions", {"prompt": "x"}).status == 503


def test_runtime_workers_take_traffic():
    """A router started empty; baton-worker prefill and decode registered through the API serve
    the exact answer; a second decode added later takes its share."""
    with Cluster("admin-runtime") as c:
        p = c.worker("prefill")
        d1 = c.worker("decode")
        d2 = c.worker("decode")
        r = c.router("--threads", "2")
        port = r.port
        assert post(port, "/workers", {"url": url(p.port), "worker_type": "prefill",
                                       "bootstrap_port": p.wait_port("bootstrap")}).status == 202
        assert post(port, "/workers", {"url": url(d1.port), "worker_type": "decode"}).status == 202
        want = simtext.complete_text("runtime worker", 5).text
        body = {"prompt": "runtime worker", "max_tokens": 5}
        res = post(port, "/v1/completions", body)
        assert res.status == 200 and res.json()["choices"][0]["text"] == want, res.text
        assert post(port, "/workers", {"url": url(d2.port), "worker_type": "decode"}).status == 202
        for _ in range(6):
            res = post(port, "/v1/completions", body)
            assert res.status == 200 and res.json()["choices"][0]["text"] == want, res.text

        # round robin over two decodes: the one added later answered its share of the six
        assert completions_served(d2) >= 2, get(d2.port, "/metrics").text
        assert completions_served(d1) >= 3
        res = get(port, "/workers")
        assert res.json()["stats"]["decode_count"] == 2


def openai_error(res, status, code=None):
    """The one error shape of every route: {"error":{"message","type","param","code"}}."""
    assert res.status == status, (res.status, res.text)
    j = res.json()
    assert list(j) == ["error"], j
    e = j["error"]
    assert set(e) == {"message", "type", "param", "code"}, e
    assert isinstance(e["message"], str) and e["message"], e
    assert e["param"] is None or isinstance(e["param"], str), e
    assert e["type"] == ("server_error" if status >= 500 else "invalid_request_error"), e
    if code is not None:
        assert e["code"] == code, e


def test_every_admin_error_has_one_shape():
    with Upstream("a") as a, Cluster("admin-errors") as c:
        r = c.router("--threads", "1")
        port = r.port
        assert post(port, "/workers", {"url": a.url}).status == 202
        openai_error(post(port, "/workers", {"url": a.url}), 409, "WORKER_ALREADY_EXISTS")
        openai_error(post(port, "/workers", {"worker_type": "decode"}), 400, "BAD_REQUEST")
        openai_error(request(port, "POST", "/workers", body=b"{not json",
                             headers={"Content-Type": "application/json"}), 400)
        openai_error(get(port, "/workers/w-00000000"), 404, "WORKER_NOT_FOUND")
        openai_error(request(port, "DELETE", "/workers/w-00000000"), 404, "WORKER_NOT_FOUND")
        openai_error(request(port, "PUT", "/workers"), 405)
        openai_error(request(port, "POST", "/remove_worker?url=http://127.0.0.1:9"), 404)
        openai_error(request(port, "POST", "/add_worker"), 400)
        # inference and service routes answer in the same shape
        openai_error(get(port, "/no/such/path"), 404)
        openai_error(post(port, "/v1/chat/completions", {"messages": 3}), 400)
    with Cluster("admin-errors-token") as c:
        r = c.router("--threads", "1", "--admin-token", "s3cret")
        openai_error(get(r.port, "/workers"), 401, "UNAUTHORIZED")


def completions_served(w):
    """Sum of the worker's baton_worker_requests_total samples for /v1/completions."""
    total = 0.0
    for ln in get(w.port, "/metrics").text.split("\n"):
        if ln.startswith("baton_worker_requests_total{") and "completions" in ln:
            total += float(ln.rsplit(" ", 1)[1])
    return total


def main():
    t = TestRunner()
    t.run(test_workers_api)
    t.run(test_legacy_endpoints)
    t.run(test_every_admin_error_has_one_shape)
    t.run(test_runtime_workers_take_traffic)
    t.finish()


if __name__ == "__main__":
    main()
