"""simtext.py — an independent reference for baton-worker's deterministic output.

Standard library only. It re-implements the definition in docs/WORKER.md (and
src/worker/simtext.h) from scratch, so tests can compute the exact answer a worker, or a
router in front of workers, must return:

    >>> import simtext
    >>> r = simtext.complete_text("hello world", 8)
    >>> r.text, r.finish_reason, r.completion_tokens
    ('route ten to was data fast wind eight', 'length', 8)

    chat:         simtext.complete_chat(messages, max_tokens, stop=...)
    completions:  simtext.complete_text(prompt, max_tokens, stop=...)   (or complete_ids)
    /generate:    simtext.complete_text(text, max_new_tokens, ...) / complete_ids(input_ids, ...)

Default max tokens when the body gives none: /generate 128, chat 128, completions 16.
"""

import re

VOCAB = [
    "the", "of", "and", "to", "in", "is", "it", "that", "for", "on",
    "with", "as", "was", "at", "by", "be", "this", "from", "or", "an",
    "are", "not", "but", "have", "all", "can", "new", "one", "more", "time",
    "data", "model", "token", "batch", "cache", "route", "layer", "page", "queue", "fast",
    "slow", "river", "stone", "cloud", "light", "north", "south", "green", "blue", "red",
    "seven", "eight", "nine", "ten", "apple", "bread", "lamp", "door", "road", "hill",
    "wind", "rain", "snow", "star",
]
assert len(VOCAB) == 64

DEFAULT_MAX_TOKENS = {"generate": 128, "chat": 128, "completions": 16}

_M64 = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15
_INPUT_BASE = 1 << 63
_WS = re.compile(rb"[ \t\n\v\f\r]+")


def fnv1a64(data: bytes) -> int:
    h = 0xcbf29ce484222325
    for b in data:
        h ^= b
        h = (h * 0x100000001b3) & _M64
    return h


def mix(seed: int, k: int) -> int:
    """splitmix64's finalizer applied to seed + k * golden (mod 2^64)."""
    z = (seed + k * _GOLDEN) & _M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _M64
    return z ^ (z >> 31)


def seed_text(prompt: str) -> int:
    return fnv1a64(prompt.encode("utf-8"))


def ids_text(ids) -> str:
    return " ".join(str(int(i)) for i in ids)


def seed_ids(ids) -> int:
    return seed_text(ids_text(ids))


def words(prompt: str):
    return [w for w in _WS.split(prompt.encode("utf-8")) if w]


def count_words(prompt: str) -> int:
    return max(1, len(words(prompt)))


def word_id(word: bytes) -> int:
    return fnv1a64(word) & 0x7FFFFFFF


def token(seed: int, i: int) -> int:
    return mix(seed, i + 1) % len(VOCAB)


def logprob_of(z: int) -> float:
    return -(((z >> 56) + 1) / 256.0)


def output_logprob(seed: int, i: int) -> float:
    return logprob_of(mix(seed, i + 1))


def input_logprob(seed: int, j: int) -> float:
    return logprob_of(mix(seed, _INPUT_BASE + j))


def chat_prompt(messages) -> str:
    """Each message renders as "<role>: <content>\\n"; content arrays join their text parts;
    missing or null content renders as ""."""
    out = []
    for m in messages:
        c = m.get("content")
        if c is None:
            c = ""
        elif isinstance(c, list):
            c = "".join(p["text"] for p in c)
        out.append(f"{m['role']}: {c}\n")
    return "".join(out)


class Result:
    """One generated sequence."""

    def __init__(self, seed, prompt_tokens):
        self.seed = seed
        self.prompt_tokens = prompt_tokens
        self.ids = []
        self.text = ""  # final (after stop truncation)
        self.finish_reason = None  # "length" | "stop"
        self.matched = None  # the stop string or stop token id, for "stop"
        self.tok_end = []

    @property
    def completion_tokens(self):
        return len(self.ids)

    def token_text(self, i):
        """Token i as it appears in OpenAI logprobs: the word, with a leading space for i > 0."""
        return (" " if i > 0 else "") + VOCAB[self.ids[i]]

    def output_logprobs(self):
        return [output_logprob(self.seed, i) for i in range(len(self.ids))]

    def sglang_output_token_logprobs(self):
        return [[output_logprob(self.seed, i), t, None] for i, t in enumerate(self.ids)]

    def sglang_finish_reason(self):
        if self.finish_reason == "length":
            return {"type": "length", "length": len(self.ids)}
        return {"type": "stop", "matched": self.matched}

    def __repr__(self):
        return (f"Result(text={self.text!r}, finish={self.finish_reason}, "
                f"matched={self.matched!r}, ids={self.ids})")


