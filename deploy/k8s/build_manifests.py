"""Writes ``deploy/k8s/base/``, ``deploy/k8s/monitoring/`` and ``deploy/k8s/planner/``:
pdserve's Kubernetes manifests, declared here once.

The three worker pools (prefill, decode, embed) are one pod shape with a role: written
out by hand they would be three copies that drift. Everything else is here too so that
one file says what the fleet is. The overlays (``cpu-dev/``, ``gpu/``) are small
hand-written kustomize patches on top. Run ``python deploy/k8s/build_manifests.py``
after a change; a test checks the files are current, render and validate.

The monitoring folder is separate: its kinds (PodMonitor, ServiceMonitor,
PrometheusRule) exist only where the Prometheus Operator is installed. Its rule and
dashboard come from ``deploy/prometheus/alerts.yml`` and ``deploy/grafana``: one source.
The planner folder is separate too: an overlay adds the SLO planner if it wants one
(the gpu overlay does, in recommend mode).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).parent
DEPLOY = HERE.parent
BASE, MONITORING, PLANNER = HERE / "base", HERE / "monitoring", HERE / "planner"

IMAGE = "pdserve:0.1.0"  # pinned; the overlays name their registry and build (kustomize images)
REDIS_IMAGE = "redis:7.4.1-alpine"
USER = 10001  # the image's pdserve user
ROUTER_PORT, ENGINE_PORT, SIDE_CHANNEL_PORT, KV_EVENTS_PORT = 8000, 8200, 5600, 5557
PLANNER_METRICS_PORT = 9400
# UCX over TCP (no RDMA) listens in this range, so that a NetworkPolicy can name it.
UCX_TCP_PORTS = (5700, 5799)
# A stream may run this long after SIGTERM (the agent drains for it), and the engine
# takes up to a minute more to stop: the pod's grace period covers both.
DRAIN_S, STOP_S = 600, 60
# The largest models take tens of minutes to load: the startup probe waits this long.
STARTUP_BUDGET_S = 1800
ROUTER_URL = f"http://pdserve-router:{ROUTER_PORT}"
RUN, MODELS = "/run/pdserve", "/models"
# The artifact store the registry's versions point into (``artifact: /store/...``): a
# read-only volume here; an object store is for `pdserve model pull` to grow into.
STORE = "/store"
Doc = dict[str, Any]


def labels(component: str) -> dict[str, str]:
    return {"app.kubernetes.io/name": "pdserve", "app.kubernetes.io/component": component}


def meta(name: str, component: str, **extra: Any) -> Doc:
    return {"name": name, "labels": labels(component), **extra}


def field_env(name: str, path: str) -> Doc:
    return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}}


def secret_env(name: str, secret: str, key: str) -> Doc:
    return {"name": name, "valueFrom": {"secretKeyRef": {"name": secret, "key": key}}}


def config_env(*names: str) -> list[Doc]:
    return [
        {"name": n, "valueFrom": {"configMapKeyRef": {"name": "pdserve-model", "key": n}}}
        for n in names
    ]


def locked_down(read_only_root: bool = True) -> Doc:
    """A container's security context: non-root, nothing to escalate to."""
    return {
        "runAsNonRoot": True,
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": read_only_root,
        "capabilities": {"drop": ["ALL"]},
    }


