"""test_bench.py — baton-bench against a real baton-worker on loopback: every endpoint, streaming
and not, exact token totals, open and closed loop, multi-turn, a ShareGPT file, errors by kind,
--compare, extra headers (--header), and command-line errors.
"""

import json
import os
import shutil
import subprocess
import tempfile

from harness import Cluster, SkipTest, TestRunner, binary, url
from router_upstream import Upstream

ZERO = ("--prefill-us-per-token", "0", "--decode-us-per-token", "0")


def bench(*args, expect_rc=0, timeout=120):
    """Runs baton-bench with --result-json; returns (result dict or None, stdout+stderr)."""
    fd, path = tempfile.mkstemp(prefix="bench-", suffix=".json")
    os.close(fd)
    os.unlink(path)
    try:
        r = subprocess.run([binary("baton-bench"), "--result-json", path, *map(str, args)],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           timeout=timeout)
        assert r.returncode == expect_rc, f"rc {r.returncode} != {expect_rc}:\n{r.stdout}"
        res = None
        if os.path.exists(path):
            with open(path) as f:
                res = json.load(f)
        return res, r.stdout
    finally:
        if os.path.exists(path):
            os.unlink(path)


def test_endpoints_exact_totals():
    with Cluster("bench") as c:
        w = c.worker("regular", *ZERO)
        for ep in ("chat", "completions", "generate"):
            for stream in (False, True):
                extra = ["--stream"] if stream else []
                res, out = bench("--base-url", url(w.port), "--endpoint", ep, *extra,
                                 "--concurrency", 4, "--num-requests", 40, "--input-len", 30,
                                 "--output-len", 7)
                what = f"{ep} stream={stream}"
                assert res["completed"] == 40 and res["failed"] == 0, (what, res)
                # Prompt words are exact; output tokens come from usage / meta_info.
                assert res["total_input_tokens"] == 40 * 30, (what, res)
                assert res["total_output_tokens"] == 40 * 7, (what, res)
                assert res["e2e_ms"]["n"] == 40 and res["ttft_ms"]["n"] == 40
                assert 0 < res["ttft_ms"]["p50"] <= res["e2e_ms"]["max"]
                if stream:
                    # 7 content chunks each: 6 gaps, and a TPOT per request.
                    assert res["itl_ms"]["n"] == 40 * 6, (what, res["itl_ms"])
                    assert res["tpot_ms"]["n"] == 40
                    for q in ("p50", "p90", "p99"):
                        assert res["ttft_ms"][q] <= res["e2e_ms"]["max"]
                else:
                    assert res["itl_ms"]["n"] == 0 and res["tpot_ms"]["n"] == 0
                    assert res["ttft_ms"]["p50"] == res["e2e_ms"]["p50"]
                assert "baton-bench result" in out


def test_ranges_open_loop_and_duration():
    with Cluster("bench") as c:
        w = c.worker("regular", *ZERO)
        res, _ = bench("--base-url", url(w.port), "--stream", "--request-rate", 200,
                       "--num-requests", 60, "--input-len-range", "5:9", "--output-len-range",
                       "2:4", "--arrival", "fixed")
        assert res["completed"] == 60 and res["failed"] == 0, res
        assert 60 * 5 <= res["total_input_tokens"] <= 60 * 9
        assert 60 * 2 <= res["total_output_tokens"] <= 60 * 4
        assert res["config"]["load"] == "fixed"
        # Fixed rate 200/s for 60 requests: about 0.3 s (bounds loose for a loaded machine).
        assert 0.25 <= res["duration_s"] < 10, res["duration_s"]

        res, _ = bench("--base-url", url(w.port), "--concurrency", 2, "--duration", 0.5,
                       "--warmup", 0.2, "--input-len", 10, "--output-len", 3)
        assert res["completed"] > 0 and res["failed"] == 0
        assert res["warmup_requests"] > 0
        assert res["duration_s"] >= 0.45


def test_multi_turn_and_slo():
    with Cluster("bench") as c:
        w = c.worker("regular", *ZERO)
        res, _ = bench("--base-url", url(w.port), "--endpoint", "completions", "--multi-turn", 3,
                       "--concurrency", 1, "--num-requests", 3, "--input-len", 10,
                       "--output-len", 4, "--stream")
        assert res["completed"] == 3, res
        # Turn k repeats the history: 10, then 10+4+10, then 10+4+10+4+10 prompt words.
        assert res["total_input_tokens"] == 10 + 24 + 38, res["total_input_tokens"]
        # A generous SLO keeps every request; an impossible one keeps none.
        res, _ = bench("--base-url", url(w.port), "--num-requests", 20, "--slo-ttft-ms", 60000)
        assert res["good_requests"] == 20
        res, _ = bench("--base-url", url(w.port), "--num-requests", 20, "--slo-e2e-ms", 1e-6)
        assert res["good_requests"] == 0 and res["completed"] == 20


