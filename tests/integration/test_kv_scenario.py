"""test_kv_scenario.py — a smoke run of loadtest/scenarios/kv_routing.py: precise, cache_aware,
consistent_hash and round_robin get their rows on the same token-id workload with no failed
request, precise's worker-reported hit ratio is above round_robin's (affinity from the workers'
own events), the vllm-nixl precise row sent some requests to the decode alone, and the probe's
figures are printed. With --l3 (2P2D on a baton-store): precise with and without the store's
events, both without a failed request, the credited run's router having followed the store."""

import os
import re
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import BUILD_DIR, TestRunner, binary  # noqa: E402
from test_scenarios import table_rows, col  # noqa: E402

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "loadtest",
                      "scenarios", "kv_routing.py")


def test_kv_routing_smoke():
    for b in ("baton", "baton-worker", "baton-bench"):
        binary(b)
    r = subprocess.run([sys.executable, SCRIPT, "--smoke", "--vllm-precise", "--build-dir",
                        BUILD_DIR], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       timeout=240)
    out = r.stdout
    assert r.returncode == 0, out
    header, rows = table_rows(out, "policies on the same multi-turn workload")
    names = [row[0] for row in rows]
    assert names == ["round_robin", "consistent_hash", "cache_aware", "precise",
                     "precise vllm-nixl", "precise vllm-nixl, both legs"], out
    for n in names:
        assert col(header, rows, "errors", n) == "0", out
    assert float(col(header, rows, "hit ratio", "precise")) > \
        float(col(header, rows, "hit ratio", "round_robin")), out
    assert float(col(header, rows, "decode alone", "precise vllm-nixl")) > 0, out
    assert float(col(header, rows, "decode alone", "precise vllm-nixl, both legs")) == 0, out
    assert "kvev_probe bench" in out, out


def test_kv_routing_l3_smoke():
    for b in ("baton", "baton-worker", "baton-bench", "baton-store"):
        binary(b)
    r = subprocess.run([sys.executable, SCRIPT, "--smoke", "--l3", "--no-ideal", "--workers",
                        "2", "--policies", "precise", "--build-dir", BUILD_DIR],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=240)
    out = r.stdout
    assert r.returncode == 0, out
    header, rows = table_rows(out, "policies on the same multi-turn workload")
    names = [row[0] for row in rows]
    assert names == ["precise", "precise, no L3 credit"], out
    for n in names:
        assert col(header, rows, "errors", n) == "0", out
    m = re.search(r"the store's \(L3\) (\d+) blocks", out)
    assert m and int(m.group(1)) > 0, out


def main():
    t = TestRunner()
    t.run(test_kv_routing_smoke)
    t.run(test_kv_routing_l3_smoke)
    t.finish()


if __name__ == "__main__":
    main()
