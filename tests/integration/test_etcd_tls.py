"""test_etcd_tls.py — the shared etcd registry over TLS: a real etcd serving its client
port with --cert-file/--key-file/--trusted-ca-file/--client-cert-auth on loopback, certificates
made at test time with the openssl CLI (tls_pki.Pki), routers on --registry etcds://... with
--registry-ca/-cert/-key, and a worker registering itself with --register-ca/-cert/-key.

Refusals: a router that trusts another CA, and one without a client certificate, get no worker
from etcd, say etcd is unreachable in /readiness, and log the TLS failure. Skips visibly when
Debian's etcd-server is not installed (scripts/install-deps.sh --test).
"""

import json
import os
import re
import shutil
import signal
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from etcd_cluster import EtcdCluster, EtcdTls, etcd_binary  # noqa: E402
from harness import Cluster, TestRunner, binary, get, post, request, url, wait_until  # noqa: E402
from test_etcd import ROUTER_ARGS, chat_ok, converge, metric, readiness_registry, urls  # noqa: E402
from tls_pki import Pki  # noqa: E402


class Setup:
    """One Pki and one 3-member TLS etcd for every test (each test uses its own key prefix)."""

    def __init__(self, pki, etcd, router_cert, worker_cert):
        self.pki, self.etcd = pki, etcd
        self.router_cert, self.worker_cert = router_cert, worker_cert

    def router_tls(self, ca=None, cert="router"):
        args = ["--registry-ca", ca or self.pki.ca[0]]
        if cert:
            pem, key = self.router_cert
            args += ["--registry-cert", pem, "--registry-key", key]
        return args

    def worker_tls(self):
        pem, key = self.worker_cert
        return ["--register-ca", self.pki.ca[0], "--register-cert", pem, "--register-key", key]


def connected(r):
    return readiness_registry(r).get("connected") is True or \
        "baton_registry_etcd_up 1" in get(r.port, "/metrics").text


def via(r):
    """The member a connected router watches through (its /readiness detail), or None."""
    m = re.search(r" via (\S+)$", readiness_registry(r).get("detail", ""))
    return m.group(1) if m else None


def tls_router(c, s, prefix, name, *extra):
    r = c.router("--registry", s.etcd.url(prefix), *ROUTER_ARGS, *s.router_tls(), *extra,
                 name=name)
    wait_until(lambda: connected(r), timeout=20, what=f"{name} connected to etcd over TLS")
    return r


def test_two_routers_register_remove_over_tls(s):
    prefix = "/tls1"
    with Cluster("etcd-tls1") as c:
        w = c.worker("regular")
        a = tls_router(c, s, prefix, "router-a")
        # B takes the same settings from its JSON file ("registry": {"ca", "cert", "key"}).
        conf = os.path.join(c.logdir, "b.json")
        with open(conf, "w") as f:
            json.dump({"registry": {"url": s.etcd.url(prefix), "ca": s.pki.ca[0],
                                    "cert": s.router_cert[0], "key": s.router_cert[1]}}, f)
        b = c.router("--config", conf, *ROUTER_ARGS, name="router-b")
        wait_until(lambda: connected(b), timeout=20, what="router-b connected to etcd over TLS")
        os.unlink(conf)
        for r in (a, b):
            r.wait_log(r"registry_tls ca=.* client_cert=yes")
        res = post(a.port, "/workers", {"url": url(w.port), "worker_type": "regular"})
        assert res.status == 202, res.text
        wid = res.json()["id"]
        # Stored in the TLS etcd (read back by the test over TLS with its own client cert).
        wait_until(lambda: f"{prefix}/workers/{wid}" in s.etcd.keys(prefix + "/"), timeout=10,
                   what="the worker's key in etcd")
        converge([b], lambda u: url(w.port) in u, "B sees A's registration over TLS")
        assert chat_ok(b)
        detail = readiness_registry(b)
        assert detail.get("connected") is True, detail
        res = request(b.port, "DELETE", f"/workers/{wid}")
        assert res.status == 202, res.text
        converge([a], lambda u: url(w.port) not in u, "A drops B's removal over TLS")
        wait_until(lambda: s.etcd.keys(prefix + "/") == {}, timeout=10, what="key deleted")
        # The routers' only TLS client connections are their etcd ones (the workers are http).
        for r in (a, b):
            assert (metric(r, 'baton_tls_handshakes_total{side="client"}') or 0) >= 1
        # A clean stop with etcd connections open over TLS (in SANITIZE builds: no leak).
        assert a.stop() == 0 and b.stop() == 0


