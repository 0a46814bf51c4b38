#!/usr/bin/env python3
"""run_examples.py BUILD_DIR SOURCE_DIR c|python — libbaton as a third party sees it.

c: installs the build into a temporary prefix under BUILD_DIR (cmake --install), compiles
   examples/c/kv_handoff.c with `pkg-config --cflags --libs baton` from that prefix only, and runs a
   hand-off between two example processes on 127.0.0.1 over tcp and over shm; the decode process
   checks every byte (exit 0 only when all match) and the prefill one that DONE went out. Then
   the same example linked with the installed libbaton.a, over tcp.
python: runs examples/python/kv_handoff.py the same way (two Python processes, ctypes binding on
   the freshly built libbaton.so), over tcp and shm.
"""
import glob
import os
import shutil
import subprocess
import sys
import tempfile

TIMEOUT_S = 120


def run(cmd, **kw):
    print("+", " ".join(cmd), flush=True)
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT_S, **kw)
    if r.returncode != 0:
        raise SystemExit(f"FAIL: exit {r.returncode}\n{r.stdout}\n{r.stderr}")
    return r


def handoff(prefill_cmd, decode_cmd, env):
    """Starts the prefill process, reads its port, runs the decode process; both must exit 0."""
    pre = subprocess.Popen(prefill_cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           env=env)
    try:
        line = pre.stdout.readline()  # "port=N", printed once it listens
        if not line.startswith("port="):
            pre.kill()
            out, err = pre.communicate()
            raise SystemExit(f"FAIL: prefill did not print its port: {line!r} {err}")
        port = line.strip().split("=", 1)[1]
        dec = subprocess.run(decode_cmd + [port], capture_output=True, text=True, env=env,
                             timeout=TIMEOUT_S)
        if dec.returncode != 0:
            pre.kill()  # it would wait for a room that never comes
        out, err = pre.communicate(timeout=TIMEOUT_S)
    finally:
        if pre.poll() is None:
            pre.kill()
            pre.wait()
    print(dec.stdout, dec.stderr[-3000:], out, err[-3000:], sep="\n", flush=True)
    if dec.returncode != 0 or pre.returncode != 0:
        raise SystemExit(f"FAIL: decode rc={dec.returncode} prefill rc={pre.returncode}")
    if "bad_bytes=0 " not in dec.stdout:
        raise SystemExit("FAIL: decode did not report every byte verified")
    if "libbaton" not in dec.stderr + err:
        raise SystemExit("FAIL: no libbaton log line reached the host's log callback")


# In a sanitizer build (make test SANITIZE=1) libbaton is instrumented: the host program is
# compiled with the same runtime, and Python (which is not) gets it preloaded.
SANITIZE = os.environ.get("BATON_SANITIZE") == "1"
SAN_FLAGS = ["-fsanitize=address,undefined"] if SANITIZE else []


def sanitizer_env(env):
    if not SANITIZE:
        return env
    libs = [run(["cc", f"-print-file-name={n}"]).stdout.strip() for n in ("libasan.so",
                                                                           "libubsan.so")]
    # The interpreter's own allocations are not ours to report: leak checks stay off for it.
    return dict(env, LD_PRELOAD=" ".join(libs), ASAN_OPTIONS="detect_leaks=0")


