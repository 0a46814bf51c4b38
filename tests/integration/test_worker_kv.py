"""test_worker_kv.py — the KV hand-off between baton-worker prefill and decode through libbaton:
exact text and exact byte counts over tcp and shm, rdma falling back, layer-wise on and off,
model presets, corrupted KV caught (kv_corrupted), the page pool (too big, queueing), kill -9 of
either worker mid-transfer with clean failures and automatic recovery, bad command lines, and the
authenticated bootstrap (--kv-secret-file): matching secrets work, a wrong or missing one is
refused and counted in baton_kv_auth_failures_total while the good pair carries on."""

import json
import os
import random
import re
import socket
import subprocess
import sys
import threading
import time
import zlib

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from harness import Cluster, get, post, sse_events, wait_until  # noqa: E402
import simtext  # noqa: E402

FAST = ("--prefill-us-per-token", "10", "--decode-us-per-token", "200")


def room():
    return random.randrange(0, 2**63)


def with_boot(body, p, rooms=None):
    b = dict(body)
    b["bootstrap_host"] = harness.HOST
    b["bootstrap_port"] = p.wait_port("bootstrap")
    b["bootstrap_room"] = room() if rooms is None else rooms
    return b


def dual(p, d, path, body, timeout=30.0):
    """Sends the same body to prefill and decode concurrently; returns (prefill, decode)."""
    out = {}

    def go(name, w):
        try:
            out[name] = post(w.port, path, body, timeout=timeout)
        except Exception as e:  # noqa: BLE001 - reported below
            out[name] = e

    ts = [threading.Thread(target=go, args=(k, w)) for k, w in (("p", p), ("d", d))]
    for t in ts:
        t.start()
    for t in ts:
        t.join(timeout + 5)
    for k in ("p", "d"):
        if isinstance(out.get(k), Exception) or k not in out:
            raise AssertionError(f"{k}: {out.get(k)!r}")
    return out["p"], out["d"]


def metric(port, name):
    """The value of one sample (name with its labels, as rendered), or 0 when absent."""
    for line in get(port, "/metrics").text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    return 0.0


def check_pair(p, d, prompt, n=7, preset="tiny"):
    """One /generate and one streamed chat through the pair: exact text, exact KV bytes."""
    before = metric(d.port, 'baton_kv_bytes_total{direction="received"}')
    body = with_boot({"text": prompt, "sampling_params": {"max_new_tokens": n}}, p)
    rp, rd = dual(p, d, "/generate", body)
    assert rp.status == 200 and rd.status == 200, (rp.text, rd.text)
    want = simtext.complete_text(prompt, n)
    assert rd.json()["text"] == want.text and rd.json()["output_ids"] == want.ids, rd.text
    msgs = [{"role": "user", "content": prompt}]
    body = with_boot({"messages": msgs, "max_tokens": n, "stream": True}, p)
    rp, rd = dual(p, d, "/v1/chat/completions", body)
    assert rd.status == 200, rd.text
    ev = sse_events(rd.body)
    text = "".join(json.loads(e)["choices"][0]["delta"].get("content", "")
                   for e in ev[:-1] if json.loads(e)["choices"])
    assert text == simtext.complete_chat(msgs, n).text and ev[-1] == "[DONE]"
    # token-id prompts: the ids are the tokens (huge ids included); derived from the prompt so
    # that a second pair check on the same decode finds nothing in its prefix cache (every KV
    # byte must move, as asserted below)
    h = zlib.crc32(prompt.encode()) & 0xFFFF
    ids = [[1 + h, 2, 3], [2**62, h, 77] * 7]
    body = with_boot({"prompt": ids, "max_tokens": n}, p, [room(), room()])
    body["bootstrap_host"] = [harness.HOST] * 2
    body["bootstrap_port"] = [p.wait_port("bootstrap")] * 2
    rp, rd = dual(p, d, "/v1/completions", body)
    assert rd.status == 200, rd.text
    assert [ch["text"] for ch in rd.json()["choices"]] == \
        [simtext.complete_ids(x, n).text for x in ids], rd.text
    # every byte of all four prompts' KV went through, nothing more
    moved = metric(d.port, 'baton_kv_bytes_total{direction="received"}') - before
    expect = simtext.kv_room_bytes(simtext.count_words(prompt), preset) + \
        simtext.kv_room_bytes(simtext.count_words(simtext.chat_prompt(msgs)), preset) + \
        sum(simtext.kv_room_bytes(len(x), preset) for x in ids)
    assert moved == expect, (moved, expect)


