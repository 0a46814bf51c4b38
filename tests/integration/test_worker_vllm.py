"""test_worker_vllm.py — baton-worker --protocol vllm-nixl | vllm-mooncake behind the router:
exact text through each protocol (chat and completions, stream or not, n>1,
logprobs), the KV moved through libbaton and verified byte by byte by the decode, the NIXL
prefill's held pages released by the pull, by timeout and by abort (with their metrics), a late
pull after a release refused at once, kill -9 of the holder between the phases, and legs of the
wrong protocol refused by the worker."""

import json
import os
import re
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import harness  # noqa: E402
from harness import Cluster, TestRunner, get, post, sse_events, url, wait_until  # noqa: E402
import simtext  # noqa: E402

FAST = ("--prefill-us-per-token", "10", "--decode-us-per-token", "200")
MSGS = [{"role": "user", "content": "Tell me about pulling KV pages."}]
ONE_SHOT = ("--max-retries", "0", "--breaker-threshold", "0")


def metric(port, name, labels=None):
    """The sum of the series of `name` that carry `labels`."""
    total = 0.0
    for ln in get(port, "/metrics").text.splitlines():
        if ln.startswith("#"):
            continue
        head, _, val = ln.rpartition(" ")
        if head.split("{")[0] != name:
            continue
        if all(f'{k}="{v}"' in head for k, v in (labels or {}).items()):
            total += float(val)
    return total


def check_texts(r):
    """Chat (non-stream, stream, n=2 with logprobs) and completions through the router: exactly
    a regular worker's text, which needs the prefill's KV and first token to arrive intact."""
    res = post(r.port, "/v1/chat/completions", {"messages": MSGS, "max_tokens": 12})
    assert res.status == 200, res.text
    want = simtext.complete_chat(MSGS, 12)
    assert res.json()["choices"][0]["message"]["content"] == want.text, res.text
    assert res.json()["usage"]["completion_tokens"] == 12

    res = post(r.port, "/v1/chat/completions",
               {"messages": MSGS, "max_tokens": 10, "stream": True,
                "stream_options": {"include_usage": True}})
    assert res.status == 200 and res.headers["content-type"].startswith("text/event-stream")
    ev = sse_events(res.body)
    assert ev[-1] == "[DONE]", ev
    chunks = [json.loads(e) for e in ev[:-1]]
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    assert text == simtext.complete_chat(MSGS, 10).text
    assert chunks[-1]["usage"]["completion_tokens"] == 10

    res = post(r.port, "/v1/chat/completions",
               {"messages": MSGS, "max_tokens": 6, "n": 2, "logprobs": True, "top_logprobs": 1})
    assert res.status == 200, res.text
    want = simtext.complete_chat(MSGS, 6)
    chs = res.json()["choices"]
    assert [c["message"]["content"] for c in chs] == [want.text, want.text], chs
    assert all(len(c["logprobs"]["content"]) == 6 for c in chs), chs

    prompts = ["one prompt", "and another one"]
    res = post(r.port, "/v1/completions", {"prompt": prompts, "max_tokens": 5})
    assert res.status == 200, res.text
    assert [c["text"] for c in res.json()["choices"]] == \
        [simtext.complete_text(q, 5).text for q in prompts]
    return 1 + 1 + 2 + 2  # sequences handed off


def test_nixl_end_to_end():
    with Cluster("vllm-nixl") as c:
        p = c.worker("prefill", "--protocol", "vllm-nixl", *FAST)
        d = c.worker("decode", "--protocol", "vllm-nixl", *FAST)
        r = c.router("--pd-protocol", "vllm-nixl", "--prefill", url(p.port), "--decode",
                     url(d.port), *ONE_SHOT)
        n = check_texts(r)
        # every held sequence was pulled; nothing is held any more
        wait_until(lambda: metric(p.port, "baton_worker_kv_holds_released_total",
                                  {"result": "pulled"}) == n, 10, what="pulled holds")
        assert metric(p.port, "baton_worker_kv_holds") == 0
        assert metric(p.port, "baton_worker_kv_holds_released_total", {"result": "timeout"}) == 0
        assert metric(r.port, "baton_pd_stranded_releases_total") == 0


