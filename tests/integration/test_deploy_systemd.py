"""test_deploy_systemd.py — deploy/systemd/ units pass `systemd-analyze verify` with no warning,
and `systemd-analyze security --offline` rates their hardening (exposure at most 2.0 of 10).

The units are copied to a temp dir with ExecStart pointing at the built binaries (verify checks
that the command exists). Skips visibly where systemd-analyze is missing.
"""

import os
import re
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import SkipTest, TestRunner, binary  # noqa: E402

UNITS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "deploy", "systemd")


def analyze(*args):
    r = subprocess.run(["systemd-analyze", *args], capture_output=True, text=True, timeout=120)
    return r.returncode, (r.stdout + r.stderr).strip()


def staged(d):
    for name in os.listdir(UNITS):
        with open(os.path.join(UNITS, name)) as f:
            text = f.read()
        text = text.replace("/usr/local/bin/baton-worker", binary("baton-worker"))
        text = text.replace("/usr/local/bin/baton ", binary("baton") + " ")
        with open(os.path.join(d, name), "w") as f:
            f.write(text)
    # A template is verified through one of its instances.
    return [os.path.join(d, "baton.service"), os.path.join(d, "baton-worker@prefill.service")]


def test_verify_and_hardening():
    if shutil.which("systemd-analyze") is None:
        raise SkipTest("systemd-analyze not installed")
    with tempfile.TemporaryDirectory(prefix="baton-systemd-") as d:
        units = staged(d)
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
