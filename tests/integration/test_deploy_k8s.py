"""test_deploy_k8s.py — deploy/kubernetes/ checked offline.

`kubectl --dry-run=client` cannot run here: it still asks an API server for the resource
mapping (tried: "unable to recognize ... localhost:8080"). So the manifests get:
  - a structure check with PyYAML (Debian python3-yaml): known kinds and apiVersions, required
    fields, selectors that match their pods, Service/ServiceMonitor/probe ports that exist,
    resource requests everywhere, probes on /liveness and /readiness (router), PDBs that allow
    no full outage;
  - the real binaries run with the manifests' own arguments (pod variables substituted, ports
    made ephemeral): the router starts with the ConfigMap's baton.json, baton-worker accepts
    its container arguments;
  - the manifests' exact command lines end to end (paths, hosts and ports substituted): a real
    etcd, the router with the ConfigMap's baton.json and the admin token from the Secret's file,
    the RBG's SGLang postStart hook registering its pod with that token (a wrong token is
    refused) and its preStop hook removing it, and a baton-worker pool pod registering itself
    through etcd with the KV secret from its file;
  - HiCache tiers: the baton-worker pools' tiers flags, the SGLang roles' HiCache L2 flags and
    no L3 backend; the worker pools' exact command lines beside store.yaml's master and node
    on a real etcd, a turn computed on one prefill pod found in L3 by the other;
  - `kubectl kustomize` (offline) on the kustomization when a kubectl is installed.
"""

import glob
import json
import os
import re
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import Cluster, SkipTest, TestRunner, binary, get, post, url, wait_until  # noqa: E402

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
K8S = os.path.join(ROOT, "deploy", "kubernetes")

KINDS = {
    "ConfigMap": "v1", "Service": "v1", "Deployment": "apps/v1", "StatefulSet": "apps/v1",
    "PodDisruptionBudget": "policy/v1", "ServiceMonitor": "monitoring.coreos.com/v1",
    "RoleBasedGroup": "workloads.x-k8s.io/v1alpha1",
    "Kustomization": "kustomize.config.k8s.io/v1beta1",
}
SECRETS = "/var/run/secrets/baton"  # where the pods mount the Secret baton-secrets
NAME_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


def load_docs():
    import yaml
    docs = []
    for path in sorted(glob.glob(os.path.join(K8S, "**", "*.yaml"), recursive=True)):
        with open(path) as f:
            for d in yaml.safe_load_all(f):
                if d:
                    docs.append((os.path.relpath(path, K8S), d))
    return docs


def pods(docs):
    """(file, workload name, replicas, pod template) of every workload, RBG roles included."""
    out = []
    for f, d in docs:
        if d["kind"] in ("Deployment", "StatefulSet"):
            out.append((f, d["metadata"]["name"], d["spec"].get("replicas", 1),
                        d["spec"]["template"]))
        elif d["kind"] == "RoleBasedGroup":
            for role in d["spec"]["roles"]:
                out.append((f, f"{d['metadata']['name']}/{role['name']}", role["replicas"],
                            role["template"]))
    return out


