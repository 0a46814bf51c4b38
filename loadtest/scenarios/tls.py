#!/usr/bin/env python3
"""tls.py — what TLS on the client port costs: Baton vs nginx with the same certificate and suites.

A zero-cost regular baton-worker (plain HTTP) is loaded directly, through Baton over plain HTTP
(reference), through Baton over HTTPS and through nginx over HTTPS (same EC P-256 certificate,
TLS 1.2, ECDHE + AES-GCM/ChaCha20 suites, P-256 first, upstream keep-alive), in one run:
  1. keep-alive at a moderate Poisson rate: p50/p99 latency each path adds over the direct one;
  2. keep-alive at saturation (closed loop): requests/s;
  3. a new connection per request (closed loop): requests/s = full TLS handshakes/s, as seen by
     baton-bench (its TLS client is the project's own layer, mbedTLS);
  4. server-bound handshakes/s: `openssl s_time -new` clients (OpenSSL, much cheaper per
     handshake than the mbedTLS client) against each HTTPS server, no HTTP request;
  5. memory of idle TLS keep-alive connections (one GET /health served on each), RSS per
     connection (nginx: master + workers).
Goal: Baton >= 0.9x nginx on requests/s and handshakes/s. The certificate is made at run time
with the openssl CLI.
"""

import os
import re
import socket
import ssl
import subprocess
import sys
import time

import scenlib

SUITES = ("ECDHE-ECDSA-AES128-GCM-SHA256:ECDHE-ECDSA-AES256-GCM-SHA384:"
          "ECDHE-ECDSA-CHACHA20-POLY1305")


def make_cert(d):
    """EC P-256 CA and a server certificate for 127.0.0.1 / localhost. (ca_pem, cert, key)."""
    def run(*a):
        subprocess.run(["openssl", *a], check=True, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL, cwd=d)
    run("genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", "ca.key")
    run("req", "-x509", "-new", "-key", "ca.key", "-out", "ca.pem", "-days", "2", "-subj",
        "/CN=tls-scenario CA")
    run("genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", "srv.key")
    run("req", "-new", "-key", "srv.key", "-out", "srv.csr", "-subj", "/CN=localhost")
    with open(os.path.join(d, "srv.ext"), "w") as f:
        f.write("subjectAltName=DNS:localhost,IP:127.0.0.1\n")
    run("x509", "-req", "-in", "srv.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
        "-CAcreateserial", "-out", "srv.pem", "-days", "2", "-extfile", "srv.ext")
    return tuple(os.path.join(d, n) for n in ("ca.pem", "srv.pem", "srv.key"))


def nginx_https(lab, worker_port, cert, key):
    """nginx terminating TLS with the same certificate and suites, proxying to the worker."""
    return lab.nginx([worker_port], name="nginx-tls", tls=[
        f"ssl_certificate {cert};", f"ssl_certificate_key {key};", "ssl_protocols TLSv1.2;",
        f"ssl_ciphers {SUITES};", "ssl_prefer_server_ciphers on;",
        "ssl_ecdh_curve prime256v1:X25519:secp384r1;"])


