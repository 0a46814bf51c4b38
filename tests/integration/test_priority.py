"""test_priority.py — priority classes end to end: a real router with one admission slot (and,
for interactive, its one reserve slot) in front of a scripted worker that holds chosen requests
until the test releases them, so queues form however slow the machine is. An
interactive request takes the reserve slot at once, and a second one overtakes queued bulk ones;
bulk is shed first when the queue fills; --priority-preempt sheds a queued bulk request for a
default one; an API key's default class and the reserved system class; bad x-priority and body
priority values answered 400 in the OpenAI shape without reaching a worker; the per-class
metrics; and --priority-to-workers putting vLLM's priority integer on both legs of a vLLM PD
pair (scripted upstreams that record the bodies)."""

import os
import sys
import tempfile
import threading

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from harness import Cluster, TestRunner, post, url, wait_until  # noqa: E402
from router_upstream import Upstream  # noqa: E402
from test_resilience import err_of, metrics, mval  # noqa: E402

COMP = {"model": "m", "prompt": "hello there", "max_tokens": 12}
ONE_SLOT = ("--threads", "1", "--max-concurrent-requests", "1", "--queue-timeout-ms", "60000",
            "--check-interval-ms", "0")


class GatedWorker(Upstream):
    """A worker whose requests are named by their prompt. A name passed to hold() is answered
    only after release(name): it keeps its admission slot as long as the test needs, on any
    machine. Every other request is answered at once. With one slot serving a queue, the order
    in which requests reach the worker (arrived()) is the order the router admitted them."""

    def __init__(self, *held):
        self.gates = {name: threading.Event() for name in held}
        super().__init__("gated", self._script)

    def _script(self, req, io):
        name = req.json().get("prompt")
        gate = self.gates.get(name)
        if gate is not None:
            gate.wait(120)
        io.respond(200, {"id": f"cmpl-{name}", "object": "text_completion",
                         "choices": [{"index": 0, "text": "ok", "finish_reason": "stop"}]})

    def release(self, *names):
        for name in names:
            self.gates[name].set()

    def arrived(self):
        return [q.json().get("prompt") for q in self.requests]

    def __exit__(self, exc_type, exc, tb):
        self.release(*self.gates)  # a failed test must not leave a script thread waiting
        return super().__exit__(exc_type, exc, tb)


class Flight:
    """Requests sent from threads, each named by its prompt; their answers by name."""

    def __init__(self, port):
        self.port = port
        self.res = {}
        self.lock = threading.Lock()
        self.threads = []

    def send(self, name, prio=None, body=None, headers=None):
        hdrs = dict(headers or {})
        if prio:
            hdrs["x-priority"] = prio

        def go():
            r = post(self.port, "/v1/completions", body or dict(COMP, prompt=name),
                     headers=hdrs, timeout=150)
            with self.lock:
                self.res[name] = r

        t = threading.Thread(target=go)
        t.start()
        self.threads.append(t)

    def join(self):
        for t in self.threads:
            t.join(160)
        assert not any(t.is_alive() for t in self.threads)

    def answered(self, name):
        wait_until(lambda: name in self.res, 30, what=f"{name} answered")
        return self.res[name]


def depth(port, prio):
    return mval(metrics(port), "baton_priority_queue_depth", priority=prio) or 0


def wait_depth(port, prio, n):
    wait_until(lambda: depth(port, prio) == n, 30, what=f"{n} {prio} request(s) queued")


def wait_active(port, n=1):
    wait_until(lambda: mval(metrics(port), "baton_active_requests") == n, 30,
               what=f"{n} slot(s) taken")