def test_worker_registers_itself_over_tls(s):
    prefix = "/tls2"
    with Cluster("etcd-tls2") as c:
        a = tls_router(c, s, prefix, "router-a")
        b = tls_router(c, s, prefix, "router-b")
        w = c.worker("regular", "--register", s.etcd.url(prefix), "--register-ttl", "3",
                     *s.worker_tls())
        converge([a, b], lambda u: url(w.port) in u, "self-registered worker over TLS")
        assert chat_ok(a) and chat_ok(b)
        w.wait_log(r"registered key=/tls2/workers/")
        # SIGHUP re-reads the registration's certificate files too.
        w.signal(signal.SIGHUP)
        w.wait_log(r"tls_reloaded which=register")
        assert w.stop() == 0
        converge([a, b], lambda u: url(w.port) not in u, "revoked over TLS on SIGTERM",
                 timeout=5)
        # The worker without its client certificate is refused by etcd: never registered.
        bad = c.worker("regular", "--register", s.etcd.url(prefix), "--register-ca",
                       s.pki.ca[0], name="worker-nocert")
        bad.wait_log(r"tls_failed side=client .*", timeout=15)
        bad.wait_log(r"lease_grant_failed err=BATON_ETLS", timeout=15)
        assert url(bad.port) not in urls(a) and s.etcd.keys(prefix + "/") == {}


def assert_refused(c, s, r, w_static, prefix):
    """r cannot use etcd: not connected in /readiness (ETLS), a TLS failure logged, and its
    worker set is exactly its own (etcd's workers never arrive)."""
    m = r.wait_log(r"tls_failed side=client peer=127\.0\.0\.1:\d+ reason=(\S+)", timeout=15)
    print(f"  {r.name}: refused, reason={m.group(1)}", flush=True)
    r.wait_log(r"registry_unreachable err=BATON_ETLS", timeout=15)
    wait_until(lambda: "ETLS" in str(readiness_registry(r)), timeout=10,
               what=f"{r.name}: /readiness names the TLS failure")
    detail = readiness_registry(r)
    assert detail.get("connected") is False and "etcd unreachable" in str(detail), detail
    assert (metric(r, "baton_registry_etcd_up") or 0) == 0
    assert (metric(r, "baton_registry_etcd_errors_total") or 0) >= 1
    assert urls(r) == {url(w_static.port)}, urls(r)
    assert chat_ok(r)  # keeps serving its own worker


def test_wrong_ca_refused(s):
    prefix = "/tls3"
    with Cluster("etcd-tls3") as c:
        w = c.worker("regular")
        a = tls_router(c, s, prefix, "router-a")
        res = post(a.port, "/workers", {"url": url(w.port), "worker_type": "regular"})
        assert res.status == 202, res.text
        mine = c.worker("regular")
        other = s.pki.other_ca[0]
        r = c.router("--registry", s.etcd.url(prefix), *ROUTER_ARGS, "--worker", url(mine.port),
                     *s.router_tls(ca=other), name="router-wrong-ca")
        assert_refused(c, s, r, mine, prefix)
        r.wait_log(r"reason=cert_untrusted", timeout=5)
        # A change in etcd while refused does not reach it either.
        w2 = c.worker("regular")
        assert post(a.port, "/workers", {"url": url(w2.port)}).status == 202
        converge([a], lambda u: url(w2.port) in u, "A has the new worker")
        assert urls(r) == {url(mine.port)}


def test_no_client_cert_refused(s):
    prefix = "/tls4"
    with Cluster("etcd-tls4") as c:
        mine = c.worker("regular")
        a = tls_router(c, s, prefix, "router-a")
        w = c.worker("regular")
        assert post(a.port, "/workers", {"url": url(w.port)}).status == 202
        r = c.router("--registry", s.etcd.url(prefix), *ROUTER_ARGS, "--worker", url(mine.port),
                     *s.router_tls(cert=None), name="router-nocert")
        assert_refused(c, s, r, mine, prefix)
        # etcd ended the handshake with an alert (it requires a client certificate); the
        # router verified etcd's certificate fine.
        r.wait_log(r"reason=handshake_failed .*alert", timeout=5)
        assert "cert_untrusted" not in r.tail(200) and "cert_wrong_host" not in r.tail(200)


def test_wrong_host_refused(s):
    """etcd's certificate is from the right CA but names another host: the endpoint's IP is
    checked as for https:// workers, so the router refuses it."""
    cert = s.pki.cert("etcd-elsewhere", cn="etcd.example", san="DNS:etcd.example",
                      usage="serverAuth,clientAuth")
    tls = EtcdTls(cert, s.pki.ca[0], s.etcd.tls.client, check_host=False)
    with EtcdCluster(size=1, name="etcd-tls-host", tls=tls) as other, \
            Cluster("etcd-tls-host-r") as c:
        mine = c.worker("regular")
        r = c.router("--registry", other.url("/tls6"), *ROUTER_ARGS, "--worker", url(mine.port),
                     *s.router_tls(), name="router-wrong-host")
        assert_refused(c, s, r, mine, "/tls6")
        r.wait_log(r"reason=cert_wrong_host", timeout=5)


