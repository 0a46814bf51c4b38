"""test_docs.py — every shell command in README.md and docs/*.md is either run here as written or
listed in RULES with the reason it cannot run on one machine.

The commands are extracted from the ```sh blocks (continuation lines joined, comments dropped).
Each one must match a rule (first match wins); a command without one fails the suite, so a new
or changed command in the docs gets a rule: a runner, or a reason. Runners change only what one
machine needs: ports become free ephemeral ones, `localhost:8000` the router started here,
/opt/baton a temporary prefix (installed with `cmake --install`, what `make install` runs after
its build), bare program names the built ones.
"""

import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from harness import BUILD_DIR, Cluster, TestRunner, binary, free_port  # noqa: E402

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
SHELLS = ("sh", "bash", "shell")


def doc_files():
    return [os.path.join(ROOT, "README.md")] + sorted(glob.glob(os.path.join(ROOT, "docs", "*.md")))


def blocks(path):
    """(first line, [lines]) of each ```sh block."""
    lang, buf, start = None, [], 0
    with open(path, encoding="utf-8") as f:
        for i, line in enumerate(f, 1):
            m = re.match(r"^\s*```(\w*)\s*$", line)
            if m and lang is None:
                lang, buf, start = m.group(1) or "-", [], i
            elif m:
                if lang in SHELLS:
                    yield start, buf
                lang = None
            elif lang is not None:
                buf.append(line.rstrip("\n"))


def commands(lines):
    """One string per command: continuations and open quotes joined, comments dropped."""
    cur = ""
    for line in lines:
        s = line.strip()
        if not cur and (not s or s.startswith("#")):
            continue
        cur = f"{cur} {s}" if cur else s
        if cur.endswith("\\"):
            cur = cur[:-1].rstrip()
            continue
        if cur.count("'") % 2:
            continue
        yield re.sub(r"\s+#\s.*$", "", cur)
        cur = ""


def all_commands():
    out = []
    for path in doc_files():
        for start, lines in blocks(path):
            for c in commands(lines):
                out.append((f"{os.path.relpath(path, ROOT)}:{start}", c))
    return out



def sh(cmd, cwd=None, env=None, timeout=120):
    path = BUILD_DIR + os.pathsep + os.environ.get("PATH", "")
    r = subprocess.run(["sh", "-c", cmd], cwd=cwd, capture_output=True, text=True,
                       timeout=timeout, env=dict(os.environ, PATH=path, **(env or {})),
                       stdin=subprocess.DEVNULL)
    assert r.returncode == 0, f"{cmd}\nexit {r.returncode}\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}"
    return r.stdout


# ---- runners: each gets the command and a shared context; it asserts what the doc promises ----

class Ctx:
    def __init__(self, cluster):
        self.c = cluster
        self.pd_router = None
        self.tmp = tempfile.mkdtemp(prefix="baton-docs-")
        self.prefix = None

    def router_port(self):
        """A router with a prefill/decode pair of baton-workers, for the API examples."""
        if self.pd_router is None:
            _, _, self.pd_router = self.c.pd()
        return self.pd_router.port


def run_api_curl(cmd, ctx):
    port = ctx.router_port()
    out = sh(cmd.replace("localhost:8000", f"127.0.0.1:{port}"))
    assert out.strip(), cmd


def run_pki(cmd, ctx):
    sh(cmd, cwd=ctx.tmp)


def run_tls_router_and_curl(cmd, ctx):
    """SECURITY.md: the router with the recipe's certificates, then the mTLS curl."""
    if cmd.startswith("baton "):
        ctx.tls_port = free_port()
        argv = cmd.replace("--port 8443", f"--port {ctx.tls_port}").split()
        argv[0] = binary("baton")
        # The recipe's files are in the directory it ran in (the harness starts no cwd).
        argv = [os.path.join(ctx.tmp, a) if re.fullmatch(r"[\w.-]+\.(pem|key)", a) else a
                for a in argv]
        p = ctx.c.start("docs-tls-router", argv, wait=())
        p.wait_log(r"\slistening addr=", timeout=20)
        return
    out = sh(cmd.replace("localhost:8443", f"localhost:{ctx.tls_port}"), cwd=ctx.tmp)
    assert '"status"' in out, out


