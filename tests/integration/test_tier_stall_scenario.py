"""test_tier_stall_scenario.py — a smoke run of loadtest/scenarios/tier_stall.py: probes and big
requests all answered, and the prefill's whole-page work (fills, checks, copies into rooms) done
on the thread pool, none on the loop."""

import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import BUILD_DIR, TestRunner, binary  # noqa: E402
from test_scenarios import col, table_rows  # noqa: E402

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "loadtest",
                      "scenarios", "tier_stall.py")


def test_tier_stall_smoke():
    for b in ("baton", "baton-worker"):
        binary(b)
    r = subprocess.run([sys.executable, SCRIPT, "--smoke", "--build-dir", BUILD_DIR],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=110)
    out = r.stdout
    assert r.returncode == 0, out
    header, rows = table_rows(out, "probe requests beside")
    assert [row[0] for row in rows] == ["this"], out
    assert col(header, rows, "errors", "this") == "0", out
    assert int(col(header, rows, "probes", "this")) > 0, out
    assert int(col(header, rows, "big reqs", "this")) >= 2, out
    assert float(col(header, rows, "page work s (loop)", "this")) == 0, out
    assert float(col(header, rows, "page work s (pool)", "this")) > 0, out


if __name__ == "__main__":
    t = TestRunner()
    t.run(test_tier_stall_smoke)
    t.finish()
