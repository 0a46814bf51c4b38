"""test_container.py — the Containerfile that docs/OPERATIONS.md builds `baton:0.1.0` from.

What it promises is checked on the file itself: a Debian 12 build stage that runs the same
install script and builds the three programs, a run stage with the three binaries, the example
configuration, a non-root user (the manifests' runAsUser) and the router as entry point. The
image is built and its binaries run (`--version`) only where a container builder can run (podman,
buildah, or a Docker client with a daemon); elsewhere that part is reported skipped, with why.
"""

import os
import re
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import SkipTest, TestRunner  # noqa: E402

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
CONTAINERFILE = os.path.join(ROOT, "Containerfile")
PROGRAMS = ("baton", "baton-worker", "baton-bench")


def test_containerfile_promises():
    text = open(CONTAINERFILE).read()
    stages = re.findall(r"^FROM (\S+)", text, re.M)
    assert stages and all(s.startswith("debian:12") for s in stages), stages
    assert "sh scripts/install-deps.sh" in text, "the build stage uses the install script"
    build = re.search(r"--target ([\w -]+)", text)
    assert build and set(PROGRAMS) <= set(build.group(1).split()), build
    for p in PROGRAMS:
        assert re.search(rf"/{p}\b.*\n?.*/usr/local/bin/", text), p
    user = re.search(r"^USER (\d+)", text, re.M)
    assert user and int(user.group(1)) != 0, "runs as a non-root user"
    with open(os.path.join(ROOT, "deploy", "kubernetes", "router.yaml")) as f:
        assert f"runAsUser: {user.group(1)}" in f.read(), "the manifests' runAsUser"
    assert "COPY conf/baton.json /etc/baton/baton.json" in text
    ignore = open(os.path.join(ROOT, ".containerignore")).read().split()
    assert "build" in ignore and ".git" in ignore, ignore


def builder():
    """(argv prefix, why not) of a container builder that can run here."""
    why = []
    for tool, probe in (("podman", ["podman", "info"]), ("buildah", ["buildah", "info"]),
                        ("docker", ["docker", "info"])):
        if shutil.which(tool) is None:
            why.append(f"no {tool}")
            continue
        r = subprocess.run(probe, capture_output=True, text=True, timeout=60)
        if r.returncode == 0:
            return ([tool, "build"] if tool != "buildah" else [tool, "bud"]), None
        why.append(f"{tool}: {(r.stderr or r.stdout).strip().splitlines()[-1][:120]}")
    return None, "; ".join(why)


def test_image_builds_and_runs():
    argv, why = builder()
    if argv is None:
        raise SkipTest(f"no container builder can run here ({why})")
    tag = "baton-test:containerfile"
    r = subprocess.run(argv + ["-t", tag, "-f", CONTAINERFILE, ROOT], capture_output=True,
                       text=True, timeout=3600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    tool = argv[0] if argv[0] != "buildah" else "podman"
    for p in PROGRAMS:
        r = subprocess.run([tool, "run", "--rm", "--entrypoint", f"/usr/local/bin/{p}", tag,
                            "--version"], capture_output=True, text=True, timeout=300)
        assert r.returncode == 0 and r.stdout.startswith(p + " "), r


if __name__ == "__main__":
    t = TestRunner()
    t.run(test_containerfile_promises)
    t.run(test_image_builds_and_runs)
    t.finish()