def matches(selector, labels):
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def test_structure():
    try:
        docs = load_docs()
    except ImportError:
        raise SkipTest("python3-yaml not installed (scripts/install-deps.sh --test)")
    kinds = [d["kind"] for _, d in docs]
    for k in ("ConfigMap", "Deployment", "Service", "PodDisruptionBudget", "ServiceMonitor",
              "RoleBasedGroup", "StatefulSet"):
        assert k in kinds, f"no {k} in deploy/kubernetes"
    for f, d in docs:
        assert d.get("kind") in KINDS, (f, d.get("kind"))
        assert d.get("apiVersion") == KINDS[d["kind"]], (f, d["kind"], d.get("apiVersion"))
        if d["kind"] != "Kustomization":
            assert NAME_RE.match(d["metadata"]["name"]), (f, d["metadata"])
    # Workloads: selectors match their pods; every container has requests, a memory limit,
    # probes on ports it declares.
    wl = pods(docs)
    for f, d in docs:
        if d["kind"] in ("Deployment", "StatefulSet"):
            assert matches(d["spec"]["selector"]["matchLabels"],
                           d["spec"]["template"]["metadata"]["labels"]), (f, d["metadata"])
    for f, name, replicas, tpl in wl:
        assert replicas >= 2, (name, "a single replica is an outage on every restart")
        for c in tpl["spec"]["containers"]:
            req = c.get("resources", {}).get("requests", {})
            assert "cpu" in req and "memory" in req, (name, c["name"], "requests")
            assert "memory" in c["resources"].get("limits", {}), (name, c["name"], "limit")
            port_names = {p["name"] for p in c.get("ports", [])}
            for probe in ("livenessProbe", "readinessProbe"):
                hg = c[probe].get("httpGet") or c[probe]["tcpSocket"]
                assert hg["port"] in port_names, (name, probe, hg)
            if c.get("command") == ["baton"]:
                assert c["livenessProbe"]["httpGet"]["path"] == "/liveness", name
                assert c["readinessProbe"]["httpGet"]["path"] == "/readiness", name
    # Services select pods and target named ports they have.
    services = [(f, d) for f, d in docs if d["kind"] == "Service"]
    for f, s in services:
        sel = s["spec"]["selector"]
        targets = [tpl for _, _, _, tpl in wl if matches(sel, tpl["metadata"]["labels"])]
        assert targets, (f, s["metadata"]["name"], "selects no pod")
        for p in s["spec"]["ports"]:
            tp = p.get("targetPort", p["port"])
            if isinstance(tp, str):
                assert any(tp in {cp["name"] for c in t["spec"]["containers"]
                                  for cp in c.get("ports", [])} for t in targets), (f, tp)
    # ServiceMonitors select a Service and scrape a port it names.
    for f, sm in ((f, d) for f, d in docs if d["kind"] == "ServiceMonitor"):
        sel = sm["spec"]["selector"]["matchLabels"]
        svc = [s for _, s in services if matches(sel, s["metadata"].get("labels", {}))]
        assert svc, (f, sm["metadata"]["name"], "selects no Service")
        for ep in sm["spec"]["endpoints"]:
            assert ep["path"] == "/metrics"
            assert any(ep["port"] in {p["name"] for p in s["spec"]["ports"]} for s in svc), ep
    # PDBs select a workload and never allow all of it down (nor block every eviction).
    for f, pdb in ((f, d) for f, d in docs if d["kind"] == "PodDisruptionBudget"):
        sel = pdb["spec"]["selector"]["matchLabels"]
        sel_wl = [(n, r) for _, n, r, tpl in wl if matches(sel, tpl["metadata"]["labels"])]
        assert sel_wl, (f, pdb["metadata"]["name"], "selects nothing")
        for n, r in sel_wl:
            if "minAvailable" in pdb["spec"]:
                assert 1 <= pdb["spec"]["minAvailable"] < r, (n, pdb["spec"], r)
            else:
                assert 1 <= pdb["spec"]["maxUnavailable"] < r, (n, pdb["spec"], r)
    # RBG: router, prefill and decode roles, and baton-store's master and store roles; the router
    # starts after both pools, store nodes after the masters; the store roles run store.yaml's
    # exact containers.
    rbg = next(d for _, d in docs if d["kind"] == "RoleBasedGroup")
    roles = {r["name"]: r for r in rbg["spec"]["roles"]}
    assert set(roles) == {"router", "prefill", "decode", "master", "store"}, roles.keys()
    assert set(roles["router"]["dependencies"]) == {"prefill", "decode"}
    assert roles["store"]["dependencies"] == ["master"]
    for role, workload in (("master", "baton-store-master"), ("store", "baton-store-node")):
        tpl = next(t for _, n, _, t in wl if n == workload)
        assert roles[role]["template"] == tpl, (role, "differs from store.yaml's pods")
    # The store: two masters (election), the node a StatefulSet.
    wk = {n: (f, r) for f, n, r, _ in wl}
    assert wk["baton-store-master"][1] == 2 and wk["baton-store-node"][1] >= 2
    # The kustomization lists files that exist.
    kust = next(d for _, d in docs if d["kind"] == "Kustomization")
    for r in kust["resources"]:
        assert os.path.exists(os.path.join(K8S, r)), r