def pod_security(user: int = USER) -> Doc:
    return {
        "runAsNonRoot": True,
        "runAsUser": user,
        "runAsGroup": user,
        "fsGroup": user,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def resources(cpu: str, memory: str, limit_memory: str | None = None) -> Doc:
    return {
        "requests": {"cpu": cpu, "memory": memory},
        "limits": {"memory": limit_memory or memory},
    }


def spread(component: str) -> list[Doc]:
    """One pod of a kind per node, and per zone where there are several: a node or zone
    lost takes a share of a pool, not all of it."""
    return [
        {"maxSkew": 1, "topologyKey": key, "whenUnsatisfiable": "ScheduleAnyway",
         "labelSelector": {"matchLabels": labels(component)}}
        for key in ("kubernetes.io/hostname", "topology.kubernetes.io/zone")
    ]  # fmt: skip


def model_pull_init() -> Doc:
    """Fills the node's model cache before the agent starts, so a pod is never "starting"
    while it downloads: the version's artifact and checksum come from the router's model
    registry (a viewer token reads it); a version already cached is only verified."""
    return {
        "name": "model-pull",
        "image": IMAGE,
        "command": ["pdserve", "model", "pull", "$(PDSERVE_MODEL)",
                    "--version", "$(PDSERVE_MODEL_VERSION)", "--router-url", ROUTER_URL,
                    "--cache", MODELS],
        "env": [*config_env("PDSERVE_MODEL", "PDSERVE_MODEL_VERSION"),
                secret_env("PDSERVE_VIEWER_TOKEN", "pdserve-secrets", "viewer-token"),
                {"name": "HOME", "value": "/tmp"}],
        "resources": resources("500m", "1Gi"),
        "securityContext": locked_down(),
        "volumeMounts": [{"name": "models", "mountPath": MODELS},
                         {"name": "store", "mountPath": STORE, "readOnly": True},
                         {"name": "tmp", "mountPath": "/tmp"}],
    }  # fmt: skip


def agent_token_init() -> Doc:
    """Mints this pod's agent token (its worker id is the pod's name) into a memory
    volume: the secret stays in this container; the agent gets only its own token."""
    return {
        "name": "agent-token",
        "image": IMAGE,
        "command": ["pdserve", "agent-token", "$(POD_NAME)", "--out", f"{RUN}/agent-token"],
        "env": [field_env("POD_NAME", "metadata.name"),
                secret_env("PDSERVE_AGENT_SECRET", "pdserve-secrets", "agent-secret")],
        "resources": resources("100m", "128Mi"),
        "securityContext": locked_down(),
        "volumeMounts": [{"name": "run", "mountPath": RUN}],
    }  # fmt: skip


def agent_command(role: str) -> list[str]:
    command = [
        "pdserve", role,
        "--model", f"{MODELS}/$(PDSERVE_MODEL)/$(PDSERVE_MODEL_VERSION)",
        "--served-model-name", "$(PDSERVE_MODEL)",
        "--model-version", "$(PDSERVE_MODEL_VERSION)",
        "--host", "$(POD_IP)", "--port", str(ENGINE_PORT),
        "--router-url", ROUTER_URL,
        "--drain-timeout-s", str(DRAIN_S), "--ready-timeout-s", str(STARTUP_BUDGET_S),
        # The engine's log in a file the agent reads vLLM's start-up figures from, and
        # echoes to the container's stdout (bounded at 64 MiB).
        "--ready-file", f"{RUN}/ready", "--log-file", "/tmp/engine.log", "--echo-engine-log",
    ]  # fmt: skip
    if role != "embed":
        command += ["--kv-events-endpoint", f"tcp://$(POD_IP):{KV_EVENTS_PORT}"]
    if role in ("prefill", "decode"):
        command += ["--side-channel-port", str(SIDE_CHANNEL_PORT), "--ucx-net-devices", ""]
    return command


def agent_container(role: str) -> Doc:
    ports = [{"name": "engine", "containerPort": ENGINE_PORT}]
    if role != "embed":
        ports.append({"name": "kv-events", "containerPort": KV_EVENTS_PORT})
    if role in ("prefill", "decode"):
        ports.append({"name": "nixl", "containerPort": SIDE_CHANNEL_PORT})
    ready = {"exec": {"command": ["test", "-f", f"{RUN}/ready"]}}
    return {
        "name": "agent",
        "image": IMAGE,
        "command": agent_command(role),
        "env": [
            field_env("POD_IP", "status.podIP"),
            {"name": "PDSERVE_AGENT_TOKEN_FILE", "value": f"{RUN}/agent-token"},
            {"name": "HOME", "value": "/tmp"},
            {"name": "UCX_TCP_PORT_RANGE", "value": "-".join(map(str, UCX_TCP_PORTS))},
            *config_env("PDSERVE_MODEL", "PDSERVE_MODEL_VERSION"),
        ],
        "ports": ports,
        # Weights loaded, the engine up and registered: the ready file appears. Until then
        # the startup probe waits (the largest models), and no liveness probe runs: the
        # agent supervises its engine and restarts it itself.
        "startupProbe": {**ready, "periodSeconds": 10,
                         "failureThreshold": STARTUP_BUDGET_S // 10},
        "readinessProbe": {**ready, "periodSeconds": 5, "failureThreshold": 1},
        # The drain: SIGTERM to the agent, which deregisters (the ready file goes), lets
        # what it serves finish (up to DRAIN_S), stops the engine and exits.
        "lifecycle": {"preStop": {"exec": {"command": [
            "/bin/sh", "-c", "kill -TERM 1; while kill -0 1 2>/dev/null; do sleep 1; done"]}}},
        "resources": resources("4", "16Gi"),
        "securityContext": locked_down(),
        "volumeMounts": [
            {"name": "models", "mountPath": MODELS, "readOnly": True},
            {"name": "run", "mountPath": RUN},
            {"name": "tmp", "mountPath": "/tmp"},
            {"name": "shm", "mountPath": "/dev/shm"},
        ],
    }  # fmt: skip


def worker_deployment(role: str) -> Doc:
    component = role
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": meta(f"pdserve-{role}", component),
        "spec": {
            "replicas": 0 if role == "embed" else 1,
            "selector": {"matchLabels": labels(component)},
            # A new pod is ready (weights loaded) before an old one drains.
            "strategy": {"type": "RollingUpdate",
                         "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}},
            "template": {
                "metadata": {"labels": {**labels(component), "pdserve.dev/worker": "true"}},
                "spec": {
                    "serviceAccountName": "pdserve-worker",
                    "automountServiceAccountToken": False,
                    "terminationGracePeriodSeconds": DRAIN_S + STOP_S,
                    "securityContext": pod_security(),
                    "topologySpreadConstraints": spread(component),
                    "initContainers": [agent_token_init(), model_pull_init()],
                    "containers": [agent_container(role)],
                    "volumes": [
                        {"name": "models",
                         "persistentVolumeClaim": {"claimName": "pdserve-models"}},
                        {"name": "store", "persistentVolumeClaim": {
                            "claimName": "pdserve-model-store", "readOnly": True}},
                        {"name": "run", "emptyDir": {"medium": "Memory", "sizeLimit": "1Mi"}},
                        {"name": "tmp", "emptyDir": {}},
                        {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": "2Gi"}},
                    ],
                },
            },
        },
    }  # fmt: skip


def worker_access() -> list[Doc]:
    """The workers' service account (no API access: its token is not even mounted) and
    each pool's disruption budget: a node drain takes one worker of a pool at a time."""
    budgets = [
        {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
         "metadata": meta(f"pdserve-{role}", role),
         "spec": {"maxUnavailable": 1, "selector": {"matchLabels": labels(role)}}}
        for role in ("prefill", "decode", "embed")
    ]  # fmt: skip
    account = {"apiVersion": "v1", "kind": "ServiceAccount",
               "metadata": meta("pdserve-worker", "worker"),
               "automountServiceAccountToken": False}  # fmt: skip
    return [account, *budgets]


def router_env() -> list[Doc]:
    return [
        field_env("POD_IP", "status.podIP"),
        field_env("POD_NAMESPACE", "metadata.namespace"),
        secret_env("REDIS_PASSWORD", "pdserve-secrets", "redis-password"),
        {"name": "PDSERVE_STATE_URL",
         "value": "redis://:$(REDIS_PASSWORD)@pdserve-redis:6379/0"},
        secret_env("PDSERVE_ADMIN_TOKENS", "pdserve-secrets", "admin-tokens"),
        secret_env("PDSERVE_AGENT_SECRET", "pdserve-secrets", "agent-secret"),
        {"name": "PDSERVE_API_KEYS", "valueFrom": {"secretKeyRef": {
            "name": "pdserve-secrets", "key": "api-keys", "optional": True}}},
        {"name": "PDSERVE_ALLOWED_WORKER_NETWORKS", "valueFrom": {"configMapKeyRef": {
            "name": "pdserve-router", "key": "allowed-worker-networks"}}},
        {"name": "PDSERVE_FILES_DIR", "value": "/var/lib/pdserve/files"},
        *config_env("PDSERVE_MODEL"),
        # The ratio API scales the pools' Deployments (router/scaling), within bounds.
        {"name": "PDSERVE_SCALER", "value": "kubernetes"},
        {"name": "PDSERVE_SCALER_NAMESPACE", "value": "$(POD_NAMESPACE)"},
        {"name": "PDSERVE_SCALER_DEPLOYMENTS", "value":
         "$(PDSERVE_MODEL)/prefill=pdserve-prefill,$(PDSERVE_MODEL)/decode=pdserve-decode"},
        {"name": "HOME", "value": "/tmp"},
    ]  # fmt: skip


def router_deployment() -> Doc:
    health = {"httpGet": {"path": "/health", "port": "http"}}
    container = {
        "name": "router",
        "image": IMAGE,
        "command": ["pdserve", "router", "--host", "$(POD_IP)", "--port", str(ROUTER_PORT)],
        "env": router_env(),
        "ports": [{"name": "http", "containerPort": ROUTER_PORT}],
        "startupProbe": {**health, "periodSeconds": 2, "failureThreshold": 60},
        "readinessProbe": {**health, "periodSeconds": 5},
        "livenessProbe": {**health, "periodSeconds": 10, "failureThreshold": 6},
        "resources": resources("2", "2Gi", "4Gi"),
        "securityContext": locked_down(),
        "volumeMounts": [
            # The tokenizers: the router reads each model's from the path its workers
            # register, so it mounts their cache at the same place.
            {"name": "models", "mountPath": MODELS, "readOnly": True},
            # Registering a version checks its artifact is there (and checksums it).
            {"name": "store", "mountPath": STORE, "readOnly": True},
            {"name": "files", "mountPath": "/var/lib/pdserve/files"},
            {"name": "tmp", "mountPath": "/tmp"},
        ],
    }  # fmt: skip
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": meta("pdserve-router", "router"),
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": labels("router")},
            "strategy": {"type": "RollingUpdate",
                         "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}},
            "template": {
                "metadata": {"labels": labels("router")},
                "spec": {
                    "serviceAccountName": "pdserve-router",
                    # Streams finish on the old replica while the new one takes requests.
                    "terminationGracePeriodSeconds": 120,
                    "securityContext": pod_security(),
                    "topologySpreadConstraints": spread("router"),
                    "containers": [container],
                    "volumes": [
                        {"name": "models", "persistentVolumeClaim": {
                            "claimName": "pdserve-models", "readOnly": True}},
                        {"name": "store", "persistentVolumeClaim": {
                            "claimName": "pdserve-model-store", "readOnly": True}},
                        {"name": "files",
                         "persistentVolumeClaim": {"claimName": "pdserve-files"}},
                        {"name": "tmp", "emptyDir": {}},
                    ],
                },
            },
        },
    }  # fmt: skip


def router_around() -> list[Doc]:
    """The router's Service, disruption budget, autoscaler and API access."""
    service = {
        "apiVersion": "v1", "kind": "Service", "metadata": meta("pdserve-router", "router"),
        "spec": {"selector": labels("router"),
                 "ports": [{"name": "http", "port": ROUTER_PORT, "targetPort": "http"}]},
    }  # fmt: skip
    budget = {
        "apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
        "metadata": meta("pdserve-router", "router"),
        "spec": {"minAvailable": 1, "selector": {"matchLabels": labels("router")}},
    }  # fmt: skip
    # The router's own load signal: how late its event loop runs (every request waits
    # that long), as prometheus-adapter serves it (docs/deploy.md has the rule); CPU too,
    # for clusters without the adapter.
    autoscaler = {
        "apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler",
        "metadata": meta("pdserve-router", "router"),
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment",
                               "name": "pdserve-router"},
            "minReplicas": 2, "maxReplicas": 8,
            "metrics": [
                {"type": "Pods", "pods": {
                    "metric": {"name": "pdserve_event_loop_lag_p99_seconds"},
                    "target": {"type": "AverageValue", "averageValue": "50m"}}},
                {"type": "Resource", "resource": {
                    "name": "cpu", "target": {"type": "Utilization", "averageUtilization": 70}}},
            ],
            "behavior": {"scaleDown": {"stabilizationWindowSeconds": 300}},
        },
    }  # fmt: skip
    return [service, budget, autoscaler, *router_access()]


