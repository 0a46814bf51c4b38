"""test_scenarios.py — a smoke run of each benchmark scenario (loadtest/scenarios/*.py --smoke):
the script starts its processes, runs a small load for a few seconds, tears down, exits 0 and
prints its table with a row per path and no failed request. Parts that need a missing optional
package (nginx) are reported as skipped.
"""

import os
import re
import subprocess
import sys

from harness import BUILD_DIR, SkipTest, TestRunner, binary, sanitized

SCEN_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "loadtest",
                        "scenarios")
_outputs = {}


def run_scenario(script, timeout=180):
    for b in ("baton", "baton-worker", "baton-bench"):
        binary(b)
    argv = [sys.executable, os.path.join(SCEN_DIR, script), "--smoke", "--build-dir", BUILD_DIR]
    r = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       timeout=timeout)
    out = r.stdout
    _outputs[script] = out
    if r.returncode != 0:
        raise AssertionError(f"{script} exited {r.returncode}:\n{out}")
    return out


def table_rows(out, title_part):
    """Rows (lists of cells) of the first table whose title contains title_part."""
    lines = out.splitlines()
    for i, ln in enumerate(lines):
        if ln.startswith("### ") and title_part in ln:
            rows = []
            for row in lines[i + 2:]:
                if not row.startswith("|"):
                    if rows:
                        break
                    continue
                cells = [c.strip() for c in row.strip().strip("|").split("|")]
                if set(row.replace("|", "").strip()) <= {"-"}:
                    continue  # the separator line
                rows.append(cells)
            return rows[0], rows[1:]
    raise AssertionError(f"no table titled '...{title_part}...' in:\n{out}")


def col(header, rows, name, path):
    for r in rows:
        if r[0] == path:
            return r[header.index(name)]
    raise AssertionError(f"no row {path!r} in {rows}")


def nginx_installed():
    return "SKIPPED: nginx is not installed" not in "".join(_outputs.values())


def test_router_overhead():
    out = run_scenario("router_overhead.py")
    assert "== Scenario 1" in out
    for title in ("non-streaming: E2E latency", "non-streaming: saturation", "streaming: TTFT",
                  "streaming: saturation"):
        header, rows = table_rows(out, title)
        paths = [r[0] for r in rows]
        assert paths[:2] == ["direct", "baton"], paths
        for r in rows:
            assert r[header.index("errors")] == "0", (title, r)
        if "saturation" in title:
            for p in paths:
                assert float(col(header, rows, "max req/s", p)) > 0
    # Baton in PD mode beside regular, one user at a time, and every proxy's CPU time
    # per request from /proc (a number, never '-', for each proxy row; '-' for direct).
    for title in ("non-streaming: E2E latency", "non-streaming: E2E latency, closed loop, "
                  "concurrency 1", "non-streaming: saturation", "streaming: TTFT at",
                  "streaming: TTFT, closed loop, concurrency 1", "streaming: saturation"):
        header, rows = table_rows(out, title)
        assert [r[0] for r in rows][:3] == ["direct", "baton", "baton-pd"], (title, rows)
        for r in rows:
            assert r[header.index("errors")] == "0", (title, r)
            cpu = r[header.index("CPU us/req")]
            if r[0] == "direct":
                assert cpu == "-", (title, r)
            else:
                assert float(cpu) >= 0, (title, r)
    if nginx_installed():
        for mode in ("non-streaming", "streaming"):
            header, rows = table_rows(out, f"{mode}: overhead ratios")
            names = [r[0] for r in rows]
            assert any("CPU/request" in n and "Baton PD / nginx" in n for n in names), rows
            assert any("added p50 at c=1, Baton PD / nginx" in n for n in names), rows
            for r in rows:
                assert r[header.index("nginx")] != "-", r  # nginx's side is always measured
    assert re.search(r"scenario 1 done: 0 failed requests", out), out


def test_pd_sweep():
    out = run_scenario("pd_sweep.py")
    assert "== Scenario 2" in out
    for topo in ("1P1D", "2P2D"):
        header, rows = table_rows(out, f"{topo}: streaming chat")
        assert rows, out
        for r in rows:
            assert r[header.index("errors")] == "0", r
            # Streaming through PD: a TTFT and a TPOT were measured (not "-").
            assert float(r[header.index("TTFT p50")]) > 0, r
            assert float(r[header.index("TPOT p50")]) > 0, r
    assert "scenario 2 done: 0 failed requests" in out


