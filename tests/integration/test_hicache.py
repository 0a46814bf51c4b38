"""test_hicache.py — HiCache tiers in baton-worker on a real baton-store (a master and nodes on
loopback): a prompt computed on one worker is found by another in L3 (exact per-tier counts in
meta_info, exactly the uncached tokens charged, every fetched byte verified); L2 under an L1 too
small to hold it; the write policies' effect on the store; a store node killed -9 while pages
are fetched (the request completes, recomputing); PD with the prefill's hits handed to the
decode; large pages' work off the loop; concurrent requests for one history fetched once."""

import os
import re
import signal
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import harness  # noqa: E402
from harness import HOST, Cluster, TestRunner, get, post, url, wait_until  # noqa: E402
from test_store import Store  # noqa: E402

PAGE = 16
FAST = ("--prefill-us-per-token", "1", "--decode-us-per-token", "100", "--page-tokens", str(PAGE))
# tiny preset: 4 layers × 16 tokens × 128 bytes a token
PAGE_BYTES = 4 * PAGE * 128


def metric(port, name, labels=None):
    total = 0.0
    for line in get(port, "/metrics").text.splitlines():
        m = re.match(r"^" + re.escape(name) + r"(\{[^}]*\})?\s+(\S+)$", line)
        if m and all(f'{k}="{v}"' in (m.group(1) or "") for k, v in (labels or {}).items()):
            total += float(m.group(2))
    return total


def words(s, n, start=0):
    return " ".join(f"s{s}w{i}" for i in range(start, start + n))


def generate(port, text):
    r = post(port, "/generate", {"text": text, "sampling_params": {"max_new_tokens": 2}})
    assert r.status == 200, r.text
    return r.json()["meta_info"]


def tier_worker(c, st, name, *extra, mode="regular"):
    args = [*FAST, "--l2-bytes", "1M", "--kv-secret-file", st.secret,
            "--hicache-storage-prefetch-policy", "wait_complete", *extra]
    if st is not None:
        args += ["--store-master", st.addr]
    return c.worker(mode, *args, name=name)


def test_l3_across_workers():
    with Cluster("hicache-l3") as c:
        st = Store(c, nodes=2, segment="16M")
        a = tier_worker(c, st, "a")
        b = tier_worker(c, st, "b")
        # 400 words: 24 whole pages (384 tokens, above the 256-token minimum hit)
        t1 = words(1, 400)
        m = generate(a.port, t1)
        assert m["cached_tokens"] == 0, m
        # the pages went to L3 (write_through), K and V objects each
        wait_until(lambda: metric(a.port, "baton_worker_tier_written_bytes_total",
                                  {"tier": "l3"}) == 25 * PAGE_BYTES, timeout=20,
                   what="25 pages written to the store")
        # turn 2 on the other worker: its history comes from L3, only the rest is computed
        t2 = t1 + " " + words(1, 100, 400)
        m = generate(b.port, t2)
        assert m["cached_tokens_details"] == {"device": 0, "host": 0, "storage": 400}, m
        assert m["cached_tokens"] == 400, m
        assert metric(b.port, "baton_worker_cache_hit_tokens_total", {"tier": "l3"}) == 400
        assert metric(b.port, "baton_worker_cache_miss_tokens_total") == 500 - 400
        assert metric(b.port, "baton_worker_tier_fetched_bytes_total",
                      {"tier": "l3"}) == 25 * PAGE_BYTES
        assert metric(b.port, "baton_worker_tier_corrupt_pages_total") == 0
        # the same turn again on b: all of it in its own L1 now
        m = generate(b.port, t2)
        assert m["cached_tokens_details"]["device"] == 496, m


def test_l2_under_small_l1():
    with Cluster("hicache-l2") as c:
        # L1 holds 4 pages; L2 the rest; no store
        w = c.worker("regular", *FAST, "--cache-tokens", str(4 * PAGE), "--l2-bytes", "1M",
                     name="w")
        t = words(2, 200)
        assert generate(w.port, t)["cached_tokens"] == 0
        # the L2 copies run on the thread pool: a page is in L2 once its copy is done
        wait_until(lambda: metric(w.port, "baton_worker_tier_written_bytes_total",
                                  {"tier": "l2"}) == 12 * PAGE_BYTES, timeout=20,
                   what="turn 1's 12 pages in L2")
        m = generate(w.port, t)
        assert m["cached_tokens"] == 192, m
        assert m["cached_tokens_details"] == {"device": 64, "host": 128, "storage": 0}, m
        assert metric(w.port, "baton_worker_cache_hit_tokens_total", {"tier": "l2"}) == 128
        assert metric(w.port, "baton_worker_tier_fetched_bytes_total",
                      {"tier": "l2"}) == 8 * PAGE_BYTES