def nixl_prefill_leg(p, body):
    b = dict(body, stream=False, max_tokens=1,
             kv_transfer_params={"do_remote_decode": True, "do_remote_prefill": False,
                                 "remote_engine_id": None, "remote_block_ids": None,
                                 "remote_host": None, "remote_port": None})
    res = post(p.port, "/v1/chat/completions", b)
    assert res.status == 200, res.text
    return res.json()


def assert_pull_refused(d, msgs, ktp, what):
    """The decode's pull with these kv_transfer_params fails with a bootstrap error at once (well
    before its 20 s bootstrap timeout)."""
    t0 = time.monotonic()
    res = post(d.port, "/v1/chat/completions",
               {"messages": msgs, "max_tokens": 7, "kv_transfer_params": ktp}, timeout=30)
    assert res.status >= 500 and "bootstrap" in res.json()["error"]["code"], res.text
    assert time.monotonic() - t0 < 15, f"{what}: not refused at once"


def test_nixl_prefill_answer_and_release():
    """The prefill answers phase 1 at once with the fields vLLM's decode needs; the hold ends by
    timeout or by abort (metrics for each), and a pull after a release fails at once."""
    with Cluster("vllm-hold") as c:
        p = c.worker("prefill", "--protocol", "vllm-nixl", "--kv-hold-timeout-ms", "400", *FAST)
        d = c.worker("decode", "--protocol", "vllm-nixl", "--bootstrap-timeout-ms", "20000",
                     *FAST)
        ans = nixl_prefill_leg(p, {"messages": MSGS, "max_tokens": 9})
        ktp = ans["kv_transfer_params"]
        assert ktp["do_remote_prefill"] is True and ktp["do_remote_decode"] is False, ktp
        assert ktp["remote_host"] == harness.HOST and \
            ktp["remote_port"] == p.wait_port("bootstrap"), ktp
        assert isinstance(ktp["remote_block_ids"], list) and ktp["remote_block_ids"], ktp
        assert ktp["remote_engine_id"] and ktp["tp_size"] == 1, ktp
        assert re.fullmatch(r"chatcmpl-[0-9a-f]{16}", ktp["remote_request_id"]), ktp
        first = simtext.complete_chat(MSGS, 1).text
        assert ans["choices"][0]["message"]["content"] == first, ans
        assert metric(p.port, "baton_worker_kv_holds") == 1
        # timeout
        wait_until(lambda: metric(p.port, "baton_worker_kv_holds_released_total",
                                  {"result": "timeout"}) == 1, 10, what="hold timeout")
        assert metric(p.port, "baton_worker_kv_holds") == 0
        # a pull after the release is refused at once (not after the decode's 20 s timeout)
        assert_pull_refused(d, MSGS, ktp, "late pull")

        # abort by request id
        ans = nixl_prefill_leg(p, {"messages": MSGS, "max_tokens": 9})
        rid = ans["kv_transfer_params"]["remote_request_id"]
        res = post(p.port, "/abort_requests", {"request_ids": [rid, "unknown-id"]})
        assert res.status == 200 and res.json() == {"released": 1}, res.text
        assert metric(p.port, "baton_worker_kv_holds_released_total", {"result": "aborted"}) == 1
        assert metric(p.port, "baton_worker_kv_holds") == 0
        assert post(p.port, "/abort_requests", {"request_ids": "x"}).status == 400
        # a decode (not a NIXL prefill) has nothing to abort
        assert post(d.port, "/abort_requests", {"request_ids": [rid]}).status == 404


