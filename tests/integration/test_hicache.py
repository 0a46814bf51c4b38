"""test_hicache.py — HiCache tiers in baton-worker on a real baton-store (a master and nodes on
loopback): a prompt computed on one worker is found by another in L3 (exact per-tier counts in
meta_info, exactly the uncached tokens charged, every fetched byte verified); L2 under an L1 too
small to hold it; the write policies' effect on the store; a store node killed -9 while pages
are fetched (the request completes, recomputing); PD with the prefill's hits handed to the
decode."""

import os
import re
import signal
import sys
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
        m = generate(w.port, t)
        assert m["cached_tokens"] == 192, m
        assert m["cached_tokens_details"] == {"device": 64, "host": 128, "storage": 0}, m
        assert metric(w.port, "baton_worker_cache_hit_tokens_total", {"tier": "l2"}) == 128
        assert metric(w.port, "baton_worker_tier_fetched_bytes_total",
                      {"tier": "l2"}) == 8 * PAGE_BYTES


if __name__ == "__main__":
    r = TestRunner()
    r.run(test_l3_across_workers)
    r.run(test_l2_under_small_l1)
    r.finish()