def generate(seed, prompt_tokens, max_tokens, stop=None, stop_token_ids=None, first_token=None):
    """Applies the stop rules token by token (docs/WORKER.md, "Generation")."""
    if isinstance(stop, str):
        stop = [stop]
    stop = [s for s in (stop or []) if s]
    stop_ids = list(stop_token_ids or [])
    r = Result(seed, prompt_tokens)
    if max_tokens == 0:
        r.finish_reason = "length"
        return r
    text = ""
    while True:
        i = len(r.ids)
        t = token(seed, i) if (i > 0 or first_token is None) else first_token
        r.ids.append(t)
        if t in stop_ids:
            r.tok_end.append(len(text))
            r.text, r.finish_reason, r.matched = text, "stop", t
            return r
        text = text + (" " if text else "") + VOCAB[t]
        r.tok_end.append(len(text))
        best = None
        for k, s in enumerate(stop):
            p = text.find(s)
            if p >= 0 and (best is None or p < best[0]):
                best = (p, k)
        if best is not None:
            r.text, r.finish_reason, r.matched = text[:best[0]], "stop", stop[best[1]]
            return r
        if len(r.ids) >= max_tokens:
            r.text, r.finish_reason = text, "length"
            return r


def complete_text(prompt, max_tokens, stop=None, stop_token_ids=None):
    return generate(seed_text(prompt), count_words(prompt), max_tokens, stop, stop_token_ids)


def complete_ids(ids, max_tokens, stop=None, stop_token_ids=None):
    return generate(seed_ids(ids), len(ids), max_tokens, stop, stop_token_ids)


def complete_chat(messages, max_tokens, stop=None, stop_token_ids=None):
    return complete_text(chat_prompt(messages), max_tokens, stop, stop_token_ids)


def input_token_logprobs_text(prompt, start=0):
    """SGLang meta_info.input_token_logprobs for a text prompt: [logprob, id, null] per prompt
    token from `start`; the first prompt token's logprob is null."""
    seed = seed_text(prompt)
    ws = words(prompt) or [b""]
    return [[None if j == 0 else input_logprob(seed, j), word_id(w), None]
            for j, w in enumerate(ws) if j >= start]


def input_token_logprobs_ids(ids, start=0):
    seed = seed_ids(ids)
    return [[None if j == 0 else input_logprob(seed, j), int(t), None]
            for j, t in enumerate(ids) if j >= start]


# ---- the simulated KV cache (docs/WORKER.md, "KV cache") ----

KV_SALT = 0x6B762D6361636865  # "kv-cache"

# name: (layers, kv_heads, head_dim, dtype_bytes, page_tokens)
KV_PRESETS = {
    "tiny": (4, 2, 16, 2, 16),
    "llama3-8b": (32, 8, 128, 2, 64),
    "large": (64, 8, 128, 2, 64),
}


def kv_token_bytes(kv_heads, head_dim, dtype_bytes):
    """Bytes of one token in one layer: K and V."""
    return 2 * kv_heads * head_dim * dtype_bytes


def kv_key(token_id: int, pos: int, layer: int) -> int:
    return mix(mix(mix(KV_SALT, token_id), pos + 1), layer + 1)


def kv_bytes(token_id: int, pos: int, layer: int, token_bytes: int) -> bytes:
    """The K and V bytes of one token in one layer: words key + i * golden, little-endian."""
    out = bytearray()
    w = kv_key(token_id, pos, layer)
    while len(out) < token_bytes:
        out += w.to_bytes(8, "little")
        w = (w + _GOLDEN) & _M64
    return bytes(out[:token_bytes])


def prompt_token_ids(prompt: str):
    """Token ids of a text prompt (its words; an empty prompt is one token, the id of "")."""
    return [word_id(w) for w in (words(prompt) or [b""])]


def kv_room_bytes(n_tokens, preset="tiny"):
    """KV bytes one room of n prompt tokens moves (every layer)."""
    layers, heads, dim, dt, _ = KV_PRESETS[preset]
    return n_tokens * layers * kv_token_bytes(heads, dim, dt)


if __name__ == "__main__":
    import json
    import sys
    prompt = sys.argv[1] if len(sys.argv) > 1 else "hello world"
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 16
    r = complete_text(prompt, n)
    print(json.dumps({"text": r.text, "ids": r.ids, "finish_reason": r.finish_reason,
                      "prompt_tokens": r.prompt_tokens}))
