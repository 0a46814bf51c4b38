"""test_auth.py — authentication and authorisation of the router: API keys (flags and a
file re-read on SIGHUP) with 401 invalid_api_key in the OpenAI format, open health routes,
/metrics with and without a token, admin routes behind a token (or loopback only), per-key rate
limits with 429 + Retry-After, what reaches workers (no client Authorization unless
--forward-authorization; --worker-api-key), and the rate-limited log under a flood of bad keys."""

import json
import os
import re
import signal
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from harness import Cluster, TestRunner, get, post, request, wait_until  # noqa: E402
from router_upstream import Upstream  # noqa: E402

GEN = {"text": "hello", "sampling_params": {"max_new_tokens": 4}}
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
QUIET = ("--check-interval-ms", "0", "--threads", "1")


def bearer(key):
    return {"Authorization": f"Bearer {key}"}


def assert_401(res, code="invalid_api_key"):
    assert res.status == 401, (res.status, res.text)
    assert res.headers.get("content-type", "").startswith("application/json"), res.headers
    assert res.headers.get("www-authenticate") == "Bearer", res.headers
    err = res.json()["error"]
    assert err["type"] == "invalid_request_error" and err["code"] == code, err
    assert isinstance(err["message"], str) and err["message"] and "param" in err, err


def test_api_keys():
    tmp = tempfile.mkdtemp(prefix="baton-auth-")
    keyfile = os.path.join(tmp, "keys")
    with open(keyfile, "w") as f:
        f.write("# router keys\nfile-key-1\n")
    try:
        with Upstream("regular") as w, Cluster("auth-keys") as c:
            r = c.router("--worker", w.url, "--api-key", "flag-key", "--api-key-file", keyfile,
                         *QUIET)
            for path, body in (("/generate", GEN), ("/v1/chat/completions", CHAT),
                               ("/v1/completions", {"model": "m", "prompt": "x"})):
                assert_401(post(r.port, path, body))
                assert_401(post(r.port, path, body, headers=bearer("wrong")))
                assert_401(post(r.port, path, body, headers=bearer("flag-ke")))
                assert_401(post(r.port, path, body, headers={"Authorization": "flag-key"}))
            assert_401(get(r.port, "/v1/models"))
            # (/get_server_info is an admin route: test_admin_routes)
            # an unknown path or a wrong method tells an anonymous caller nothing
            assert_401(get(r.port, "/no/such/route"))
            assert_401(get(r.port, "/generate"))
            assert not w.requests, "a refused request reached the worker"
            for key in ("flag-key", "file-key-1"):
                res = post(r.port, "/generate", GEN, headers=bearer(key))
                assert res.status == 200, res.text
            assert get(r.port, "/no/such/route", headers=bearer("flag-key")).status == 404
            # health and (without a token) metrics stay open
            assert get(r.port, "/health").status == 200
            assert get(r.port, "/liveness").status == 200
            assert get(r.port, "/readiness").status in (200, 503)
            assert get(r.port, "/metrics").status == 200
            # SIGHUP re-reads the file: its old key goes, the new one comes, the flag's stays
            with open(keyfile, "w") as f:
                f.write("file-key-2\n")
            r.signal(signal.SIGHUP)
            r.wait_log(r"auth_reloaded api_keys=2")
            assert_401(post(r.port, "/generate", GEN, headers=bearer("file-key-1")))
            assert post(r.port, "/generate", GEN, headers=bearer("file-key-2")).status == 200
            assert post(r.port, "/generate", GEN, headers=bearer("flag-key")).status == 200
            # a reload that fails keeps the keys in force
            os.unlink(keyfile)
            r.signal(signal.SIGHUP)
            r.wait_log(r"auth_reload_failed")
            assert post(r.port, "/generate", GEN, headers=bearer("file-key-2")).status == 200
            # the client's key is the router's credential: it never reaches the worker
            assert w.requests and all("authorization" not in q.headers for q in w.requests), \
                [q.headers for q in w.requests]
    finally:
        for n in os.listdir(tmp):
            os.unlink(os.path.join(tmp, n))
        os.rmdir(tmp)


