"""test_deploy_systemd.py — the systemd units as `make install` puts them: installed into a
temporary prefix (`cmake --install BUILD --prefix P`, what `make install PREFIX=P` runs), they
name P/bin/baton and P/bin/baton-worker, which are installed and executable, pass
`systemd-analyze verify` with no warning, and `systemd-analyze security --offline` rates their
hardening (exposure at most 2.0 of 10). Skips visibly where systemd-analyze is missing.
"""

import os
import re
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import BUILD_DIR, SkipTest, TestRunner  # noqa: E402


def analyze(*args):
    r = subprocess.run(["systemd-analyze", *args], capture_output=True, text=True, timeout=120)
    return r.returncode, (r.stdout + r.stderr).strip()


def installed(prefix):
    """Installs the build into prefix; returns the unit files to verify."""
    r = subprocess.run(["cmake", "--install", BUILD_DIR, "--prefix", prefix], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    for name in ("baton", "baton-worker", "baton-bench"):
        path = os.path.join(prefix, "bin", name)
        assert os.access(path, os.X_OK), path
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30)
        assert out.returncode == 0 and out.stdout.startswith(name + " "), out
    assert os.path.exists(os.path.join(prefix, "share", "baton", "baton.json"))
    units = os.path.join(prefix, "lib", "systemd", "system")
    for name, exe in (("baton.service", "baton"), ("baton-worker@.service", "baton-worker")):
        text = open(os.path.join(units, name)).read()
        assert f"ExecStart={prefix}/bin/{exe} " in text, (name, text)
    # A template is verified through one of its instances.
    shutil.copy(os.path.join(units, "baton-worker@.service"),
                os.path.join(units, "baton-worker@prefill.service"))
    return [os.path.join(units, "baton.service"), os.path.join(units, "baton-worker@prefill.service")]


def test_verify_and_hardening():
    if shutil.which("systemd-analyze") is None:
        raise SkipTest("systemd-analyze not installed")
    with tempfile.TemporaryDirectory(prefix="baton-systemd-") as d:
        units = installed(d)
        rc, out = analyze("verify", "--man=no", *units)
        assert rc == 0 and out == "", out
        for u in units:
            text = open(u.replace("@prefill", "@")).read()
            for opt in ("DynamicUser=yes", "ProtectSystem=strict", "NoNewPrivileges=yes",
                        "PrivateTmp=yes", "CapabilityBoundingSet=", "SystemCallFilter="):
                assert opt in text, (u, opt)
            rc, out = analyze("security", "--offline=yes", "--no-pager", u)
            m = re.search(r"Overall exposure level for \S+: ([0-9.]+)", out)
            assert m, out[-500:]
            assert float(m.group(1)) <= 2.0, (u, m.group(1))
        # The check has teeth: a misspelt option is reported.
        with open(units[0], "a") as f:
            f.write("\n[Service]\nProtectSytem=strict\n")
        rc, out = analyze("verify", "--man=no", units[0])
        assert "Unknown key" in out, out


if __name__ == "__main__":
    t = TestRunner()
    t.run(test_verify_and_hardening)
    t.finish()