def test_transports():
    """The same exact text over tcp and over shm; the engine says which one carried it."""
    prompt = " ".join(f"word{i}" for i in range(40))  # 40 tokens: 3 pages per layer
    for tp in ("tcp", "shm"):
        with Cluster(f"kv-{tp}") as c:
            p = c.worker("prefill", *FAST, "--transport", tp)
            d = c.worker("decode", *FAST, "--transport", tp)
            check_pair(p, d, prompt)
            d.wait_log(rf"peer_up .*transport={tp}\b")
            info = get(d.port, "/get_server_info").json()
            assert info["kv"]["transport"] == tp and info["kv"]["layers"] == 4, info
            # decode verified every page; prefill acknowledged every byte
            sent = metric(p.port, 'baton_kv_bytes_total{direction="sent"}')
            got = metric(d.port, 'baton_kv_bytes_total{direction="received"}')
            assert sent == got > 0, (sent, got)
            assert metric(d.port, "baton_kv_corrupted_total") == 0
            # libbaton announced the bootstrap listener exactly once, in the harness's form
            lines = [ln for ln in open(p.log_path) if "_listening addr=" in ln]
            assert len(lines) == 1 and re.search(r" bootstrap_listening addr=127\.0\.0\.1:%d\b"
                                                 % p.wait_port("bootstrap"), lines[0]), lines


def test_rdma_falls_back():
    """rdma first: without usable devices the engine logs why and runs the next transport."""
    with Cluster("kv-rdma") as c:
        p = c.worker("prefill", *FAST, "--transport", "rdma,tcp")
        d = c.worker("decode", *FAST, "--transport", "rdma,tcp")
        check_pair(p, d, "rdma or not, the text is the same")
        m = d.wait_log(r"kv_ready role=decode transports=(\S+)")
        if m.group(1) == "tcp":
            d.wait_log(r"transport_unavailable transport=rdma")


def test_layerwise_on_off():
    """Layer by layer or all at once: the same text; the prefill writes per layer only when on."""
    prompt = "layer wise hand off overlaps the transfer with the rest of prefill " * 3
    slow = ("--prefill-us-per-token", "2000", "--decode-us-per-token", "200")
    texts = {}
    for mode in ("on", "off"):
        with Cluster(f"kv-layerwise-{mode}") as c:
            p = c.worker("prefill", *slow, "--layerwise", mode, "--log-level", "debug")
            d = c.worker("decode", *slow)
            body = with_boot({"text": prompt, "sampling_params": {"max_new_tokens": 12}}, p)
            rp, rd = dual(p, d, "/generate", body)
            assert rp.status == 200 and rd.status == 200, (rp.text, rd.text)
            texts[mode] = rd.json()["text"]
            # the timing model's layer events reached the engine as separate writes (on), or
            # one write of the whole room after compute (off)
            # (the log file is filled by the harness's reader thread: wait for the last write's
            # line before reading it whole)
            p.wait_log(r"kv_write room=\d+ layers=\d+-3\b")
            logs = open(p.log_path).read()
            writes = re.findall(r"kv_write room=\d+ layers=(\d+)-(\d+)", logs)
            if mode == "on":
                # (a late loop may report several layers at once: their fills can finish in any
                # order, but each is still its own write)
                assert sorted((int(a), int(b)) for a, b in writes) == [(i, i) for i in range(4)], \
                    writes
            else:
                assert writes == [("0", "3")], writes
                # everything went out after compute: the whole transfer is "tail"
                xfer = metric(p.port, "baton_kv_transfer_seconds_sum")
                tail = metric(p.port, "baton_kv_transfer_tail_seconds_sum")
                assert tail >= xfer > 0, (tail, xfer)
            assert get(p.port, "/get_server_info").json()["kv"]["layerwise"] == (mode == "on")
    want = simtext.complete_text(prompt, 12).text
    assert texts["on"] == texts["off"] == want, texts


