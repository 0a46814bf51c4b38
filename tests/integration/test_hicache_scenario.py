"""test_hicache_scenario.py — a smoke run of loadtest/scenarios/hicache.py: every configuration
gets its row with no failed request, round_robin with L3 finds history in the store that the
other prefill computed (an L3 hit ratio above 0), the kill-and-restart pass reports its row, and
the decode offload wrote to the store."""

import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import BUILD_DIR, TestRunner, binary  # noqa: E402
from test_scenarios import table_rows, col  # noqa: E402

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "loadtest",
                      "scenarios", "hicache.py")


def test_hicache_smoke():
    for b in ("baton", "baton-worker", "baton-bench", "baton-store"):
        binary(b)
    r = subprocess.run([sys.executable, SCRIPT, "--smoke", "--build-dir", BUILD_DIR],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=280)
    out = r.stdout
    assert r.returncode == 0, out
    header, rows = table_rows(out, "tiers on the same multi-turn workload")
    names = [row[0] for row in rows]
    assert names == [f"2P2D {p} {t}" for p in ("round_robin", "cache_aware")
                     for t in ("no tiers", "L2", "L2+L3")] + \
        ["2P2D cache_aware L2+L3 l3-cost 20%"], out
    for n in names:
        assert col(header, rows, "errors", n) == "0", out
    assert float(col(header, rows, "hit L3", "2P2D round_robin L2+L3")) > 0, out
    assert float(col(header, rows, "hit L3", "2P2D round_robin no tiers")) == 0, out
    header, rows = table_rows(out, "prefill-0 killed and restarted empty (round_robin, L2+L3)")
    assert len(rows) == 1 and rows[0][header.index("errors")].isdigit(), out
    header, rows = table_rows(out, "decode offload (1P1D)")
    assert float(col(header, rows, "L3 MiB out", "on")) > 0, out
    assert col(header, rows, "errors", "on") == "0", out


def main():
    r = TestRunner()
    r.run(test_hicache_smoke)
    r.finish()


if __name__ == "__main__":
    main()