def router_access() -> list[Doc]:
    """The router's service account may read and set the scale of the two pool
    Deployments it sizes, and nothing else."""
    account = {"apiVersion": "v1", "kind": "ServiceAccount",
               "metadata": meta("pdserve-router", "router")}  # fmt: skip
    role = {
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
        "metadata": meta("pdserve-router-scaler", "router"),
        "rules": [{"apiGroups": ["apps"], "resources": ["deployments/scale"],
                   "resourceNames": ["pdserve-prefill", "pdserve-decode"],
                   "verbs": ["get", "patch"]}],
    }  # fmt: skip
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
        "metadata": meta("pdserve-router-scaler", "router"),
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                    "name": "pdserve-router-scaler"},
        "subjects": [{"kind": "ServiceAccount", "name": "pdserve-router"}],
    }  # fmt: skip
    return [account, role, binding]


def redis() -> list[Doc]:
    """The routers' shared state. Its password comes from the Secret through a config
    file an init container writes, never a command line (which `ps` shows)."""
    password = secret_env("REDISCLI_AUTH", "pdserve-secrets", "redis-password")
    ping = {"exec": {"command": ["sh", "-c", "redis-cli -h 127.0.0.1 ping | grep -q PONG"]}}
    config = {
        "name": "config", "image": REDIS_IMAGE,
        "command": ["sh", "-c",
                    "umask 077; printf 'requirepass %s\\n' \"$REDISCLI_AUTH\" > /conf/redis.conf"],
        "env": [password], "resources": resources("100m", "64Mi"),
        "securityContext": locked_down(),
        "volumeMounts": [{"name": "conf", "mountPath": "/conf"}],
    }  # fmt: skip
    server = {
        "name": "redis", "image": REDIS_IMAGE,
        "command": ["redis-server", "/conf/redis.conf", "--bind", "$(POD_IP)", "127.0.0.1",
                    "--appendonly", "yes", "--dir", "/data"],
        "env": [field_env("POD_IP", "status.podIP"), password],
        "ports": [{"name": "redis", "containerPort": 6379}],
        "startupProbe": {**ping, "periodSeconds": 2, "failureThreshold": 30},
        "readinessProbe": {**ping, "periodSeconds": 5},
        "livenessProbe": {**ping, "periodSeconds": 10, "failureThreshold": 6},
        "resources": resources("250m", "512Mi", "1Gi"),
        "securityContext": locked_down(),
        "volumeMounts": [{"name": "conf", "mountPath": "/conf", "readOnly": True},
                         {"name": "data", "mountPath": "/data"}],
    }  # fmt: skip
    service = {
        "apiVersion": "v1", "kind": "Service", "metadata": meta("pdserve-redis", "redis"),
        "spec": {"clusterIP": "None", "selector": labels("redis"),
                 "ports": [{"name": "redis", "port": 6379, "targetPort": "redis"}]},
    }  # fmt: skip
    stateful = {
        "apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": meta("pdserve-redis", "redis"),
        "spec": {
            "serviceName": "pdserve-redis", "replicas": 1,
            "selector": {"matchLabels": labels("redis")},
            "template": {"metadata": {"labels": labels("redis")}, "spec": {
                "automountServiceAccountToken": False,
                "securityContext": pod_security(999),  # the image's redis user
                "initContainers": [config], "containers": [server],
                "volumes": [{"name": "conf", "emptyDir": {"medium": "Memory",
                                                          "sizeLimit": "1Mi"}}]}},
            "volumeClaimTemplates": [{"metadata": {"name": "data"}, "spec": {
                "accessModes": ["ReadWriteOnce"],
                "resources": {"requests": {"storage": "1Gi"}}}}],
        },
    }  # fmt: skip
    return [service, stateful]


