"""test_etcd.py — several routers over one etcd registry, with real processes: a
3-member etcd cluster on loopback, two routers, simulated workers.

Skips visibly when Debian's etcd-server is not installed (scripts/install-deps.sh --test).
Convergence is waited for with generous bounds (the host is shared); the time it took is
printed, and docs/BENCHMARKS.md has the measured figures (loadtest/scenarios/
registry_convergence.py).
"""

import http.server
import json
import os
import queue
import signal
import socketserver
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from etcd_cluster import EtcdCluster, b64, etcd_binary  # noqa: E402
from harness import (Cluster, SkipTest, TestRunner, binary, get, post, request, url,  # noqa: E402
                     wait_until)

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 2}
ROUTER_ARGS = ("--threads", "2", "--check-interval-ms", "0", "--max-retries", "2")
# A router listens once its first read of etcd is applied, or after --registry-timeout-ms
# (2 s) with what it has; that time-out also ends each call, which then goes to the next
# member. Where a test asserts on a new router's very first answer, or on the calls it makes, a
# loaded host's slow read must not let it start empty or send the read twice: the wait is made
# long enough to be a bound only (inside the harness's 20 s wait for the listen line).
FIRST_READ = ("--registry-timeout-ms", "15000")


def urls(r):
    res = get(r.port, "/list_workers")
    assert res.status == 200, res.text
    return set(res.json()["urls"])


def converge(routers, pred, what, timeout=10.0):
    t0 = time.monotonic()
    for r in routers:
        wait_until(lambda: pred(urls(r)), timeout=timeout, what=f"{r.name}: {what}")
    dt = time.monotonic() - t0
    print(f"  converged ({what}) in {dt * 1000:.0f} ms", flush=True)
    return dt


def readiness(r):
    return get(r.port, "/readiness").json()


def metric(r, name):
    for line in get(r.port, "/metrics").text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return None


def chat_ok(r):
    res = post(r.port, "/v1/chat/completions", CHAT, timeout=20)
    return res.status == 200


class Load:
    """Clients sending requests to every router until stopped; counts failures."""

    def __init__(self, routers, threads_per_router=2):
        self.stop = threading.Event()
        self.ok = 0
        self.failed = []
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self._run, args=(r,), daemon=True)
                        for r in routers for _ in range(threads_per_router)]

    def _run(self, r):
        while not self.stop.is_set():
            try:
                res = post(r.port, "/v1/chat/completions", CHAT, timeout=20)
                good, why = res.status == 200, f"{res.status} {res.text[:200]}"
            except OSError as e:
                good, why = False, repr(e)
            with self.lock:
                if good:
                    self.ok += 1
                else:
                    self.failed.append(f"{r.name}: {why}")

    def __enter__(self):
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        for t in self.threads:
            t.join(timeout=30)
        return False


def two_routers(c, etcd_url, *extra):
    a = c.router("--registry", etcd_url, *ROUTER_ARGS, *extra, name="router-a")
    b = c.router("--registry", etcd_url, *ROUTER_ARGS, *extra, name="router-b")
    for r in (a, b):
        wait_until(lambda: readiness_registry(r).get("connected") is True or
                   get(r.port, "/metrics").text.find("baton_registry_etcd_up 1") >= 0,
                   timeout=20, what=f"{r.name} connected to etcd")
    return a, b


def readiness_registry(r):
    return readiness(r).get("registry", {})


