"""test_cli.py — what a user meets first on the command line: a second router on a busy port is
refused, --version on every binary, one line for a bad flag, the router's --help grouped with every
choice and default, `cannot read FILE: <reason>` for every file option, and a normal run that
logs no warning."""

import os
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from harness import Cluster, TestRunner, binary, post  # noqa: E402

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
MISSING = "/nonexistent-baton-test/missing.pem"
NOENT = f"cannot read {MISSING}: No such file or directory"
HELP_GROUPS = ["listen", "workers", "routing", "tokenizer", "limits", "timeouts", "resilience",
               "security", "registry"]
POLICIES = ["round_robin", "random", "power_of_two", "least_load", "consistent_hash",
            "cache_aware"]


def run(argv, timeout=20):
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL)


def test_second_router_on_a_port_is_refused():
    with Cluster("cli-port") as c:
        first = c.router("--threads", "2")  # its own threads share the port
        port = first.port
        r = run([binary("baton"), "--host", "127.0.0.1", "--port", str(port)])
        assert r.returncode != 0, r
        assert f"port {port} is in use" in r.stderr, r.stderr
        assert "listening" not in r.stderr, r.stderr
        assert first.alive()


def test_version_on_every_binary():
    for name in ("baton", "baton-worker", "baton-bench"):
        r = run([binary(name), "--version"])
        assert r.returncode == 0, (name, r)
        assert re.fullmatch(rf"{name} \d+\.\d+\.\d+\n", r.stdout), (name, r.stdout)


def test_bad_flag_is_one_line():
    for name in ("baton-worker", "baton-bench"):
        r = run([binary(name), "--no-such-flag"])
        assert r.returncode == 2, (name, r)
        lines = r.stderr.splitlines()
        assert len(lines) == 1, (name, r.stderr)
        assert "--no-such-flag" in lines[0] and "see --help" in lines[0], (name, lines)
    r = run([binary("baton"), "--no-such-flag"])
    assert r.returncode == 2 and "--no-such-flag" in r.stderr and len(r.stderr.splitlines()) <= 2


def test_help_has_no_issue_numbers():
    for name in ("baton", "baton-worker", "baton-bench"):
        r = run([binary(name), "--help"])
        assert r.returncode == 0, (name, r)
        assert not re.search(r"issue \d|#\d", r.stdout, re.I), (name, r.stdout)


def test_router_help_grouped_with_choices_and_defaults():
    out = run([binary("baton"), "--help"]).stdout
    heads = [ln[:-1] for ln in out.splitlines() if re.fullmatch(r"[a-z]+:", ln)]
    assert heads == HELP_GROUPS, heads  # and no "other:" group
    pol = [ln for ln in out.splitlines() if ln.strip().startswith("--policy ")]
    assert len(pol) == 1 and all(p in pol[0] for p in POLICIES), pol
    # Every option of the table (the lines with a metavar or a bool) says its default.
    for ln in out.splitlines():
        m = re.match(r"  (--[a-z-]+)", ln)
        if m and m.group(1) not in ("--config", "--version", "--prefill", "--decode",
                                    "--prefill-engine-id", "--worker"):
            assert "(default: " in ln, ln
    # The registry's TLS options sit with --registry.
    reg = out.split("\nregistry:\n", 1)[1]
    for flag in ("--registry ", "--registry-ca", "--registry-cert", "--registry-key"):
        assert flag in reg, flag


def router_file_cases(tmp):
    cert = os.path.join(tmp, "present.pem")
    with open(cert, "w") as f:
        f.write("x\n")
    return [
        ["--tls-cert", MISSING, "--tls-key", MISSING],
        ["--tls-cert", cert, "--tls-key", MISSING],
        ["--tls-cert", cert, "--tls-key", cert, "--tls-client-ca", MISSING],
        ["--upstream-ca", MISSING],
        ["--upstream-cert", MISSING, "--upstream-key", cert],
        ["--api-key-file", MISSING],
        ["--admin-token-file", MISSING],
        ["--config", MISSING],
        ["--registry", "etcd://127.0.0.1:9/baton", "--registry-password-file", MISSING],
        ["--registry", "etcds://127.0.0.1:9/baton", "--registry-ca", MISSING],
    ]


def test_file_options_say_cannot_read():
    with tempfile.TemporaryDirectory() as tmp:
        for case in router_file_cases(tmp):
            r = run([binary("baton"), "--port", "0"] + case)
            assert r.returncode != 0, (case, r)
            assert NOENT in r.stderr, (case, r.stderr)
            assert "Read/write of file" not in r.stderr, (case, r.stderr)
        worker_cases = [
            ["--tls-cert", MISSING, "--tls-key", MISSING],
            ["--register", "etcds://127.0.0.1:9/baton", "--register-ca", MISSING],
            ["--mode", "prefill", "--bootstrap-port", "0", "--kv-secret-file", MISSING],
        ]
        for case in worker_cases:
            r = run([binary("baton-worker"), "--port", "0"] + case)
            assert r.returncode != 0, (case, r)
            assert NOENT in r.stderr, (case, r.stderr)
        r = run([binary("baton-bench"), "--ca", MISSING, "--base-url", "https://127.0.0.1:9",
                 "--num-requests", "1"])
        assert r.returncode != 0 and NOENT in r.stderr, r


def test_normal_run_logs_no_warning():
    with Cluster("cli-quiet") as c:
        p, d, r = c.pd()
        msgs = [{"role": "user", "content": "Hello there"}]
        for stream in (False, True):
            res = post(r.port, "/v1/chat/completions",
                       {"messages": msgs, "max_tokens": 8, "stream": stream})
            assert res.status == 200, res.text
        for proc in (r, d, p):  # the router first, then the decode before its prefill
            assert proc.stop() == 0, proc.name
        for proc in (p, d, r):
            with open(proc.log_path) as f:
                warns = [ln for ln in f if "level=warn" in ln or "level=error" in ln]
            assert not warns, (proc.name, warns)


if __name__ == "__main__":
    t = TestRunner()
    t.run(test_second_router_on_a_port_is_refused)
    t.run(test_version_on_every_binary)
    t.run(test_bad_flag_is_one_line)
    t.run(test_help_has_no_issue_numbers)
    t.run(test_router_help_grouped_with_choices_and_defaults)
    t.run(test_file_options_say_cannot_read)
    t.run(test_normal_run_logs_no_warning)
    t.finish()