def s_time(port, seconds, clients):
    """Full handshakes/s against port from `clients` parallel `openssl s_time -new` runs."""
    procs = [subprocess.Popen(["openssl", "s_time", "-connect", f"{scenlib.HOST}:{port}", "-new",
                               "-time", str(seconds), "-cipher", SUITES],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for _ in range(clients)]
    total = 0.0
    for p in procs:
        out, _ = p.communicate(timeout=seconds + 60)
        m = re.search(r"(\d+) connections in (\d+) real seconds", out)
        if not m or int(m.group(2)) == 0:
            raise RuntimeError(f"openssl s_time gave no figure:\n{out}")
        total += int(m.group(1)) / int(m.group(2))
    return total


med = scenlib.med


def idle_tls_kib(proc, port, ca, n, with_children):
    """RSS growth per idle TLS keep-alive connection (KiB), after one GET /health on each."""
    def rss():
        pids = [proc.pid] + (scenlib.children(proc.pid) if with_children else [])
        return sum(scenlib.rss_kib(p) for p in pids)
    ctx = ssl.create_default_context(cafile=ca)
    before = rss()
    socks = []
    try:
        for _ in range(n):
            raw = socket.create_connection((scenlib.HOST, port), timeout=30)
            s = ctx.wrap_socket(raw, server_hostname=scenlib.HOST)
            s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
            got = b""
            while b"\r\n\r\n" not in got:
                chunk = s.recv(4096)
                if not chunk:
                    raise RuntimeError("connection closed before the answer")
                got += chunk
            socks.append(s)
        time.sleep(1.0)
        return (rss() - before) / n
    finally:
        for s in socks:
            s.close()


def main():
    ap = scenlib.arg_parser(__doc__.split("\n")[0])
    ap.add_argument("--rate", type=float, default=300.0, help="moderate rate, req/s (300)")
    ap.add_argument("--rate-connections", type=int, default=16,
                    help="moderate rate: at most this many requests (connections) in flight (16)")
    ap.add_argument("--concurrency", type=int, default=32,
                    help="keep-alive saturation: closed-loop users (32)")
    ap.add_argument("--conn-concurrency", type=int, default=8,
                    help="new-connection runs: closed-loop users (8)")
    ap.add_argument("--duration", type=float, default=5.0, help="seconds per run (5)")
    ap.add_argument("--warmup", type=float, default=1.0, help="warm-up seconds per run (1)")
    ap.add_argument("--output-len", type=int, default=16)
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--repeat", type=int, default=1,
                    help="runs per path, interleaved across paths; medians shown (1)")
    ap.add_argument("--s-time-clients", type=int, default=os.cpu_count() or 1,
                    help="parallel openssl s_time clients (number of CPUs)")
    ap.add_argument("--idle", type=int, default=1000,
                    help="idle TLS connections for the memory figure (1000)")
    args = ap.parse_args()
    if args.smoke:
        args.rate, args.concurrency, args.conn_concurrency = 50.0, 4, 2
        args.duration, args.warmup, args.s_time_clients, args.idle = 1.0, 0.2, 1, 20

    print("== TLS: Baton vs nginx over HTTPS (same certificate and suites) ==")
    print(scenlib.machine_line())
    figures = {"config": vars(args), "runs": {}}
    with scenlib.Lab(args, "tls") as lab:
        ca, cert, key = make_cert(lab.dir)
        w = lab.worker("regular", "--prefill-us-per-token", 0, "--decode-us-per-token", 0,
                       "--max-batch", 4096, "--max-queue", 100000)
        plain = lab.router("--worker", w.url, name="baton-http")
        tls = lab.router("--worker", w.url, "--tls-cert", cert, "--tls-key", key,
                         name="baton-https")
        targets = [("direct", w.url), ("baton http", plain.url),
                   ("baton https", f"https://{scenlib.HOST}:{tls.port}")]
        ngx = nginx_https(lab, w.port, cert, key)
        if ngx:
            targets.append(("nginx https", f"https://{scenlib.HOST}:{ngx.port}"))
        else:
            scenlib.skip_note("nginx is not installed: no nginx column "
                              "(scripts/install-bench-deps.sh installs it)")
        print("paths: " + ", ".join(f"{n} {u}" for n, u in targets))
        print(f"load: chat, {args.input_len} prompt words, {args.output_len} output tokens, "
              f"non-streaming; {args.duration}s per run after {args.warmup}s warm-up")
        common = ["--input-len", args.input_len, "--output-len", args.output_len,
                  "--duration", args.duration, "--warmup", args.warmup, "--ca", ca]

        def runs_for(label, *extra):
            out = {n: [] for n, _ in targets}
            for _ in range(args.repeat):
                for n, u in targets:
                    out[n].append(lab.bench(u, *common, *extra, label=f"{label}-{n[:5]}"))
            figures["runs"][label] = out
            return out

        # At most --rate-connections in flight: past that, arrivals wait instead of opening
        # connections, so the bench does not spend itself on handshakes (its mbedTLS client is
        # slow at them) and the figure stays the per-request cost over warm connections.
        moderate = runs_for("moderate", "--request-rate", args.rate, "--max-concurrency",
                            args.rate_connections)
        d50, d99 = med(moderate["direct"], "e2e_ms", "p50"), med(moderate["direct"], "e2e_ms",
                                                                  "p99")
        rows = []
        for n, _ in targets:
            r = moderate[n]
            p50, p99 = med(r, "e2e_ms", "p50"), med(r, "e2e_ms", "p99")
            rows.append([n, p50, p99, None if n == "direct" else (p50 - d50) * 1000,
                         None if n == "direct" else (p99 - d99) * 1000,
                         med(r, "request_throughput"), med(r, "max_lag_ms"),
                         sum(x["failed"] for x in r)])
        scenlib.print_table(
            f"keep-alive: E2E latency at {args.rate:g} req/s (Poisson, at most "
            f"{args.rate_connections} in flight)",
            ["path", "p50 ms", "p99 ms", "+p50 us", "+p99 us", "req/s", "bench lag ms",
             "errors"], rows,
            note="+p50/+p99: latency added over the direct (plain HTTP) path.")

        sat = runs_for("keepalive-sat", "--concurrency", args.concurrency)
        fresh = runs_for("new-conn", "--concurrency", args.conn_concurrency, "--new-connection")
        ngx_sat = med(sat["nginx https"], "request_throughput") if ngx else None
        ngx_new = med(fresh["nginx https"], "request_throughput") if ngx else None
        rows = []
        for n, _ in targets:
            ts, tn = med(sat[n], "request_throughput"), med(fresh[n], "request_throughput")
            rows.append([n, ts, scenlib.ratio(ts, ngx_sat), med(sat[n], "e2e_ms", "p99"), tn,
                         scenlib.ratio(tn, ngx_new), med(fresh[n], "e2e_ms", "p50"),
                         med(fresh[n], "e2e_ms", "p99"),
                         sum(x["failed"] for x in sat[n] + fresh[n]),
                         f"{100 * med(fresh[n], 'bench_cpu_util'):.0f}%"])
        scenlib.print_table(
            f"saturation: keep-alive (concurrency {args.concurrency}) and a new connection per "
            f"request (concurrency {args.conn_concurrency})",
            ["path", "keep-alive req/s", "x nginx", "p99 ms", "new-conn req/s", "x nginx",
             "p50 ms", "p99 ms", "errors", "bench CPU (new-conn)"], rows,
            note="new-conn req/s on an https path = full TLS handshakes/s (with the request); "
                 "bench CPU near 100% means the mbedTLS client in baton-bench is the limit.")

        https = [(n, u) for n, u in targets if u.startswith("https")]
        rows = []
        hs = {}
        secs = max(1, int(args.duration))
        for n, u in https:
            port = int(u.rsplit(":", 1)[1])
            hs[n] = s_time(port, secs, args.s_time_clients)
        for n, _ in https:
            rows.append([n, hs[n], scenlib.ratio(hs[n], hs.get("nginx https"))])
        figures["handshakes_per_s"] = hs
        scenlib.print_table(
            f"server-bound full handshakes/s ({args.s_time_clients} x openssl s_time -new, "
            f"{secs}s)", ["path", "handshakes/s", "x nginx"], rows)

        scenlib.raise_nofile(args.idle + 1024)
        rows = []
        for n, u in https:
            port = int(u.rsplit(":", 1)[1])
            proc = tls if n == "baton https" else ngx
            kib = idle_tls_kib(proc.p, port, ca, args.idle, with_children=proc is ngx)
            figures.setdefault("idle_kib_per_conn", {})[n] = kib
            rows.append([n, args.idle, kib, kib * 10000 / 1024])
        scenlib.print_table(
            f"{args.idle} idle TLS keep-alive connections (one GET /health served on each)",
            ["path", "conns", "KiB/conn", "MiB per 10k"], rows,
            note="RSS growth over the idle connections; nginx: master + worker processes.")
        if ngx:
            b = med(sat["baton https"], "request_throughput")
            print(f"\nsummary: Baton/nginx keep-alive req/s {b / ngx_sat:.2f}x, new-connection "
                  f"req/s {med(fresh['baton https'], 'request_throughput') / ngx_new:.2f}x, "
                  f"server-bound handshakes/s {hs['baton https'] / hs['nginx https']:.2f}x "
                  f"(goal >= 0.90x each); {scenlib.load_now()}")
    scenlib.write_json(args.json, figures)
    return 0


if __name__ == "__main__":
    sys.exit(main())
