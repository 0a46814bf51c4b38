"""test_xfer_bench.py — smoke runs of baton-xfer-bench (loadtest/xfer/) and of its scenario
(loadtest/scenarios/transfer.py, transfer_layerwise.py): a second or two of small rooms over tcp and shm between two
processes, every received byte checked, and the scenario's pull vs push rows; the JSON parses and says so; a server whose pattern
differs is caught as corruption; bad options are refused cleanly.
"""

import json
import os
import re
import subprocess
import sys
import tempfile

from harness import BUILD_DIR, SkipTest, TestRunner, binary

SCEN_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "loadtest",
                        "scenarios")
SCEN = os.path.join(SCEN_DIR, "transfer.py")


def run(argv, timeout=120):
    return subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          timeout=timeout)


def test_smoke_json():
    with tempfile.TemporaryDirectory(prefix="xfer-bench-") as d:
        out = os.path.join(d, "r.json")
        r = run([binary("baton-xfer-bench"), "--smoke", "--json", out])
        assert r.returncode == 0, f"exit {r.returncode}\n{r.stdout}\n{r.stderr[-3000:]}"
        with open(out) as f:
            res = json.load(f)
    assert res["tool"] == "baton-xfer-bench"
    assert res["config"]["verify"] == "all"
    assert res["machine"]["nproc"] >= 1
    by_tp = {t["transport"]: t for t in res["transports"]}
    assert set(by_tp) == {"tcp", "shm", "rdma"}, by_tp.keys()
    # rdma: measured where a device exists, else reported as not measurable (not a failure).
    assert by_tp["rdma"]["status"] in ("ok", "unavailable"), by_tp["rdma"]
    if by_tp["rdma"]["status"] == "unavailable":
        assert by_tp["rdma"]["error"], by_tp["rdma"]
    names = [c["case"] for c in res["memcpy"]]
    assert names == ["4KiB", "64KiB", "1MiB", "kv-128"], names
    for c in res["memcpy"]:
        assert c["gbps"] > 0, c
    for name in ("tcp", "shm"):
        t = by_tp[name]
        assert t["status"] == "ok", t
        assert [c["case"] for c in t["cases"]] == names
        for c in t["cases"]:
            assert "error" not in c, c
            assert c["gbps"] > 0 and c["rooms_per_s"] > 0, c
            assert c["lat_us"]["n"] > 0 and c["lat_us"]["p50"] > 0, c
            assert c["lat_us"]["p99"] >= c["lat_us"]["p50"], c
            # --smoke verifies every room: each run's rooms plus the warm-up
            rooms = sum(x["rooms"] for x in c["runs"])
            assert c["verified_rooms"] >= rooms + 1, c
            assert c["verified_bytes"] >= c["verified_rooms"] * c["room_bytes"] > 0, c
            assert c["corrupt_rooms"] == 0, c
        kv = t["cases"][-1]
        # 128 tokens of the preset shape: 64 layers x 2 x 8 heads x 128 dim x 2 bytes per token
        assert kv["room_bytes"] == 128 * 64 * 2 * 8 * 128 * 2, kv
        assert kv["layers"] == 64 and kv["pages_per_layer"] == 4, kv
    assert res["corrupt_rooms"] == 0 and res["verified_bytes"] > 0