def test_interactive_overtakes_bulk():
    """The one slot busy: an interactive request takes the reserve slot beyond the cap at once;
    with both busy, two bulk requests and then a second interactive one wait, and the
    interactive one is served before both older bulk requests."""
    with GatedWorker("first", "inter0") as w, Cluster("prio-order") as c:
        r = c.router("--worker", w.url, *ONE_SLOT)
        f = Flight(r.port)
        f.send("first")
        wait_active(r.port)
        f.send("inter0", "interactive")
        wait_active(r.port, 2)
        assert depth(r.port, "interactive") == 0
        f.send("bulk1", "bulk")
        wait_depth(r.port, "bulk", 1)
        f.send("bulk2", "bulk")
        wait_depth(r.port, "bulk", 2)
        f.send("inter1", "interactive")
        wait_depth(r.port, "interactive", 1)
        w.release("first", "inter0")  # from here the queue is served one at a time
        f.join()
        for name, res in f.res.items():
            assert res.status == 200, (name, res.status, res.text)
        assert sorted(w.arrived()[:2]) == ["first", "inter0"], w.arrived()
        assert w.arrived()[2:] == ["inter1", "bulk1", "bulk2"], w.arrived()
        ms = metrics(r.port)
        assert mval(ms, "baton_priority_admitted_total", priority="bulk") == 2
        assert mval(ms, "baton_priority_admitted_total", priority="interactive") == 2
        assert mval(ms, "baton_priority_admitted_total", priority="default") == 1
        assert mval(ms, "baton_priority_queued_total", priority="bulk") == 2
        assert mval(ms, "baton_priority_queued_total", priority="interactive") == 1
        assert mval(ms, "baton_priority_queue_time_seconds_count", priority="bulk") == 2
        assert mval(ms, "baton_priority_queue_depth") == 0


def test_bulk_shed_first():
    """--queue-size 4: bulk may fill 2 places, default 4, interactive 5. With both slots busy
    (the cap's and interactive's reserve) the third bulk request is refused (429, Retry-After)
    while default and interactive still queue; then default is refused at 4 and interactive
    still gets the fifth place."""
    with GatedWorker("first", "inter0") as w, Cluster("prio-shed") as c:
        r = c.router("--worker", w.url, *ONE_SLOT, "--queue-size", "4")
        f = Flight(r.port)
        f.send("first")
        wait_active(r.port)
        f.send("inter0", "interactive")
        wait_active(r.port, 2)
        for i in range(2):
            f.send(f"bulk{i}", "bulk")
            wait_depth(r.port, "bulk", i + 1)
        res = post(r.port, "/v1/completions", COMP, headers={"x-priority": "bulk"})
        err_of(res, 429, "queue_full")
        assert res.headers.get("retry-after") == "1", res.headers
        for i in range(2):
            f.send(f"def{i}")
            wait_depth(r.port, "default", i + 1)
        err_of(post(r.port, "/v1/completions", COMP), 429, "queue_full")
        f.send("inter1", "interactive")
        wait_depth(r.port, "interactive", 1)
        err_of(post(r.port, "/v1/completions", COMP, headers={"x-priority": "interactive"}),
               429, "queue_full")
        w.release("first", "inter0")
        f.join()
        assert all(x.status == 200 for x in f.res.values()), f.res
        assert sorted(w.arrived()[:2]) == ["first", "inter0"], w.arrived()
        assert w.arrived()[2:] == ["inter1", "def0", "def1", "bulk0", "bulk1"], w.arrived()
        ms = metrics(r.port)
        assert mval(ms, "baton_priority_shed_total", priority="bulk", reason="queue_full") == 1
        assert mval(ms, "baton_priority_shed_total", priority="default", reason="queue_full") == 1
        assert mval(ms, "baton_priority_shed_total", priority="interactive",
                    reason="queue_full") == 1
        assert mval(ms, "baton_admission_rejected_total", reason="queue_full") == 3


