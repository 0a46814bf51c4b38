"""migration_ref.py — what a client has of a stream, and the continuation body that carries it
(docs/WORKER.md "Continuations"): shared by the migration tests and loadtest/chaos_migration.py."""

import http.client
import json
import random
import re
import threading

from harness import HOST, get, url, wait_until

_ID = re.compile(r'"id":"[^"]*"')
_CREATED = re.compile(r'"created":\d+')
_E2E = re.compile(r'"e2e_latency":[0-9.e+-]+')


def normalize(ev):
    """An event with its id, created and /generate's e2e_latency masked (a continuation is
    another request, timed on its own)."""
    return _E2E.sub('"e2e_latency":0', _CREATED.sub('"created":0', _ID.sub('"id":"-"', ev)))


def n_sequences(api, body):
    n = body.get("n", 1) if api != "generate" else 1
    prompts = body.get("prompt") if api == "completions" else body.get("text")
    k = len(prompts) if api != "chat" and isinstance(prompts, list) else 1
    return k * n


def client_view(api, events, n_seq):
    """Per sequence: None (nothing seen), or {"text", "finished", "tokens"?} from the payloads."""
    seen = [None] * n_seq
    for e in events:
        if e == "[DONE]":
            continue
        c = json.loads(e)
        if api == "generate":
            i = c.get("index", 0)
            seen[i] = {"text": c["text"], "finished": c["meta_info"]["finish_reason"] is not None,
                       "tokens": c["meta_info"]["completion_tokens"]}
            continue
        for ch in c.get("choices", []):
            i = ch["index"]
            s = seen[i] or {"text": "", "finished": False}
            s["text"] += ch["delta"].get("content", "") if api == "chat" else ch["text"]
            s["finished"] = s["finished"] or ch.get("finish_reason") is not None
            seen[i] = s
    return seen


def continuation(api, body, events):
    b = dict(body)
    b["baton_continuation"] = {"choices": client_view(api, events, n_sequences(api, body))}
    return b


def assemble(api, events, n_seq):
    """What a client makes of a whole stream: per sequence text and finish, the usage, ids."""
    view = client_view(api, events, n_seq)
    usage, ids, finish = None, set(), [None] * n_seq
    for e in events:
        if e == "[DONE]":
            continue
        c = json.loads(e)
        if "error" in c:
            return {"error": c["error"]}
        ids.add(c.get("id") if api != "generate" else c["meta_info"]["id"])
        if c.get("usage"):
            usage = c["usage"]
        for ch in c.get("choices", []):
            if ch.get("finish_reason") is not None:
                finish[ch["index"]] = ch["finish_reason"]
        if api == "generate" and c["meta_info"]["finish_reason"] is not None:
            finish[c.get("index", 0)] = c["meta_info"]["finish_reason"]
    return {"texts": [v and v["text"] for v in view], "finish": finish, "usage": usage,
            "ids": len(ids), "done": events[-1:] == ["[DONE]"]}


# ---- the chaos run shared by test_migration.py (a smoke) and loadtest/chaos_migration.py ----

PATHS = {"chat": "/v1/chat/completions", "completions": "/v1/completions", "generate": "/generate"}
_CACHED = re.compile(r'"cached_tokens":\d+')
WORDS = ("the quick brown fox jumps over lazy dogs while routers hand off caches between "
         "prefill and decode workers in rooms").split()
ROUTER_ARGS = (
    "--threads", "2", "--connect-timeout-ms", "1000", "--prefill-timeout-ms", "5000",
    "--first-byte-timeout-ms", "5000", "--idle-timeout-ms", "3000",
    "--request-timeout-ms", "60000", "--max-retries", "3", "--retry-backoff-ms", "50",
    "--retry-backoff-max-ms", "400", "--retry-budget-ms", "60000", "--migration-limit", "3",
    "--check-interval-ms", "500", "--check-down-interval-ms", "300",
    "--check-fast-interval-ms", "100", "--check-timeout-ms", "400", "--check-rise", "1",
    "--check-fall", "2", "--breaker-threshold", "5", "--breaker-cooldown-ms", "200",
    "--breaker-cooldown-max-ms", "500")


def masked(ev):
    """normalize, and the prefix-cache hit count (a decode's cache is not the twin's)."""
    return _CACHED.sub('"cached_tokens":0', normalize(ev))


def stream(port, path, body, on_event=None, timeout=60.0):
    """Streams a request; on_event(k, payload) after each event. Returns (status, payloads)."""
    conn = http.client.HTTPConnection(HOST, port, timeout=timeout)
    try:
        conn.request("POST", path, body=json.dumps(body),
                     headers={"Content-Type": "application/json"})
        r = conn.getresponse()
        if r.status != 200:
            return r.status, [r.read().decode()]
        events, data = [], []
        while True:
            line = r.readline()
            if not line:
                break
            line = line.decode().rstrip("\r\n")
            if line.startswith("data:"):
                data.append(line[5:].lstrip(" "))
            elif line == "" and data:
                events.append("\n".join(data))
                data = []
                if on_event:
                    on_event(len(events), events[-1])
                if events[-1] == "[DONE]":
                    break
        return 200, events
    finally:
        conn.close()