def test_write_policies():
    with Cluster("hicache-wp") as c:
        st = Store(c, nodes=1, segment="16M")
        # selective: a page reaches L2 and L3 only when it is used a second time
        w = tier_worker(c, st, "sel", "--hicache-write-policy", "write_through_selective")
        t = words(3, 400)
        generate(w.port, t)
        time.sleep(0.3)
        assert metric(w.port, "baton_worker_tier_written_bytes_total", {"tier": "l2"}) == 0
        assert metric(w.port, "baton_worker_tier_written_bytes_total", {"tier": "l3"}) == 0
        generate(w.port, t)
        wait_until(lambda: metric(w.port, "baton_worker_tier_written_bytes_total",
                                  {"tier": "l3"}) == 25 * PAGE_BYTES, timeout=20,
                   what="selective pages in the store after their second use")
        # exists before put: the same pages again write nothing more to the store; the write
        # ends, finding every page there
        assert metric(w.port, "baton_worker_tier_l3_present_bytes_total") == 0
        generate(w.port, t)
        wait_until(lambda: metric(w.port, "baton_worker_tier_l3_present_bytes_total") ==
                   25 * PAGE_BYTES, timeout=20, what="the third use's pages found in the store")
        assert metric(w.port, "baton_worker_tier_written_bytes_total",
                      {"tier": "l3"}) == 25 * PAGE_BYTES
        # write_back: L2 (32 pages) at once, L3 only for what L2 evicts
        wb = tier_worker(c, st, "wb", "--hicache-write-policy", "write_back", "--l2-bytes",
                         str(32 * PAGE_BYTES))
        generate(wb.port, words(4, 400))  # 25 pages: all fit
        wait_until(lambda: metric(wb.port, "baton_worker_tier_written_bytes_total",
                                  {"tier": "l2"}) == 25 * PAGE_BYTES, timeout=20,
                   what="25 pages in L2")
        time.sleep(0.3)
        assert metric(wb.port, "baton_worker_tier_written_bytes_total", {"tier": "l3"}) == 0
        generate(wb.port, words(5, 400))  # 25 more: 18 of the first go to L3 on eviction
        wait_until(lambda: metric(wb.port, "baton_worker_tier_written_bytes_total",
                                  {"tier": "l3"}) == 18 * PAGE_BYTES, timeout=20,
                   what="written back on eviction")
        # and they are found there by another worker
        o = tier_worker(c, st, "other")
        m = generate(o.port, words(4, 400) + " tail")
        assert m["cached_tokens_details"]["storage"] == 18 * PAGE, m


def test_pd_turn2_on_other_prefill():
    with Cluster("hicache-pd") as c:
        st = Store(c, nodes=2, segment="16M")
        ps = [tier_worker(c, st, f"p{i}", mode="prefill") for i in range(2)]
        ds = [c.worker("decode", *FAST, "--kv-secret-file", st.secret, name=f"d{i}")
              for i in range(2)]
        args = []
        for p in ps:
            args += ["--prefill", url(p.port), str(p.wait_port("bootstrap"))]
        for d in ds:
            args += ["--decode", url(d.port)]
        r = c.router(*args, "--prefill-policy", "round_robin", "--decode-policy", "round_robin")
        t1 = words(6, 400)
        m1 = generate(r.port, t1)
        assert m1["cached_tokens"] == 0, m1
        first = [p for p in ps if metric(p.port, "baton_worker_prompt_tokens_total") > 0]
        assert len(first) == 1
        wait_until(lambda: metric(first[0].port, "baton_worker_tier_written_bytes_total",
                                  {"tier": "l3"}) == 25 * PAGE_BYTES, timeout=20,
                   what="turn 1's pages in the store")
        t2 = t1 + " " + words(6, 100, 400)
        m2 = generate(r.port, t2)
        # turn 2 went to the other prefill: its history came from L3, the hand-off told the
        # decode, the decode told the client
        second = [p for p in ps if p is not first[0]][0]
        assert metric(second.port, "baton_worker_prompt_tokens_total") == 500
        assert m2["cached_tokens_details"] == {"device": 0, "host": 0, "storage": 400}, m2
        assert m2["cached_tokens"] == 400, m2
        # exactly the uncached tokens were computed: 400 by the first, 100 by the second
        assert metric(first[0].port, "baton_worker_cache_miss_tokens_total") == 400
        assert metric(second.port, "baton_worker_cache_miss_tokens_total") == 100
        assert metric(second.port, "baton_worker_tier_fetched_bytes_total",
                      {"tier": "l3"}) == 25 * PAGE_BYTES
        # the fetched pages went into the room (L2 to L1) and the decode verified every byte
        assert metric(second.port, "baton_worker_tier_loaded_pages_total") == 25
        assert sum(metric(d.port, "baton_kv_corrupted_total") for d in ds) == 0