def test_sighup_reloads_registry_ca(s):
    """A router started with the wrong CA file connects once the file is fixed and SIGHUP
    re-reads it (the registry's TLS files reload like the other TLS files)."""
    prefix = "/tls5"
    with Cluster("etcd-tls5") as c:
        w = c.worker("regular")
        a = tls_router(c, s, prefix, "router-a")
        assert post(a.port, "/workers", {"url": url(w.port)}).status == 202
        ca = os.path.join(c.logdir, "registry-ca.pem")
        shutil.copy(s.pki.other_ca[0], ca)
        r = c.router("--registry", s.etcd.url(prefix), *ROUTER_ARGS, *s.router_tls(ca=ca),
                     name="router-reload")
        r.wait_log(r"registry_unreachable err=BATON_ETLS", timeout=15)
        assert url(w.port) not in urls(r)
        shutil.copy(s.pki.ca[0], ca)
        r.signal(signal.SIGHUP)
        r.wait_log(r"tls_reloaded which=registry")
        converge([r], lambda u: url(w.port) in u, "the right CA after SIGHUP", timeout=15)
        wait_until(lambda: connected(r), timeout=10, what="connected after the reload")
        os.unlink(ca)


def test_member_failover_over_tls(s):
    """The member the routers use first dies: calls and watches move to another member, over
    TLS as well (run last: the member stays down)."""
    prefix = "/tls7"
    first = s.etcd.members[0]
    with Cluster("etcd-tls7") as c:
        w, w2 = c.worker("regular"), c.worker("regular")
        a = tls_router(c, s, prefix, "router-a")
        b = tls_router(c, s, prefix, "router-b")
        assert post(a.port, "/workers", {"url": url(w.port)}).status == 202
        converge([b], lambda u: url(w.port) in u, "B sees A's registration")
        assert via(b) == first.endpoint, readiness_registry(b)  # ready now: the detail shows
        s.etcd.kill(first)
        s.etcd.wait_leader()
        assert post(a.port, "/workers", {"url": url(w2.port)}).status == 202
        converge([b], lambda u: url(w2.port) in u, "B sees A's registration after a member died",
                 timeout=30)
        for r in (a, b):
            wait_until(lambda: connected(r) and via(r) not in (None, first.endpoint),
                       timeout=30, what=f"{r.name} watching through another member")
        assert chat_ok(b)


def test_config_errors(s):
    """TLS options with a plaintext etcd:// registry, or half a client certificate, refuse to
    start (exit 2) rather than sending the registry in clear."""
    plain = "etcd://127.0.0.1:2379/x"
    tls = s.etcd.url("/x")
    pem, key = s.router_cert
    cases = [
        [binary("baton"), "--port", "0", "--registry", plain, "--registry-ca", s.pki.ca[0]],
        [binary("baton"), "--port", "0", "--registry", tls, "--registry-cert", pem],
        [binary("baton"), "--port", "0", "--registry", tls, "--registry-ca",
         os.path.join(s.pki.dir, "missing.pem")],
        [binary("baton-worker"), "--port", "0", "--register", plain, "--register-ca",
         s.pki.ca[0]],
        [binary("baton-worker"), "--port", "0", "--register", tls, "--register-key", key],
    ]
    for argv in cases:
        res = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                             timeout=30)
        assert res.returncode == 2, (argv, res.returncode, res.stderr[-500:])
        assert "register" in res.stderr or "registry" in res.stderr, res.stderr[-500:]


def main():
    t = TestRunner()
    if etcd_binary() is None:
        print("[ SKIPPED ] test_etcd_tls: etcd not installed (scripts/install-deps.sh --test)",
              flush=True)
        t.skipped += 1
        t.finish()
    binary("baton")
    with Pki() as pki:
        # etcd's JSON gateway dials its own gRPC port as a TLS client with the server
        # certificate, so with --client-cert-auth that certificate needs clientAuth as well.
        server = pki.cert("etcd", usage="serverAuth,clientAuth")
        tls = EtcdTls(server, pki.ca[0], pki.cert("test-client", cn="test", client=True))
        setup = Setup(pki, None, pki.cert("router", cn="router", client=True),
                      pki.cert("worker", cn="worker", client=True))
        with EtcdCluster(size=3, name="etcd-tls", tls=tls) as etcd:
            setup.etcd = etcd
            t.run(test_two_routers_register_remove_over_tls, setup)
            t.run(test_worker_registers_itself_over_tls, setup)
            t.run(test_wrong_ca_refused, setup)
            t.run(test_no_client_cert_refused, setup)
            t.run(test_wrong_host_refused, setup)
            t.run(test_sighup_reloads_registry_ca, setup)
            t.run(test_config_errors, setup)
            t.run(test_member_failover_over_tls, setup)
    t.finish()


if __name__ == "__main__":
    main()