def run_vllm_nixl_block(cmd, ctx):
    """README "Fronting vLLM": the baton-worker pair and the router, ports made free."""
    if not hasattr(ctx, "nixl_ports"):
        ctx.nixl_ports = {p: str(free_port()) for p in ("8100", "8200", "8998", "8000")}
    for old, new in ctx.nixl_ports.items():
        cmd = re.sub(rf"(?<=[ :]){old}\b", new, cmd)
    argv = cmd.split()
    argv[0] = binary(argv[0])
    name = f"docs-{os.path.basename(argv[0])}-{len(ctx.c.procs)}"
    p = ctx.c.start(name, argv, wait=())
    p.wait_log(r"\slistening addr=", timeout=20)
    if os.path.basename(argv[0]) == "baton":
        port = int(ctx.nixl_ports["8000"])
        sh(f"curl -sf 127.0.0.1:{port}/v1/completions -d "
           "'{\"prompt\":\"Hello\",\"max_tokens\":4}'")


def run_libbaton_install(cmd, ctx):
    """LIBBATON.md: install into a temporary prefix, build the C example as the doc says."""
    if ctx.prefix is None:
        ctx.prefix = os.path.join(ctx.tmp, "opt-baton")
        shutil.copy(os.path.join(ROOT, "examples", "c", "kv_handoff.c"),
                    os.path.join(ctx.tmp, "my_engine.c"))
    if cmd.startswith("make install"):
        sh(f"cmake --install {BUILD_DIR} --prefix {ctx.prefix}", timeout=300)
        return
    if cmd.startswith("export PKG_CONFIG_PATH="):
        ctx.pc = cmd.split("=", 1)[1].replace("/opt/baton", ctx.prefix)
        return
    env = {"PKG_CONFIG_PATH": ctx.pc}
    if cmd.startswith("LIBDIR="):
        ctx.libdir = sh("pkg-config --variable=libdir baton", env=env).strip()
        return
    env["LIBDIR"] = getattr(ctx, "libdir", "")
    sh(cmd + " -o my_engine" + sanitizer_flags(), cwd=ctx.tmp, env=env)
    out = subprocess.run([os.path.join(ctx.tmp, "my_engine")], capture_output=True, text=True,
                         timeout=30)
    assert "usage" in (out.stdout + out.stderr).lower(), out


def sanitizer_flags():
    """A sanitizer build's libbaton needs its runtime in the program linked with it too."""
    try:
        with open(os.path.join(BUILD_DIR, "CMakeCache.txt")) as f:
            on = re.search(r"^BATON_SANITIZE:BOOL=ON$", f.read(), re.M) is not None
    except OSError:
        on = False
    return " -fsanitize=address,undefined" if on else ""


def run_baton_tok(cmd, ctx):
    """TOKENIZER.md: baton-tok on a model's files — GPT-4o's from the npm test packages
    (scripts/install-deps.sh --test); without them there is no model directory to run it on."""
    model = os.path.join(ROOT, "tests", "npm", "node_modules", "@lenml", "tokenizer-gpt4o",
                         "models")
    if not os.path.exists(os.path.join(model, "tokenizer.json")):
        print(f"  (not run, no tokenizer files installed: {cmd})", flush=True)
        return
    cmd = cmd.replace("MODEL_DIR", model).replace("build/baton-tok",
                                                  os.path.join(BUILD_DIR, "baton-tok"))
    r = subprocess.run(["sh", "-c", cmd], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip(), (cmd, r.stdout, r.stderr)


def run_help(cmd, ctx):
    """A program whose doc line is its --help."""
    argv = cmd.split()
    argv[0] = os.path.join(BUILD_DIR, os.path.basename(argv[0]))
    r = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    assert r.returncode == 0 and r.stdout, r


def run_gpu_check(cmd, ctx):
    """scripts/gpu-check.sh on the suite's build: without a GPU every check skips visibly (77);
    --fake runs them on the fake driver and they pass; a build without the CUDA Toolkit has no
    baton-gpu-check and the script says so (2)."""
    argv = cmd.split()
    argv[0] = os.path.join(ROOT, argv[0])
    argv[argv.index("--build") + 1] = BUILD_DIR
    argv += ["--out", os.path.join(ctx.tmp, "gpu-check")]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=300, cwd=ROOT,
                       stdin=subprocess.DEVNULL)
    out = r.stdout + r.stderr
    if not os.path.exists(os.path.join(BUILD_DIR, "baton-gpu-check")):
        assert r.returncode == 2 and "is missing" in out, out[-2000:]
    elif "--fake" in argv:
        assert r.returncode == 0 and "0 failed" in out and "(fake driver)" in out, out[-2000:]
    else:
        assert r.returncode in (0, 77), out[-2000:]
        if r.returncode == 77:
            assert "SKIP" in out, out[-2000:]