def test_idle_conns():
    out = run_scenario("idle_conns.py")
    assert "== Scenario 3" in out
    if "SKIPPED: the descriptor limit" in out:
        raise SkipTest("descriptor limit too low for the smoke run")
    header, rows = table_rows(out, "idle keep-alive connections")
    conns = int(col(header, rows, "conns", "baton"))
    assert conns > 0
    assert col(header, rows, "alive checked", "baton") != "0"
    # RSS was read from /proc (a real number, not a placeholder).
    float(col(header, rows, "RSS after MiB", "baton"))
    assert "scenario 3 done" in out


def test_long_prompts():
    out = run_scenario("long_prompts.py")
    assert "== Scenario 4" in out
    header, rows = table_rows(out, "word prompts")
    paths = [r[0] for r in rows]
    assert paths[:3] == ["direct", "baton (regular)", "baton (PD 1P1D)"], paths
    for r in rows:
        assert r[header.index("errors")] == "0", r
        assert int(r[header.index("requests")]) > 0, r
    assert "scenario 4 done: 0 failed requests" in out


def test_priority():
    """The priority scenario's smoke: every run has its row, no interactive request failed
    (none is shed: the figures against the 1.5x target are the full run's, docs/BENCHMARKS.md)."""
    out = run_scenario("priority.py")
    header, rows = table_rows(out, "interactive TTFT under a bulk flood")
    names = [r[0] for r in rows]
    assert names == ["interactive alone", "interactive, classes, reserve 50%",
                     "interactive, classes, reserve 25%", "interactive, no classes"], names
    for r in rows:
        assert int(r[header.index("completed")]) > 0, r
    for with_classes in rows[1:3]:
        assert with_classes[header.index("failed")] == "0", with_classes
        assert with_classes[header.index("shed")] == "0", with_classes
        assert int(with_classes[header.index("flood shed")]) > 0, with_classes  # overloaded
    assert "priority done: 0 failed interactive requests" in out, out


def test_nginx_columns():
    if not nginx_installed():
        raise SkipTest("nginx is not installed: the nginx columns were skipped "
                       "(scripts/install-bench-deps.sh)")
    out = _outputs.get("router_overhead.py", "")
    header, rows = table_rows(out, "non-streaming: saturation")
    assert "nginx" in [r[0] for r in rows]
    header, rows = table_rows(_outputs.get("long_prompts.py", ""), "word prompts")
    assert "nginx" in [r[0] for r in rows]
    # baton-bench's own ceiling, against canned answers, parsed without an error.
    header, rows = table_rows(out, "baton-bench's own ceiling")
    assert [r[0] for r in rows] == ["non-streaming", "streaming"], rows
    for r in rows:
        assert r[header.index("errors")] == "0" and float(r[header.index("req/s")]) > 0, r



def test_allocs():
    """The router's heap calls per request under the LD_PRELOAD counter."""
    if not os.path.exists(os.path.join(BUILD_DIR, "libbaton_allocs.so")):
        raise SkipTest("libbaton_allocs.so is not built (left out of sanitizer builds)")
    out = run_scenario("allocs.py")
    header, rows = table_rows(out, "router heap calls per request")
    got = {(r[0], r[1]): r for r in rows}
    for key in (("pd", "json"), ("pd", "stream"), ("regular", "json"), ("regular", "stream")):
        assert key in got, (key, rows)
    for r in rows:
        allocs = float(r[header.index("allocs/req")])
        new_blocks = float(r[header.index("malloc")]) + float(r[header.index("calloc")])
        assert allocs > 0, r  # the shim counted
        # every block a request allocates is freed again: nothing leaks per request
        assert float(r[header.index("free/req")]) >= new_blocks - 0.5, r
    # counts, not times: the pooled request structs and buffers keep these below the 39 and 60
    # heap calls per request of a router that parsed bodies with jansson (its parse is most of
    # the rest)
    assert float(got[("regular", "json")][header.index("allocs/req")]) <= 34, got
    assert float(got[("pd", "json")][header.index("allocs/req")]) <= 50, got
    assert "allocs done: 0 failed requests" in out, out


def profile_tables(out, unit):
    """{case: rows} of profile.py's tables; every value cell is a number."""
    tables = {}
    for case in ("pd-stream", "regular-long"):
        header, rows = table_rows(out, f"{case}: router")
        assert header[1] == f"B {unit}", header
        assert len(rows) >= 5, (case, rows)
        for r in rows:
            assert float(r[1].replace(",", "")) > 0, (case, r)
        tables[case] = rows
    assert re.search(r"profile done: 0 failed requests", out), out
    return tables


