"""test_deploy_monitoring.py — deploy/grafana/baton.json and deploy/prometheus/alerts.yml through
promtool (Debian package prometheus).

Every PromQL expression of the dashboard is extracted (Grafana variables replaced: $instance by
".*", $__rate_interval by 5m), checked by `promtool check rules` as a recording rule, and
evaluated by `promtool test rules` over synthetic series with the value it must give. A new
panel expression without an expected value here fails the test. The alerts have their own unit
test file next to them (deploy/prometheus/alerts_test.yml), run here too. The metric names the
dashboard and the alerts use must exist in a real router's and worker's /metrics.
"""

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import Cluster, SkipTest, TestRunner, get, post  # noqa: E402

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
DASH = os.path.join(ROOT, "deploy", "grafana", "baton.json")
PROM = os.path.join(ROOT, "deploy", "prometheus")

# Synthetic series, 1-minute samples over 10 minutes (rates are exact over a 5m window).
SERIES = [
    ('baton_requests_total{instance="r1",route="/v1/chat/completions",status="200"}', "0+60x10"),
    ('baton_requests_total{instance="r1",route="/v1/chat/completions",status="503"}', "0+30x10"),
    ('baton_requests_total{instance="r1",route="/generate",status="200"}', "0+30x10"),
    ('baton_time_to_first_token_seconds_bucket{instance="r1",route="/v1/chat/completions",le="1"}',
     "0+60x10"),
    ('baton_time_to_first_token_seconds_bucket{instance="r1",route="/v1/chat/completions",'
     'le="+Inf"}', "0+60x10"),
    ('baton_inter_token_latency_seconds_bucket{instance="r1",route="/v1/chat/completions",'
     'le="0.5"}', "0+60x10"),
    ('baton_inter_token_latency_seconds_bucket{instance="r1",route="/v1/chat/completions",'
     'le="+Inf"}', "0+60x10"),
    ('baton_request_duration_seconds_bucket{instance="r1",route="/generate",le="2"}', "0+60x10"),
    ('baton_request_duration_seconds_bucket{instance="r1",route="/generate",le="+Inf"}',
     "0+60x10"),
    ('baton_queue_depth{instance="r1"}', "5x10"),
    ('baton_active_requests{instance="r1"}', "7x10"),
    ('baton_admission_rejected_total{instance="r1",reason="queue_full"}', "0+15x10"),
    ('baton_retries_total{instance="r1",role="decode",reason="connect"}', "0+30x10"),
    ('baton_stream_migrations_total{instance="r1",outcome="started"}', "0+6x10"),
    ('baton_worker_breaker_state{instance="r1",worker="w-1",role="prefill"}', "1x10"),
    ('baton_worker_breaker_state{instance="r1",worker="w-2",role="decode"}', "0x10"),
    ('baton_worker_health{instance="r1",worker="w-1",role="prefill"}', "0x10"),
    ('baton_worker_health{instance="r1",worker="w-2",role="decode"}', "1x10"),
    ('baton_worker_in_flight_requests{instance="r1",worker="w-1",role="prefill"}', "3x10"),
    ('baton_worker_in_flight_requests{instance="r1",worker="w-2",role="decode"}', "0x10"),
    ('baton_kv_bytes_total{instance="d1",direction="received"}', "0+6000x10"),
    ('baton_kv_rooms_total{instance="d1",result="failed"}', "0+15x10"),
    ('baton_kv_corrupted_total{instance="d1"}', "0+1x10"),
    ('baton_registry_etcd_up{instance="r1"}', "1x10"),
    ('baton_registry_etcd_events_total{instance="r1",type="put"}', "0+60x10"),
]

# (panel title, refId) -> expected samples at 10m as {labels: value}.
EXPECTED = {
    ("Request rate by route", "A"): {'{route="/v1/chat/completions"}': 1.5,
                                     '{route="/generate"}': 0.5},
    ("Error ratio (5xx)", "A"): {"{}": 0.25},
    ("Errors by status", "A"): {'{status="503"}': 0.5},
    ("Time to first token (router)", "A"): {"{}": 0.5},
    ("Time to first token (router)", "B"): {"{}": 0.99},
    ("Inter-token latency / TPOT (router)", "A"): {"{}": 0.25},
    ("Inter-token latency / TPOT (router)", "B"): {"{}": 0.495},
    ("End-to-end latency", "A"): {"{}": 1},
    ("End-to-end latency", "B"): {"{}": 1.98},
    ("Queue and active requests", "A"): {"{}": 5},
    ("Queue and active requests", "B"): {"{}": 7},
    ("Admission rejections", "A"): {'{reason="queue_full"}': 0.25},
    ("Retries and stream migrations", "A"): {'{role="decode",reason="connect"}': 0.5},
    ("Retries and stream migrations", "B"): {'{outcome="started"}': 0.1},
    ("Breaker state per worker (0 closed, 1 open, 2 half-open)", "A"): {
        '{worker="w-1",role="prefill"}': 1, '{worker="w-2",role="decode"}': 0},
    ("Health per worker (1 up, 0 down; worst router)", "A"): {
        '{worker="w-1",role="prefill"}': 0, '{worker="w-2",role="decode"}': 1},
    ("In-flight requests per worker", "A"): {
        '{worker="w-1",role="prefill"}': 3, '{worker="w-2",role="decode"}': 0},
    ("KV transfer rate (decode workers, received)", "A"): {'{instance="d1"}': 100},
    ("KV transfer failures", "A"): {'{instance="d1"}': 0.25},
    ("KV transfer failures", "B"): {"{}": 5},
    ("Shared registry (etcd)", "A"): {"{}": 1},
    ("Shared registry (etcd)", "B"): {'{type="put"}': 1},
}


