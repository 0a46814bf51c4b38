"""test_store_tls.py — the baton-store master's HTTP API over TLS (--tls-cert / --tls-key, and
--tls-client-ca for client certificates), checked with the real openssl client and Python's ssl:
the chain verifies against the CA, /health and /metrics (behind the bearer token) answer over
TLS, plain HTTP and an untrusted client are refused, SIGHUP loads a new certificate for new
connections, and the store keeps serving through it all."""

import os
import signal
import ssl
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import harness  # noqa: E402
import tls_pki  # noqa: E402
from harness import HOST, SkipTest, TestRunner  # noqa: E402
from test_store import Store  # noqa: E402

PKI = None


def s_client(port, *extra, data=b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"):
    p = subprocess.run(["openssl", "s_client", "-connect", f"{HOST}:{port}", "-servername",
                        "localhost", "-verify_return_error", "-ign_eof", *extra], input=data,
                       capture_output=True, timeout=30)
    return p.returncode, p.stdout.decode(errors="replace") + p.stderr.decode(errors="replace")


def test_http_tls():
    cert = PKI.cert("store-master")
    token = os.path.join(PKI.dir, "token")
    with open(token, "w") as f:
        f.write("store-admin-token\n")
    with harness.Cluster("store-tls") as c:
        st = Store(c, nodes=1, master_args=("--tls-cert", cert[0], "--tls-key", cert[1],
                                            "--admin-token-file", token))
        assert st.put("k", b"over tls")[0] == 0
        # the real openssl client: the chain verifies against the test CA, the API answers
        rc, out = s_client(st.http, "-CAfile", PKI.ca[0])
        assert rc == 0 and "Verify return code: 0 (ok)" in out, out
        assert '"leader":true' in out, out
        # ... and against another CA it does not
        rc, out = s_client(st.http, "-CAfile", PKI.other_ca[0])
        assert rc != 0 and "certificate verify failed" in out, out
        ctx = PKI.client_context()
        r = tls_pki.request(ctx, st.http, "GET", "/metrics")
        assert r.status == 401
        r = tls_pki.request(ctx, st.http, "GET", "/metrics",
                            headers={"Authorization": "Bearer store-admin-token"})
        assert r.status == 200 and "baton_store_objects 1" in r.body.decode()
        r = tls_pki.request(ctx, st.http, "GET", "/batch_query_keys?keys=k",
                            headers={"Authorization": "Bearer store-admin-token"})
        assert r.status == 200 and r.json()["k"]["exists"] is True
        # plain HTTP on the TLS port: refused, the listener goes on
        r = harness.get(st.http, "/health")
        assert r.status == 400, r.status
        # SIGHUP: new connections get the new certificate
        new = PKI.cert("store-master-2", cn="store-renewed")
        os.replace(new[0], cert[0])
        os.replace(new[1], cert[1])
        st.master.signal(signal.SIGHUP)
        harness.wait_until(lambda: "CN = store-renewed" in s_client(st.http, "-CAfile",
                                                                    PKI.ca[0])[1] or
                           "CN=store-renewed" in s_client(st.http, "-CAfile", PKI.ca[0])[1],
                           timeout=10, what="the renewed certificate served")
        assert st.get("k")[1] == b"over tls"


def test_http_client_certificates():
    cert = PKI.cert("store-master-mtls")
    client = PKI.cert("store-client", cn="scraper", client=True)
    stranger = PKI.cert("stranger", cn="scraper", client=True, ca=PKI.other_ca)
    with harness.Cluster("store-mtls") as c:
        st = Store(c, nodes=1, master_args=("--tls-cert", cert[0], "--tls-key", cert[1],
                                            "--tls-client-ca", PKI.ca[0]))
        r = tls_pki.request(PKI.client_context(cert=client), st.http, "GET", "/health")
        assert r.status == 200
        for who in (None, stranger):
            try:
                r = tls_pki.request(PKI.client_context(cert=who), st.http, "GET", "/health")
            except (ssl.SSLError, ConnectionError, OSError):
                continue
            raise AssertionError(f"a client without a trusted certificate got {r.status}")
        rc, out = s_client(st.http, "-CAfile", PKI.ca[0], "-cert", client[0], "-key", client[1])
        assert rc == 0 and '"leader":true' in out, out
        assert st.put("still", b"serving")[0] == 0


def test_bad_tls_options():
    with harness.Cluster("store-tls-bad") as c:  # noqa: F841
        for args in (["--tls-cert", PKI.ca[0]], ["--tls-cert", "/nonexistent", "--tls-key",
                                                 "/nonexistent"]):
            p = subprocess.run([harness.binary("baton-store"), "master", "--host", HOST,
                                "--port", "0", "--http-port", "0", *args],
                               capture_output=True, text=True, timeout=30)
            assert p.returncode == 2, p.stderr
            assert "master_tls_invalid" in p.stdout + p.stderr


def use(pki):
    global PKI
    PKI = pki


if __name__ == "__main__":
    try:
        tls_pki.run_tests([test_http_tls, test_http_client_certificates, test_bad_tls_options],
                          use)
    except RuntimeError as e:  # no openssl CLI
        r = TestRunner()
        r.run(lambda: (_ for _ in ()).throw(SkipTest(str(e))))
        r.finish()
