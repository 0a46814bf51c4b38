"""test_cache_scenario.py — a smoke run of loadtest/scenarios/cache_routing.py: every policy
gets its row on the same workload with no failed request, cache_aware's worker-reported hit
ratio is above round_robin's (its affinity does not depend on timing: the load guard cannot
trip at this load), and the kill-and-restart pass reports its row."""

import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import BUILD_DIR, TestRunner, binary  # noqa: E402
from test_scenarios import table_rows, col  # noqa: E402

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "loadtest",
                      "scenarios", "cache_routing.py")


def test_cache_routing_smoke():
    for b in ("baton", "baton-worker", "baton-bench"):
        binary(b)
    r = subprocess.run([sys.executable, SCRIPT, "--smoke", "--build-dir", BUILD_DIR],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=240)
    out = r.stdout
    assert r.returncode == 0, out
    header, rows = table_rows(out, "policies on the same multi-turn workload")
    names = [row[0] for row in rows]
    assert names == ["round_robin", "power_of_two", "least_load", "consistent_hash",
                     "cache_aware", "cache_aware guard 2/150%"], out
    for n in names:
        assert col(header, rows, "errors", n) == "0", out
    hit_ca = float(col(header, rows, "hit ratio", "cache_aware"))
    hit_rr = float(col(header, rows, "hit ratio", "round_robin"))
    assert hit_ca > hit_rr, out
    header, rows = table_rows(out, "killed and restarted")
    # a request caught by the kill may fail after its retries: the count is reported, not 0
    assert len(rows) == 1 and rows[0][header.index("errors")].isdigit(), out
    assert rows[0][header.index("predicted / reported")] != "", out


def main():
    t = TestRunner()
    t.run(test_cache_routing_smoke)
    t.finish()


if __name__ == "__main__":
    main()