def test_nixl_lease_renewed_by_heartbeats():
    """vLLM's NIXL lease (kv_lease_duration): a held sequence outlives its lease while a decode
    heartbeats for it (POST /kv_lease, each extending it to 2/3 of the lease from then), then the
    decode's pull gets it; a hold nobody heartbeats for ends when its lease does."""
    lease = 2000
    with Cluster("vllm-lease") as c:
        p = c.worker("prefill", "--protocol", "vllm-nixl", "--kv-lease-ms", str(lease), *FAST)
        d = c.worker("decode", "--protocol", "vllm-nixl", "--bootstrap-timeout-ms", "20000",
                     *FAST)
        ans = nixl_prefill_leg(p, {"messages": MSGS, "max_tokens": 9})
        ktp = ans["kv_transfer_params"]
        assert ktp["baton_lease_port"] == p.port, ktp
        rid = ktp["remote_request_id"]
        t_end = time.monotonic() + 2 * lease / 1000
        while time.monotonic() < t_end:  # heartbeats every 100 ms for two lease lengths
            res = post(p.port, "/kv_lease", {"request_ids": [rid]})
            assert res.status == 200 and res.json() == {"renewed": 1}, res.text
            time.sleep(0.1)
        assert metric(p.port, "baton_worker_kv_holds") == 1
        assert metric(p.port, "baton_worker_kv_lease_renewals_total") >= 10
        res = post(d.port, "/v1/chat/completions",
                   {"messages": MSGS, "max_tokens": 9, "kv_transfer_params": ktp}, timeout=30)
        assert res.status == 200, res.text
        assert res.json()["choices"][0]["message"]["content"] == \
            simtext.complete_chat(MSGS, 9).text
        assert metric(p.port, "baton_worker_kv_holds_released_total", {"result": "pulled"}) == 1
        # no heartbeat: the lease runs out
        ans = nixl_prefill_leg(p, {"messages": MSGS, "max_tokens": 9})
        wait_until(lambda: metric(p.port, "baton_worker_kv_holds_released_total",
                                  {"result": "timeout"}) == 1, 20, what="the lease to run out")
        assert_pull_refused(d, MSGS, ans["kv_transfer_params"], "pull after the lease")
        assert post(p.port, "/kv_lease", {"request_ids": "x"}).status == 400


def test_nixl_decode_heartbeats_while_waiting():
    """A decode whose KV pages are all taken waits for them longer than the prefill's lease:
    its heartbeats (every lease/6 from the request's arrival) keep the prefill's hold, and the
    request is answered exactly. The same decode with heartbeats too rare to matter (its own
    lease 60 s: every 10 s) loses the hold and fails cleanly."""
    for decode_lease, ok in (("1000", True), ("60000", False)):
        with Cluster("vllm-lease-wait") as c:
            p = c.worker("prefill", "--protocol", "vllm-nixl", "--kv-lease-ms", "1000", *FAST)
            # one sequence's pages fill the pool: the second waits for the first to finish
            d = c.worker("decode", "--protocol", "vllm-nixl", "--kv-lease-ms", decode_lease,
                         "--kv-pool-tokens", "16", "--decode-us-per-token", "30000",
                         "--prefill-us-per-token", "10", "--bootstrap-timeout-ms", "30000")
            r = c.router("--pd-protocol", "vllm-nixl", "--prefill", url(p.port), "--decode",
                         url(d.port), "--first-byte-timeout-ms", "60000", *ONE_SHOT)
            first = {}
            long_req = threading.Thread(target=lambda: first.update(res=post(
                r.port, "/v1/completions", {"prompt": "a b", "max_tokens": 100},
                timeout=60)))
            long_req.start()  # 100 steps of 30 ms: ~3 s holding the decode's only pages
            wait_until(lambda: metric(d.port, "baton_kv_pool_slots", {"state": "used"}) > 0,
                       20, what="the first request to take the decode's pages")
            res = post(r.port, "/v1/completions", {"prompt": "c d", "max_tokens": 2},
                       timeout=60)
            long_req.join(60)
            assert first["res"].status == 200, first["res"].text
            if ok:
                assert res.status == 200, res.text
                assert res.json()["choices"][0]["text"] == simtext.complete_text("c d", 2).text
                assert metric(p.port, "baton_worker_kv_lease_renewals_total") >= 3
            else:
                assert res.status >= 500, res.text
                assert metric(p.port, "baton_worker_kv_holds_released_total",
                              {"result": "timeout"}) == 1