def test_register_a_route_b_remove_b_stops_a(etcd):
    prefix = "/t1"
    with Cluster("etcd-t1") as c:
        w = c.worker("regular")
        a, b = two_routers(c, etcd.url(prefix))
        res = post(a.port, "/workers", {"url": url(w.port), "worker_type": "regular"})
        assert res.status == 202, res.text
        wid = res.json()["id"]
        # Stored under the prefix, one key per worker id (published right after the 202).
        wait_until(lambda: f"{prefix}/workers/{wid}" in etcd.keys(prefix + "/"), timeout=10,
                   what="the worker's key in etcd")
        converge([b], lambda u: url(w.port) in u, "B sees A's registration")
        assert chat_ok(b), "router B routes to the worker registered through A"
        # Health and breaker state stay per router: not stored in etcd.
        assert "health" not in json.loads(etcd.keys(prefix + "/")[f"{prefix}/workers/{wid}"])
        res = request(b.port, "DELETE", f"/workers/{wid}")
        assert res.status == 202, res.text
        converge([a, b], lambda u: url(w.port) not in u, "A drops the worker removed through B")
        res = post(a.port, "/v1/chat/completions", CHAT)
        assert res.status == 503, (res.status, res.text)
        wait_until(lambda: etcd.keys(prefix + "/") == {}, timeout=10, what="key deleted")
        # The legacy API publishes too.
        res = request(b.port, "POST", f"/add_worker?url={url(w.port)}")
        assert res.status == 200, res.text
        converge([a], lambda u: url(w.port) in u, "A sees B's legacy registration")
        res = request(a.port, "POST", f"/remove_worker?url={url(w.port)}")
        assert res.status == 200, res.text
        converge([b], lambda u: url(w.port) not in u, "B drops the legacy removal")
        # A router started later reads the current set.
        post(a.port, "/workers", {"url": url(w.port)})
        late = c.router("--registry", etcd.url(prefix), *ROUTER_ARGS, name="router-late")
        converge([late], lambda u: url(w.port) in u, "a new router reads the set")
        assert chat_ok(late)


def test_kill_leader_under_load(etcd):
    prefix = "/t2"
    with Cluster("etcd-t2") as c:
        w1 = c.worker("regular")
        w2 = c.worker("regular")
        # Both routers talk to the leader first: killing it breaks their watches for real.
        leader = etcd.wait_leader()
        a, b = two_routers(c, etcd.url(prefix, first=leader))
        assert post(a.port, "/workers", {"url": url(w1.port)}).status == 202
        converge([a, b], lambda u: url(w1.port) in u, "first worker")
        with Load([a, b]) as load:
            time.sleep(0.5)
            print(f"  killing leader {leader.name}", flush=True)
            etcd.kill(leader)
            new_leader = etcd.wait_leader(timeout=30)
            print(f"  new leader {new_leader.name}", flush=True)
            # Changes resume: a registration through B reaches A.
            wait_until(lambda: post(b.port, "/workers", {"url": url(w2.port)}).status in
                       (202, 409), timeout=10, what="registration through B")
            converge([a, b], lambda u: url(w2.port) in u, "registration after the leader died",
                     timeout=20)
            time.sleep(0.5)
        assert not load.failed, load.failed[:5]
        for r in (a, b):
            r.wait_log(r"watch_ended err=")  # the watch on the dead leader broke and resynced
            # (B's resync follows its own publication, which A converging on does not wait for)
            wait_until(lambda: metric(r, "baton_registry_etcd_resyncs_total") >= 2,
                       what=f"{r.name} resynced after the leader died")
        assert load.ok > 0
        print(f"  {load.ok} requests, none failed", flush=True)
        etcd.start(leader)  # back for the next tests
        etcd.wait_leader()
        etcd.wait_serving(leader)


def test_hung_member_watch_moves(etcd):
    """The member both routers watch through stops answering (SIGSTOP: no close, no error):
    the liveness read notices, the watch moves to a member that serves, changes flow again."""
    prefix = "/t5"
    with Cluster("etcd-t5") as c:
        w = c.worker("regular")
        victim = next(m for m in etcd.members if m is not etcd.wait_leader())  # keep the leader
        etcd.wait_serving(victim)
        a, b = two_routers(c, etcd.url(prefix, first=victim))
        for r in (a, b):  # both really watch through it (the watch created there, not only
            # the read: a stop between the two would move the watch before it existed)
            r.wait_log(r"watch_created endpoint=127\.0\.0\.1:%d" % victim.client)
        os.killpg(victim.p.pid, signal.SIGSTOP)
        try:
            wait_until(lambda: post(a.port, "/workers", {"url": url(w.port)}).status in (202, 409),
                       timeout=10, what="registration through A")
            converge([b], lambda u: url(w.port) in u, "B, whose watch was on the hung member",
                     timeout=20)
            b.wait_log(r"watch_stale watch_endpoint=127\.0\.0\.1:%d" % victim.client)
            assert chat_ok(b)
        finally:
            os.killpg(victim.p.pid, signal.SIGCONT)