def container(docs, name_prefix, cname):
    for _, n, _, tpl in pods(docs):
        if n.startswith(name_prefix):
            for c in tpl["spec"]["containers"]:
                if c["name"] == cname:
                    return c
    raise AssertionError(f"no container {cname} in {name_prefix}")


def test_binaries_accept_the_manifests():
    """The ConfigMap's baton.json starts a router; the worker containers' args parse."""
    try:
        docs = load_docs()
    except ImportError:
        raise SkipTest("python3-yaml not installed (scripts/install-deps.sh --test)")
    cm = next(d for _, d in docs if d["kind"] == "ConfigMap")
    conf = json.loads(cm["data"]["baton.json"])
    assert conf["registry"]["url"].startswith("etcd://")
    # Loopback, ephemeral port, and an etcd that is not there: the router must still start
    # (it serves its last known set, empty here) and say the registry is unreachable.
    conf.update(host="127.0.0.1", port=0)
    conf["registry"]["url"] = "etcd://127.0.0.1:9/baton"
    conf["registry"]["timeout_ms"] = 200
    with Cluster("deploy-k8s") as c:
        path = os.path.join(c.logdir, "baton.json")
        with open(path, "w") as f:
            json.dump(conf, f)
        with open(os.path.join(c.logdir, "admin-token"), "w") as f:
            f.write("token\n")
        router = container(docs, "baton-router", "baton")
        args = [a.replace("/etc/baton/baton.json", path).replace(SECRETS, c.logdir)
                for a in router["args"]]
        r = c.start("router", [binary("baton")] + args)
        r.wait_log(r"registry_unreachable", timeout=15)
        assert get(r.port, "/liveness").status == 200
        os.unlink(path)
        for role in ("prefill", "decode"):
            w = container(docs, f"baton-worker-{role}", "worker")
            args = []
            for a in w["args"]:
                a = a.replace("$(POD_IP)", "127.0.0.1")
                a = re.sub(r"^--(port|bootstrap-port)=\d+$", r"--\1=0", a)
                a = a.replace("--host=0.0.0.0", "--host=127.0.0.1")
                args.append(a)
            # --help after every other option: each one is parsed and checked first.
            res = subprocess.run([binary("baton-worker")] + args + ["--help"],
                                 capture_output=True, text=True, timeout=30)
            assert res.returncode == 0, (role, args, res.stderr)
            assert "--register URL" in res.stdout


def rbg_docs():
    import yaml
    with open(os.path.join(K8S, "rbg", "baton-rbg.yaml")) as f:
        return yaml.safe_load(f)


def hook_script(role, which):
    rbg = rbg_docs()
    r = next(x for x in rbg["spec"]["roles"] if x["name"] == role)
    c = r["template"]["spec"]["containers"][0]
    cmd = c["lifecycle"][which]["exec"]["command"]
    assert cmd[:2] == ["sh", "-c"], cmd
    mounts = {m["mountPath"] for m in c.get("volumeMounts", [])}
    assert SECRETS in mounts, (role, mounts)
    return cmd[2]


def workers_of(port, token):
    res = get(port, "/workers", headers={"Authorization": f"Bearer {token}"})
    assert res.status == 200, res.text
    return {w["url"]: w for w in res.json()["workers"]}