def test_presets_and_shape_mismatch():
    """A real model's shape moves 128 KiB per token; a decode with another shape refuses."""
    with Cluster("kv-presets") as c:
        args = ("--model-preset", "llama3-8b", "--kv-pool-tokens", "1024")
        p = c.worker("prefill", *FAST, *args)
        d = c.worker("decode", *FAST, *args)
        check_pair(p, d, "a prompt of eight words for a big model", preset="llama3-8b")
        d2 = c.worker("decode", *FAST)  # tiny
        body = with_boot({"text": "shapes differ", "sampling_params": {"max_new_tokens": 2}}, p)
        rp, rd = dual(p, d2, "/generate", body)
        assert rd.status == 500 and rd.json()["error"]["code"] == "bootstrap_mismatch", rd.text
        assert rp.status == 500 and rp.json()["error"]["code"] == "bootstrap_mismatch", rp.text
        assert "layers" in rp.json()["error"]["message"], rp.text
        assert metric(d2.port, 'baton_kv_room_failures_total{reason="mismatch"}') == 1


def test_corrupted_kv():
    """The prefill flips one byte of every 2nd room (test-only flag): the decode refuses those
    with kv_corrupted before streaming anything, and the others are exact. The prompts span
    several pages, so fills and checks split into several jobs must still flip and find the
    byte exactly once."""
    with Cluster("kv-corrupt") as c:
        p = c.worker("prefill", *FAST, "--fault-corrupt-kv-every", "2")
        d = c.worker("decode", *FAST)
        results = []
        for i in range(4):
            # several pages per layer: fills and the last layer's check run split into jobs
            prompt = f"corruption must not pass silently {i} " + "again " * 150
            stream = i % 2 == 1
            body = with_boot({"text": prompt, "stream": stream,
                              "sampling_params": {"max_new_tokens": 5}}, p)
            rp, rd = dual(p, d, "/generate", body)
            assert rp.status == 200, rp.text  # the prefill does not know
            results.append((prompt, rd))
        for i, (prompt, rd) in enumerate(results):
            if i % 2 == 1:  # the 2nd and 4th rooms
                assert rd.status == 500, rd.text
                assert rd.headers["content-type"].startswith("application/json"), rd.headers
                e = rd.json()["error"]
                assert e["code"] == "kv_corrupted" and "layer 3, page 0" in e["message"], e
            else:
                assert rd.status == 200 and rd.json()["text"] == \
                    simtext.complete_text(prompt, 5).text, rd.text
        assert metric(d.port, "baton_kv_corrupted_total") == 2
        assert metric(d.port, 'baton_kv_room_failures_total{reason="kv_corrupted"}') == 2
        assert metric(d.port, 'baton_kv_rooms_total{result="ok"}') == 2
        p.wait_log(r"fault_injected kind=corrupt_kv")
        d.wait_log(r"kv_corrupted room=\d+ layer=3 page=0")


def open_request(port, body):
    """Sends a request on a socket left open (the caller closes it to cancel the request)."""
    s = socket.create_connection((harness.HOST, port), timeout=10)
    data = json.dumps(body).encode()
    s.sendall(b"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Content-Length: " + str(len(data)).encode() + b"\r\n\r\n" + data)
    return s