def test_nixl_export_and_pull():
    """The NIXL prefill holds its pages as a libbaton export (pull API) and the decode pulls it:
    a pull whose shape differs (another prompt) is refused at once and the export keeps
    waiting; the right pull then gets every byte, verified, counted as the prefill's hand-off;
    an export released by abort refuses a later pull at once."""
    with Cluster("vllm-export") as c:
        p = c.worker("prefill", "--protocol", "vllm-nixl", "--log-level", "debug", *FAST)
        d = c.worker("decode", "--protocol", "vllm-nixl", "--bootstrap-timeout-ms", "20000",
                     *FAST)
        ans = nixl_prefill_leg(p, {"messages": MSGS, "max_tokens": 7})
        ktp = ans["kv_transfer_params"]
        p.wait_log(r"kv_exported key=\d+ pages=\d+")  # the answer came after the export
        long_msgs = [{"role": "user", "content": " ".join(["many more words"] * 80)}]
        assert_pull_refused(d, long_msgs, ktp, "a pull of another shape")
        assert metric(p.port, "baton_worker_kv_holds") == 1  # the export still waits
        res = post(d.port, "/v1/chat/completions",
                   {"messages": MSGS, "max_tokens": 7, "kv_transfer_params": ktp})
        assert res.status == 200, res.text
        assert res.json()["choices"][0]["message"]["content"] == \
            simtext.complete_chat(MSGS, 7).text
        wait_until(lambda: metric(p.port, "baton_worker_kv_holds_released_total",
                                  {"result": "pulled"}) == 1, 10, what="pulled")
        assert metric(p.port, "baton_kv_rooms_total", {"result": "ok"}) == 1
        assert metric(p.port, "baton_kv_bytes_total", {"direction": "sent"}) > 0
        assert metric(d.port, "baton_kv_corrupted_total") == 0
        # released by abort: a pull that comes afterwards is refused at once
        ans = nixl_prefill_leg(p, {"messages": MSGS, "max_tokens": 7})
        rid = ans["kv_transfer_params"]["remote_request_id"]
        assert post(p.port, "/abort_requests", {"request_ids": [rid]}).json() == {"released": 1}
        assert_pull_refused(d, MSGS, ans["kv_transfer_params"], "a pull after the release")
        assert metric(p.port, "baton_kv_room_failures_total", {"reason": "aborted"}) >= 1
        assert metric(p.port, "baton_worker_kv_holds") == 0


def test_nixl_hold_expires_before_answer():
    """A sequence's export times out while another sequence of the same request still computes
    (one at a time, the second 3000 tokens long): the answer is a clean 503 kv_hold_expired, the
    expired hold counts as "timeout", the other as "failed", and every page comes back."""
    with Cluster("vllm-expire") as c:
        p = c.worker("prefill", "--protocol", "vllm-nixl", "--kv-hold-timeout-ms", "50",
                     "--prefill-us-per-token", "100", "--max-batch", "1")
        res = post(p.port, "/v1/completions",
                   {"prompt": ["short one", " ".join(["word"] * 3000)], "max_tokens": 3,
                    "stream": False,
                    "kv_transfer_params": {"do_remote_decode": True, "do_remote_prefill": False}},
                   timeout=30)
        assert res.status == 503 and res.json()["error"]["code"] == "kv_hold_expired", res.text
        assert metric(p.port, "baton_worker_kv_holds_released_total", {"result": "timeout"}) == 1
        assert metric(p.port, "baton_worker_kv_holds_released_total", {"result": "failed"}) == 1
        assert metric(p.port, "baton_worker_kv_holds") == 0
        wait_until(lambda: metric(p.port, "baton_kv_pool_slots", {"state": "used"}) == 0, 10,
                   what="pages back")


