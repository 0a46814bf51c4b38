"""migration_ref.py — what a client has of a stream, and the continuation body that carries it
(docs/WORKER.md "Continuations"): shared by the migration tests and loadtest/chaos_migration.py."""

import json
import re

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