def test_worker_credentials():
    """--worker-api-key goes to workers without a key of their own; --forward-authorization
    passes the client's header through instead."""
    with Upstream("regular") as w, Cluster("auth-upstream") as c:
        r = c.router("--worker", w.url, "--api-key", "client-key", "--worker-api-key", "wk",
                     *QUIET)
        assert post(r.port, "/generate", GEN, headers=bearer("client-key")).status == 200
        assert w.requests[-1].headers.get("authorization") == "Bearer wk", w.requests[-1].headers
        r.kill()
        r = c.router("--worker", w.url, "--api-key", "client-key", "--forward-authorization",
                     *QUIET)
        assert post(r.port, "/generate", GEN, headers=bearer("client-key")).status == 200
        assert w.requests[-1].headers.get("authorization") == "Bearer client-key"


def test_metrics_token():
    with Cluster("auth-metrics") as c:
        r = c.router("--metrics-token", "mt", *QUIET)
        assert_401(get(r.port, "/metrics"), code="invalid_token")
        assert_401(get(r.port, "/metrics", headers=bearer("nope")), code="invalid_token")
        res = get(r.port, "/metrics", headers=bearer("mt"))
        assert res.status == 200 and "baton_" in res.text, res.text[:200]
        assert get(r.port, "/health").status == 200


def test_admin_routes():
    with Upstream("regular") as w, Cluster("auth-admin") as c:
        # no token: loopback clients only, and the router says so at start-up
        r = c.router(*QUIET)
        r.wait_log(r"admin_routes auth=loopback_only")
        assert get(r.port, "/workers").status == 200
        r.kill()

        tmp = tempfile.mkdtemp(prefix="baton-admin-")
        tokfile = os.path.join(tmp, "admin")
        with open(tokfile, "w") as f:
            f.write("adm-1\n")
        try:
            r = c.router("--admin-token-file", tokfile, "--api-key", "k", *QUIET)
            r.wait_log(r"admin_routes auth=token")
            body = {"url": w.url, "worker_type": "regular"}
            for hdr in ({}, bearer("k"), bearer("adm-")):
                for method, path, b in (("GET", "/workers", None), ("POST", "/workers", body),
                                        ("GET", "/workers/w-00000000", None),
                                        ("DELETE", "/workers/w-00000000", None),
                                        ("POST", f"/add_worker?url={w.url}", None),
                                        ("POST", f"/remove_worker?url={w.url}", None),
                                        ("GET", "/list_workers", None),
                                        # a worker's own configuration: operators only
                                        ("GET", "/get_server_info", None),
                                        ("GET", "/get_model_info", None)):
                    res = request(r.port, method, path, body=b, headers=hdr)
                    assert res.status == 401, (method, path, hdr, res.status, res.text)
                    assert res.json()["error"]["code"] == "UNAUTHORIZED", res.text
                    assert res.headers.get("www-authenticate") == "Bearer"
            assert get(r.port, "/workers", headers=bearer("adm-1")).json()["total"] == 0
            res = post(r.port, "/workers", body, headers=bearer("adm-1"))
            assert res.status == 202, res.text
            assert get(r.port, "/workers", headers=bearer("adm-1")).json()["total"] == 1
            res = get(r.port, "/get_server_info", headers=bearer("adm-1"))
            assert res.status == 200 and w.requests[-1].path == "/get_server_info", res.text
            # the token file is re-read on SIGHUP too
            with open(tokfile, "w") as f:
                f.write("adm-2\n")
            r.signal(signal.SIGHUP)
            r.wait_log(r"auth_reloaded .*admin_token=1")
            assert get(r.port, "/workers", headers=bearer("adm-1")).status == 401
            assert get(r.port, "/workers", headers=bearer("adm-2")).status == 200
        finally:
            for n in os.listdir(tmp):
                os.unlink(os.path.join(tmp, n))
            os.rmdir(tmp)


