"""test_demo.py — `make demo`'s script end to end: it starts prefill, decode and router, answers
the curl line it prints, and stops all three on Ctrl-C (SIGINT) or when one of them dies."""

import os
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import simtext  # noqa: E402
from harness import BUILD_DIR, TestRunner, free_ports, post, wait_until  # noqa: E402

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))



def children_of(pid):
    """The demo's baton and baton-worker children (not its sleep/curl helpers)."""
    out = subprocess.run(["ps", "-o", "pid=,comm=", "--ppid", str(pid)], capture_output=True,
                         text=True)
    rows = [ln.split(None, 1) for ln in out.stdout.splitlines() if ln.strip()]
    return [int(pid_) for pid_, comm in rows if comm.strip() in ("baton", "baton-worker")]


def alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie still answers kill(0); treat it as gone.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][0] != "Z"
    except OSError:
        return False


def start_demo():
    router, prefill, decode, boot = free_ports(4)
    env = dict(os.environ, BATON_DEMO_PORT=str(router), BATON_DEMO_PREFILL_PORT=str(prefill),
               BATON_DEMO_DECODE_PORT=str(decode), BATON_DEMO_BOOTSTRAP_PORT=str(boot))
    p = subprocess.Popen(["sh", os.path.join(ROOT, "scripts", "demo.sh"), BUILD_DIR],
                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env,
                         start_new_session=True, text=True)
    lines = []
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        line = p.stdout.readline()
        if not line:
            break
        lines.append(line)
        if "Press Ctrl-C" in line:
            return p, router, "".join(lines)
    p.kill()
    raise AssertionError("demo did not report ready:\n" + "".join(lines))


def test_demo_answers_and_stops_on_sigint():
    p, port, banner = start_demo()
    try:
        assert f"http://127.0.0.1:{port}/v1/chat/completions" in banner, banner
        kids = children_of(p.pid)
        assert len(kids) == 3, kids
        msgs = [{"role": "user", "content": "Hello there"}]
        res = post(port, "/v1/chat/completions", {"messages": msgs, "max_tokens": 16})
        assert res.status == 200, res.text
        want = simtext.complete_chat(msgs, 16)
        assert res.json()["choices"][0]["message"]["content"] == want.text
        os.kill(p.pid, signal.SIGINT)
        assert p.wait(timeout=15) == 0
        wait_until(lambda: not any(alive(k) for k in kids), 10, what="demo children to exit")
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)


def test_demo_stops_when_a_process_dies():
    p, port, _ = start_demo()
    try:
        kids = children_of(p.pid)
        assert len(kids) == 3, kids
        os.kill(kids[0], signal.SIGKILL)
        assert p.wait(timeout=15) != 0
        wait_until(lambda: not any(alive(k) for k in kids), 10, what="demo children to exit")
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)


def test_demo_refuses_a_busy_port():
    """Another router on the demo's port: the demo says the port is in use and never "ready"."""
    from harness import Cluster
    with Cluster("demo-busy") as c:
        other = c.router()
        _, prefill, decode, boot = free_ports(4)
        env = dict(os.environ, BATON_DEMO_PORT=str(other.port),
                   BATON_DEMO_PREFILL_PORT=str(prefill), BATON_DEMO_DECODE_PORT=str(decode),
                   BATON_DEMO_BOOTSTRAP_PORT=str(boot))
        r = subprocess.run(["sh", os.path.join(ROOT, "scripts", "demo.sh"), BUILD_DIR], env=env,
                           capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
        assert r.returncode != 0, r
        assert f"port {other.port} is in use" in r.stderr, r.stderr
        assert "ready" not in r.stdout, r.stdout


if __name__ == "__main__":
    t = TestRunner()
    t.run(test_demo_answers_and_stops_on_sigint)
    t.run(test_demo_stops_when_a_process_dies)
    t.run(test_demo_refuses_a_busy_port)
    t.finish()