def storage_and_config() -> list[Doc]:
    def claim(name: str, size: str, mode: str = "ReadWriteMany") -> Doc:
        return {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": meta(name, "storage"),
            "spec": {"accessModes": [mode], "resources": {"requests": {"storage": size}}},
        }

    model = {
        "apiVersion": "v1", "kind": "ConfigMap", "metadata": meta("pdserve-model", "worker"),
        # The served model (its registry id, what clients ask for) and the registered
        # version the pools run (`pdserve admin models --register` it first).
        "data": {"PDSERVE_MODEL": "llama-3.1-8b-instruct", "PDSERVE_MODEL_VERSION": "v1"},
    }  # fmt: skip
    router = {
        "apiVersion": "v1", "kind": "ConfigMap", "metadata": meta("pdserve-router", "router"),
        # The pod network: a registering worker's addresses must fall inside it.
        "data": {"allowed-worker-networks": "10.0.0.0/8"},
    }  # fmt: skip
    return [
        # The weights cache every worker pulls into and the routers read tokenizers from.
        claim("pdserve-models", "500Gi"),
        claim("pdserve-model-store", "500Gi", "ReadOnlyMany"),
        claim("pdserve-files", "50Gi"),  # /v1/files: every router replica serves them
        model,
        router,
    ]