def test_manifests_run_end_to_end():
    """The manifests' router and self-registration command lines, with their Secret's files."""
    try:
        docs = load_docs()
    except ImportError:
        raise SkipTest("python3-yaml not installed (scripts/install-deps.sh --test)")
    from etcd_cluster import EtcdCluster, etcd_binary
    if etcd_binary() is None:
        raise SkipTest("etcd not installed (scripts/install-deps.sh --test)")
    cm = next(d for _, d in docs if d["kind"] == "ConfigMap")
    conf = json.loads(cm["data"]["baton.json"])
    router = container(docs, "baton-router", "baton")
    rbg_router = next(x for x in rbg_docs()["spec"]["roles"] if x["name"] == "router")
    assert rbg_router["template"]["spec"]["containers"][0]["args"] == router["args"]
    assert "--admin-token-file" in router["args"], router["args"]
    with EtcdCluster(size=1, name="deploy-k8s-etcd") as etcd, Cluster("deploy-k8s-e2e") as c:
        secrets = os.path.join(c.logdir, "secrets")
        os.mkdir(secrets)
        token = "t0k3n-" + os.urandom(8).hex()
        for key, value in (("admin-token", token), ("kv-secret", os.urandom(16).hex()),
                           ("wrong-token", "not-the-token")):
            with open(os.path.join(secrets, key), "w") as f:
                f.write(value + "\n")
            os.chmod(os.path.join(secrets, key), 0o440)  # the manifests' defaultMode
        conf.update(host="127.0.0.1", port=0)
        conf["registry"]["url"] = etcd.url("/baton")
        path = os.path.join(c.logdir, "baton.json")
        with open(path, "w") as f:
            json.dump(conf, f)

        def subst(a):
            return a.replace("/etc/baton/baton.json", path).replace(SECRETS, secrets)

        r = c.start("router", [binary("baton")] + [subst(a) for a in router["args"]])
        r.wait_log(r"admin_routes auth=token")
        # The SGLang pod's stand-in: a baton-worker where the pod's port 30000 would be.
        pod = c.worker("prefill")

        def hook(role, which, tries_and_sleep=None, token_file="admin-token"):
            script = hook_script(role, which)
            script = script.replace("http://baton-router:8000", f"http://127.0.0.1:{r.port}")
            script = script.replace(":30000", f":{pod.port}").replace("%3A30000",
                                                                       f"%3A{pod.port}")
            script = script.replace(f"{SECRETS}/admin-token", f"{secrets}/{token_file}")
            if tries_and_sleep:  # only for the refusal: 120 tries 5 s apart would be 10 min
                script = script.replace("seq 1 120", f"seq 1 {tries_and_sleep[0]}")
                script = script.replace("sleep 5", f"sleep {tries_and_sleep[1]}")
            return subprocess.run(["sh", "-c", script], env=dict(os.environ, POD_IP="127.0.0.1"),
                                  capture_output=True, text=True, timeout=60)

        # A wrong token is refused (401): the hook gives up with a failure, nothing is added.
        res = hook("prefill", "postStart", (2, 0.1), token_file="wrong-token")
        assert res.returncode != 0, res
        assert url(pod.port) not in workers_of(r.port, token)
        res = hook("prefill", "postStart")
        assert res.returncode == 0, res
        w = workers_of(r.port, token)[url(pod.port)]
        assert w["worker_type"] == "prefill" and w["bootstrap_port"] == 8998, w
        res = hook("prefill", "preStop")
        assert res.returncode == 0, res
        wait_until(lambda: url(pod.port) not in workers_of(r.port, token), 20,
                   what="the preStop hook's DELETE to apply")
        res = hook("decode", "postStart")
        assert res.returncode == 0 and url(pod.port) in workers_of(r.port, token), res

        # A baton-worker pool pod: its exact arguments, registering itself through etcd.
        w = container(docs, "baton-worker-decode", "worker")
        args = []
        for a in w["args"]:
            a = a.replace("$(POD_IP)", "127.0.0.1").replace(SECRETS, secrets)
            a = re.sub(r"^--register=etcd://.*$", f"--register={etcd.url('/baton')}", a)
            a = a.replace("--host=0.0.0.0", "--host=127.0.0.1")
            args.append(re.sub(r"^--(port|bootstrap-port)=\d+$", r"--\1=0", a))
        assert any(a.startswith("--kv-secret-file=") for a in args), args
        wk = c.start("pool-decode", [binary("baton-worker")] + args)
        wk.wait_log(r"kv_auth=hmac-sha256")
        # --register-url names port 30000 (the pod's); what matters is that it appears.
        wait_until(lambda: "http://127.0.0.1:30000" in workers_of(r.port, token), 30,
                   what="the pool pod's self-registration to reach the router")


