"""test_responses_clients.py — the npm clients users reach for, through the router in PD (SGLang
bootstrap and vLLM NIXL protocols, real baton-worker processes): openai's responses.create
(streamed and not), the Vercel AI SDK's default OpenAI provider (generateText, streamText) and
LangChain's ChatOpenAI with useResponsesApi each get the simulated engine's reference text. The
clients come from scripts/install-deps.sh --test (tests/npm/node_modules); without them the test
reports itself skipped."""

import json
import os
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import simtext  # noqa: E402
from harness import Cluster, SkipTest, TestRunner, url  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
NODE_MODULES = os.environ.get("BATON_TEST_NODE_MODULES",
                              os.path.join(HERE, "..", "npm", "node_modules"))
CLIENTS = ["openai", "ai", "@ai-sdk/openai", "@langchain/openai"]
INPUT, MAX = "hello there", 6


def need_clients():
    if shutil.which("node") is None:
        raise SkipTest("node not installed (scripts/install-deps.sh --test)")
    missing = [c for c in CLIENTS if not os.path.isdir(os.path.join(NODE_MODULES, c))]
    if missing:
        raise SkipTest("npm clients not installed in tests/npm/node_modules (run "
                       "scripts/install-deps.sh --test); missing: " + ", ".join(missing))


def run_clients(port):
    res = subprocess.run(["node", os.path.join(HERE, "responses_clients.mjs"), NODE_MODULES,
                          url(port) + "/v1", INPUT, str(MAX)],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


def check(out):
    want = simtext.complete_chat([{"role": "user", "content": INPUT}], MAX).text
    assert out["openai_create"] == want, out
    assert out["openai_stream"] == {"text": want, "last": "response.incomplete"}, out
    for name in ("ai_generateText", "ai_streamText", "langchain_responses"):
        assert out[name] == want, (name, out[name])


def test_clients_through_sglang_pd():
    need_clients()
    with Cluster("clients-sglang") as c:
        _, _, r = c.pd()
        check(run_clients(r.port))


def test_clients_through_vllm_nixl_pd():
    need_clients()
    with Cluster("clients-nixl") as c:
        p = c.worker("prefill", "--protocol", "vllm-nixl")
        d = c.worker("decode", "--protocol", "vllm-nixl")
        r = c.router("--prefill", url(p.port), "--decode", url(d.port),
                     "--pd-protocol", "vllm-nixl")
        check(run_clients(r.port))


if __name__ == "__main__":
    t = TestRunner()
    t.run(test_clients_through_sglang_pd)
    t.run(test_clients_through_vllm_nixl_pd)
    t.finish()
