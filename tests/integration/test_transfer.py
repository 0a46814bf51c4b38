"""test_transfer.py — libbaton between real processes on loopback, through baton-xfer-peer.

The decode peer verifies every received byte against the pattern both peers derive from a seed,
and checks that pages it released (after the engine said no write can land anymore) are still
poisoned when it takes them again. So "corrupt=0 late=0" means: no misplaced, missing or late
byte. Covered: 1,000 concurrent rooms of mixed sizes over tcp and shm; a random abort storm with
page reuse; kill -9 of either peer mid-transfer with automatic recovery; a SIGSTOP blip
(missed heartbeats) of the same incarnation.
"""

import os
import re
import signal
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

STATS_RE = re.compile(r"(progress|result|final) role=(\w+) ok=(\d+) failed=(\d+) corrupt=(\d+) "
                      r"late=(\d+) open=(\d+) started=(\d+) bytes=(\d+) write_errors=(\d+) "
                      r"t_ms=(\d+) peak=(\d+) errors=(\S+)")


def peer_bin():
    return harness.binary("baton-xfer-peer")


def stats_lines(proc, kind=None):
    """Every stats line so far, parsed, oldest first."""
    out = []
    with proc._cond:
        lines = list(proc._lines)
    for line in lines:
        m = STATS_RE.search(line)
        if m and (kind is None or m.group(1) == kind):
            out.append({"kind": m.group(1), "ok": int(m.group(3)), "failed": int(m.group(4)),
                        "corrupt": int(m.group(5)), "late": int(m.group(6)),
                        "open": int(m.group(7)), "started": int(m.group(8)),
                        "bytes": int(m.group(9)), "peak": int(m.group(12)),
                        "errors": parse_errors(m.group(13))})
    return out


def parse_errors(s):
    if s == "-":
        return {}
    return {k: int(v) for k, v in (e.rsplit(":", 1) for e in s.split(","))}


def wait_stats(proc, pred, timeout, what):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for st in reversed(stats_lines(proc)):
            if pred(st):
                return st
        if not proc.alive():
            break
        time.sleep(0.1)
    raise AssertionError(f"{proc.name}: no stats line with {what} within {timeout}s\n{proc.tail()}")


def wait_exit(proc, timeout):
    try:
        return proc.p.wait(timeout=timeout)
    except Exception:  # noqa: BLE001
        raise AssertionError(f"{proc.name} did not finish within {timeout}s\n{proc.tail()}")


def start_prefill(cl, transports, name="prefill", port=0, extra=()):
    argv = [peer_bin(), "--role", "prefill", "--host", harness.HOST, "--port", str(port),
            "--transports", transports, "--hb-ms", "100", "--hb-misses", "5"] + list(extra)
    return cl.start(name, argv, wait=("bootstrap",))


def start_decode(cl, port, transports, name="decode", extra=()):
    argv = [peer_bin(), "--role", "decode", "--connect", f"{harness.HOST}:{port}",
            "--transports", transports, "--hb-ms", "100", "--hb-misses", "5"] + list(extra)
    return cl.start(name, argv, wait=())


def result_of(proc, timeout=120):
    m = proc.wait_log(r"result role=decode", timeout=timeout)
    assert m
    wait_exit(proc, 30)
    res = stats_lines(proc, "result")[-1]
    assert proc.p.returncode == 0, f"decode exited with {proc.p.returncode}"
    return res


def check_clean(res):
    assert res["corrupt"] == 0, f"corrupted rooms: {res}"
    assert res["late"] == 0, f"late writes into released pages: {res}"


# ---- 1,000 concurrent rooms ---------------------------------------------------------------

def rooms_1000(transport):
    with harness.Cluster(f"xfer-{transport}") as cl:
        p = start_prefill(cl, transport)
        d = start_decode(cl, p.ports["bootstrap"], transport,
                         extra=["--rooms", "1000", "--concurrency", "1000", "--pool-mb", "192",
                                "--max-layers", "3", "--max-ppl", "4", "--max-page", "32768"])
        res = result_of(d)
        check_clean(res)
        assert res["ok"] == 1000 and res["failed"] == 0, res
        assert res["bytes"] > 10 * 1024 * 1024, res
        assert res["peak"] >= 900, f"rooms were not concurrent: {res}"
        d.wait_log(rf"peer_up role=decode .* transport={transport}", timeout=5)
        # The prefill side saw the same 1,000 rooms end with DONE.
        st = wait_stats(p, lambda s: s["ok"] == 1000, 10, "ok=1000")
        assert st["failed"] == 0, st


def test_tcp_1000_concurrent_rooms():
    rooms_1000("tcp")


def test_shm_1000_concurrent_rooms():
    rooms_1000("shm")


def test_transport_fallback_order():
    """The decode side's order wins; a transport the prefill lacks falls back to the next."""
    with harness.Cluster("xfer-fallback") as cl:
        p = start_prefill(cl, "tcp")
        d = start_decode(cl, p.ports["bootstrap"], "shm,tcp", extra=["--rooms", "50"])
        res = result_of(d)
        check_clean(res)
        assert res["ok"] == 50, res
        d.wait_log(r"peer_up role=decode .* transport=tcp", timeout=5)


# ---- abort storm with page reuse ------------------------------------------------------------