def test_router_releases_stranded_blocks():
    """The decode dies after phase 1: the router's release frees the prefill's held pages at
    once (not at the prefill's own timeout), counted on both sides."""
    with Cluster("vllm-stranded") as c:
        p = c.worker("prefill", "--protocol", "vllm-nixl", "--kv-hold-timeout-ms", "600000",
                     *FAST)
        d = c.worker("decode", "--protocol", "vllm-nixl", *FAST)
        r = c.router("--pd-protocol", "vllm-nixl", "--prefill", url(p.port), "--decode",
                     url(d.port), *ONE_SHOT, "--check-interval-ms", "0")
        assert post(r.port, "/v1/completions", {"prompt": "warm", "max_tokens": 2}).status == 200
        d.kill()  # kill -9
        res = post(r.port, "/v1/completions", {"prompt": "stranded", "max_tokens": 4},
                   timeout=30)
        assert res.status in (502, 503), res.text
        wait_until(lambda: metric(p.port, "baton_worker_kv_holds_released_total",
                                  {"result": "aborted"}) == 1, 10, what="prefill released")
        assert metric(p.port, "baton_worker_kv_holds") == 0
        # the router counts the release when the prefill's answer reaches it, after the
        # prefill counted it: wait for it too
        wait_until(lambda: metric(r.port, "baton_pd_stranded_releases_total",
                                  {"protocol": "vllm-nixl", "result": "released"}) == 1, 10,
                   what="router counted the release")


def test_nixl_holder_killed():
    """kill -9 of the prefill that holds the pages, before the decode pulls: the decode's pull
    fails cleanly and in bounded time (the router answers an error, no hang), and a restarted
    prefill serves the next request."""
    with Cluster("vllm-kill") as c:
        p = c.worker("prefill", "--protocol", "vllm-nixl", *FAST)
        d = c.worker("decode", "--protocol", "vllm-nixl", "--bootstrap-timeout-ms", "20000",
                     *FAST)
        ans = nixl_prefill_leg(p, {"messages": MSGS, "max_tokens": 5})
        p.kill()  # kill -9 of the holder
        t0 = time.monotonic()
        res = post(d.port, "/v1/chat/completions",
                   {"messages": MSGS, "max_tokens": 5,
                    "kv_transfer_params": ans["kv_transfer_params"]}, timeout=30)
        assert res.status >= 500 and "bootstrap" in res.json()["error"]["code"], res.text
        assert time.monotonic() - t0 < 15, "pull from a dead holder not failed promptly"
        # a new prefill: the decode pulls from it normally
        p2 = c.worker("prefill", "--protocol", "vllm-nixl", *FAST)
        r = c.router("--pd-protocol", "vllm-nixl", "--prefill", url(p2.port), "--decode",
                     url(d.port), *ONE_SHOT)
        res = post(r.port, "/v1/chat/completions", {"messages": MSGS, "max_tokens": 5})
        assert res.status == 200, res.text
        assert res.json()["choices"][0]["message"]["content"] == \
            simtext.complete_chat(MSGS, 5).text


def test_mooncake_end_to_end():
    with Cluster("vllm-mooncake") as c:
        p = c.worker("prefill", "--protocol", "vllm-mooncake", *FAST)
        d = c.worker("decode", "--protocol", "vllm-mooncake", *FAST)
        r = c.router("--pd-protocol", "vllm-mooncake", *ONE_SHOT)
        res = post(r.port, "/workers", {
            "url": url(p.port), "worker_type": "prefill", "engine_id": "prefill-0",
            "bootstrap_addr": f"http://{harness.HOST}:{p.wait_port('bootstrap')}"})
        assert res.status == 202, res.text
        assert post(r.port, "/workers", {"url": url(d.port), "worker_type": "decode"}).status \
            == 202
        check_texts(r)
        assert metric(d.port, "baton_worker_requests_total", {"status": "200"}) >= 4


