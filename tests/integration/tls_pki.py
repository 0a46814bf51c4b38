"""tls_pki.py — test certificates made at test time with the openssl CLI, and HTTPS helpers.

Nothing is stored in the repository: each Pki lives in a temporary directory that close() removes.
EC P-256 keys (fast to make); the server certificates name localhost and 127.0.0.1.
"""

import http.client
import os
import shutil
import socket
import ssl
import subprocess
import tempfile

from harness import HOST, TestRunner, exchange


class Pki:
    def __init__(self):
        if shutil.which("openssl") is None:
            raise RuntimeError("openssl CLI missing: scripts/install-deps.sh --test installs it")
        self.dir = tempfile.mkdtemp(prefix="baton-pki-")
        self.ca = self._ca("ca", "Baton Test CA")
        self.other_ca = self._ca("other-ca", "Some Other CA")

    def close(self):
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def path(self, name):
        return os.path.join(self.dir, name)

    def _run(self, *args):
        subprocess.run(["openssl", *args], check=True, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL, cwd=self.dir)

    def _key(self, name):
        key = self.path(f"{name}.key")
        self._run("genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256",
                  "-out", key)
        return key

    def _ca(self, name, cn):
        key = self._key(name)
        pem = self.path(f"{name}.pem")
        self._run("req", "-x509", "-new", "-key", key, "-out", pem, "-days", "2", "-subj",
                  f"/CN={cn}", "-addext", "basicConstraints=critical,CA:TRUE",
                  "-addext", "keyUsage=critical,keyCertSign,cRLSign")
        return (pem, key)

    def cert(self, name, cn="localhost", san="DNS:localhost,IP:127.0.0.1", days=2, ca=None,
             client=False, usage=None):
        """A leaf signed by `ca` (default: the test CA); ca="self" makes it self-signed.
        days=-1 makes one that expired yesterday. usage: the extended key usage, when neither
        "serverAuth" nor "clientAuth" alone (client=True) fits, e.g. "serverAuth,clientAuth" for
        etcd, whose JSON gateway dials its own gRPC port with the server certificate.
        Returns (cert_path, key_path)."""
        key = self._key(name)
        pem = self.path(f"{name}.pem")
        ext = self.path(f"{name}.ext")
        usage = usage or ("clientAuth" if client else "serverAuth")
        with open(ext, "w") as f:
            if san:
                f.write(f"subjectAltName={san}\n")
            f.write(f"extendedKeyUsage={usage}\n")
        if ca == "self":
            self._run("req", "-x509", "-new", "-key", key, "-out", pem, "-days", str(days),
                      "-subj", f"/CN={cn}", "-addext", f"subjectAltName={san}")
            return (pem, key)
        ca_pem, ca_key = ca or self.ca
        csr = self.path(f"{name}.csr")
        self._run("req", "-new", "-key", key, "-out", csr, "-subj", f"/CN={cn}")
        self._run("x509", "-req", "-in", csr, "-CA", ca_pem, "-CAkey", ca_key, "-CAcreateserial",
                  "-out", pem, "-days", str(days), "-extfile", ext)
        return (pem, key)

    def intermediate(self, name):
        """An intermediate CA signed by the test CA. Returns (cert_path, key_path)."""
        key = self._key(name)
        pem, csr, ext = (self.path(f"{name}.{x}") for x in ("pem", "csr", "ext"))
        with open(ext, "w") as f:
            f.write("basicConstraints=critical,CA:TRUE\nkeyUsage=critical,keyCertSign,cRLSign\n")
        self._run("req", "-new", "-key", key, "-out", csr, "-subj", f"/CN={name}")
        self._run("x509", "-req", "-in", csr, "-CA", self.ca[0], "-CAkey", self.ca[1],
                  "-CAcreateserial", "-out", pem, "-days", "2", "-extfile", ext)
        return (pem, key)

    def chain(self, name, leaf, *cas):
        """A PEM file with the leaf certificate first, then the given CA certificates."""
        out = self.path(f"{name}-chain.pem")
        with open(out, "w") as f:
            for p in (leaf[0],) + tuple(c[0] for c in cas):
                with open(p) as src:
                    f.write(src.read())
        return (out, leaf[1])

    def client_context(self, cert=None, ca=None):
        """A TLS client context that verifies against the test CA (host name checked)."""
        ctx = ssl.create_default_context(cafile=ca or self.ca[0])
        if cert:
            ctx.load_cert_chain(cert[0], cert[1])
        return ctx


def run_tests(tests, use_pki):
    """Runs the test functions with one Pki for all, handed to use_pki first; exits."""
    t = TestRunner()
    with Pki() as pki:
        use_pki(pki)
        for fn in tests:
            t.run(fn)
    t.finish()


def https_url(port, host=HOST):
    return f"https://{host}:{port}"


def request(ctx, port, method, path, body=None, headers=None, timeout=30.0, host=HOST):
    """One HTTPS request on a fresh connection; body may be bytes, str or a JSON-able object."""
    conn = http.client.HTTPSConnection(host, port, timeout=timeout, context=ctx)
    try:
        return exchange(conn, method, path, body, headers)
    finally:
        conn.close()


def tls_socket(ctx, port, host=HOST, timeout=10.0, server_hostname=None):
    raw = socket.create_connection((host, port), timeout=timeout)
    try:
        return ctx.wrap_socket(raw, server_hostname=server_hostname or host)
    except Exception:
        raw.close()
        raise


def metric(text, name, **labels):
    """The value of one Prometheus sample (0.0 when absent)."""
    want = ",".join(f'{k}="{v}"' for k, v in labels.items())
    key = f"{name}{{{want}}}" if labels else name
    for line in text.splitlines():
        if line.startswith(key + " "):
            return float(line.split()[-1])
    return 0.0