def random_case(rng, generate=True):
    api = rng.choice(["chat", "chat", "completions", "completions"] + ["generate"] * generate)
    words = " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 12)))
    max_t = rng.randint(12, 40)
    n = rng.choice([1, 1, 2, 3])
    if api == "chat":
        body = {"messages": [{"role": "user", "content": words}], "max_tokens": max_t}
        if n > 1:
            body["n"] = n
    elif api == "completions":
        body = {"prompt": words, "max_tokens": max_t}
        if n > 1:
            body["n"] = n
    else:
        body = {"text": words if n == 1 else [words, words + " again"],
                "sampling_params": {"max_new_tokens": max_t}}
    if api != "generate" and rng.random() < 0.5:
        body["stream_options"] = {"include_usage": True}
    body["stream"] = True
    return api, body


def check_stream(api, body, events, twin):
    """Empty when events equal the twin (one id throughout), else what differs."""
    got, want = [masked(e) for e in events], [masked(e) for e in twin]
    if got != want:
        k = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
        return (f"differs from its twin at event {k} of {len(got)} (twin: {len(want)}):\n"
                f" got {got[max(0, k - 1):k + 2]}\nwant {want[max(0, k - 1):k + 2]}\n"
                f" got ends {got[-2:]}")
    ids = set()
    for e in events[:-1]:
        c = json.loads(e)
        ids.add(c["meta_info"]["id"] if api == "generate" else (c["id"], c["created"]))
    if len(ids) != 1:
        return f"{len(ids)} ids in one stream: {ids}"
    return ""


def chaos_run(c, mode, n_streams, concurrency, seed, worker_args, n_workers=3):
    """Streams through a router while a random decode (or regular worker) is killed -9 and
    restarted on its port, again and again. mode: regular, pd (SGLang's protocol) or vllm-nixl
    (chat and completions only: vLLM has no /generate). Returns (failures, router metrics)."""
    rng = random.Random(seed)
    ref = c.worker("regular", "--prefill-us-per-token", "1", "--decode-us-per-token", "1",
                   name="twin")
    victims, argv = [], []
    if mode == "vllm-nixl":
        worker_args = tuple(worker_args) + ("--protocol", mode)
        p = c.worker("prefill", *worker_args, name="prefill")
        argv += ["--pd-protocol", mode, "--prefill", url(p.port)]
        role = "decode"
    elif mode == "pd":
        p = c.worker("prefill", *worker_args, name="prefill")
        argv += ["--prefill", url(p.port), str(p.wait_port("bootstrap"))]
        role = "decode"
    else:
        role = "regular"
    for i in range(n_workers):
        w = c.worker(role, *worker_args, name=f"{role}{i}")
        victims.append(w)
        argv += ["--decode" if role == "decode" else "--worker", url(w.port)]
    r = c.router(*argv, *ROUTER_ARGS)
    wait_until(lambda: get(r.port, "/readiness").status == 200, what="router ready")

    cases = [random_case(rng, generate=mode != "vllm-nixl") for _ in range(n_streams)]
    twins = []
    for api, body in cases:
        st, ev = stream(ref.port, PATHS[api], body)
        assert st == 200, ev
        twins.append(ev)
    failures, lock, stop = [], threading.Lock(), threading.Event()
    todo = list(range(n_streams))

    def client():
        while True:
            with lock:
                if not todo:
                    return
                i = todo.pop()
            api, body = cases[i]
            st, ev = stream(r.port, PATHS[api], body)
            why = f"status {st}: {ev}" if st != 200 else check_stream(api, body, ev, twins[i])
            if why:
                with lock:
                    failures.append((i, api, body, why))

    def killer():
        krng = random.Random(seed + 1)
        while not stop.wait(krng.uniform(0.1, 0.4)):
            k = krng.randrange(len(victims))
            old = victims[k]
            old.kill()
            extra = list(worker_args) + ["--port", str(old.port)]
            victims[k] = c.worker(role, *extra, name=old.name + "-again")

    threads = [threading.Thread(target=client) for _ in range(concurrency)]
    kt = threading.Thread(target=killer)
    for t in threads:
        t.start()
    kt.start()
    for t in threads:
        t.join(timeout=300)
    stop.set()
    kt.join(timeout=30)
    metrics = get(r.port, "/metrics").text
    assert r.alive(), r.tail(40)
    return failures, metrics


def migrations(metrics, outcome):
    m = re.search(r'baton_stream_migrations_total\{outcome="%s"\} (\d+)' % outcome, metrics)
    return int(m.group(1)) if m else 0