def test_all_members_down_keep_serving_then_resync(etcd):
    prefix = "/t3"
    with Cluster("etcd-t3") as c:
        w1 = c.worker("regular")
        w2 = c.worker("regular")
        a, b = two_routers(c, etcd.url(prefix))
        assert post(a.port, "/workers", {"url": url(w1.port)}).status == 202
        converge([a, b], lambda u: url(w1.port) in u, "worker registered")
        for m in etcd.members:
            etcd.kill(m)
        for r in (a, b):
            wait_until(lambda: readiness_registry(r).get("connected") is False, timeout=15,
                       what=f"{r.name} notices etcd is gone")
            ready = readiness(r)
            assert ready["status"] == "ready" and ready["regular"] == 1, ready
            assert "unreachable" in ready["registry"]["detail"], ready
            assert metric(r, "baton_registry_etcd_up") == 0
            r.wait_log(r"registry_unreachable")
            for _ in range(5):
                assert chat_ok(r), f"{r.name} keeps serving its last known workers"
        # A change made through A while etcd is down is kept and published on return.
        assert post(a.port, "/workers", {"url": url(w2.port)}).status == 202
        resyncs = metric(b, "baton_registry_etcd_resyncs_total")
        for m in etcd.members:
            etcd.start(m)
        etcd.wait_leader(timeout=60)
        for r in (a, b):
            # /readiness and the gauge in one wait: a watch that breaks again right after the
            # reconnect flips both, and a check of one then the other would race it
            wait_until(lambda: readiness_registry(r).get("connected") is True and
                       metric(r, "baton_registry_etcd_up") == 1, timeout=30,
                       what=f"{r.name} reconnects")
        assert metric(b, "baton_registry_etcd_resyncs_total") > resyncs
        converge([a, b], lambda u: {url(w1.port), url(w2.port)} <= u,
                 "the change made during the outage", timeout=20)
        # And the watch works again.
        wid = post(a.port, "/workers", {"url": url(w1.port)}).json()  # 409: already there
        assert wid["error"]["code"] == "WORKER_ALREADY_EXISTS", wid
        res = request(b.port, "POST", f"/remove_worker?url={url(w1.port)}")
        assert res.status == 200
        converge([a], lambda u: url(w1.port) not in u, "watch resumed after the outage")


def test_lease_expiry_removes_killed_worker(etcd):
    prefix = "/t4"
    with Cluster("etcd-t4") as c:
        a, b = two_routers(c, etcd.url(prefix))
        # A wildcard KV-event bind (any address, any port) is registered under the worker's
        # host and the port it got.
        w = c.worker("regular", "--register", etcd.url(prefix), "--register-ttl", "2",
                     "--kv-events-endpoint", "tcp://*:*")
        kv_port = w.wait_port("kvevents")
        converge([a, b], lambda u: url(w.port) in u, "self-registered worker")
        assert chat_ok(a) and chat_ok(b)
        for r in (a, b):
            got = worker_entry(r, url(w.port))
            assert got["kv_events_endpoint"] == f"tcp://127.0.0.1:{kv_port}", got
            assert got["kv_events_replay_endpoint"] is None, got
        keys = etcd.keys(prefix + "/")
        assert len(keys) == 1 and json.loads(next(iter(keys.values())))["url"] == url(w.port)
        time.sleep(3)  # longer than the TTL: the keep-alive holds it
        assert url(w.port) in urls(a) and url(w.port) in urls(b)
        w.kill()
        converge([a, b], lambda u: url(w.port) not in u, "lease expiry", timeout=15)
        assert etcd.keys(prefix + "/") == {}
        # A clean stop revokes the lease at once: the key goes long before its 60 s TTL would
        # (the wait is a bound for a loaded host, well under the TTL).
        p = c.worker("prefill", "--register", etcd.url(prefix), "--register-ttl", "60")
        converge([a, b], lambda u: url(p.port) in u, "prefill worker")
        got = get(a.port, "/workers").json()["workers"][0]
        assert got["worker_type"] == "prefill" and got["bootstrap_port"] == p.wait_port(
            "bootstrap"), got
        p.stop()
        converge([a, b], lambda u: url(p.port) not in u, "revoked on SIGTERM", timeout=30)