def abort_storm(transport):
    with harness.Cluster(f"xfer-abort-{transport}") as cl:
        # Per-layer delay on the prefill side keeps writes in flight when the aborts hit.
        p = start_prefill(cl, transport, extra=["--write-delay-ms", "1"])
        # A small pool (128 slots of 64 KiB) forces constant page reuse.
        d = start_decode(cl, p.ports["bootstrap"], transport,
                         extra=["--rooms", "1000", "--concurrency", "16", "--pool-mb", "8",
                                "--max-layers", "6", "--max-ppl", "4", "--abort-pct", "60"])
        res = result_of(d)
        check_clean(res)
        assert res["ok"] + res["failed"] == 1000, res
        assert set(res["errors"]) <= {"BATON_EABORTED"}, res
        assert res["errors"].get("BATON_EABORTED", 0) >= 50, f"too few aborts landed: {res}"
        assert res["ok"] >= 100, res


def test_tcp_abort_storm_page_reuse():
    abort_storm("tcp")


def test_shm_abort_storm_page_reuse():
    abort_storm("shm")


# ---- kill -9 mid-transfer, recovery ------------------------------------------------------------

def kill_prefill(transport):
    with harness.Cluster(f"xfer-killp-{transport}") as cl:
        p = start_prefill(cl, transport, extra=["--write-delay-ms", "2"])
        port = p.ports["bootstrap"]
        d = start_decode(cl, port, transport,
                         extra=["--duration-s", "14", "--concurrency", "16", "--pool-mb", "64"])
        wait_stats(d, lambda s: s["ok"] >= 20, 20, "ok>=20 before the kill")
        p.kill()  # SIGKILL mid-transfer
        down = wait_stats(d, lambda s: s["errors"].get("BATON_EPEERDOWN", 0) > 0, 10,
                          "BATON_EPEERDOWN after the kill")
        ok_before = down["ok"]
        d.wait_log(r"peer_lost peer=", timeout=5)
        # Same port, new process: a new incarnation; the decode side reconnects on its own.
        p2 = start_prefill(cl, transport, name="prefill2", port=port,
                           extra=["--write-delay-ms", "2"])
        d.wait_log(r"peer_up role=decode .* reconnects=1 restarted=1", timeout=15)
        wait_stats(d, lambda s: s["ok"] >= ok_before + 20, 20, "rooms succeeding again")
        res = result_of(d, timeout=60)
        check_clean(res)
        assert set(res["errors"]) <= {"BATON_EPEERDOWN"}, res
        assert res["ok"] >= ok_before + 20, res
        assert p2.alive()


def test_tcp_kill_prefill_recovers():
    kill_prefill("tcp")


def test_shm_kill_prefill_recovers():
    kill_prefill("shm")


def kill_decode(transport):
    with harness.Cluster(f"xfer-killd-{transport}") as cl:
        # 20 ms per layer: the prefill side always holds rooms with writes still to do.
        p = start_prefill(cl, transport, extra=["--write-delay-ms", "20"])
        port = p.ports["bootstrap"]
        d = start_decode(cl, port, transport,
                         extra=["--duration-s", "30", "--concurrency", "16"])
        wait_stats(d, lambda s: s["ok"] >= 20, 20, "ok>=20 before the kill")
        d.kill()
        # The prefill side fails the dead peer's open rooms cleanly and forgets it.
        p.wait_log(r"peer_down role=prefill .* err=BATON_EPEERDOWN", timeout=10)
        wait_stats(p, lambda s: s["open"] == 0 and s["failed"] > 0, 10,
                   "open=0 with failed rooms after the decode died")
        # A new decode process is served at once.
        d2 = start_decode(cl, port, transport, name="decode2", extra=["--rooms", "200"])
        res = result_of(d2)
        check_clean(res)
        assert res["ok"] == 200, res
        assert p.alive()


def test_tcp_kill_decode_recovers():
    kill_decode("tcp")


def test_shm_kill_decode_recovers():
    kill_decode("shm")


# ---- a blip: missed heartbeats, same incarnation -----------------------------------------------

def test_tcp_heartbeat_blip_same_incarnation():
    with harness.Cluster("xfer-blip") as cl:
        p = start_prefill(cl, "tcp", extra=["--write-delay-ms", "2"])
        port = p.ports["bootstrap"]
        d = start_decode(cl, port, "tcp",
                         extra=["--duration-s", "14", "--concurrency", "8"])
        wait_stats(d, lambda s: s["ok"] >= 20, 20, "ok>=20 before the stop")
        p.signal(signal.SIGSTOP)
        try:
            # 100 ms x 5 missed: the decode side declares the peer down on its own.
            d.wait_log(r"peer_lost peer=.*heartbeats missed", timeout=10)
            down = wait_stats(d, lambda s: s["errors"].get("BATON_EPEERDOWN", 0) > 0, 10,
                              "rooms failed by the heartbeat timeout")
        finally:
            p.signal(signal.SIGCONT)
        d.wait_log(r"peer_up role=decode .* reconnects=1$", timeout=15)
        wait_stats(d, lambda s: s["ok"] >= down["ok"] + 20, 20, "rooms succeeding again")
        res = result_of(d, timeout=60)
        check_clean(res)
        assert set(res["errors"]) <= {"BATON_EPEERDOWN"}, res


def main():
    r = harness.TestRunner()
    only = set(sys.argv[1:])  # run a subset: test_transfer.py test_tcp_abort_storm_page_reuse
    for t in (test_tcp_1000_concurrent_rooms, test_shm_1000_concurrent_rooms,
              test_transport_fallback_order, test_tcp_abort_storm_page_reuse,
              test_shm_abort_storm_page_reuse, test_tcp_kill_prefill_recovers,
              test_shm_kill_prefill_recovers, test_tcp_kill_decode_recovers,
              test_shm_kill_decode_recovers, test_tcp_heartbeat_blip_same_incarnation):
        if not only or t.__name__ in only:
            r.run(t)
    r.finish()


if __name__ == "__main__":
    main()