def test_pool():
    """A prompt bigger than the whole pool gets 503 at once; a request that fits waits for pages
    (FIFO) until another request lets go of its pages, then succeeds; all pages come back."""
    with Cluster("kv-pool") as c:
        p = c.worker("prefill", *FAST)
        d = c.worker("decode", *FAST, "--kv-pool-tokens", "32")  # 2 pages of 16 tokens
        big = " ".join(["w"] * 40)  # 3 pages
        r = post(d.port, "/generate", with_boot({"text": big}, p), timeout=20)
        assert r.status == 503 and r.json()["error"]["code"] == "kv_pool_exhausted", r.text
        assert "raise --kv-pool-tokens" in r.json()["error"]["message"]
        # A and B (decode only: their prefill never comes) hold one page each
        holders = [open_request(d.port, with_boot({"text": f"holder {i}"}, p)) for i in range(2)]
        try:
            wait_until(lambda: metric(d.port, 'baton_kv_pool_slots{state="used"}') == 2,
                       what="two pages held")
            out = {}
            body = with_boot({"text": "waits for a page", "sampling_params": {"max_new_tokens": 4}},
                             p)
            t = threading.Thread(target=lambda: out.setdefault("pd", dual(p, d, "/generate", body)))
            t.start()
            wait_until(lambda: metric(d.port, "baton_kv_pool_waiting") == 1,
                       what="a request waiting for pages")
            assert "pd" not in out
            holders[0].close()  # A's client leaves: its offer is aborted, then its page is free
            t.join(30)
            rp, rd = out["pd"]
            assert rd.status == 200 and rd.json()["text"] == \
                simtext.complete_text("waits for a page", 4).text, rd.text
            assert metric(d.port, 'baton_kv_pool_slots{state="used"}') == 1  # B's
        finally:
            for h in holders:
                h.close()
        wait_until(lambda: metric(d.port, 'baton_kv_pool_slots{state="used"}') == 0,
                   what="every page back")
        assert metric(d.port, 'baton_kv_pool_slots{state="free"}') == 2
        assert metric(d.port, 'baton_kv_room_failures_total{reason="canceled"}') == 2
        assert metric(p.port, 'baton_kv_pool_slots{state="used"}') == 0


def test_abort_storm_page_reuse():
    """Decode clients leave mid-transfer while a small pool hands the same pages to the next
    rooms: a write of an aborted room landing in reused pages would show as kv_corrupted. None
    may, every finished request is exact, and every page comes back."""
    with Cluster("kv-storm") as c:
        timing = ("--prefill-us-per-token", "1000", "--decode-us-per-token", "500")
        p = c.worker("prefill", *timing)
        d = c.worker("decode", *timing, "--kv-pool-tokens", "64")  # 4 slots, reused constantly
        rng = random.Random(os.getpid())
        results = []
        lock = threading.Lock()

        def one(i):
            prompt = " ".join(f"storm{i}w{k}" for k in range(12 + i % 9))  # 1 or 2 pages
            body = with_boot({"text": prompt, "sampling_params": {"max_new_tokens": 3}}, p)
            if i % 2:
                # the client leaves after 0-25 ms (the router then cancels the prefill too)
                sp = open_request(p.port, body)
                sd = open_request(d.port, body)
                time.sleep(rng.random() * 0.025)
                sd.close()
                time.sleep(0.2)
                sp.close()
                with lock:
                    results.append((i, prompt, None, None))
                return
            pres = {}
            pt = threading.Thread(target=lambda: pres.setdefault(
                "r", post(p.port, "/generate", body, timeout=30)))
            pt.start()
            rd = post(d.port, "/generate", body, timeout=30)
            pt.join(35)
            with lock:
                results.append((i, prompt, rd, pres.get("r")))

        for batch in range(6):
            ts = [threading.Thread(target=one, args=(batch * 4 + k,)) for k in range(4)]
            for t in ts:
                t.start()
            for t in ts:
                t.join(60)
        assert len(results) == 24
        for i, prompt, rd, rp in results:
            if rd is not None:
                assert rp is not None and rp.status == 200, (i, rp and rp.text)
                assert rd.status == 200 and rd.json()["text"] == \
                    simtext.complete_text(prompt, 3).text, (i, rd.text)
        # rooms really were abandoned while open (12 clients left, nearly all after the offer)
        assert metric(d.port, 'baton_kv_room_failures_total{reason="canceled"}') >= 1
        assert metric(d.port, "baton_kv_corrupted_total") == 0
        assert metric(d.port, "baton_kv_writes_rejected_total") == 0
        wait_until(lambda: metric(d.port, 'baton_kv_pool_slots{state="used"}') == 0,
                   what="every decode page back")
        wait_until(lambda: metric(p.port, 'baton_kv_pool_slots{state="used"}') == 0,
                   what="every prefill page back")


def slow_request(p, d, prompt, out):
    """Starts one PD request in the background; out gets ("p"|"d", response, seconds)."""
    body = with_boot({"text": prompt, "sampling_params": {"max_new_tokens": 3}}, p)

    def go(name, w):
        t0 = time.monotonic()
        try:
            out[name] = (post(w.port, "/generate", body, timeout=60), time.monotonic())
        except Exception as e:  # noqa: BLE001
            out[name] = (e, time.monotonic())

    ts = [threading.Thread(target=go, args=(k, w)) for k, w in (("p", p), ("d", d))]
    for t in ts:
        t.start()
    return ts