def store_args(c, docs, workload, cname, etcd_url, secrets):
    """A store container's exact arguments, run here: loopback, ephemeral ports, a test etcd."""
    out = []
    for a in container(docs, workload, cname)["args"]:
        a = a.replace("$(POD_IP)", "127.0.0.1").replace("$(POD_NAME)", "node-0")
        a = a.replace(SECRETS, secrets)
        a = re.sub(r"^--registry=etcd://.*$", f"--registry={etcd_url}", a)
        a = re.sub(r"^--(port|http-port)=\d+$", r"--\1=0", a)
        a = re.sub(r"^(--kv-events-(replay-)?endpoint=tcp://127.0.0.1):\d+$", r"\1:*", a)
        a = re.sub(r"^--segment-bytes=.*$", "--segment-bytes=64M", a)
        out.append(a)
    return out


def test_store_manifests_run():
    """store.yaml's masters and node with their own arguments: a leader is elected through etcd,
    the node registers, a put and a get go through the registry with the KV secret, /metrics
    wants the admin token, the KV-event sockets are bound."""
    try:
        docs = load_docs()
    except ImportError:
        raise SkipTest("python3-yaml not installed (scripts/install-deps.sh --test)")
    from etcd_cluster import EtcdCluster, etcd_binary
    if etcd_binary() is None:
        raise SkipTest("etcd not installed (scripts/install-deps.sh --test)")
    with EtcdCluster(size=1, name="deploy-store-etcd") as etcd, Cluster("deploy-store") as c:
        secrets = os.path.join(c.logdir, "secrets")
        os.mkdir(secrets)
        token = "t0k3n-" + os.urandom(8).hex()
        for key, value in (("admin-token", token), ("kv-secret", os.urandom(16).hex())):
            with open(os.path.join(secrets, key), "w") as f:
                f.write(value + "\n")
            os.chmod(os.path.join(secrets, key), 0o440)
        reg = etcd.url("/baton")
        masters = [c.start(f"master{i}", [binary("baton-store")] + store_args(
            c, docs, "baton-store-master", "master", reg, secrets),
            wait=("master", "http", "kvevents", "kvreplay")) for i in range(2)]
        c.start("node", [binary("baton-store")] + store_args(
            c, docs, "baton-store-node", "node", reg, secrets), wait=("node",))

        def leaders():
            return [m for m in masters if b'"leader":true' in get(m.port, "/health").body]
        wait_until(lambda: len(leaders()) == 1, 20, what="one leading master")
        cli = [binary("baton-store"), "--registry", reg, "--kv-secret-file",
               os.path.join(secrets, "kv-secret")]
        data = os.urandom(100000)
        src, dst = os.path.join(c.logdir, "in"), os.path.join(c.logdir, "out")
        with open(src, "wb") as f:
            f.write(data)

        def put_ok():
            return subprocess.run([cli[0], "put", "k", src] + cli[1:], capture_output=True,
                                  timeout=60).returncode == 0
        wait_until(put_ok, 30, what="a put through the registry (the node registered)")
        res = subprocess.run([cli[0], "get", "k", dst] + cli[1:], capture_output=True, timeout=60)
        assert res.returncode == 0, res.stderr
        with open(dst, "rb") as f:
            assert f.read() == data
        lead = leaders()[0]
        assert get(lead.port, "/metrics").status == 401
        m = get(lead.port, "/metrics", headers={"Authorization": f"Bearer {token}"})
        assert m.status == 200 and "baton_store_objects 1" in m.text, m.text[:300]


def worker_args(docs, workload, etcd_url, secrets):
    """A baton-worker pool container's exact arguments, run here: loopback, ephemeral ports, a
    test etcd for both the registry and the store's master, a smaller L2."""
    out = []
    for a in container(docs, workload, "worker")["args"]:
        a = a.replace("$(POD_IP)", "127.0.0.1").replace(SECRETS, secrets)
        a = re.sub(r"^--(register|store-registry)=etcd://.*$", rf"--\1={etcd_url}", a)
        a = re.sub(r"^--(port|bootstrap-port)=\d+$", r"--\1=0", a)
        a = re.sub(r"^--l2-bytes=.*$", "--l2-bytes=16M", a)
        # the manifest's timeout rule is a deadline; on a loaded test machine the L3 hit must
        # not depend on one
        a = re.sub(r"^--hicache-storage-prefetch-policy=.*$",
                   "--hicache-storage-prefetch-policy=wait_complete", a)
        out.append(a)
    return out