def test_mooncake_command_line():
    """`--prefill URL BOOTSTRAP_PORT --prefill-engine-id ID` (README "Fronting vLLM"): the port
    is the prefill's bootstrap server on its host; no POST /workers needed."""
    with Cluster("vllm-mooncake-cli") as c:
        p = c.worker("prefill", "--protocol", "vllm-mooncake", *FAST)
        d = c.worker("decode", "--protocol", "vllm-mooncake", *FAST)
        boot = p.wait_port("bootstrap")
        r = c.router("--pd-protocol", "vllm-mooncake", "--prefill", url(p.port), str(boot),
                     "--prefill-engine-id", "prefill-0", "--decode", url(d.port), *ONE_SHOT)
        ws = {w["url"]: w for w in get(r.port, "/workers").json()["workers"]}
        pw = ws[url(p.port)]
        assert pw["engine_id"] == "prefill-0", pw
        assert pw["bootstrap_addr"] == f"http://{harness.HOST}:{boot}", pw
        check_texts(r)
        # Without the engine id the router says what is missing and does not start.
        res = subprocess.run([harness.binary("baton"), "--port", "0", "--pd-protocol",
                              "vllm-mooncake", "--prefill", url(p.port), str(boot)],
                             capture_output=True, text=True, timeout=30)
        assert res.returncode != 0 and "--prefill-engine-id" in res.stderr, res.stderr


def test_wrong_protocol_refused():
    """A worker refuses the other protocols' legs with 400 (never a silent local recompute)."""
    with Cluster("vllm-wrong") as c:
        sg = c.worker("prefill", *FAST)
        nx = c.worker("decode", "--protocol", "vllm-nixl", *FAST)
        mc = c.worker("prefill", "--protocol", "vllm-mooncake", *FAST)
        ktp = {"do_remote_decode": True, "do_remote_prefill": False}
        res = post(sg.port, "/v1/completions",
                   {"prompt": "x", "max_tokens": 1, "kv_transfer_params": ktp})
        assert res.status == 400 and "sglang" in res.json()["error"]["message"], res.text
        # a NIXL decode leg missing what vLLM requires
        bad = {"do_remote_prefill": True, "remote_host": "127.0.0.1", "remote_port": 1,
               "remote_engine_id": "e", "remote_request_id": "r", "remote_block_ids": []}
        res = post(nx.port, "/v1/completions",
                   {"prompt": "x", "max_tokens": 1, "kv_transfer_params": bad})
        assert res.status == 400 and res.json()["error"]["param"] == "kv_transfer_params", \
            res.text
        # SGLang bootstrap fields to a vLLM worker
        res = post(nx.port, "/v1/completions",
                   {"prompt": "x", "max_tokens": 1, "bootstrap_host": "h", "bootstrap_port": 1,
                    "bootstrap_room": 5})
        assert res.status == 400, res.text
        # a NIXL prefill leg to a Mooncake prefill (no transfer_id)
        res = post(mc.port, "/v1/completions",
                   {"prompt": "x", "max_tokens": 1, "stream": False, "kv_transfer_params": ktp})
        assert res.status == 400 and "transfer_id" in res.json()["error"]["message"], res.text


def test_ttft_scenario_smoke():
    """loadtest/scenarios/pd_protocols.py --smoke: every protocol serves the load, no errors."""
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "loadtest",
                          "scenarios", "pd_protocols.py")
    out = subprocess.run([sys.executable, script, "--smoke", "--build-dir", harness.BUILD_DIR],
                         capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stdout + out.stderr
    for proto in ("sglang", "vllm-nixl", "vllm-mooncake"):
        assert re.search(rf"\| {proto} +\| +2 \|", out.stdout), out.stdout
    assert "pd_protocols done: 0 failed requests" in out.stdout, out.stdout


if __name__ == "__main__":
    t = TestRunner()
    for fn in (test_nixl_end_to_end, test_nixl_prefill_answer_and_release,
               test_nixl_lease_renewed_by_heartbeats, test_nixl_decode_heartbeats_while_waiting,
               test_nixl_export_and_pull, test_nixl_hold_expires_before_answer,
               test_router_releases_stranded_blocks, test_nixl_holder_killed,
               test_mooncake_end_to_end, test_mooncake_command_line, test_wrong_protocol_refused,
               test_ttft_scenario_smoke):
        t.run(fn)
    t.finish()