def network_policies() -> list[Doc]:
    """Default deny into pdserve's pods; then only what each needs. Engines' HTTP and KV
    events: from the routers. The NIXL side channel and UCX's TCP ports: from the peer
    workers. Redis: from the routers. The router's API: from anywhere in the cluster
    (an ingress or clients; narrow it to yours)."""

    def pods(component: str) -> Doc:
        return {"podSelector": {"matchLabels": labels(component)}}

    def port(number: int, end: int | None = None) -> Doc:
        return {"protocol": "TCP", "port": number, **({"endPort": end} if end else {})}

    workers = {"podSelector": {"matchLabels": {"app.kubernetes.io/name": "pdserve",
                                               "pdserve.dev/worker": "true"}}}  # fmt: skip
    policies = [
        ("pdserve-default-deny", {"matchLabels": {"app.kubernetes.io/name": "pdserve"}}, []),
        ("pdserve-router", pods("router")["podSelector"],
         [{"ports": [port(ROUTER_PORT)]}]),
        ("pdserve-redis", pods("redis")["podSelector"],
         [{"from": [pods("router")], "ports": [port(6379)]}]),
        ("pdserve-workers", workers["podSelector"], [
            {"from": [pods("router")], "ports": [port(ENGINE_PORT), port(KV_EVENTS_PORT)]},
            {"from": [workers], "ports": [port(SIDE_CHANNEL_PORT), port(*UCX_TCP_PORTS)]},
        ]),
    ]  # fmt: skip
    return [
        {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
         "metadata": meta(name, "network"),
         "spec": {"podSelector": selector, "policyTypes": ["Ingress"], "ingress": rules}}
        for name, selector, rules in policies
    ]  # fmt: skip


