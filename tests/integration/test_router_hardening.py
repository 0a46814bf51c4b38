"""test_router_hardening.py — the router against hostile clients and hostile workers (attacks in
router_attacks.py): every byte it holds for a peer is bounded, failures reach SSE clients as
error events a real SSE parser sees, half-closed clients are answered, and what a worker says
about itself stays with the operators."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import router_attacks as atk  # noqa: E402
from harness import Cluster, TestRunner  # noqa: E402
from router_upstream import Upstream  # noqa: E402


def test_half_closed_client_answered():
    """A client that sends its whole request and then shuts down its sending side gets its
    answer (buffered and streamed), not an abort."""
    def script(req, io):
        if req.json().get("stream"):
            io.start_sse()
            io.event({"text": "a"})
            io.event({"text": "b"})
            io.chunk("data: [DONE]\n\n")
            io.end_sse()
        else:
            io.respond(200, {"text": "whole"})

    with Upstream("w", script) as w, Cluster("hard-halfclose") as c:
        r = c.router("--worker", w.url, "--threads", "1")
        got = atk.half_closed_request(r.port, "/v1/completions", {"prompt": "hi"})
        assert got.startswith(b"HTTP/1.1 200"), got[:200]
        assert got.endswith(b'{"text": "whole"}'), got[-200:]
        got = atk.half_closed_request(r.port, "/v1/completions", {"prompt": "hi", "stream": True})
        assert got.startswith(b"HTTP/1.1 200"), got[:200]
        assert b'data: {"text": "b"}' in got and got.endswith(b"0\r\n\r\n"), got[-300:]


def main():
    t = TestRunner()
    t.run(test_half_closed_client_answered)
    t.finish()


if __name__ == "__main__":
    main()
