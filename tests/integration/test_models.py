"""test_models.py — many models behind one router: a worker's models from its registration
(model_id) or its own /v1/models (read on health checks, LoRA adapters included), requests routed
within the requested model's pool (PD pairs included), 404 model_not_found without a worker being
called, /v1/models and /v1/models/{id} answered from the union, and the single-model rule."""

import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from harness import Cluster, TestRunner, get, post, url, wait_until  # noqa: E402
from router_upstream import Upstream  # noqa: E402

CHECKS = ("--check-interval-ms", "100", "--check-fast-interval-ms", "50")


def chat(model):
    return {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}


def answer(req, io):
    if req.method == "GET":  # the model list forwarded before any worker is named
        io.respond(200, {"object": "list", "data": []})
        return
    io.respond(200, {"id": "x", "object": "chat.completion", "model": req.json().get("model"),
                     "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"},
                                  "finish_reason": "stop"}]})


def inference(up):
    return [r for r in up.requests if r.method == "POST"]


def model_ids(port):
    res = get(port, "/v1/models")
    assert res.status == 200, res.text
    return sorted(m["id"] for m in res.json()["data"])


def test_discovered_models_route_by_name():
    with Upstream("a", answer, models=["alpha", "alpha-lora"]) as a, \
            Upstream("b", answer, models=["beta"]) as b, Cluster("models-found") as c:
        r = c.router("--worker", a.url, "--worker", b.url, *CHECKS)
        wait_until(lambda: model_ids(r.port) == ["alpha", "alpha-lora", "beta"],
                   what="the union of the workers' lists")
        for m, up in (("alpha-lora", a), ("alpha", a), ("beta", b)):
            before_a, before_b = len(inference(a)), len(inference(b))
            for _ in range(4):
                res = post(r.port, "/v1/chat/completions", chat(m))
                assert res.status == 200, res.text
            got_a, got_b = len(inference(a)) - before_a, len(inference(b)) - before_b
            assert (got_a, got_b) == ((4, 0) if up is a else (0, 4)), (m, got_a, got_b)
        # Unknown: 404 in the OpenAI shape, and no worker called.
        n = len(inference(a)) + len(inference(b))
        res = post(r.port, "/v1/chat/completions", chat("gamma"))
        assert res.status == 404, res.text
        err = res.json()["error"]
        assert err["code"] == "model_not_found" and err["param"] == "model", err
        assert err["type"] == "invalid_request_error" and "gamma" in err["message"], err
        assert len(inference(a)) + len(inference(b)) == n
        # One model by id, from the union; unknown: 404.
        res = get(r.port, "/v1/models/alpha-lora")
        assert res.status == 200, res.text
        assert res.json()["id"] == "alpha-lora" and res.json()["object"] == "model", res.text
        assert "root" not in res.text and "/models/" not in res.text
        res = get(r.port, "/v1/models/gamma")
        assert res.status == 404 and res.json()["error"]["code"] == "model_not_found", res.text
        res = post(r.port, "/v1/models/alpha", {})
        assert res.status == 405, res.text


def test_unnamed_workers_take_unknown_models():
    # Two named models and one worker that lists none: a model nobody names goes to it.
    with Upstream("a", answer, models=["alpha"]) as a, Upstream("b", answer, models=["beta"]) as b, \
            Upstream("u", answer) as u, Cluster("models-unnamed") as c:
        r = c.router("--worker", a.url, "--worker", b.url, "--worker", u.url, *CHECKS)
        wait_until(lambda: model_ids(r.port) == ["alpha", "beta"], what="the union")
        for _ in range(3):
            res = post(r.port, "/v1/chat/completions", chat("gamma"))
            assert res.status == 200, res.text
        assert len(inference(u)) == 3 and not inference(a) and not inference(b)
        res = post(r.port, "/v1/chat/completions", chat("beta"))
        assert res.status == 200 and len(inference(b)) == 1, res.text


def test_single_model_deployment_unconfigured():
    # One model between all workers: any name reaches them, as before (the worker judges it);
    # no name at all as well.
    with Cluster("models-single") as c:
        w1 = c.worker("regular")
        w2 = c.worker("regular")
        r = c.router("--worker", url(w1.port), "--worker", url(w2.port), *CHECKS)
        wait_until(lambda: model_ids(r.port) == ["baton-sim"], what="the workers' model")
        for m in ("baton-sim", "something-else"):
            res = post(r.port, "/v1/chat/completions", chat(m))
            assert res.status == 200, res.text
        body = chat("x")
        del body["model"]
        res = post(r.port, "/v1/chat/completions", body)
        assert res.status == 200, res.text


def worker_requests(port):
    text = get(port, "/metrics").text
    return sum(float(m.group(1)) for m in
               re.finditer(r'^baton_worker_requests_total\{[^}]*\} (\S+)', text, re.M))


def test_pd_pairs_within_the_model_pool():
    # Two PD pools told apart by registration (model_id, the admin API): a request's prefill and
    # decode both serve its model.
    with Cluster("models-pd") as c:
        pools = {}
        for m in ("alpha", "beta"):
            p = c.worker("prefill", "--model-name", m)
            d = c.worker("decode", "--model-name", m)
            pools[m] = (p, d)
        r = c.router(*CHECKS)
        for m, (p, d) in pools.items():
            res = post(r.port, "/workers", {"url": url(p.port), "worker_type": "prefill",
                                             "bootstrap_port": p.wait_port("bootstrap"),
                                             "model_id": m})
            assert res.status == 202, res.text
            res = post(r.port, "/workers", {"url": url(d.port), "worker_type": "decode",
                                             "model_id": m})
            assert res.status == 202, res.text
        wait_until(lambda: get(r.port, "/readiness").status == 200, what="readiness")
        assert model_ids(r.port) == ["alpha", "beta"]
        for m in ("beta", "alpha"):
            other = "alpha" if m == "beta" else "beta"
            before = [worker_requests(w.port) for w in pools[other]]
            mine = [worker_requests(w.port) for w in pools[m]]
            for _ in range(4):
                res = post(r.port, "/v1/chat/completions", chat(m))
                assert res.status == 200, res.text
                assert res.json()["model"] == m, res.text
            assert [worker_requests(w.port) for w in pools[other]] == before
            after = [worker_requests(w.port) for w in pools[m]]
            assert all(a >= b + 4 for a, b in zip(after, mine)), (mine, after)
        res = post(r.port, "/v1/completions", {"model": "gamma", "prompt": "x", "max_tokens": 2})
        assert res.status == 404 and res.json()["error"]["code"] == "model_not_found", res.text
        # Metrics by model: registered names only, anything else is "other".
        text = get(r.port, "/metrics").text
        for line in ('baton_model_requests_total{model="alpha",status="200"} 4',
                     'baton_model_requests_total{model="beta",status="200"} 4',
                     'baton_model_requests_total{model="other",status="404"} 1'):
            assert line in text, (line, [x for x in text.splitlines() if "model_req" in x])
        assert "gamma" not in text


if __name__ == "__main__":
    t = TestRunner()
    t.run(test_discovered_models_route_by_name)
    t.run(test_unnamed_workers_take_unknown_models)
    t.run(test_single_model_deployment_unconfigured)
    t.run(test_pd_pairs_within_the_model_pool)
    t.finish()
