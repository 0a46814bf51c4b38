"""etcd_cluster.py — a real etcd cluster (Debian's etcd-server) on loopback for the shared-registry
tests and the convergence benchmark: N members, temp data dirs, leader lookup, kill/restart.

With tls (an EtcdTls), the members serve their client port over TLS only (etcd's --cert-file,
--key-file, --trusted-ca-file, --client-cert-auth); peers still talk plain HTTP on loopback.

Standard library only. etcd needs its peer URLs before it starts, so its ports come from the
scenarios' free_ports (outside the ephemeral range; the start is retried with new ports once).
"""

import base64
import json
import os
import shutil
import signal
import ssl
import subprocess
import tempfile
import time
import sys
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                "loadtest", "scenarios"))
from scenlib import free_ports  # noqa: E402

HOST = "127.0.0.1"


def etcd_binary():
    return shutil.which("etcd")



def b64(s):
    return base64.b64encode(s.encode()).decode()


class EtcdTls:
    """The files of a TLS etcd: its certificate and key, the CA it trusts for client
    certificates (the --trusted-ca-file), and the client certificate the tests' own calls use."""

    def __init__(self, cert, ca, client, check_host=True):
        self.cert, self.ca, self.client = cert, ca, client  # (pem, key), ca pem, (pem, key)
        self.check_host = check_host  # False: a test certificate naming another host on purpose

    def context(self):
        ctx = ssl.create_default_context(cafile=self.ca)
        ctx.check_hostname = self.check_host
        ctx.load_cert_chain(self.client[0], self.client[1])
        return ctx


class Member:
    def __init__(self, name, client, peer, data_dir, log_path):
        self.name, self.client, self.peer = name, client, peer
        self.data_dir, self.log_path = data_dir, log_path
        self.p = None

    @property
    def endpoint(self):
        return f"{HOST}:{self.client}"

    def alive(self):
        return self.p is not None and self.p.poll() is None


class EtcdCluster:
    """Context manager: starts `size` members and waits for a leader; kills them on exit."""

    def __init__(self, size=3, name="etcd", tls=None):
        self.size = size
        self.tls = tls
        self.scheme = "https" if tls else "http"
        self.dir = tempfile.mkdtemp(prefix=f"baton-{name}-")
        self.members = []

    def __enter__(self):
        ports = free_ports(2 * self.size)
        initial = ",".join(f"e{i}=http://{HOST}:{ports[2 * i + 1]}" for i in range(self.size))
        for i in range(self.size):
            m = Member(f"e{i}", ports[2 * i], ports[2 * i + 1], os.path.join(self.dir, f"e{i}"),
                       os.path.join(self.dir, f"e{i}.log"))
            m.initial = initial
            self.members.append(m)
            self.start(m)
        self.wait_leader(timeout=60)
        return self

    def __exit__(self, exc_type, exc, tb):
        for m in self.members:
            self.kill(m)
        if exc_type is not None:
            for m in self.members:
                try:
                    with open(m.log_path) as f:
                        tail = f.readlines()[-15:]
                    print(f"---- {m.name} log tail ----\n" + "".join(tail))
                except OSError:
                    pass
        shutil.rmtree(self.dir, ignore_errors=True)
        return False

    def start(self, m):
        # Election timing a little above etcd's defaults: the test host is shared and loaded.
        argv = [etcd_binary(), "--name", m.name, "--data-dir", m.data_dir,
                "--listen-client-urls", f"{self.scheme}://{HOST}:{m.client}",
                "--advertise-client-urls", f"{self.scheme}://{HOST}:{m.client}",
                "--listen-peer-urls", f"http://{HOST}:{m.peer}",
                "--initial-advertise-peer-urls", f"http://{HOST}:{m.peer}",
                "--initial-cluster", m.initial, "--initial-cluster-state", "new",
                "--initial-cluster-token", os.path.basename(self.dir),
                "--heartbeat-interval", "100", "--election-timeout", "1000",
                "--log-level", "warn"]
        if self.tls:
            argv += ["--cert-file", self.tls.cert[0], "--key-file", self.tls.cert[1],
                     "--trusted-ca-file", self.tls.ca, "--client-cert-auth"]
        log = open(m.log_path, "a")
        m.p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                               start_new_session=True)
        log.close()

    def kill(self, m, sig=signal.SIGKILL):
        if m.alive():
            os.killpg(m.p.pid, sig)
            try:
                m.p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(m.p.pid, signal.SIGKILL)
                m.p.wait(timeout=10)

    def url(self, prefix="/baton", first=None):
        """etcd[s]://... with every member; `first` (a Member) listed first, so clients use it."""
        order = ([first] if first else []) + [m for m in self.members if m is not first]
        scheme = "etcds://" if self.tls else "etcd://"
        return scheme + ",".join(m.endpoint for m in order) + prefix

    def call(self, api, body, member=None, timeout=10.0, headers=None):
        """One JSON-gateway call to a live member (the first that answers). The time-out is a
        bound, not a speed check: a loaded host's member may take seconds to commit a write, and
        one tried again on the next member after a time-out may already have been applied."""
        last = None
        for m in ([member] if member else self.members):
            if not m.alive():
                continue
            req = urllib.request.Request(f"{self.scheme}://{m.endpoint}{api}",
                                         data=json.dumps(body).encode(),
                                         headers=dict({"Content-Type": "application/json"},
                                                      **(headers or {})))
            try:
                ctx = self.tls.context() if self.tls else None
                with urllib.request.urlopen(req, timeout=timeout, context=ctx) as r:
                    return json.loads(r.read().decode())
            except OSError as e:
                last = e
        raise RuntimeError(f"no etcd member answered {api}: {last}")

    def leader(self):
        """The member that is leader now, or None."""
        for m in self.members:
            if not m.alive():
                continue
            try:
                st = self.call("/v3/maintenance/status", {}, member=m, timeout=2.0)
            except RuntimeError:
                continue
            if st.get("leader") and st.get("leader") == st.get("header", {}).get("member_id"):
                return m
        return None

    def wait_leader(self, timeout=30.0):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            m = self.leader()
            if m is not None:
                return m
            time.sleep(0.1)
        raise RuntimeError("etcd cluster has no leader")

    def wait_serving(self, m, timeout=30.0):
        """Waits until member m answers a linearizable read (a restarted member catches up)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                self.call("/v3/kv/range", {"key": b64("-")}, member=m, timeout=2.0)
                return
            except RuntimeError:
                time.sleep(0.1)
        raise RuntimeError(f"etcd member {m.name} does not serve")

    def keys(self, prefix):
        end = prefix[:-1] + chr(ord(prefix[-1]) + 1)
        res = self.call("/v3/kv/range", {"key": b64(prefix), "range_end": b64(end)})
        return {base64.b64decode(kv["key"]).decode(): base64.b64decode(kv["value"]).decode()
                for kv in res.get("kvs", [])}