def test_rate_limit():
    # A token every 100 s: the burst is spent and stays spent however slowly the requests
    # below are served (a fast rate would let a slow run earn a token between them).
    with Upstream("regular") as w, Cluster("auth-rate") as c:
        r = c.router("--worker", w.url, "--api-key", "a", "--api-key", "b", "--rate-limit",
                     "0.01:3", *QUIET)
        t0 = time.monotonic()
        codes = [post(r.port, "/generate", GEN, headers=bearer("a")).status for _ in range(3)]
        assert codes == [200] * 3, codes
        res = post(r.port, "/generate", GEN, headers=bearer("a"))
        elapsed = time.monotonic() - t0
        assert res.status == 429, (res.status, res.text)
        err = res.json()["error"]
        assert err["code"] == "rate_limit_exceeded" and err["type"] == "rate_limit_error", err
        # 0.01/s: the next token is 100 s after the first request, less the time gone since
        retry = int(res.headers["retry-after"])
        assert 100 - elapsed <= retry <= 100, (res.headers, elapsed)
        n_before = len(w.requests)
        assert post(r.port, "/generate", GEN, headers=bearer("a")).status == 429
        assert len(w.requests) == n_before, "a rate-limited request reached the worker"
        # another key has its own bucket; health is never limited
        assert post(r.port, "/generate", GEN, headers=bearer("b")).status == 200
        assert all(get(r.port, "/health").status == 200 for _ in range(10))
        r.kill()

        # The bucket refills: after Retry-After the key is served again. One token, one every
        # 2 s: requests until one is refused (a slow host may serve a few first), then the wait.
        r = c.router("--worker", w.url, "--api-key", "a", "--rate-limit", "0.5:1", *QUIET)
        for _ in range(10):
            res = post(r.port, "/generate", GEN, headers=bearer("a"))
            if res.status != 200:
                break
        assert res.status == 429, (res.status, res.text)
        retry = int(res.headers["retry-after"])
        assert 1 <= retry <= 2, res.headers  # 0.5/s: a token in at most 2 s
        time.sleep(retry + 0.2)
        assert post(r.port, "/generate", GEN, headers=bearer("a")).status == 200


def test_bad_key_flood_log_is_limited():
    """Thousands of bad keys write at most ~10 auth_failed lines a second, then one
    log_suppressed line with the count."""
    with Cluster("auth-flood") as c:
        r = c.router("--api-key", "k", *QUIET)
        import socket
        n = 2000
        t0 = time.monotonic()
        s = socket.create_connection(("127.0.0.1", r.port), timeout=10)
        req = b"GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer bad\r\n\r\n"
        buf = b""
        for _ in range(n // 100):  # pipelined in batches of 100 on one keep-alive connection
            s.sendall(req * 100)
            got = 0
            while got < 100:
                d = s.recv(65536)
                assert d, "router closed the connection"
                buf += d
                got = buf.count(b"HTTP/1.1 401")
            buf = b""
        s.close()
        secs = time.monotonic() - t0
        time.sleep(1.1)
        assert get(r.port, "/v1/models", headers=bearer("bad")).status == 401  # flushes the count
        m = r.wait_log(r"log_suppressed event=auth_failed count=(\d+)")
        lines = [ln for ln in r.tail(100000).splitlines() if " auth_failed " in ln]
        assert len(lines) <= 10 * (int(secs) + 3), (len(lines), secs)
        assert int(m.group(1)) > 0


def main():
    t = TestRunner()
    t.run(test_api_keys)
    t.run(test_worker_credentials)
    t.run(test_metrics_token)
    t.run(test_admin_routes)
    t.run(test_rate_limit)
    t.run(test_bad_key_flood_log_is_limited)
    t.finish()


if __name__ == "__main__":
    main()