def test_pd_decode_offload():
    with Cluster("hicache-offload") as c:
        st = Store(c, nodes=2, segment="16M")
        # the prefills keep their pages in L2 (write_back, never evicted): what turn 2 finds in
        # L3 can only be the decode's offload
        ps = [tier_worker(c, st, f"p{i}", "--hicache-write-policy", "write_back", mode="prefill")
              for i in range(2)]
        d = tier_worker(c, st, "d", "--disaggregation-decode-enable-offload-kvcache",
                        mode="decode")
        r = c.router("--prefill", url(ps[0].port), str(ps[0].wait_port("bootstrap")),
                     "--prefill", url(ps[1].port), str(ps[1].wait_port("bootstrap")),
                     "--decode", url(d.port), "--prefill-policy", "round_robin")
        ids = list(range(1000, 1400))  # 25 pages
        r1 = post(r.port, "/generate", {"input_ids": ids,
                                        "sampling_params": {"max_new_tokens": 40}})
        assert r1.status == 200, r1.text
        out = r1.json()["output_ids"]
        assert len(out) == 40
        # prompt and generated tokens: 440 tokens, 27 whole pages, offloaded on the decode
        wait_until(lambda: metric(d.port, "baton_worker_tier_written_bytes_total",
                                  {"tier": "l3"}) == 27 * PAGE_BYTES, timeout=20,
                   what="the decode's 27 pages in the store")
        assert metric(ps[0].port, "baton_worker_tier_written_bytes_total", {"tier": "l3"}) == 0
        # turn 2 (prompt + answer + a new message) on the other prefill: all 27 pages from L3
        r2 = post(r.port, "/generate", {"input_ids": ids + out + list(range(5000, 5050)),
                                        "sampling_params": {"max_new_tokens": 4}})
        assert r2.status == 200, r2.text
        m = r2.json()["meta_info"]
        assert m["cached_tokens_details"] == {"device": 0, "host": 0, "storage": 432}, m
        assert sum(metric(p.port, "baton_worker_tier_corrupt_pages_total") for p in ps) == 0


def test_client_gone_during_lookup():
    with Cluster("hicache-gone") as c:
        st = Store(c, nodes=1, segment="16M")
        a = tier_worker(c, st, "a")
        b = tier_worker(c, st, "b")
        t1 = words(9, 400)
        generate(a.port, t1)
        wait_until(lambda: metric(a.port, "baton_worker_tier_written_bytes_total",
                                  {"tier": "l3"}) == 25 * PAGE_BYTES, timeout=20,
                   what="turn 1 in the store")
        # the master stops answering: b's lookup waits on its exists; the client leaves
        st.master.signal(signal.SIGSTOP)
        try:
            try:
                harness.request(b.port, "POST", "/generate",
                                {"text": t1 + " more", "sampling_params": {"max_new_tokens": 2}},
                                timeout=0.5)
                raise AssertionError("answered while the store was stopped")
            except OSError:
                pass  # the client gave up: the job is gone, its lookup not yet
            wait_until(lambda: metric(b.port, "baton_worker_requests_total") >= 1, timeout=10,
                       what="the abort counted")
        finally:
            st.master.signal(signal.SIGCONT)
        # the lookup's store call ends later without its job; b goes on serving, and finds
        # the history once the master answers again (from L3, or from its own L1 when the
        # first try after the outage still missed the store)
        wait_until(lambda: generate(b.port, t1 + " again")["cached_tokens"] == 400, timeout=20,
                   what="the history found after the master came back")
        assert metric(b.port, "baton_worker_tier_corrupt_pages_total") == 0


def test_store_node_killed_mid_fetch():
    with Cluster("hicache-kill") as c:
        st = Store(c, nodes=2, segment="16M")
        a = tier_worker(c, st, "a")
        b = tier_worker(c, st, "b", "--hicache-storage-prefetch-policy", "timeout",
                        "--prefetch-timeout-base-ms", "1500")
        t1 = words(7, 2000)  # 125 pages spread over both nodes
        ref = post(a.port, "/generate", {"text": t1 + " more",
                                         "sampling_params": {"max_new_tokens": 8}}).json()
        wait_until(lambda: metric(a.port, "baton_worker_tier_written_bytes_total",
                                  {"tier": "l3"}) == 125 * PAGE_BYTES, timeout=30,
                   what="125 pages in the store")
        # b starts fetching; one node dies -9 while its pages are on their way
        import threading
        out = {}

        def turn2():
            out["r"] = post(b.port, "/generate", {"text": t1 + " more",
                                                  "sampling_params": {"max_new_tokens": 8}},
                            timeout=60)
        th = threading.Thread(target=turn2)
        th.start()
        st.nodes[1].kill()
        th.join(70)
        r = out["r"]
        assert r.status == 200, r.text
        m = r.json()["meta_info"]
        # what could not be fetched was recomputed: the same answer, fewer cached tokens
        assert r.json()["text"] == ref["text"]
        assert m["cached_tokens"] == m["cached_tokens_details"]["storage"]
        assert m["cached_tokens"] < 2000, m
        assert metric(b.port, "baton_worker_tier_corrupt_pages_total") == 0
        # and the worker goes on serving with the store's other node
        m = generate(b.port, words(8, 50))
        assert m["cached_tokens"] == 0