def monitoring() -> list[Doc]:
    """For the Prometheus Operator: scrape the routers and the engines, the alert rules
    and the dashboard (a Grafana sidecar loads ConfigMaps labelled grafana_dashboard)."""
    router = {
        "apiVersion": "monitoring.coreos.com/v1", "kind": "ServiceMonitor",
        "metadata": meta("pdserve-router", "router"),
        "spec": {"selector": {"matchLabels": labels("router")},
                 "endpoints": [{"port": "http", "path": "/metrics", "interval": "10s"}]},
    }  # fmt: skip
    engines = {
        "apiVersion": "monitoring.coreos.com/v1", "kind": "PodMonitor",
        "metadata": meta("pdserve-engines", "worker"),
        "spec": {"selector": {"matchLabels": {"pdserve.dev/worker": "true"}},
                 "podMetricsEndpoints": [{"port": "engine", "path": "/metrics",
                                          "interval": "15s"}]},
    }  # fmt: skip
    plans = {
        "apiVersion": "monitoring.coreos.com/v1", "kind": "PodMonitor",
        "metadata": meta("pdserve-planner", "planner"),
        "spec": {"selector": {"matchLabels": labels("planner")},
                 "podMetricsEndpoints": [{"port": "metrics", "path": "/metrics",
                                          "interval": "30s"}]},
    }  # fmt: skip
    rules = yaml.safe_load((DEPLOY / "prometheus" / "alerts.yml").read_text())
    rule = {
        "apiVersion": "monitoring.coreos.com/v1", "kind": "PrometheusRule",
        "metadata": meta("pdserve", "monitoring"), "spec": {"groups": rules["groups"]},
    }  # fmt: skip
    dashboard = (DEPLOY / "grafana" / "pdserve-dashboard.json").read_text()
    board = {
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {**meta("pdserve-dashboard", "monitoring"),
                     "labels": {**labels("monitoring"), "grafana_dashboard": "1"}},
        "data": {"pdserve-dashboard.json": dashboard},
    }  # fmt: skip
    return [router, engines, plans, rule, board]