def test_preemption_and_timeout():
    """--priority-preempt, --queue-size 2: a default request finding the queue full sheds the
    queued bulk one (429) and takes its place; a waiter past --queue-timeout-ms gets 408,
    counted for its class."""
    with GatedWorker("first") as w, Cluster("prio-preempt") as c:
        r = c.router("--worker", w.url, "--threads", "1", "--max-concurrent-requests",
                     "1", "--check-interval-ms", "0", "--queue-size", "2",
                     "--queue-timeout-ms", "60000", "--priority-preempt")
        f = Flight(r.port)
        f.send("first")
        wait_active(r.port)
        f.send("bulk", "bulk")
        wait_depth(r.port, "bulk", 1)
        f.send("def0")
        wait_depth(r.port, "default", 1)
        f.send("def1")  # the queue (2) is full for default: the bulk waiter goes
        err_of(f.answered("bulk"), 429, "queue_full")
        w.release("first")
        f.join()
        assert f.res["bulk"].headers.get("retry-after") == "1"
        assert w.arrived() == ["first", "def0", "def1"], w.arrived()
        assert all(f.res[n].status == 200 for n in ("first", "def0", "def1"))
        ms = metrics(r.port)
        assert mval(ms, "baton_priority_shed_total", priority="bulk", reason="preempted") == 1
        assert mval(ms, "baton_priority_admitted_total", priority="bulk") == 0

    with GatedWorker("first") as w, Cluster("prio-timeout") as c:
        r = c.router("--worker", w.url, "--threads", "1", "--max-concurrent-requests",
                     "1", "--check-interval-ms", "0", "--queue-timeout-ms", "300")
        f = Flight(r.port)
        f.send("first")
        wait_active(r.port)
        f.send("late", "bulk")
        err_of(f.answered("late"), 408, "queue_timeout")
        w.release("first")
        f.join()
        assert f.res["first"].status == 200
        ms = metrics(r.port)
        assert mval(ms, "baton_priority_shed_total", priority="bulk",
                    reason="queue_timeout") == 1


def test_preemption_across_threads():
    """--threads 4: the queued bulk requests and the default newcomers that shed them land on
    whichever event loops the kernel gives their connections; every newcomer still finds its
    bulk victim (another loop sheds it when this one has none), so every bulk request gets 429
    and every default request is served."""
    with GatedWorker("first") as w, Cluster("prio-preempt-mt") as c:
        r = c.router("--worker", w.url, "--threads", "4", "--max-concurrent-requests",
                     "1", "--check-interval-ms", "0", "--queue-size", "8",
                     "--queue-timeout-ms", "60000", "--priority-preempt")
        f = Flight(r.port)
        f.send("first")  # holds the slot until released: queues form
        wait_active(r.port)
        for i in range(4):  # bulk may fill 4 of 8 places
            f.send(f"bulk{i}", "bulk")
            wait_depth(r.port, "bulk", i + 1)
        for i in range(8):  # from the fifth on, each sheds a bulk waiter
            f.send(f"def{i}")
            wait_depth(r.port, "default", i + 1)
        for i in range(4):
            err_of(f.answered(f"bulk{i}"), 429, "queue_full")
        w.release("first")
        f.join()
        for n in ["first"] + [f"def{i}" for i in range(8)]:
            assert f.res[n].status == 200, (n, f.res[n].status, f.res[n].text)
        ms = metrics(r.port)
        assert mval(ms, "baton_priority_shed_total", priority="bulk", reason="preempted") == 4
        assert mval(ms, "baton_priority_queue_depth") == 0


def test_key_default_class_and_system():
    """A key's `priority=CLASS` is its requests' class unless they say otherwise; only a key
    with class system may claim system (403 otherwise)."""
    with Cluster("prio-keys") as c, tempfile.TemporaryDirectory() as d:
        keys = os.path.join(d, "keys")
        with open(keys, "w", encoding="utf-8") as fh:
            fh.write("k-bulk priority=bulk\nk-sys priority=system\nk-plain\n")
        w = c.worker("regular")
        r = c.router("--worker", url(w.port), "--api-key-file", keys, "--check-interval-ms", "0")

        def call(key, prio=None):
            h = {"Authorization": f"Bearer {key}"}
            if prio:
                h["x-priority"] = prio
            return post(r.port, "/v1/completions", dict(COMP, max_tokens=2), headers=h)

        assert call("k-bulk").status == 200
        assert call("k-bulk", "interactive").status == 200  # a default, not a ceiling
        assert call("k-plain").status == 200
        e = err_of(call("k-plain", "system"), 403, "priority_not_allowed")
        assert e["type"] == "permission_error", e
        err_of(call("k-bulk", "system"), 403, "priority_not_allowed")
        assert call("k-sys").status == 200
        assert call("k-sys", "system").status == 200
        ms = metrics(r.port)
        assert mval(ms, "baton_priority_admitted_total", priority="bulk") == 1
        assert mval(ms, "baton_priority_admitted_total", priority="interactive") == 1
        assert mval(ms, "baton_priority_admitted_total", priority="default") == 1
        assert mval(ms, "baton_priority_admitted_total", priority="system") == 2


