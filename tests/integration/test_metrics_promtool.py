"""test_metrics_promtool.py — the router's and the workers' /metrics after real PD traffic,
errors included, pass `promtool check metrics` (Prometheus's own linter)."""

import os
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from harness import Cluster, SkipTest, TestRunner, get, post  # noqa: E402


def promtool_check(text, who):
    r = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True,
                       text=True, timeout=30)
    assert r.returncode == 0, f"promtool rejected {who} metrics:\n{r.stdout}{r.stderr}"


def test_promtool_accepts_router_and_worker_metrics():
    if shutil.which("promtool") is None:
        raise SkipTest("promtool not installed (Debian package prometheus; "
                       "scripts/install-deps.sh --test installs it)")
    with Cluster("promtool") as c:
        p, d, r = c.pd()
        msgs = [{"role": "user", "content": "metrics please"}]
        assert post(r.port, "/v1/chat/completions", {"messages": msgs, "max_tokens": 3}).status == 200
        assert post(r.port, "/v1/chat/completions", {"messages": "nope"}).status == 400
        assert get(r.port, "/nowhere").status == 404
        for proc, who in ((r, "router"), (p, "prefill"), (d, "decode")):
            res = get(proc.port, "/metrics")
            assert res.status == 200, (who, res.status)
            assert "text/plain" in res.headers.get("content-type", ""), res.headers
            assert "# TYPE" in res.text, who
            promtool_check(res.text, who)


if __name__ == "__main__":
    t = TestRunner()
    t.run(test_promtool_accepts_router_and_worker_metrics)
    t.finish()