# ---- the rules --------------------------------------------------------------------------------

OTHER_HOSTS = "names other machines (10.0.0.x, pod or etcd hosts): a multi-host deployment"
GPU_ENGINE = "starts a GPU inference engine (vLLM / SGLang), not installed on the test machine"
BENCH = "a benchmark run (minutes of load, the figures of docs/BENCHMARKS.md); the scenarios' " \
        "--smoke forms run in test_scenarios, test_etcd, test_tls, test_cache_scenario, " \
        "test_worker_vllm, test_bench, test_xfer_bench and test_migration (chaos_migration)"
ROOT_ONLY = "changes the machine (sudo, systemctl, /etc): run by test_deploy_systemd against " \
            "a temporary prefix instead"

STORE = "the baton-store recipe (a master and a node that run until stopped, fixed ports): the " \
        "same commands run on ephemeral ports in test_store"

RULES = [
    (r"^head -c 32 /dev/urandom \| base64 > store\.secret$", STORE),
    (r"^baton-store (master|node|put|get|exists|stat) ", STORE),
    (r"^make demo$", "run by test_demo: scripts/demo.sh, what `make demo` runs after its build"),
    (r"^make test$", "the test suite itself"),
    (r"^python3 -m sglang\.launch_server ", GPU_ENGINE),
    (r"(^|\s)vllm serve ", GPU_ENGINE),
    (r"^baton .*10\.0\.0\.", OTHER_HOSTS),
    (r"^baton-worker .*10\.0\.0\.", OTHER_HOSTS),
    (r"^curl .*localhost:8000/workers -d '\{\"url\":\"http://10\.0\.0\.\d+:80[12]0\"",
     "registers vLLM workers on other machines, after the router of the line above"),
    (r"^baton --host 0\.0\.0\.0 --port 8000 --pd-protocol vllm-mooncake$",
     "the router for the vLLM Mooncake workers on 10.0.0.x (the same line is started in "
     "test_worker_vllm::test_mooncake_command_line's form)"),
    (r"^curl .*localhost:8000/", run_api_curl),
    (r"^baton-worker --mode (prefill|decode) +--protocol vllm-nixl", run_vllm_nixl_block),
    (r"^baton --port 8000 --pd-protocol vllm-nixl ", run_vllm_nixl_block),
    (r"^baton-bench --base-url http://127\.0\.0\.1:8000 ", BENCH),
    (r"^baton-bench --endpoint generate --dataset sharegpt\.json", BENCH),
    (r"^baton-bench --compare ", "compares two result files of earlier runs (test_bench "
     "::test_compare_and_cli_errors runs --compare)"),
    (r"^python3 loadtest/scenarios/", BENCH),
    (r"^build/baton-(tree-cost|xfer-bench) --(?!help)", BENCH),
    (r"^(echo '[^']*' \| )?build/baton-tok (encode|info) MODEL_DIR( --special)?$", run_baton_tok),
    (r"^build/baton-xfer-bench --help$", run_help),
    (r"^(sh )?scripts/install-bench-deps\.sh$", "installs packages (root, network)"),
    (r"^cmake -S \. -B ", "configures a second build tree; the suite runs in the one it was "
     "configured in"),
    (r"^cmake --build ", "builds benchmark binaries in a second tree (the suite's own build "
     "built them)"),
    (r"^(make install PREFIX=/opt/baton|export PKG_CONFIG_PATH=/opt/baton/lib/pkgconfig|"
     r"LIBDIR=\$\(pkg-config --variable=libdir baton\))$", run_libbaton_install),
    (r"^cc my_engine\.c ", run_libbaton_install),
    (r"^kubectl ", "needs a Kubernetes cluster; test_deploy_k8s runs the manifests' commands"),
    (r"^podman build ", "no container builder can run on the test machine "
     "(docs/OPERATIONS.md says so)"),
    (r"^sudo ", ROOT_ONLY),
    (r"^(openssl |printf )", run_pki),
    (r"^baton --port 8443 --tls-cert router\.pem ", run_tls_router_and_curl),
    (r"^curl --cacert ca\.pem --cert client\.pem ", run_tls_router_and_curl),
    (r"^baton --host 0\.0\.0\.0 --port 8443 --tls-cert /etc/baton/", "reads certificates from "
     "/etc/baton and names workers on other machines; test_tls runs the same options"),
    (r"^baton-worker --mode decode --host 0\.0\.0\.0 --port 30001 --tls-cert /etc/baton/",
     "reads certificates from /etc/baton; test_tls runs the same options"),
    (r"^kill -HUP \$\(pidof baton\)", "signals every baton on the machine; test_tls_refusals "
     "reloads certificates with SIGHUP"),
    (r"^mkdir -p /tmp/corpus-pdreq$", "the long fuzzing run's set-up (below)"),
    (r"^build-fuzz/fuzz/fuzz_pdreq ", "a long fuzzing run (10^7 inputs); fuzz_smoke runs "
     "each harness for 10 s"),
    (r"^scripts/gpu-check\.sh --build build --no-build( --fake)?$", run_gpu_check),
    (r"^scripts/gpu-check\.sh( --build build-gpu --bundle-to gpu-bundle)?$", "builds a second "
     "tree (build-gpu) with the CUDA Toolkit; the --no-build forms run here on the suite's build"),
    (r"^scripts/gpu-check\.sh --bundle gpu-bundle ", "runs on a GPU machine from a bundle made "
     "by --bundle-to; the --no-build forms run the same checks here"),
]