def planner() -> list[Doc]:
    """The SLO planner (docs/planner.md): one replica (two would take turns superseding
    each other's plans), in recommend mode: it publishes a plan and its reason and
    changes nothing. Patch ``--mode apply`` in (its token then needs the operator
    scope) to let it size the pools through the routers' ratio API, which scales the
    Deployments. The profile is the prior its model plans on until the routers have
    measured the engines: calibrate your own (``pdserve sim calibrate``)."""
    profile = (DEPLOY.parent / "sim" / "profiles" / "llama3-8b-h100.json").read_text()
    config = {
        "apiVersion": "v1", "kind": "ConfigMap", "metadata": meta("pdserve-planner", "planner"),
        "data": {"profile.json": profile},
    }  # fmt: skip
    health = {"httpGet": {"path": "/metrics", "port": "metrics"}}
    container = {
        "name": "planner",
        "image": IMAGE,
        "command": [
            "pdserve", "planner", "--router", ROUTER_URL, "--model", "$(PDSERVE_MODEL)",
            "--mode", "recommend", "--slo", "ttft=2,itl=0.05,attainment=0.95",
            "--profile", "/etc/pdserve-planner/profile.json", "--scaler", "kubernetes",
            "--min-workers", "2", "--max-workers", "16", "--interval-s", "30",
            "--metrics-host", "$(POD_IP)", "--metrics-port", str(PLANNER_METRICS_PORT),
        ],
        "env": [
            field_env("POD_IP", "status.podIP"), *config_env("PDSERVE_MODEL"),
            secret_env("PDSERVE_PLANNER_TOKEN", "pdserve-secrets", "planner-token"),
            {"name": "HOME", "value": "/tmp"},
        ],
        "ports": [{"name": "metrics", "containerPort": PLANNER_METRICS_PORT}],
        "startupProbe": {**health, "periodSeconds": 2, "failureThreshold": 30},
        "readinessProbe": {**health, "periodSeconds": 10},
        "livenessProbe": {**health, "periodSeconds": 30, "failureThreshold": 4},
        "resources": resources("100m", "256Mi", "512Mi"),
        "securityContext": locked_down(),
        "volumeMounts": [
            {"name": "config", "mountPath": "/etc/pdserve-planner", "readOnly": True},
            {"name": "tmp", "mountPath": "/tmp"},
        ],
    }  # fmt: skip
    deployment = {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": meta("pdserve-planner", "planner"),
        "spec": {
            "replicas": 1,
            "strategy": {"type": "Recreate"},
            "selector": {"matchLabels": labels("planner")},
            "template": {
                "metadata": {"labels": labels("planner")},
                "spec": {
                    # It speaks HTTP to the routers only: no Kubernetes API token.
                    "automountServiceAccountToken": False,
                    "securityContext": pod_security(),
                    "containers": [container],
                    "volumes": [
                        {"name": "config", "configMap": {"name": "pdserve-planner"}},
                        {"name": "tmp", "emptyDir": {}},
                    ],
                },
            },
        },
    }  # fmt: skip
    metrics = {
        "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
        "metadata": meta("pdserve-planner", "network"),
        "spec": {"podSelector": {"matchLabels": labels("planner")}, "policyTypes": ["Ingress"],
                 "ingress": [{"ports": [{"protocol": "TCP", "port": PLANNER_METRICS_PORT}]}]},
    }  # fmt: skip
    return [config, deployment, metrics]


def files() -> dict[Path, str]:
    """Every generated file and its text."""
    base = {
        "router.yaml": [router_deployment(), *router_around()],
        "workers.yaml": [
            *(worker_deployment(r) for r in ("prefill", "decode", "embed")),
            *worker_access(),
        ],
        "redis.yaml": redis(),
        "storage.yaml": storage_and_config(),
        "network-policy.yaml": network_policies(),
    }
    out = {BASE / name: dump(docs) for name, docs in base.items()}
    out[BASE / "kustomization.yaml"] = kustomization(list(base))
    out[MONITORING / "monitoring.yaml"] = dump(monitoring())
    out[MONITORING / "kustomization.yaml"] = kustomization(["monitoring.yaml"])
    out[PLANNER / "planner.yaml"] = dump(planner())
    out[PLANNER / "kustomization.yaml"] = kustomization(["planner.yaml"])
    return out


def kustomization(resources: list[str]) -> str:
    return dump([{"apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
                  "resources": resources}])  # fmt: skip


def dump(docs: list[Doc]) -> str:
    header = "# Generated by deploy/k8s/build_manifests.py: edit that, then run it.\n"
    return header + "---\n".join(yaml.safe_dump(d, sort_keys=False, width=100) for d in docs)


def main() -> int:
    for path, text in files().items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        print(f"wrote {path.relative_to(DEPLOY.parent)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