def test_tiers_flags():
    """Tiers on in the baton-worker pools (L2, L3 through etcd, decode offload) and HiCache's L2
    in the RBG's SGLang roles, whose L3 cannot be baton-store (no storage backend named)."""
    try:
        docs = load_docs()
    except ImportError:
        raise SkipTest("python3-yaml not installed (scripts/install-deps.sh --test)")
    for role in ("prefill", "decode"):
        args = container(docs, f"baton-worker-{role}", "worker")["args"]
        flags = {a.split("=", 1)[0]: a.split("=", 1)[1] if "=" in a else "" for a in args}
        assert flags.get("--l2-bytes"), (role, args)
        assert flags.get("--store-registry", "").startswith("etcd://"), (role, args)
        # the same etcd as the store masters' election
        master = container(docs, "baton-store-master", "master")["args"]
        assert f"--registry={flags['--store-registry']}" in master, (role, master)
        # the store nodes pull puts from --host: never a wildcard address
        assert flags["--host"] == "$(POD_IP)", (role, flags["--host"])
        assert ("--disaggregation-decode-enable-offload-kvcache" in flags) == (role == "decode")
    for role in rbg_docs()["spec"]["roles"]:
        if role["name"] not in ("prefill", "decode"):
            continue
        args = role["template"]["spec"]["containers"][0]["args"]
        assert "--enable-hierarchical-cache" in args, (role["name"], args)
        assert "--hicache-size" in args or "--hicache-ratio" in args, args
        assert "--hicache-storage-backend" not in args, (role["name"], "baton-store is no "
                                                         "Mooncake Store: no L3 backend here")