def test_bad_values():
    """An unknown class name or a non-integer body priority: 400 in the OpenAI error shape, and
    no worker is called."""
    with Upstream("w") as w, Cluster("prio-bad") as c:
        r = c.router("--worker", w.url, "--check-interval-ms", "0")
        e = err_of(post(r.port, "/v1/completions", COMP, headers={"x-priority": "urgent"}), 400,
                   "invalid_priority")
        assert e["param"] == "x-priority" and "urgent" in e["message"], e
        assert e["type"] == "invalid_request_error", e
        e = err_of(post(r.port, "/v1/completions", dict(COMP, priority="high")), 400,
                   "invalid_type")
        assert e["param"] == "priority", e
        err_of(post(r.port, "/v1/chat/completions",
                    {"model": "m", "messages": [{"role": "user", "content": "x"}]},
                    headers={"x-priority": "high"}), 400, "invalid_priority")
        assert not w.requests, [q.path for q in w.requests]
        # names are case-insensitive; a vLLM-style integer is a class too
        assert post(r.port, "/v1/completions", COMP, headers={"x-priority": "BULK"}).status == 200
        assert post(r.port, "/v1/completions", dict(COMP, priority=-3)).status == 200
        ms = metrics(r.port)
        assert mval(ms, "baton_priority_admitted_total", priority="bulk") == 1
        assert mval(ms, "baton_priority_admitted_total", priority="interactive") == 1


def test_priority_to_vllm_workers():
    """--priority-to-workers: both legs of a vllm-mooncake pair carry vLLM's priority for the
    class (replacing the client's own); without it the client's body goes as it came."""
    def p_script(req, io):
        io.respond(200, {"choices": [{"index": 0, "text": "x"}]})

    def d_script(req, io):
        io.respond(200, {"id": "c", "object": "text_completion",
                         "choices": [{"index": 0, "text": "ok"}]})

    for flag, want in ((True, {"interactive": -1, "bulk": 1, "default": 0}),
                       (False, {"interactive": 7, "bulk": 7, "default": 7})):
        with Upstream("p", p_script) as p, Upstream("d", d_script) as d, \
                Cluster("prio-vllm") as c:
            extra = ("--priority-to-workers",) if flag else ()
            r = c.router("--threads", "1", "--check-interval-ms", "0", *extra)
            for u, role, more in ((p.url, "prefill", {"engine_id": "e1",
                                                       "bootstrap_addr": "http://h:1"}),
                                  (d.url, "decode", {})):
                res = post(r.port, "/workers", dict({"url": u, "worker_type": role,
                                                     "pd_protocol": "vllm-mooncake"}, **more))
                assert res.status == 202, res.text
            for i, (cls, prio) in enumerate(want.items()):
                res = post(r.port, "/v1/completions", dict(COMP, priority=7),
                           headers={"x-priority": cls})
                assert res.status == 200, res.text
                pb, db = p.wait_requests(i + 1)[i].json(), d.wait_requests(i + 1)[i].json()
                assert pb["priority"] == prio and db["priority"] == prio, (flag, cls, pb, db)


def main():
    t = TestRunner()
    t.run(test_interactive_overtakes_bulk)
    t.run(test_bulk_shed_first)
    t.run(test_preemption_and_timeout)
    t.run(test_preemption_across_threads)
    t.run(test_key_default_class_and_system)
    t.run(test_bad_values)
    t.run(test_priority_to_vllm_workers)
    t.finish()


if __name__ == "__main__":
    main()