def test_large_pages_off_the_loop():
    """With a large model's pages (llama3-8b: 8 MiB each) the L2 fills after prefill, the checks
    of an L2 hit and its L2 to room copies run on the thread pool, never on the loop every stream
    shares: the page-work metric counts them by thread, exactly, and the decode verifies every
    byte."""
    preset = ("--model-preset", "llama3-8b", "--kv-pool-tokens", "1024",
              "--prefill-us-per-token", "1", "--decode-us-per-token", "100")
    pb = 8 << 20  # 32 layers x 64 tokens x 4 KiB, K and V halves
    with Cluster("hicache-large") as c:
        # L1 holds one page: turn 2 finds the rest in L2
        p = c.worker("prefill", *preset, "--cache-tokens", "64", "--l2-bytes", str(8 * pb),
                     name="p")
        d = c.worker("decode", *preset, name="d")
        r = c.router("--prefill", url(p.port), str(p.wait_port("bootstrap")), "--decode",
                     url(d.port))
        t = words(9, 260)  # 4 whole pages of 64 tokens (the last page is never cached)

        def work(kind, thread):
            return metric(p.port, "baton_worker_tier_page_work_bytes_total",
                          {"work": kind, "thread": thread})
        assert generate(r.port, t)["cached_tokens"] == 0
        wait_until(lambda: work("fill", "pool") == 4 * pb, timeout=30,
                   what="turn 1's 4 pages filled into L2 on the pool")
        m = generate(r.port, t)
        assert m["cached_tokens_details"] == {"device": 64, "host": 192, "storage": 0}, m
        assert work("load", "pool") == 3 * pb
        assert metric(p.port, "baton_worker_tier_loaded_pages_total") == 3
        # the loop did none of the fills, checks or copies
        assert work("verify", "pool") == 3 * pb
        for kind in ("fill", "load", "verify"):
            assert work(kind, "loop") == 0, kind
        assert metric(d.port, "baton_kv_corrupted_total") == 0


def test_concurrent_same_prefix_one_fetch():
    """Requests for the same history arriving together on a worker that does not hold it: one
    fetches it from L3, the others wait for that copy into L2 and reuse it (counted as joined)
    instead of recomputing it or fetching it again."""
    with Cluster("hicache-join") as c:
        st = Store(c, nodes=2, segment="16M")
        a = tier_worker(c, st, "a")
        b = tier_worker(c, st, "b")
        t = words(10, 400)
        generate(a.port, t)
        wait_until(lambda: metric(a.port, "baton_worker_tier_written_bytes_total",
                                  {"tier": "l3"}) == 25 * PAGE_BYTES, timeout=20,
                   what="the history in the store")
        n = 6
        out = [None] * n

        def one(i):
            out[i] = generate(b.port, t + f" q{i}")
        ts = [threading.Thread(target=one, args=(i,)) for i in range(n)]
        for th in ts:
            th.start()
        for th in ts:
            th.join()
        # nobody recomputed the history, and it came from the store once
        for m in out:
            assert m["cached_tokens"] == 400, out
        assert metric(b.port, "baton_worker_tier_fetched_bytes_total",
                      {"tier": "l3"}) == 25 * PAGE_BYTES, out
        assert sum(m["cached_tokens_details"]["storage"] for m in out) == 400, out
        joined = metric(b.port, "baton_worker_tier_joined_tokens_total")
        assert joined % 400 == 0 and joined <= 400 * (n - 1), joined
        assert metric(b.port, "baton_worker_tier_corrupt_pages_total") == 0
        print(f"  {int(joined) // 400} of {n - 1} requests waited for the fetch")


if __name__ == "__main__":
    r = TestRunner()
    r.run(test_l3_across_workers)
    r.run(test_l2_under_small_l1)
    r.run(test_write_policies)
    r.run(test_pd_turn2_on_other_prefill)
    r.run(test_pd_decode_offload)
    r.run(test_store_node_killed_mid_fetch)
    r.run(test_client_gone_during_lookup)
    r.run(test_large_pages_off_the_loop)
    r.run(test_concurrent_same_prefix_one_fetch)
    r.finish()