def example_c(build, src):
    prefix = tempfile.mkdtemp(prefix="example-c-prefix.", dir=build)
    try:
        run(["cmake", "--install", build, "--prefix", prefix])
        pcs = glob.glob(os.path.join(prefix, "**", "pkgconfig", "baton.pc"), recursive=True)
        if len(pcs) != 1:
            raise SystemExit(f"FAIL: baton.pc not installed once: {pcs}")
        for h in ("transfer.h", "transfer_error.h", "version.h", "export.h"):
            if not os.path.exists(os.path.join(prefix, "include", "baton", h)):
                raise SystemExit(f"FAIL: include/baton/{h} not installed")
        if os.path.exists(os.path.join(prefix, "include", "baton", "error.h")):
            raise SystemExit("FAIL: the internal baton/error.h was installed")
        env = dict(os.environ, PKG_CONFIG_PATH=os.path.dirname(pcs[0]))
        flags = run(["pkg-config", "--cflags", "--libs", "baton"], env=env).stdout.split()
        libdir = run(["pkg-config", "--variable=libdir", "baton"], env=env).stdout.strip()
        if not os.path.exists(os.path.join(libdir, "libbaton.so.0")):
            raise SystemExit(f"FAIL: libbaton.so.0 not in {libdir}")
        exe = os.path.join(prefix, "kv_handoff")
        # Only what pkg-config says: no include path or library from the source or build tree.
        run(["cc", "-Wall", "-Wextra", "-Wno-unused-parameter", "-Werror", "-o", exe,
             os.path.join(src, "examples", "c", "kv_handoff.c")] + SAN_FLAGS + flags +
            [f"-Wl,-rpath,{libdir}"])
        needed = run(["readelf", "-d", exe]).stdout
        if "libbaton.so.0" not in needed:
            raise SystemExit("FAIL: the example does not link libbaton.so.0")
        for tp in ("tcp", "shm"):
            handoff([exe, "prefill", tp], [exe, "decode", tp], env)
        # The static library: everything of Baton inside the executable, its dependencies shared.
        cflags = run(["pkg-config", "--cflags", "baton"], env=env).stdout.split()
        deps = run(["pkg-config", "--libs", "libuv", "libibverbs"]).stdout.split()
        exe_static = exe + "-static"
        run(["cc", "-Wall", "-Wextra", "-Wno-unused-parameter", "-Werror", "-o", exe_static,
             os.path.join(src, "examples", "c", "kv_handoff.c")] + SAN_FLAGS + cflags +
            [os.path.join(libdir, "libbaton.a")] + deps + ["-lmbedcrypto", "-lpthread", "-ldl",
                                                           "-lm"])
        if "libbaton" in run(["readelf", "-d", exe_static]).stdout:
            raise SystemExit("FAIL: the static example still needs libbaton.so")
        handoff([exe_static, "prefill", "tcp"], [exe_static, "decode", "tcp"], env)
        # `pkg-config --static --libs baton` alone gives a line that links (docs/LIBBATON.md),
        # against libbaton.so beside libbaton.a and against libbaton.a alone.
        static_libs = run(["pkg-config", "--cflags", "--static", "--libs", "baton"],
                          env=env).stdout.split()
        if "-lmbedcrypto" not in static_libs:
            raise SystemExit(f"FAIL: pkg-config --static misses -lmbedcrypto: {static_libs}")
        exe_pc = exe + "-pc-static"
        run(["cc", "-o", exe_pc, os.path.join(src, "examples", "c", "kv_handoff.c")] + SAN_FLAGS +
            static_libs + [f"-Wl,-rpath,{libdir}"])
        handoff([exe_pc, "prefill", "tcp"], [exe_pc, "decode", "tcp"], env)
        only_a = tempfile.mkdtemp(prefix="only-a.", dir=build)
        try:
            shutil.copy(os.path.join(libdir, "libbaton.a"), only_a)
            run(["cc", "-o", exe_pc, os.path.join(src, "examples", "c", "kv_handoff.c")] +
                SAN_FLAGS + [f"-L{only_a}"] + static_libs)
            if "libbaton" in run(["readelf", "-d", exe_pc]).stdout:
                raise SystemExit("FAIL: linked libbaton.so with only libbaton.a on the path")
            handoff([exe_pc, "prefill", "tcp"], [exe_pc, "decode", "tcp"], env)
        finally:
            shutil.rmtree(only_a, ignore_errors=True)
    finally:
        shutil.rmtree(prefix, ignore_errors=True)


def example_python(build, src):
    script = os.path.join(src, "examples", "python", "kv_handoff.py")
    lib = os.path.join(build, "lib", "libbaton.so.0")
    env = sanitizer_env(dict(os.environ, BATON_LIBRARY=lib, PYTHONDONTWRITEBYTECODE="1"))
    for tp in ("tcp", "shm"):
        handoff([sys.executable, script, "prefill", tp], [sys.executable, script, "decode", tp],
                env)
    # After `make install`: the installed example finds the installed library by itself, and the
    # source tree's through pkg-config, with no BATON_LIBRARY.
    prefix = tempfile.mkdtemp(prefix="example-py-prefix.", dir=build)
    try:
        run(["cmake", "--install", build, "--prefix", prefix])
        bare = {k: v for k, v in os.environ.items()
                if k not in ("BATON_LIBRARY", "PKG_CONFIG_PATH", "LD_LIBRARY_PATH")}
        bare = sanitizer_env(dict(bare, PYTHONDONTWRITEBYTECODE="1"))
        installed = os.path.join(prefix, "share", "baton", "python", "kv_handoff.py")
        handoff([sys.executable, installed, "prefill", "tcp"],
                [sys.executable, installed, "decode", "tcp"], bare)
        pcs = glob.glob(os.path.join(prefix, "**", "pkgconfig", "baton.pc"), recursive=True)
        via_pc = dict(bare, PKG_CONFIG_PATH=os.path.dirname(pcs[0]))
        handoff([sys.executable, script, "prefill", "tcp"],
                [sys.executable, script, "decode", "tcp"], via_pc)
    finally:
        shutil.rmtree(prefix, ignore_errors=True)


def main():
    build, src, which = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2]), sys.argv[3]
    {"c": example_c, "python": example_python}[which](build, src)
    print("PASS")


if __name__ == "__main__":
    main()