def wait_mid_transfer(p):
    """Until the prefill has written at least one layer (layer-wise) of a room still open."""
    wait_until(lambda: metric(p.port, 'baton_kv_bytes_total{direction="sent"}') > 0,
               timeout=20, what="first layer written")
    assert get(p.port, "/get_load").json()[0]["num_reqs"] == 1


# 100 words at 20 ms a token: 2 s of prefill, a layer every 500 ms
SLOW_PROMPT = " ".join(f"slow{i}" for i in range(100))
SLOW = ("--prefill-us-per-token", "20000", "--decode-us-per-token", "200")


def test_prefill_killed():
    """kill -9 of the prefill mid-transfer: the decode's request fails at once with a clean
    error; the prefill restarted on the same ports is found again without any manual step."""
    with Cluster("kv-kill-prefill") as c:
        p = c.worker("prefill", *SLOW, name="prefill-1")
        d = c.worker("decode", *SLOW)
        http_port, boot_port = p.port, p.wait_port("bootstrap")
        out = {}
        ts = slow_request(p, d, SLOW_PROMPT, out)
        wait_mid_transfer(p)
        t_kill = time.monotonic()
        p.kill()
        for t in ts:
            t.join(30)
        rd, t_done = out["d"]
        assert not isinstance(rd, Exception), rd
        assert rd.status == 502, rd.text
        assert rd.json()["error"]["code"] == "bootstrap_peer_down", rd.text
        assert t_done - t_kill < 10, t_done - t_kill  # prompt, not a bootstrap timeout (30 s)
        assert metric(d.port, 'baton_kv_room_failures_total{reason="peer_down"}') == 1
        assert metric(d.port, 'baton_kv_pool_slots{state="used"}') == 0  # pages came back
        # the same ports again, a new incarnation
        p2 = c.worker("prefill", *FAST, "--port", str(http_port), "--bootstrap-port",
                      str(boot_port), name="prefill-2")
        assert p2.wait_port("bootstrap") == boot_port
        wait_until(lambda: metric(d.port, 'baton_kv_peers{state="up"}') == 1, timeout=15,
                   what="decode reconnected")
        assert metric(d.port, "baton_kv_reconnects_total") >= 1
        d.wait_log(r"peer_up .*restarted=1")
        body = with_boot({"text": "after the restart", "sampling_params": {"max_new_tokens": 4}},
                         p2)
        rp, rd = dual(p2, d, "/generate", body)
        assert rd.status == 200 and rd.json()["text"] == \
            simtext.complete_text("after the restart", 4).text, rd.text


def test_decode_killed():
    """kill -9 of the decode mid-transfer: the prefill's request fails cleanly and promptly, its
    source pages come back, and the next pair (a new decode) works."""
    with Cluster("kv-kill-decode") as c:
        p = c.worker("prefill", *SLOW)
        d = c.worker("decode", *SLOW, name="decode-1")
        out = {}
        ts = slow_request(p, d, SLOW_PROMPT, out)
        wait_mid_transfer(p)
        t_kill = time.monotonic()
        d.kill()
        for t in ts:
            t.join(30)
        rp, t_done = out["p"]
        assert not isinstance(rp, Exception), rp
        assert rp.status == 502, rp.text
        assert rp.json()["error"]["code"] in ("bootstrap_peer_down", "bootstrap_aborted"), rp.text
        assert t_done - t_kill < 10, t_done - t_kill
        wait_until(lambda: metric(p.port, 'baton_kv_pool_slots{state="used"}') == 0,
                   timeout=10, what="source pages back")
        d2 = c.worker("decode", *FAST, name="decode-2")
        body = with_boot({"text": "a new decode", "sampling_params": {"max_new_tokens": 4}}, p)
        rp, rd = dual(p, d2, "/generate", body)
        assert rp.status == 200 and rd.status == 200, (rp.text, rd.text)
        assert rd.json()["text"] == simtext.complete_text("a new decode", 4).text


