"""test_chaos_vllm.py — test_chaos.py's scenarios for the vLLM protocols: a real
router in front of baton-workers speaking vllm-nixl or vllm-mooncake, under continuous load,
while a decode is killed (-9) mid-stream and restarted, and a NIXL prefill is killed between
its answer and the decode's pull. The same assertions as test_chaos.py: the router never
crashes; every request completes with the exact text or gets a clean error within the bound;
errors only for requests in flight on the failed worker; service returns within two health-check
intervals. For NIXL also: no KV pages stay held on a prefill once the load is over."""

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from harness import Cluster, TestRunner, get, post, url, wait_until  # noqa: E402
from test_chaos import (DECODE_ARGS, PREFILL_ARGS, ROUTER_ARGS, Load,  # noqa: E402
                        assert_router_alive, check, restart, wait_serving, worker_requests,
                        workers)

KINDS = ("chat_stream", "comp")  # vLLM serves the OpenAI routes only


def held(w):
    for ln in get(w.port, "/metrics").text.split("\n"):
        if ln.startswith("baton_worker_kv_holds "):
            return float(ln.rsplit(" ", 1)[1])
    return 0.0


def vllm_cluster(c, proto, n_prefill=2, n_decode=2, prefill_args=PREFILL_ARGS):
    pa = list(prefill_args) + ["--protocol", proto]
    da = list(DECODE_ARGS) + ["--protocol", proto]
    ps = [c.worker("prefill", *pa, name=f"prefill{i}") for i in range(n_prefill)]
    ds = [c.worker("decode", *da, name=f"decode{i}") for i in range(n_decode)]
    r = c.router("--pd-protocol", proto, *ROUTER_ARGS)
    for i, p in enumerate(ps):
        extra = {}
        if proto == "vllm-mooncake":
            extra = {"engine_id": f"prefill{i}",
                     "bootstrap_addr": f"http://127.0.0.1:{p.wait_port('bootstrap')}"}
        res = post(r.port, "/workers", dict({"url": url(p.port), "worker_type": "prefill"},
                                            **extra))
        assert res.status == 202, res.text
    for d in ds:
        assert post(r.port, "/workers", {"url": url(d.port), "worker_type": "decode"}).status \
            == 202
    wait_until(lambda: get(r.port, "/readiness").status == 200, what="router ready")
    return ps, ds, r, da


def kill_decode_midstream(proto):
    with Cluster(f"chaos-{proto}-decode") as c:
        ps, ds, r, da = vllm_cluster(c, proto)
        with Load(r.port, kinds=KINDS) as load:
            wait_until(lambda: load.count() >= 15, timeout=60, what="warm-up")
            wait_until(lambda: get(ds[0].port, "/get_load").json()[0]["num_running_reqs"] > 0,
                       timeout=20, interval=0.005, what="a stream on decode0")
            t_fail = time.monotonic()
            ds[0].kill()
            wait_until(lambda: workers(r.port)[url(ds[0].port)]["health"] == "unhealthy",
                       timeout=10, what="decode0 marked down")
            t_mark = time.monotonic()
            wait_until(lambda: load.count(after=t_mark) >= 10, timeout=60,
                       what="service on decode1")
            d_again = restart(c, ds[0], "decode", da)
            t_back = time.monotonic()
            wait_serving(r.port, url(ds[0].port), t_back, "restarted decode0")
            base = worker_requests(d_again)
            wait_until(lambda: worker_requests(d_again) >= base + 3, timeout=30,
                       what="traffic on the restarted decode")
            outs = load.stop()
        assert_router_alive(r)
        check(outs, fail_t=t_fail + 0.05, name=f"{proto}: kill decode mid-stream")
        if proto == "vllm-nixl":
            # every hold ended: pulled, or released by the router after the decode died
            for p in ps:
                wait_until(lambda: held(p) == 0, timeout=10, what="no pages held")


def test_nixl_kill_decode_midstream():
    kill_decode_midstream("vllm-nixl")


def test_mooncake_kill_decode_midstream():
    kill_decode_midstream("vllm-mooncake")


def test_nixl_kill_prefill_holding():
    """kill -9 a NIXL prefill while it holds answered requests' pages for their decodes: the
    pulls fail, no byte had reached those clients, so the router retries them on the other
    prefill; nobody waits for a timeout and requests started later succeed."""
    with Cluster("chaos-nixl-prefill") as c:
        ps, ds, r, _ = vllm_cluster(c, "vllm-nixl")
        with Load(r.port, n=6, kinds=KINDS) as load:
            wait_until(lambda: load.count() >= 10, timeout=60, what="warm-up")
            victim = ps[0]
            wait_until(lambda: get(victim.port, "/get_load").json()[0]["num_reqs"] > 0 or
                       held(victim) > 0, timeout=20, interval=0.002, what="work on prefill0")
            t_fail = time.monotonic()
            victim.kill()
            t_mark = time.monotonic()
            wait_until(lambda: load.count(after=t_mark) >= 8, timeout=60,
                       what="service on the other prefill")
            ps[0] = restart(c, victim, "prefill", list(PREFILL_ARGS) + ["--protocol", "vllm-nixl"])
            t_back = time.monotonic()
            wait_serving(r.port, url(victim.port), t_back, "restarted prefill0")
            outs = load.stop()
        assert_router_alive(r)
        check(outs, fail_t=t_fail + 0.05, name="nixl: kill the holding prefill")
        for d in ds:
            wait_until(lambda: get(d.port, "/get_load").json()[0]["num_reqs"] == 0, timeout=5,
                       what="decodes idle after the load")


if __name__ == "__main__":
    t = TestRunner()
    t.run(test_nixl_kill_decode_midstream)
    t.run(test_mooncake_kill_decode_midstream)
    t.run(test_nixl_kill_prefill_holding)
    t.finish()