def test_profile_perf():
    """profile.py --tool perf samples the router under load and prints its top
    symbols; the long-prompt case is no longer dominated by a jansson parse."""
    import shutil
    if not shutil.which("perf"):
        raise SkipTest("perf is not installed (linux-perf)")
    probe = subprocess.run(["perf", "record", "-o", os.devnull, "--", "true"],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if probe.returncode != 0:
        raise SkipTest(f"perf cannot record here: {probe.stdout.strip()[:200]}")
    out = run_scenario("profile.py")
    tables = profile_tables(out, "self %")
    # Since the one-pass scanner no jansson tree is built for a request: before it, jansson was
    # 72-82 % of a long prompt's router CPU (docs/BENCHMARKS.md), so it topped this table.
    long_rows = tables["regular-long"]
    assert not any("jansson" in r[0] and float(r[1]) > 20 for r in long_rows), long_rows
    assert re.search(r"by binary, % of samples \(us/request\): .*kernel", out), out


def test_profile_callgrind():
    """profile.py --tool callgrind counts the router's instructions per request,
    by function, deterministically."""
    import shutil
    if not shutil.which("valgrind") or not shutil.which("callgrind_control"):
        raise SkipTest("valgrind is not installed")
    if sanitized():
        raise SkipTest("a sanitizer build cannot run under valgrind")
    for b in ("baton", "baton-worker", "baton-bench"):
        binary(b)
    argv = [sys.executable, os.path.join(SCEN_DIR, "profile.py"), "--smoke", "--tool",
            "callgrind", "--build-dir", BUILD_DIR]
    r = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stdout
    tables = profile_tables(r.stdout, "instr/req")
    total = re.search(r"B: ([\d,]+) instructions/request", r.stdout)
    assert total and int(total.group(1).replace(",", "")) > 10000, r.stdout
    # The functions are the router's own and its libraries', never the thread's entry points.
    names = [row[0] for rows in tables.values() for row in rows]
    assert "thread_main" not in names and not any(n.startswith("clone") for n in names), names


def test_store_failover():
    binary("baton-store")
    out = run_scenario("store_failover.py")
    if "SKIPPED: etcd is not installed" in out:
        raise SkipTest("etcd is not installed")
    header, rows = table_rows(out, "kill -9 of the leading master")
    assert rows and all(r[header.index("not read back")] == "0" for r in rows), rows
    assert int(rows[0][header.index("restored objects")]) >= 4, rows
    header, rows = table_rows(out, "the operation log's cost")
    assert all(r[header.index("corrupted")] == "0" for r in rows), rows
    assert int(col(header, rows, "log txns", "4K")) == 0  # the first 4K row: no registry


def test_store():
    """baton-store's scenario: a throughput row per transport, node count and size with nothing
    failed or corrupted, the latency table, the metadata figures."""
    binary("baton-store")
    out = run_scenario("store.py")
    header, rows = table_rows(out, "put / get throughput")
    assert len(rows) == 8, rows  # tcp, shm x 1, 2 nodes x 64K, 1M
    for r in rows:
        assert r[header.index("failed")] == "0" and r[header.index("corrupted")] == "0", r
        assert float(r[header.index("get GB/s")]) > 0, r
    header, rows = table_rows(out, "4 KiB get latency")
    assert [r[0] for r in rows] == ["tcp", "shm"], rows
    header, rows = table_rows(out, "master metadata")
    # glibc's mallinfo2 does not see a sanitizer's allocator: the heap row reads 0 there
    measured = [r for r in rows if not (sanitized() and r[0].startswith("heap bytes"))]
    assert len(measured) >= 4 and all(r[2] not in ("-", "0") for r in measured), rows
    assert "objects corrupted: 0" in out


if __name__ == "__main__":
    t = TestRunner()
    t.run(test_router_overhead)
    t.run(test_pd_sweep)
    t.run(test_idle_conns)
    t.run(test_long_prompts)
    t.run(test_priority)
    t.run(test_nginx_columns)
    t.run(test_allocs)
    t.run(test_profile_perf)
    t.run(test_profile_callgrind)
    t.run(test_store_failover)
    t.run(test_store)
    t.finish()