def put_key(etcd, key, value):
    etcd.call("/v3/kv/put", {"key": b64(key), "value": b64(json.dumps(value))})


def del_key(etcd, key):
    etcd.call("/v3/kv/deleterange", {"key": b64(key)})


def worker_entry(r, worker_url):
    for w in get(r.port, "/workers").json()["workers"]:
        if w["url"] == worker_url:
            return w
    return None


def test_delete_self_registered_removes_for_all(etcd):
    """DELETE /workers/{id} through one router of a worker that registered itself (its own key,
    HOST:PORT) deletes that key: every router drops it, and a router started later has none."""
    prefix = "/t6"
    with Cluster("etcd-t6") as c:
        a, b = two_routers(c, etcd.url(prefix))
        w = c.worker("regular", "--register", etcd.url(prefix), "--register-ttl", "30")
        converge([a, b], lambda u: url(w.port) in u, "self-registered worker")
        wid = worker_entry(b, url(w.port))["id"]
        res = request(b.port, "DELETE", f"/workers/{wid}")
        assert res.status == 202, res.text
        wait_until(lambda: etcd.keys(prefix + "/") == {}, timeout=10,
                   what="the worker's own key deleted")
        converge([a, b], lambda u: url(w.port) not in u, "removed for every router")
        late = c.router("--registry", etcd.url(prefix), *ROUTER_ARGS, *FIRST_READ,
                        name="router-late")
        assert url(w.port) not in urls(late)


def test_two_keys_one_url(etcd):
    """Two keys naming one URL: one worker, described by the newest key, kept while either is
    left — the same in a router started before the keys, one started between, one after."""
    prefix = "/t7"
    with Cluster("etcd-t7") as c:
        w, marker = c.worker("regular"), c.worker("regular")
        before = c.router("--registry", etcd.url(prefix), *ROUTER_ARGS, name="router-before")
        wait_until(lambda: metric(before, "baton_registry_etcd_up") == 1, timeout=20,
                   what="router-before connected")
        k1, k2, k3 = (f"{prefix}/workers/{n}" for n in ("one", "two", "marker"))
        put_key(etcd, k1, {"url": url(w.port), "worker_type": "regular", "priority": 1})
        put_key(etcd, k2, {"url": url(w.port), "worker_type": "regular", "priority": 2})
        after = c.router("--registry", etcd.url(prefix), *ROUTER_ARGS, name="router-after")
        routers = [before, after]

        def prio(r):
            e = worker_entry(r, url(w.port))
            return None if e is None else e["priority"]

        for r in routers:
            wait_until(lambda: prio(r) == 2, what=f"{r.name}: the newest key's worker")
            assert len([u for u in urls(r) if u == url(w.port)]) == 1
        del_key(etcd, k2)  # the newest goes: the older key describes the worker again
        put_key(etcd, k3, {"url": url(marker.port), "worker_type": "regular"})
        # the marker comes after the delete on every watch: once it is there, the delete was seen
        converge(routers, lambda u: url(marker.port) in u, "marker after the delete")
        for r in routers:
            assert prio(r) == 1, (r.name, worker_entry(r, url(w.port)))
        late = c.router("--registry", etcd.url(prefix), *ROUTER_ARGS, *FIRST_READ,
                        name="router-late")
        routers.append(late)
        assert prio(late) == 1
        del_key(etcd, k1)
        converge(routers, lambda u: url(w.port) not in u and url(marker.port) in u,
                 "the last key naming it deleted")


def test_new_router_consistent_from_first_answer(etcd):
    """A router started after the workers were registered answers its very first request with
    all of them (it listens once the initial read is applied)."""
    prefix = "/t8"
    with Cluster("etcd-t8") as c:
        ws = [c.worker("regular") for _ in range(2)]
        a = c.router("--registry", etcd.url(prefix), *ROUTER_ARGS, name="router-a")
        wait_until(lambda: metric(a, "baton_registry_etcd_up") == 1, timeout=20,
                   what="router-a connected")
        for w in ws:
            assert post(a.port, "/workers", {"url": url(w.port)}).status == 202
        wait_until(lambda: len(etcd.keys(prefix + "/")) == 2, what="both keys in etcd")
        want = {url(w.port) for w in ws}
        for i in range(3):
            r = c.router("--registry", etcd.url(prefix), *ROUTER_ARGS, *FIRST_READ,
                         name=f"router-new{i}")
            got = urls(r)  # the first request it answers
            assert want <= got, (r.name, got)
            assert readiness(r)["status"] == "ready"
            r.stop()