def test_bad_flags():
    """Bad model or transport options are refused at start with a message, exit status 2."""
    exe = harness.binary("baton-worker")
    for args, what in ((["--transport", "carrier-pigeon"], "--transport"),
                       (["--transport", "tcp,tcp"], "--transport"),
                       (["--model-preset", "huge"], "--model-preset"),
                       (["--layers", "0"], "--layers"),
                       (["--dtype-bytes", "9"], "--dtype-bytes"),
                       (["--layerwise", "maybe"], "--layerwise"),
                       (["--head-dim", "65536", "--kv-heads", "1024"], "model shape"),
                       (["--kv-pool-tokens", "3"], "--kv-pool-tokens")):
        r = subprocess.run([exe, "--mode", "decode", "--port", "0", *args],
                           capture_output=True, timeout=20)
        assert r.returncode == 2, (args, r.returncode, r.stderr)
        assert what.encode() in r.stderr, (args, r.stderr)
    h = subprocess.run([exe, "--help"], capture_output=True, timeout=20)
    assert h.returncode == 0 and b"--model-preset" in h.stdout and b"--transport" in h.stdout
    assert b"fault-corrupt" not in h.stdout  # the test-only flag stays out of the help


def write_secret(dirname, name, text):
    path = os.path.join(dirname, name)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text + "\n")
    return path


def test_kv_secret():
    """Workers sharing --kv-secret-file exchange KV exactly as before; a decode with another
    secret, or none, gets no room from that prefill, each refusal is counted on the side that
    saw it, and the good pair is unaffected. Bad secret files stop the worker at start."""
    with Cluster("kv-secret") as c:
        good = write_secret(c.logdir, "good", "s3cret shared by this deployment's engines")
        bad = write_secret(c.logdir, "bad", "some other deployment's secret entirely")
        short = write_secret(c.logdir, "short", "too short")
        slow = ("--bootstrap-timeout-ms", "3000")
        p = c.worker("prefill", *FAST, *slow, "--kv-secret-file", good)
        d = c.worker("decode", *FAST, *slow, "--kv-secret-file", good)
        check_pair(p, d, "an authenticated hand-off of twelve words and a few more of them")
        p.wait_log(r"engine_started .*kv_auth=hmac-sha256")
        assert not any("kv_auth_disabled" in ln for ln in open(p.log_path))
        assert metric(p.port, "baton_kv_auth_failures_total") == 0
        assert metric(d.port, "baton_kv_auth_failures_total") == 0
        for name, extra in (("wrong", ("--kv-secret-file", bad)), ("none", ())):
            d2 = c.worker("decode", *FAST, *slow, *extra, name=f"decode-{name}")
            body = with_boot({"text": "not for you", "sampling_params": {"max_new_tokens": 3}},
                             p)
            rp, rd = dual(p, d2, "/generate", body)
            assert rd.status != 200 and rp.status != 200, (name, rp.text, rd.text)
            # a wrong secret fails the prefill's proof on the decode side; none is refused by
            # the prefill (its HELLO comes without authentication)
            seen_by = d2 if extra else p
            wait_until(lambda: metric(seen_by.port, "baton_kv_auth_failures_total") >= 1)
            seen_by.wait_log(r"kv_auth_refused ")
            if not extra:
                d2.wait_log(r"kv_auth_disabled")
            d2.stop()
        check_pair(p, d, "the good pair is still fine after the refusals")
        exe = harness.binary("baton-worker")
        # in every mode: a regular worker does not use the secret, but the operator who named
        # one meant it to be secure
        for mode in ("regular", "prefill", "decode"):
            for path in (short, os.path.join(c.logdir, "missing")):
                r = subprocess.run([exe, "--mode", mode, "--port", "0", "--bootstrap-port", "0",
                                    "--kv-secret-file", path], capture_output=True, timeout=20)
                assert r.returncode != 0 and b"kv_secret" in r.stderr, (mode, path, r.returncode,
                                                                         r.stderr)
        for f in (good, bad, short):
            os.unlink(f)


def main():
    t = harness.TestRunner()
    random.seed(os.getpid())
    for fn in (test_transports, test_rdma_falls_back, test_layerwise_on_off,
               test_presets_and_shape_mismatch, test_corrupted_kv, test_pool,
               test_abort_storm_page_reuse,
               test_prefill_killed, test_decode_killed, test_bad_flags, test_kv_secret):
        t.run(fn)
    t.finish()


if __name__ == "__main__":
    main()