def test_wrong_bytes_detected():
    """A server that derives its pages from another seed: the driver must see bad bytes."""
    srv = subprocess.Popen([binary("baton-xfer-bench"), "--serve", "--transports", "tcp",
                            "--listen", "127.0.0.1:0", "--src-mb", "16", "--seed", "7"],
                           stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                           start_new_session=True)
    try:
        line = srv.stdout.readline()
        assert line.startswith("port="), line
        port = int(line.strip().split("=")[1])
        with tempfile.TemporaryDirectory(prefix="xfer-bench-") as d:
            out = os.path.join(d, "r.json")
            r = run([binary("baton-xfer-bench"), "--smoke", "--no-memcpy", "--transports", "tcp",
                     "--connect", f"127.0.0.1:{port}", "--sizes", "64K", "--kv-tokens", "none",
                     "--seed", "1", "--json", out])
            assert r.returncode == 3, f"exit {r.returncode}\n{r.stderr[-2000:]}"
            with open(out) as f:
                res = json.load(f)
        assert res["corrupt_rooms"] > 0, res
        assert "kv_corrupted" in r.stderr
    finally:
        srv.terminate()
        try:
            srv.wait(timeout=10)
        except subprocess.TimeoutExpired:
            srv.kill()
            srv.wait()


def test_bad_options():
    for argv in (["--sizes", "12Q"], ["--kv-shape", "64,8"], ["--transports", "udp"],
                 ["--lanes", "99"], ["--src-mb", "1", "--sizes", "4M"], ["stray"]):
        r = run([binary("baton-xfer-bench")] + argv, timeout=30)
        assert r.returncode == 2, (argv, r.returncode, r.stderr)
        assert "usage" in r.stderr or "baton-xfer-bench:" in r.stderr, (argv, r.stderr)


def test_scenario_smoke():
    r = run([sys.executable, SCEN, "--smoke", "--build-dir", BUILD_DIR], timeout=180)
    out = r.stdout
    assert r.returncode == 0, f"exit {r.returncode}\n{out}\n{r.stderr[-3000:]}"
    assert "== Scenario 5" in out
    assert "### tcp: throughput" in out and "### shm: throughput" in out, out
    assert "corrupt rooms: 0" in out, out
    if "iperf3 is not installed" not in out:
        assert "### iperf3 on loopback" in out, out
    # pull vs push (libbaton pull mode): both modes moved and verified every byte on each
    assert "### pull vs push" in out, out
    for tp in ("tcp", "shm"):
        assert re.search(rf"^\| {tp} +\|.*\| +[0-9.]+x \| +(met|BELOW) \|$", out, re.M), out
    assert re.search(r"pull vs push \(pull >= 90% of push\): \d/2 met", out), out


def test_layerwise_scenario_smoke():
    for b in ("baton", "baton-worker", "baton-bench", "baton-xfer-bench"):
        if not os.path.exists(os.path.join(BUILD_DIR, b)):
            raise SkipTest(f"{b} is not built in {BUILD_DIR}")
    r = run([sys.executable, os.path.join(SCEN_DIR, "transfer_layerwise.py"), "--smoke",
             "--build-dir", BUILD_DIR], timeout=180)
    out = r.stdout
    assert r.returncode == 0, f"exit {r.returncode}\n{out}\n{r.stderr[-3000:]}"
    rows = [ln for ln in out.splitlines() if ln.startswith("| 512")]
    # the regular baseline, then c=1 and c=4 with layer-wise off and on
    assert len(rows) == 5, out
    cells = [[c.strip() for c in ln.strip().strip("|").split("|")] for ln in rows]
    assert [c[2] for c in cells] == ["regular", "off", "on", "off", "on"], cells
    for c in cells:
        assert int(c[-2]) > 0 and c[-1] == "0", c  # completed, errors
        assert float(c[3]) > 0, c  # TTFT p50
    assert float(cells[0][9]) > 0, cells[0]  # one layer sent alone (baton-xfer-bench), ms
    # the c=1 layer-wise row compares itself with regular + one layer: a signed figure
    assert re.match(r"[+-]\d+\.\d \((met|MISSED)\)$", cells[2][10]), cells[2]
    assert "scenario 6 done: 0 failed requests" in out, out


if __name__ == "__main__":
    t = TestRunner()
    t.run(test_smoke_json)
    t.run(test_wrong_bytes_detected)
    t.run(test_bad_options)
    t.run(test_scenario_smoke)
    t.run(test_layerwise_scenario_smoke)
    t.finish()