class FakeGateway(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True


class GatewayHandler(http.server.BaseHTTPRequestHandler):
    """A stand-in for etcd's JSON gateway: a subclass's answer(path, body) serves each POST with
    reply (one JSON object), refuse (a 5xx) or stream + chunk (a watch)."""
    protocol_version = "HTTP/1.1"

    def log_message(self, *a):
        pass

    def do_POST(self):
        self.answer(self.path, json.loads(self.rfile.read(int(self.headers["Content-Length"]))))

    def reply(self, obj):
        out = json.dumps(obj).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    def refuse(self):
        self.send_response(503)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def stream(self):
        self.send_response(200)
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()

    def chunk(self, obj):
        data = (json.dumps(obj) + "\n").encode()
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def end(self):
        self.wfile.write(b"0\r\n\r\n")


def serve_gateway(handler):
    srv = FakeGateway(("127.0.0.1", 0), handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv


def test_compacted_revision_resyncs():
    """A watch cancelled because its start revision was compacted → full read + new watch.

    Compaction cannot be forced on the router's own watch (it always starts from a fresh read),
    so a tiny stand-in for the gateway answers the first watch with etcd's compaction reply.
    """
    calls = []

    class H(GatewayHandler):
        def answer(self, path, body):
            if path == "/v3/kv/range" and body.get("count_only"):
                # the router's liveness read (every 2 s): answered, not counted, so a slow
                # run that reads between the watches does not move the full reads' revisions
                self.reply({"header": {"revision": "30"}, "count": "1"})
                return
            calls.append((path, body))
            if path == "/v3/kv/range":
                rev = 10 * len([c for c in calls if c[0] == "/v3/kv/range"])
                value = json.dumps({"url": "http://127.0.0.1:9", "worker_type": "regular"})
                self.reply({"header": {"revision": str(rev)}, "kvs": [
                    {"key": b64("/fake/workers/x"), "value": b64(value),
                     "mod_revision": str(rev)}]})
                return
            n_watch = len([c for c in calls if c[0] == "/v3/watch"])
            self.stream()
            if n_watch == 1:
                self.chunk({"result": {"header": {"revision": "30"}, "created": True}})
                self.chunk({"result": {"header": {"revision": "30"}, "canceled": True,
                                       "compact_revision": "25"}})
                self.end()
                return
            self.chunk({"result": {"header": {"revision": "30"}, "created": True}})
            time.sleep(5)
            self.end()

    srv = serve_gateway(H)
    try:
        with Cluster("etcd-compact") as c:
            # (FIRST_READ: a stand-in slowed past 2 s must not see its read sent twice)
            r = c.router("--registry", f"etcd://127.0.0.1:{srv.server_address[1]}/fake",
                         *ROUTER_ARGS, *FIRST_READ)
            r.wait_log(r"watch_canceled compact_revision=25", timeout=10)
            wait_until(lambda: len([x for x in calls if x[0] == "/v3/kv/range"]) >= 2,
                       timeout=10, what="a second full read after compaction")
            wait_until(lambda: len([x for x in calls if x[0] == "/v3/watch"]) >= 2, timeout=10,
                       what="a new watch")
            watches = [x[1] for x in calls if x[0] == "/v3/watch"]
            # Each watch starts right after the read before it (revision 10, then 20).
            assert watches[0]["create_request"]["start_revision"] == 11, watches[0]
            assert watches[1]["create_request"]["start_revision"] == 21, watches[1]
            assert watches[0]["create_request"]["key"] == b64("/fake/workers/")
            assert urls(r) == {"http://127.0.0.1:9"}
    finally:
        srv.shutdown()


def test_watch_checked_on_its_own_member():
    """The liveness read is compared with the member the watch really is on, even when another
    call moved the client to another member while the watch waited for "created" (a publish
    that failed there, as on a loaded member). Two stand-ins for the gateway: F1 serves the
    first read and the watch, refuses the publish (5xx), sends "created" only once F2 took the
    publish, then goes quiet; F2 has a key F1's watch never delivers. The router must notice that
    F1's watch is not checked by F2's answers and resync through F2."""
    took_put = threading.Event()
    stop = threading.Event()
    other = json.dumps({"url": "http://127.0.0.1:19", "worker_type": "regular"})

    def handler(first):
        class H(GatewayHandler):
            def answer(self, path, body):
                if path == "/v3/kv/range":
                    kvs = [] if first or body.get("count_only") else [
                        {"key": b64("/w/workers/other"), "value": b64(other),
                         "mod_revision": "12"}]
                    self.reply({"header": {"revision": "12"}, "kvs": kvs, "count": "1"})
                elif path == "/v3/kv/put" and first:
                    self.refuse()
                elif path == "/v3/kv/put":
                    took_put.set()
                    self.reply({"header": {"revision": "11"}})
                elif path == "/v3/watch":
                    self.stream()
                    if first:
                        took_put.wait(20)
                    self.chunk({"result": {"header": {"revision": "12"}, "created": True}})
                    stop.wait(30)  # then quiet: no event, no close
                else:
                    self.reply({})
        return H

    servers = [serve_gateway(handler(first)) for first in (True, False)]
    f1, f2 = (srv.server_address[1] for srv in servers)
    try:
        with Cluster("etcd-watch-ep") as c:
            # (FIRST_READ: a slow first read must not fail over to F2 before the watch is on F1)
            r = c.router("--registry", f"etcd://127.0.0.1:{f1},127.0.0.1:{f2}/w", *ROUTER_ARGS,
                         *FIRST_READ)
            assert post(r.port, "/workers", {"url": "http://127.0.0.1:18"}).status == 202
            assert took_put.wait(10), "the publish never reached F2"
            r.wait_log(r"watch_created endpoint=127\.0\.0\.1:%d " % f1)
            r.wait_log(r"watch_stale watch_endpoint=127\.0\.0\.1:%d answered_by=127\.0\.0\.1:%d"
                       % (f1, f2), timeout=15)
            wait_until(lambda: "http://127.0.0.1:19" in urls(r), timeout=15,
                       what="the key only F2 has, read after the resync")
    finally:
        stop.set()
        for srv in servers:
            srv.shutdown()


def test_publish_answer_after_newer_events():
    """etcd's answer to a router's own put or delete may reach it after watch events newer than
    that change (another router acting at once, a loaded host): the answer must not undo what
    those events applied. A stand-in gateway holds each answer until the router has applied the
    newer events, then a last change shows whether the router's view of the keys is right."""
    events = queue.Queue()
    release = threading.Event()
    hold = {"put": False, "txn": False}
    stop = threading.Event()

    def value(u, **kw):
        return b64(json.dumps(dict({"url": u, "worker_type": "regular"}, **kw)))

    def ev_put(key, val, rev):
        return {"kv": {"key": key, "value": val, "mod_revision": str(rev)}}

    def ev_del(key, rev):
        return {"type": "DELETE", "kv": {"key": key, "mod_revision": str(rev)}}

    def send(rev, *evs):
        events.put({"result": {"header": {"revision": str(rev)}, "events": list(evs)}})

    class H(GatewayHandler):
        def answer(self, path, body):
            if path == "/v3/kv/range":
                self.reply({"header": {"revision": "10"}, "kvs": [], "count": "0"})
            elif path == "/v3/watch":
                self.stream()
                events.put({"result": {"header": {"revision": "10"}, "created": True}})
                while not stop.is_set():
                    try:
                        self.chunk(events.get(timeout=0.1))
                    except queue.Empty:
                        continue
            elif path in ("/v3/kv/put", "/v3/kv/txn"):
                op = path.rsplit("/", 1)[1]
                if hold[op]:  # the scripted events go out first; the answer when released
                    hold[op] = False
                    hold["script"](body)
                    release.wait(20)
                    release.clear()
                self.reply({"header": {"revision": str(hold.get("rev", 10))}})
            else:
                self.reply({})

    srv = serve_gateway(H)
    u1, u2, self_key = "http://127.0.0.1:11", "http://127.0.0.1:12", b64("/p/workers/self")
    try:
        with Cluster("etcd-late-answer") as c:
            r = c.router("--registry", f"etcd://127.0.0.1:{srv.server_address[1]}/p",
                         *ROUTER_ARGS, *FIRST_READ)
            r.wait_log(r"watch_created")

            # A put answered after its own event and another router's delete of the key.
            def put_then_deleted(body):
                send(12, ev_put(body["key"], body["value"], 11), ev_del(body["key"], 12))
                hold["rev"] = 11
            hold["script"], hold["put"] = put_then_deleted, True
            wid = post(r.port, "/workers", {"url": u1}).json()["id"]
            r.wait_log(r"comp=etcd worker_removed id=%s" % wid)
            release.set()
            r.wait_log(r"published op=put id=%s" % wid)
            # A worker's own key for the same URL comes and goes: nothing may bring it back.
            send(15, ev_put(self_key, value(u1, priority=5), 13), ev_del(self_key, 14),
                 ev_put(b64("/p/workers/m1"), value("http://127.0.0.1:13"), 15))
            wait_until(lambda: "http://127.0.0.1:13" in urls(r), what="marker 1")
            assert u1 not in urls(r), "a key deleted in etcd brought its worker back"

            # A delete answered after its own event and another router's new put of the key.
            hold["rev"] = 16
            wid2 = post(r.port, "/workers", {"url": u2}).json()["id"]
            key2 = b64(f"/p/workers/{wid2}")
            send(16, ev_put(key2, value(u2), 16))
            r.wait_log(r"published op=put id=%s" % wid2)

            def deleted_then_put(body):
                send(18, ev_del(key2, 17), ev_put(key2, value(u2), 18))
                hold["rev"] = 17
            hold["script"], hold["txn"] = deleted_then_put, True
            assert request(r.port, "DELETE", f"/workers/{wid2}").status == 202
            r.wait_log(r"comp=etcd worker_added id=%s" % wid2)
            release.set()
            r.wait_log(r"published op=delete id=%s" % wid2)
            # That other router deletes it again: every router drops it.
            send(20, ev_del(key2, 19),
                 ev_put(b64("/p/workers/m2"), value("http://127.0.0.1:14"), 20))
            wait_until(lambda: "http://127.0.0.1:14" in urls(r), what="marker 2")
            assert u2 not in urls(r), "a worker whose only key was deleted stayed"
    finally:
        stop.set()
        release.set()
        srv.shutdown()


def token(e):
    t = e.call("/v3/auth/authenticate", {"name": "root", "password": "rootpw"})["token"]
    return {"Authorization": t}


def test_auth_user_password():
    """etcd with authentication on: routers log in with --registry-user/--registry-password-file."""
    with EtcdCluster(size=1, name="etcd-auth") as e, Cluster("etcd-auth-r") as c:
        e.call("/v3/auth/user/add", {"name": "root", "password": "rootpw"})
        e.call("/v3/auth/role/add", {"name": "root"})
        e.call("/v3/auth/user/grant", {"user": "root", "role": "root"})
        e.call("/v3/auth/enable", {})
        pw = os.path.join(c.logdir, "pw")
        with open(pw, "w") as f:
            f.write("rootpw\n")
        w = c.worker("regular")
        args = ("--registry-user", "root", "--registry-password-file", pw)
        a, b = two_routers(c, e.url("/auth"), *args)
        assert post(a.port, "/workers", {"url": url(w.port)}).status == 202
        converge([b], lambda u: url(w.port) in u, "B sees A's registration with auth")
        sw = c.worker("regular", "--register", e.url("/auth"), "--register-user", "root",
                      "--register-password-file", pw)
        converge([a, b], lambda u: url(sw.port) in u, "a worker registering itself with auth")
        # A read-only user: sees the set; its own publication is refused, logged, and does not
        # block the changes that follow.
        e.call("/v3/auth/role/add", {"name": "reader"}, headers=token(e))
        e.call("/v3/auth/role/grant", {"name": "reader", "perm": {
            "permType": "READ", "key": b64("/auth/"), "range_end": b64("/auth0")}},
            headers=token(e))
        e.call("/v3/auth/user/add", {"name": "reader", "password": "readpw"}, headers=token(e))
        e.call("/v3/auth/user/grant", {"user": "reader", "role": "reader"}, headers=token(e))
        rpw = os.path.join(c.logdir, "rpw")
        with open(rpw, "w") as f:
            f.write("readpw")
        ro = c.router("--registry", e.url("/auth"), *ROUTER_ARGS, "--registry-user", "reader",
                      "--registry-password-file", rpw, name="router-ro")
        converge([ro], lambda u: url(w.port) in u, "read-only router reads the set")
        w2 = c.worker("regular")
        assert post(ro.port, "/workers", {"url": url(w2.port)}).status == 202
        ro.wait_log(r"publish_rejected op=put", timeout=10)
        w3 = c.worker("regular")
        assert post(a.port, "/workers", {"url": url(w3.port)}).status == 202
        converge([ro, b], lambda u: url(w3.port) in u, "changes flow after a rejection")
        assert url(w2.port) not in urls(b)
        os.unlink(rpw)
        # Without credentials etcd refuses: the router says so and keeps retrying.
        bad = c.router("--registry", e.url("/auth"), *ROUTER_ARGS, name="router-noauth")
        wait_until(lambda: (metric(bad, "baton_registry_etcd_errors_total") or 0) >= 1,
                   timeout=10, what="unauthenticated router fails")
        assert url(w.port) not in urls(bad)
        # Not ready (no worker), and /readiness says why: the registry refuses it.
        res = get(bad.port, "/readiness")
        assert res.status == 503 and "etcd registry:" in res.text, res.text
        os.unlink(pw)


def test_pd_protocol_fields_shared(etcd):
    """A vLLM Mooncake DP prefill registered through A reaches B with its protocol, engine id,
    bootstrap address and dp_size (a replica must not see it as a plain SGLang worker)."""
    prefix = "/t-proto"
    with Cluster("etcd-proto") as c:
        w = c.worker("regular")
        a, b = two_routers(c, etcd.url(prefix))
        spec = {"url": url(w.port), "worker_type": "prefill", "pd_protocol": "vllm-mooncake",
                "engine_id": "eng-A", "bootstrap_addr": "http://127.0.0.1:8998", "dp_size": 2}
        res = post(a.port, "/workers", spec)
        assert res.status == 202, res.text
        converge([b], lambda u: url(w.port) in u, "B sees A's vLLM prefill")
        seen = [x for x in get(b.port, "/workers").json()["workers"] if x["url"] == url(w.port)]
        assert len(seen) == 1, seen
        for k in ("pd_protocol", "engine_id", "bootstrap_addr", "dp_size", "worker_type"):
            assert seen[0][k] == spec[k], (k, seen[0])


def test_convergence_scenario_smoke():
    """loadtest/scenarios/registry_convergence.py --smoke runs and reports every table."""
    import subprocess
    scen = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "loadtest",
                        "scenarios", "registry_convergence.py")
    res = subprocess.run([sys.executable, scen, "--smoke", "--build-dir",
                          os.path.dirname(binary("baton"))], capture_output=True, text=True,
                         timeout=240)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    assert "Convergence across routers" in res.stdout, res.stdout
    assert "same set at the end" in res.stdout and "| NO" not in res.stdout, res.stdout


def main():
    t = TestRunner()
    if etcd_binary() is None:
        print("[ SKIPPED ] test_etcd: etcd not installed (scripts/install-deps.sh --test)",
              flush=True)
        t.skipped += 1
        t.finish()
    binary("baton")
    with EtcdCluster(size=3) as etcd:
        t.run(test_register_a_route_b_remove_b_stops_a, etcd)
        t.run(test_kill_leader_under_load, etcd)
        t.run(test_hung_member_watch_moves, etcd)
        t.run(test_all_members_down_keep_serving_then_resync, etcd)
        t.run(test_lease_expiry_removes_killed_worker, etcd)
        t.run(test_pd_protocol_fields_shared, etcd)
        t.run(test_delete_self_registered_removes_for_all, etcd)
        t.run(test_two_keys_one_url, etcd)
        t.run(test_new_router_consistent_from_first_answer, etcd)
    t.run(test_compacted_revision_resyncs)
    t.run(test_watch_checked_on_its_own_member)
    t.run(test_publish_answer_after_newer_events)
    t.run(test_auth_user_password)
    t.run(test_convergence_scenario_smoke)
    t.finish()


if __name__ == "__main__":
    main()