def test_sharegpt_dataset():
    conv = [{"conversations": [{"from": "human", "value": f"question number {i} is here"},
                               {"from": "gpt", "value": "one two three four five"}]}
            for i in range(10)]
    fd, path = tempfile.mkstemp(suffix=".json")
    with os.fdopen(fd, "w") as f:
        json.dump(conv, f)
    try:
        with Cluster("bench") as c:
            w = c.worker("regular", *ZERO)
            res, _ = bench("--base-url", url(w.port), "--dataset", path, "--num-requests", 12)
            assert res["completed"] == 12
            assert res["total_input_tokens"] == 12 * 5
            assert res["total_output_tokens"] == 12 * 5  # the reference reply's length
    finally:
        os.unlink(path)


def test_errors_by_kind():
    with Cluster("bench") as c:
        w = c.worker("regular", *ZERO)
        port = w.port
    # The worker is gone: every request fails to connect; exit status 1, counted by kind.
    res, out = bench("--base-url", url(port), "--num-requests", 5, expect_rc=1)
    assert res["completed"] == 0 and res["failed"] == 5
    assert res["errors"] == {"connect": 5}, res["errors"]
    # HTTP errors are counted per status: an unknown path gives 404.
    with Cluster("bench") as c:
        w = c.worker("regular", *ZERO)
        res, _ = bench("--base-url", url(w.port) + "/nope", "--num-requests", 3, expect_rc=1)
        assert res["errors"] == {"http_status": 3}, res
        assert res["http_status"] == {"404": 3}, res


def test_extra_headers():
    """--header lines reach the server on every request, after the bench's own headers."""
    with Upstream("w") as w:
        # the scripted server's answer has no text: the bench counts it failed (exit 1)
        res, _ = bench("--base-url", w.url, "--endpoint", "completions", "--num-requests", 3,
                       "--header", "x-priority: bulk", "--header", "X-Other:v", expect_rc=1)
        assert res["failed"] == 3, res
        reqs = w.wait_requests(3)
        for q in reqs:
            assert q.headers.get("x-priority") == "bulk", q.headers
            assert q.headers.get("x-other") == "v", q.headers
            assert q.headers.get("content-type") == "application/json", q.headers


def test_compare_and_cli_errors():
    with Cluster("bench") as c:
        w = c.worker("regular", *ZERO)
        d = tempfile.mkdtemp()
        a, b = os.path.join(d, "a.json"), os.path.join(d, "b.json")
        for p in (a, b):
            subprocess.run([binary("baton-bench"), "--base-url", url(w.port), "--num-requests",
                            "10", "--quiet", "--result-json", p], check=True,
                           stdout=subprocess.DEVNULL)
        r = subprocess.run([binary("baton-bench"), "--compare", a, b], stdout=subprocess.PIPE,
                           text=True, check=True)
        assert "B/A" in r.stdout and "request_throughput" in r.stdout and "e2e_ms.p99" in r.stdout
        os.unlink(a)
        os.unlink(b)
        os.rmdir(d)
    bad = [["--concurrency", "0"], ["--endpoint", "bogus"], ["--request-rate", "-1"],
           ["--input-len-range", "9:3"], ["--concurrency", "2", "--request-rate", "5"],
           ["--num-requests", "5", "--duration", "1"], ["--base-url", "ftp://x"],
           ["--no-such-flag"], ["--compare", "only-one.json"], ["stray"],
           ["--header", "no-colon"], ["--header", ": empty-name"]]
    for args in bad:
        r = subprocess.run([binary("baton-bench"), *args], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)
        assert r.returncode == 2, (args, r.returncode, r.stderr)
        assert "baton-bench:" in r.stderr, (args, r.stderr)
    r = subprocess.run([binary("baton-bench"), "--help"], stdout=subprocess.PIPE, text=True)
    assert r.returncode == 0 and "--request-rate" in r.stdout


def test_plot():
    d = tempfile.mkdtemp()
    png = os.path.join(d, "cdf.png")
    try:
        with Cluster("bench") as c:
            w = c.worker("regular", *ZERO)
            # Without gnuplot on PATH: a message, no file, still exit 0.
            r = subprocess.run([binary("baton-bench"), "--base-url", url(w.port), "--stream",
                                "--num-requests", "20", "--quiet", "--plot", png],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               env={"PATH": d})
            assert r.returncode == 0, r.stdout
            assert "plot skipped: gnuplot is not installed" in r.stdout, r.stdout
            assert not os.path.exists(png)
            if not shutil.which("gnuplot"):
                raise SkipTest("gnuplot is not installed: PNG output not checked "
                               "(scripts/install-bench-deps.sh)")
            r = subprocess.run([binary("baton-bench"), "--base-url", url(w.port), "--stream",
                                "--num-requests", "20", "--quiet", "--plot", png],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            assert r.returncode == 0 and "plot written" in r.stdout, r.stdout
            with open(png, "rb") as f:
                assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    finally:
        shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    t = TestRunner()
    t.run(test_endpoints_exact_totals)
    t.run(test_ranges_open_loop_and_duration)
    t.run(test_multi_turn_and_slo)
    t.run(test_sharegpt_dataset)
    t.run(test_errors_by_kind)
    t.run(test_extra_headers)
    t.run(test_compare_and_cli_errors)
    t.run(test_plot)
    t.finish()