def need_promtool():
    if shutil.which("promtool") is None:
        raise SkipTest("promtool not installed (Debian package prometheus; "
                       "scripts/install-deps.sh --test installs it)")


def dashboard_exprs():
    with open(DASH) as f:
        dash = json.load(f)
    out = []
    for p in dash["panels"]:
        for t in p.get("targets", []):
            e = t["expr"].replace('$instance', ".*").replace("$__rate_interval", "5m")
            assert "$" not in e, f"unknown Grafana variable in {p['title']}: {e}"
            out.append(((p["title"], t["refId"]), e))
    return out


def promtool(*args, cwd=None):
    r = subprocess.run(["promtool", *args], capture_output=True, text=True, timeout=60, cwd=cwd)
    return r.returncode, r.stdout + r.stderr


def test_dashboard_exprs_check_and_evaluate():
    need_promtool()
    exprs = dashboard_exprs()
    assert len(exprs) >= 15, len(exprs)
    missing = [k for k, _ in exprs if k not in EXPECTED]
    assert not missing, f"dashboard expressions without an expected value: {missing}"
    with tempfile.TemporaryDirectory(prefix="baton-grafana-") as d:
        rules = {"groups": [{"name": "dashboard", "rules": [
            {"record": f"baton_dashboard:expr_{i}", "expr": e} for i, (_, e) in enumerate(exprs)]}]}
        with open(os.path.join(d, "rules.json"), "w") as f:
            json.dump(rules, f)  # JSON is YAML: promtool reads it as is
        rc, out = promtool("check", "rules", "rules.json", cwd=d)
        assert rc == 0, out
        assert f"{len(exprs)} rules found" in out, out
        tests = []
        for key, e in exprs:
            tests.append({"expr": e, "eval_time": "10m", "exp_samples": [
                {"labels": lbl, "value": v} for lbl, v in EXPECTED[key].items()]})
        unit = {"rule_files": ["rules.json"], "evaluation_interval": "1m", "tests": [{
            "interval": "1m",
            "input_series": [{"series": s, "values": v} for s, v in SERIES],
            "promql_expr_test": tests}]}
        with open(os.path.join(d, "test.json"), "w") as f:
            json.dump(unit, f)
        rc, out = promtool("test", "rules", "test.json", cwd=d)
        assert rc == 0, out
        # And the check has teeth: a wrong expected value fails.
        unit["tests"][0]["promql_expr_test"][0]["exp_samples"][0]["value"] = 12345
        with open(os.path.join(d, "test.json"), "w") as f:
            json.dump(unit, f)
        rc, out = promtool("test", "rules", "test.json", cwd=d)
        assert rc != 0, "promtool accepted a wrong expected value"


def test_alerts_check_and_unit_test():
    need_promtool()
    rc, out = promtool("check", "rules", "alerts.yml", cwd=PROM)
    assert rc == 0, out
    rc, out = promtool("test", "rules", "alerts_test.yml", cwd=PROM)
    assert rc == 0, out
    with open(os.path.join(PROM, "alerts.yml")) as f:
        names = set(re.findall(r"alert: (\w+)", f.read()))
    for want in ("BatonNoHealthyPair", "BatonWorkerBreakerOpen", "BatonKVCorruption",
                 "BatonHighErrorRatio", "BatonQueueSaturated"):
        assert want in names, want
    with open(os.path.join(PROM, "alerts_test.yml")) as f:
        tested = set(re.findall(r"alertname: (\w+)", f.read()))
    assert names <= tested, f"alerts without a unit test: {names - tested}"


def test_metric_names_exist():
    """Every baton_* name in the dashboard and alerts is exported by a real router or worker."""
    with Cluster("monitoring") as c:
        p, d, r = c.pd(router_args=("--registry", "etcd://127.0.0.1:9/x",
                                    "--registry-timeout-ms", "200"))
        msgs = [{"role": "user", "content": "names"}]
        assert post(r.port, "/v1/chat/completions",
                    {"messages": msgs, "max_tokens": 3, "stream": True}).status == 200
        text = "".join(get(x.port, "/metrics").text for x in (r, p, d))
    exported = set(re.findall(r"^# TYPE (\w+) ", text, re.M))
    with open(DASH) as f:
        used = set(re.findall(r"\b(baton_\w+)", f.read()))
    with open(os.path.join(PROM, "alerts.yml")) as f:
        used |= set(re.findall(r"\b(baton_\w+)", f.read()))
    used = {re.sub(r"_(bucket|sum|count)$", "", u) for u in used}
    unknown = sorted(u for u in used if u not in exported)
    assert not unknown, f"not exported by baton/baton-worker: {unknown}"


if __name__ == "__main__":
    t = TestRunner()
    t.run(test_dashboard_exprs_check_and_evaluate)
    t.run(test_alerts_check_and_unit_test)
    t.run(test_metric_names_exist)
    t.finish()