def rule_for(cmd):
    for rx, action in RULES:
        if re.search(rx, cmd):
            return rx, action
    return None, None


def test_every_command_has_a_rule():
    cmds = all_commands()
    assert len(cmds) > 50, len(cmds)  # the extraction found the docs' blocks
    missing = [f"{where}: {c}" for where, c in cmds if rule_for(c)[0] is None]
    assert not missing, "commands in the docs with no rule in test_docs.py (run them here or " \
                        "give the reason they cannot run):\n" + "\n".join(missing)
    used = {rule_for(c)[0] for _, c in cmds}
    stale = [rx for rx, _ in RULES if rx not in used]
    assert not stale, f"rules that match no command any more: {stale}"


def test_runnable_commands_run():
    cmds = all_commands()
    with Cluster("docs") as c:
        ctx = Ctx(c)
        try:
            ran = 0
            for where, cmd in cmds:
                _, action = rule_for(cmd)
                if callable(action):
                    t0 = time.monotonic()
                    try:
                        action(cmd, ctx)
                    except Exception as e:
                        raise AssertionError(f"{where}: {cmd}\n{e}") from e
                    print(f"  ran {where}: {cmd[:90]} ({time.monotonic() - t0:.1f}s)",
                          flush=True)
                    ran += 1
                else:
                    print(f"  not run {where}: {cmd[:70]}: {action}", flush=True)
            assert ran >= 20, ran
        finally:
            shutil.rmtree(ctx.tmp, ignore_errors=True)


if __name__ == "__main__":
    t = TestRunner()
    t.run(test_every_command_has_a_rule)
    t.run(test_runnable_commands_run)
    t.finish()
