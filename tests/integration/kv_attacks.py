"""kv_attacks.py — attack clients for a prefill worker's KV bootstrap port (libbaton's listener),
shared by test_kv_bootstrap_guard.py and the soak (test_soak_attacks.py):

  offer_flood   connections that announce a 2 MiB OFFER and send part of its body before any
                handshake (what used to be buffered: 2 MiB a connection);
  hello_flood   connections that send a HELLO header of the largest size and part of its body,
                then stall (the largest thing a pending connection may send);
  idle_flood    connections that say nothing (descriptors).

Run alone, it measures what the first attack costs a fresh prefill worker:
  python3 tests/integration/kv_attacks.py BUILD_DIR [CONNECTIONS]
prints the worker's RSS before and at its peak.
"""

import os
import re
import socket
import struct
import subprocess
import sys
import threading
import time

MAGIC = 0x4E544142
F_HELLO, F_OFFER = 1, 2
HELLO_MAX = 37 + 64 + 4 * (3 + 4096)  # the largest HELLO body (ctrl_frame.c)


def header(ftype, length):
    return struct.pack("<IHBBII", MAGIC, 1, ftype, 0, length, 0)


def _open(port, src, timeout=5.0):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.settimeout(timeout)
    s.bind((src, 0))
    s.connect(("127.0.0.1", port))
    return s


def _send_some(s, data):
    """Sends what the socket takes without blocking long; a closed connection is fine."""
    s.settimeout(0.2)
    try:
        s.sendall(data)
    except OSError:
        pass


def offer_flood(port, n, body_bytes=1 << 20, src="127.0.0.1"):
    socks = []
    for _ in range(n):
        try:
            s = _open(port, src)
        except OSError:
            continue
        _send_some(s, header(F_OFFER, 2 << 20) + b"\0" * body_bytes)
        socks.append(s)
    return socks


def hello_flood(port, n, src="127.0.0.1"):
    socks = []
    for _ in range(n):
        try:
            s = _open(port, src)
        except OSError:
            continue
        _send_some(s, header(F_HELLO, HELLO_MAX) + b"\x04\x00" + b"\0" * (HELLO_MAX - 100))
        socks.append(s)
    return socks


def idle_flood(port, n, src="127.0.0.1"):
    socks = []
    for _ in range(n):
        try:
            socks.append(_open(port, src))
        except OSError:
            pass
    return socks


def close_all(socks):
    for s in socks:
        try:
            s.close()
        except OSError:
            pass


def rss_mib(pid):
    with open(f"/proc/{pid}/status") as f:
        for ln in f:
            if ln.startswith("VmRSS"):
                return int(ln.split()[1]) / 1024.0
    return 0.0


def main():
    build, n = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 300
    p = subprocess.Popen([os.path.join(build, "baton-worker"), "--mode", "prefill", "--host",
                          "127.0.0.1", "--port", "0", "--bootstrap-port", "0"],
                         stderr=subprocess.PIPE, stdout=subprocess.DEVNULL)
    boot = None
    for raw in p.stderr:
        m = re.search(rb"bootstrap_listening addr=127\.0\.0\.1:(\d+)", raw)
        if m:
            boot = int(m.group(1))
        if b"comp=worker listening" in raw:
            break
    threading.Thread(target=lambda: [None for _ in p.stderr], daemon=True).start()
    try:
        before = peak = rss_mib(p.pid)
        socks = []
        for _ in range(n // 10):
            socks += offer_flood(boot, 10)
            peak = max(peak, rss_mib(p.pid))
        time.sleep(0.5)
        peak = max(peak, rss_mib(p.pid))
        print(f"{n} connections, each a 2 MiB OFFER header and 1 MiB of its body: worker RSS "
              f"{before:.0f} MiB before, {peak:.0f} MiB at peak")
        close_all(socks)
    finally:
        p.kill()
        p.wait()


if __name__ == "__main__":
    main()