def test_worker_tiers_manifests_run():
    """workers.yaml's prefill and decode pods with their exact tiers arguments, beside store.yaml's
    master and node on a real etcd: turn 1 computed on one prefill pod goes to L3 (from that pod
    or the decode's offload of the same pages, whichever is first), turn 2 on the other prefill
    pod finds it there (a put, then a hit), and the decode pod's offload writes to the store."""
    try:
        docs = load_docs()
    except ImportError:
        raise SkipTest("python3-yaml not installed (scripts/install-deps.sh --test)")
    from etcd_cluster import EtcdCluster, etcd_binary
    if etcd_binary() is None:
        raise SkipTest("etcd not installed (scripts/install-deps.sh --test)")
    from test_hicache import metric
    with EtcdCluster(size=1, name="deploy-tiers-etcd") as etcd, Cluster("deploy-tiers") as c:
        secrets = os.path.join(c.logdir, "secrets")
        os.mkdir(secrets)
        for key, value in (("admin-token", "t0k3n-" + os.urandom(8).hex()),
                           ("kv-secret", os.urandom(16).hex())):
            with open(os.path.join(secrets, key), "w") as f:
                f.write(value + "\n")
            os.chmod(os.path.join(secrets, key), 0o440)
        reg = etcd.url("/baton")
        master = c.start("master", [binary("baton-store")] + store_args(
            c, docs, "baton-store-master", "master", reg, secrets),
            wait=("master", "http", "kvevents", "kvreplay"))
        c.start("node", [binary("baton-store")] + store_args(
            c, docs, "baton-store-node", "node", reg, secrets), wait=("node",))
        ps = [c.start(f"prefill{i}", [binary("baton-worker")] + worker_args(
            docs, "baton-worker-prefill", reg, secrets), wait=("http", "bootstrap"))
            for i in range(2)]
        d = c.start("decode", [binary("baton-worker")] + worker_args(
            docs, "baton-worker-decode", reg, secrets))
        for w in ps + [d]:
            w.wait_log(r"hicache l2_pages=\d+ .*store=etcd://")
        args = []
        for p in ps:
            args += ["--prefill", url(p.port), str(p.wait_port("bootstrap"))]
        r = c.router(*args, "--decode", url(d.port), "--prefill-policy", "round_robin",
                     "--decode-policy", "round_robin")
        text = " ".join(f"t{i}" for i in range(1000))

        def generate(t):
            res = post(r.port, "/generate", {"text": t, "sampling_params": {"max_new_tokens": 2}})
            assert res.status == 200, res.text
            return res.json()["meta_info"]
        # the master is elected through etcd and the node registers: until a put goes through,
        # turn 1's pages would have nowhere to go
        src = os.path.join(c.logdir, "probe")
        with open(src, "wb") as f:
            f.write(b"x" * 4096)
        cli = [binary("baton-store"), "put", "probe", src, "--registry", reg, "--kv-secret-file",
               os.path.join(secrets, "kv-secret")]
        wait_until(lambda: subprocess.run(cli, capture_output=True, timeout=60).returncode == 0,
                   30, what="a put through the registry (the node registered)")
        m1 = generate(text)
        first = [p for p in ps if metric(p.port, "baton_worker_prompt_tokens_total") > 0]
        assert len(first) == 1 and m1["cached_tokens"] == 0, m1
        # Turn 1's prompt pages reach L3 twice over: the prefill writes them (write_through)
        # and the decode's offload writes the same pages. Whichever comes second finds them
        # held or being put and writes nothing, so the prefill's written bytes may stay 0:
        # wait for its write to end either way, then for no put left uncommitted.
        with open(os.path.join(secrets, "admin-token")) as f:
            auth = {"Authorization": "Bearer " + f.read().strip()}

        def turn1_in_store():
            ended = metric(first[0].port, "baton_worker_tier_written_bytes_total",
                           {"tier": "l3"}) + metric(first[0].port,
                                                    "baton_worker_tier_l3_present_bytes_total")
            if ended == 0:
                return False
            body = get(master.wait_port("http"), "/metrics", headers=auth).text
            return re.search(r"^baton_store_puts_in_flight 0$", body, re.M) is not None
        wait_until(turn1_in_store, 30, what="turn 1's pages in the store (written or found)")
        assert metric(first[0].port, "baton_worker_tier_store_errors_total") == 0
        second = [p for p in ps if p is not first[0]][0]
        m2 = generate(text + " more words")
        assert metric(second.port, "baton_worker_prompt_tokens_total") > 0, "round robin"
        assert m2["cached_tokens_details"]["storage"] > 0, m2
        assert metric(second.port, "baton_worker_cache_hit_tokens_total", {"tier": "l3"}) > 0
        assert metric(second.port, "baton_worker_tier_corrupt_pages_total") == 0
        # the decode pod offloads what it decoded to the same store (the prompt's pages are
        # there already: exists before put; the generated tokens' pages are new)
        res = post(r.port, "/generate", {"text": "answer at length",
                                         "sampling_params": {"max_new_tokens": 150,
                                                             "ignore_eos": True}})
        assert res.status == 200, res.text
        wait_until(lambda: metric(d.port, "baton_worker_tier_written_bytes_total",
                                  {"tier": "l3"}) > 0, 30, what="the decode's offload in L3")


def test_kubectl_kustomize():
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        raise SkipTest("kubectl not installed (optional: Debian kubernetes-client)")
    res = subprocess.run([kubectl, "kustomize", K8S], capture_output=True, text=True,
                         timeout=120)
    if res.returncode != 0 and "unknown command" in res.stderr:
        raise SkipTest(f"this kubectl has no kustomize: {res.stderr.strip()[:200]}")
    assert res.returncode == 0, res.stderr
    kinds = re.findall(r"^kind: (\w+)$", res.stdout, re.M)
    assert kinds.count("Deployment") == 4 and kinds.count("StatefulSet") == 2, kinds


if __name__ == "__main__":
    t = TestRunner()
    t.run(test_structure)
    t.run(test_binaries_accept_the_manifests)
    t.run(test_manifests_run_end_to_end)
    t.run(test_store_manifests_run)
    t.run(test_tiers_flags)
    t.run(test_worker_tiers_manifests_run)
    t.run(test_kubectl_kustomize)
    t.finish()
