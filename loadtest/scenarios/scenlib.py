"""scenlib.py — shared plumbing of the benchmark scenarios: processes on loopback ephemeral
ports, an nginx with a generated configuration, baton-bench runs, /proc readings, tables.

Standard library only. Every process a scenario starts is owned by a Lab and stopped when the
Lab closes (also on an exception or Ctrl-C); its log and the generated files live in a
temporary directory that is removed unless --keep is given (or printed when something failed).
"""

import argparse
import json
import os
import random
import re
import resource
import shutil
import signal
import statistics
import socket
import subprocess
import sys
import tempfile
import time

HOST = "127.0.0.1"
_LISTEN_RE = re.compile(r"\s(?:([a-z]+)_)?listening addr=(\S+):(\d+)")
REPO = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))


def arg_parser(description):
    """The options every scenario has."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--smoke", action="store_true",
                   help="a few seconds with a small load (what ctest runs)")
    p.add_argument("--build-dir", default=os.environ.get("BATON_BUILD_DIR")
                   or os.path.join(REPO, "build"),
                   help="where baton, baton-worker and baton-bench are (default: "
                        "$BATON_BUILD_DIR or build/)")
    p.add_argument("--keep", action="store_true",
                   help="keep the temporary directory (logs, nginx.conf, bench JSON files)")
    p.add_argument("--json", metavar="FILE", help="also write the scenario's figures as JSON")
    return p


def binary(build_dir, name):
    path = os.path.join(build_dir, name)
    if not os.access(path, os.X_OK):
        sys.exit(f"scenario: {path} is not built (cmake --build {build_dir} --target {name})")
    return path


def find_nginx():
    """The nginx executable, or None."""
    for cand in (shutil.which("nginx"), "/usr/sbin/nginx", "/usr/local/sbin/nginx"):
        if cand and os.access(cand, os.X_OK):
            return cand
    return None


def raise_nofile(want):
    """Raises this process's descriptor limit (children inherit it); returns the new soft limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and want > hard:
        try:  # root may raise the hard limit too (up to fs.nr_open)
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, want))
            return want
        except (ValueError, OSError):
            pass
    target = want if hard == resource.RLIM_INFINITY else min(want, hard)
    if target > soft:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError):
            pass
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def _port_pool():
    """The loopback ports free_port draws from: those below the kernel's ephemeral range
    (net.ipv4.ip_local_port_range), or above it when it starts low."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            lo, hi = (int(x) for x in f.read().split())
    except (OSError, ValueError):
        lo, hi = 32768, 60999
    return (10000, lo) if lo - 10000 >= 4000 else (hi + 1, 65536)


def free_port():
    """A loopback port for a server that cannot report an ephemeral one. It is drawn outside
    the ephemeral range, so the source port of some process's outgoing connection cannot take
    it between this check and the server's bind (a port bound to 0 and released can be taken
    so); a bind check skips ports in use."""
    lo, hi = _port_pool()
    rnd = random.SystemRandom()
    for _ in range(1000):
        port = rnd.randrange(lo, hi)
        with socket.socket() as s:
            try:
                s.bind((HOST, port))
            except OSError:
                continue
        return port
    raise RuntimeError(f"no free loopback port in {lo}-{hi - 1}")


def free_ports(n):
    """n distinct free_port()s."""
    ports = set()
    while len(ports) < n:
        ports.add(free_port())
    return list(ports)


def wait_connectable(port, timeout=10.0, proc=None):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            return False
        try:
            socket.create_connection((HOST, port), timeout=0.5).close()
            return True
        except OSError:
            time.sleep(0.05)
    return False


# ---- /proc ----

CLK_TCK = os.sysconf("SC_CLK_TCK")


def rss_kib(pid):
    """VmRSS of a process in KiB."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for pid {pid}")


def cpu_seconds(pid):
    """utime + stime of a process (all its threads), in seconds."""
    with open(f"/proc/{pid}/stat") as f:
        data = f.read()
    # The command name may hold spaces and parentheses: fields start after the last ')'.
    fields = data[data.rindex(")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def children(pid):
    """Direct children of pid (nginx workers of a master)."""
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                data = f.read()
        except OSError:
            continue
        fields = data[data.rindex(")") + 2:].split()
        if int(fields[1]) == pid:
            out.append(int(name))
    return out


def tree_cpu_seconds(pid):
    """utime + stime of a process and all its descendants (nginx: master + workers; Baton:
    one process, its threads already in its own figure), in seconds. A descendant that exits
    during a measurement takes its time with it: measure long-lived process trees."""
    total, todo = 0.0, [pid]
    while todo:
        p = todo.pop()
        try:
            total += cpu_seconds(p)
        except OSError:
            continue  # gone since it was listed
        todo += children(p)
    return total


# ---- processes ----

class Proc:
    def __init__(self, name, argv, logdir, env=None):
        self.name = name
        self.log_path = os.path.join(logdir, f"{name}.log")
        self._log = open(self.log_path, "w")
        full_env = dict(os.environ)
        if env:
            full_env.update(env)
        self.p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=self._log,
                                  stderr=subprocess.STDOUT, env=full_env, start_new_session=True)
        self.pid = self.p.pid
        self.ports = {}

    def wait_ports(self, keys=("http",), timeout=20.0):
        deadline = time.monotonic() + timeout
        while True:
            with open(self.log_path, errors="replace") as f:
                for line in f:
                    m = _LISTEN_RE.search(line)
                    if m:
                        self.ports.setdefault(m.group(1) or "http", int(m.group(3)))
            if all(k in self.ports for k in keys):
                return self
            if self.p.poll() is not None:
                raise RuntimeError(f"{self.name} exited ({self.p.returncode}) before listening:\n"
                                   + self.tail())
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.name} did not listen within {timeout}s:\n" + self.tail())
            time.sleep(0.05)

    @property
    def port(self):
        return self.ports["http"]

    @property
    def url(self):
        return f"http://{HOST}:{self.port}"

    def tail(self, n=20):
        try:
            with open(self.log_path, errors="replace") as f:
                return "".join(f.readlines()[-n:])
        except OSError:
            return ""

    def stop(self):
        if self.p.poll() is None:
            try:
                os.killpg(self.p.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                self.p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(self.p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                self.p.wait(timeout=5)
        self._log.close()


class Lab:
    """Owns the processes and files of one scenario run."""

    def __init__(self, args, name):
        self.args = args
        self.build = os.path.abspath(args.build_dir)
        self.dir = tempfile.mkdtemp(prefix=f"baton-{name}-")
        self.procs = []
        self.bench_runs = 0
        self.nginx_path = find_nginx()

    def __enter__(self):
        # Ctrl-C and SIGTERM unwind through __exit__, which stops everything.
        def on_term(signum, frame):
            raise KeyboardInterrupt
        signal.signal(signal.SIGTERM, on_term)
        return self

    def __exit__(self, exc_type, exc, tb):
        for p in reversed(self.procs):
            p.stop()
        if exc_type is None and not self.args.keep:
            shutil.rmtree(self.dir, ignore_errors=True)
        else:
            if exc_type is not None and exc_type is not KeyboardInterrupt:
                for p in self.procs:
                    sys.stderr.write(f"---- {p.name} ({p.log_path}) ----\n{p.tail()}")
            sys.stderr.write(f"scenario: files kept in {self.dir}\n")
        return False

    def bin(self, name):
        return binary(self.build, name)

    def start(self, name, argv, keys=("http",), env=None):
        p = Proc(name, argv, self.dir, env=env)
        self.procs.append(p)
        if keys:
            p.wait_ports(keys)
        return p

    def worker(self, mode, *extra, name=None, log_level="info"):
        argv = [self.bin("baton-worker"), "--mode", mode, "--host", HOST, "--port", "0",
                "--log-level", log_level]
        keys = ("http",)
        if mode == "prefill":
            argv += ["--bootstrap-port", "0"]
            keys = ("http", "bootstrap")
        argv += [str(x) for x in extra]
        return self.start(name or f"worker-{mode}-{len(self.procs)}", argv, keys)

    def worker_has_option(self, option):
        """Whether this baton-worker build knows a command-line option (it grows over time)."""
        if not hasattr(self, "_worker_help"):
            r = subprocess.run([self.bin("baton-worker"), "--help"], stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True)
            self._worker_help = r.stdout
        return option in self._worker_help

    def router(self, *extra, name="baton"):
        argv = [self.bin("baton"), "--host", HOST, "--port", "0", "--log-level", "info"]
        argv += [str(x) for x in extra]
        return self.start(name, argv)

    def nginx_canned(self, answers, name="nginx-canned", workers=1):
        """An nginx that answers every request on a path with a fixed body, without reading
        anything upstream: the cheapest HTTP server at hand, to find baton-bench's own ceiling.
        answers: {path: (content_type, body)}. None when nginx is not installed."""
        locs = []
        for path, (ctype, body) in answers.items():
            quoted = body.replace("\\", "\\\\").replace("'", "\\'").replace("\n", "\\n")
            locs.append(f"""        location = {path} {{
            default_type {ctype};
            return 200 '{quoted}';
        }}""")
        locs = "\n".join(locs)
        return self._nginx(name, f"worker_processes {workers};\n", 4096, lambda listen: f"""\
    client_body_buffer_size 1m;
    keepalive_requests 1000000;
    server {{
        listen {listen} backlog=4096;
{locs}
    }}
""")

    def nginx(self, upstream_ports, name="nginx", workers=None, keepalive=256, tls=None):
        """An nginx reverse proxy in front of the given ports, with upstream keep-alive; None
        when nginx is not installed. tls: extra lines of the server block (ssl_certificate, ...)
        that make the listener HTTPS."""
        servers = "\n".join(f"        server {HOST}:{p};" for p in upstream_ports)
        ssl = " ssl" if tls else ""
        ssl_lines = "".join(f"        {ln}\n" for ln in (tls or []))
        main = f"worker_processes {workers or os.cpu_count() or 1};\nworker_rlimit_nofile 65536;\n"
        return self._nginx(name, main, 32768, lambda listen: f"""\
    client_max_body_size 64m;
    client_body_buffer_size 2m;
    keepalive_timeout 75s;
    keepalive_requests 1000000;
    upstream workers {{
{servers}
        keepalive {keepalive};
        keepalive_requests 1000000;
    }}
    server {{
        listen {listen}{ssl} backlog=4096;
{ssl_lines}        location / {{
            proxy_pass http://workers;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
            proxy_request_buffering on;
            proxy_read_timeout 3600s;
        }}
    }}
""")

    def _nginx(self, name, main, connections, http_lines):
        """Writes this lab's nginx.conf for `name` (`main` directives, `connections` per worker,
        the http block's own lines from http_lines(listen address)), starts nginx on a free
        loopback port and waits for it. None when nginx is not installed."""
        if not self.nginx_path:
            return None
        prefix = os.path.join(self.dir, name)
        os.makedirs(os.path.join(prefix, "logs"), exist_ok=True)
        port = free_port()
        conf = f"""# generated by loadtest/scenarios/scenlib.py
{main}error_log {prefix}/logs/error.log warn;
pid {prefix}/nginx.pid;
events {{
    worker_connections {connections};
}}
http {{
    access_log off;
    client_body_temp_path {prefix}/client_body;
    proxy_temp_path {prefix}/proxy;
    fastcgi_temp_path {prefix}/fastcgi;
    uwsgi_temp_path {prefix}/uwsgi;
    scgi_temp_path {prefix}/scgi;
{http_lines(f"{HOST}:{port}")}}}
"""
        conf_path = os.path.join(prefix, "nginx.conf")
        with open(conf_path, "w") as f:
            f.write(conf)
        p = self.start(name, [self.nginx_path, "-p", prefix, "-c", conf_path, "-g",
                              "daemon off;"], keys=())
        if not wait_connectable(port, proc=p.p):
            raise RuntimeError(f"nginx did not come up:\n{p.tail()}")
        p.ports["http"] = port
        return p

    def bench(self, base_url, *args, label=None):
        """Runs baton-bench and returns its result JSON (a dict)."""
        self.bench_runs += 1
        out = os.path.join(self.dir, f"bench-{self.bench_runs:03d}{'-' + label if label else ''}.json")
        argv = [self.bin("baton-bench"), "--base-url", base_url, "--result-json", out,
                "--no-progress", "--quiet"] + [str(a) for a in args]
        r = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        if r.returncode != 0 or not os.path.exists(out):
            raise RuntimeError(f"baton-bench failed ({r.returncode}): {' '.join(argv)}\n"
                               f"{r.stdout}{r.stderr}")
        with open(out) as f:
            return json.load(f)


# ---- output ----

def med(runs, *keys):
    """Median over bench results of runs[i][k0][k1]...; None when absent."""
    vals = []
    for r in runs:
        v = r
        for k in keys:
            v = v.get(k) if isinstance(v, dict) else None
        if v is not None:
            vals.append(v)
    return statistics.median(vals) if vals else None


def fmt(x, nd=2):
    if x is None:
        return "-"
    if isinstance(x, str):
        return x
    if isinstance(x, int):
        return str(x)
    return f"{x:.{nd}f}"


def ratio(x, base):
    if x is None or not base:
        return "-"
    return f"{x / base:.2f}x"


def print_table(title, headers, rows, note=None):
    """A plain-text table (also valid Markdown)."""
    cells = [[str(h) for h in headers]] + [[fmt(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    print(f"\n### {title}\n")
    for i, r in enumerate(cells):
        print("| " + " | ".join(c.rjust(widths[j]) if j else c.ljust(widths[j])
                                for j, c in enumerate(r)) + " |")
        if i == 0:
            print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    if note:
        print(f"\n{note}")
    sys.stdout.flush()


def machine_line():
    """What the numbers were measured on."""
    model = "unknown CPU"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    mem = ""
    try:
        with open("/proc/meminfo") as f:
            kb = int(f.readline().split()[1])
            mem = f", {kb / 1048576:.0f} GiB RAM"
    except (OSError, ValueError, IndexError):
        pass
    load = os.getloadavg()[0]
    return (f"machine: {os.cpu_count()} CPUs ({model}){mem}, Linux {os.uname().release}; "
            f"load average at start {load:.2f}; everything runs on this machine and shares its CPUs")


def load_now():
    return f"load average now {os.getloadavg()[0]:.2f}"


def write_json(path, obj):
    if path:
        with open(path, "w") as f:
            json.dump(obj, f, indent=2)


def skip_note(what):
    print(f"SKIPPED: {what}")
    sys.stdout.flush()
