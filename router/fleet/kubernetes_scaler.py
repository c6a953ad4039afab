"""The ratio API acting on Kubernetes: a model's prefill and decode pools are Deployments
(deploy/k8s), and a change sets their replicas through the scale subresource.

With the official ``kubernetes`` client (its blocking calls run off the event loop), in
the pod's service account (``deploy/k8s`` grants it get and patch on exactly the two
Deployments' scale) or, outside a cluster, a kubeconfig (``KUBECONFIG``). The pool that
grows is scaled first, so capacity never dips below both targets' minimum mid-change.
Each pool stays within ``scaler_min_replicas`` and ``scaler_max_replicas``. The
operation is done when the registered ready workers match the target: new pods have
pulled and loaded their weights, removed ones drained (their preStop hook) and left.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable, Mapping
from typing import Any

from contracts.workers import WorkerRole
from router.errors import InvalidRequest
from router.fleet.pool_operations import PD_ROLES, Checkpoint, Operation, ScaleStep
from router.settings import ControlSettings
from router.state.base import PoolTargets

log = logging.getLogger("pdserve.router")


def apps_api() -> Any:
    """The AppsV1 API as this process may reach it: in a pod, its service account; else
    the kubeconfig (``KUBECONFIG`` or ``~/.kube/config``)."""
    # The official client is an optional extra (`kubernetes`): imported where it is used.
    from kubernetes import client, config

    # A configuration of its own, not the client's process-wide default (its first
    # ApiClient would otherwise pin whichever server was loaded first).
    configuration = client.Configuration()
    if os.environ.get("KUBERNETES_SERVICE_HOST"):
        config.load_incluster_config(client_configuration=configuration)
    else:
        # Read now: the client reads $KUBECONFIG once, when it is first imported.
        config.load_kube_config(
            config_file=os.environ.get("KUBECONFIG"), client_configuration=configuration
        )
    return client.AppsV1Api(client.ApiClient(configuration))


class KubernetesScaler:
    def __init__(
        self,
        settings: ControlSettings,
        *,
        ready_counts: Callable[[str], dict[WorkerRole, int]],
        wall_clock: Callable[[], float],
        api: Any,
    ) -> None:
        self._settings = settings
        self._deployments = settings.scaler_deployment_names()
        self._ready_counts = ready_counts
        self._wall_clock = wall_clock
        self._api = api

    def refusal(
        self, model: str, target: PoolTargets, counts: Mapping[WorkerRole, int]
    ) -> InvalidRequest | None:
        low, high = self._settings.scaler_min_replicas, self._settings.scaler_max_replicas
        for role in PD_ROLES:
            wanted = target.prefill if role is WorkerRole.PREFILL else target.decode
            if (model, role.value) not in self._deployments:
                return InvalidRequest(
                    f"no Deployment is named for {model}'s {role.value} pool "
                    f"(scaler_deployments)", param=role.value,
                )  # fmt: skip
            if not low <= wanted <= high:
                return InvalidRequest(
                    f"{role.value} must be within {low}..{high} replicas "
                    f"(scaler_min_replicas, scaler_max_replicas)", param=role.value,
                )  # fmt: skip
        return None

    async def converge(self, operation: Operation, checkpoint: Checkpoint) -> None:
        from kubernetes.client.exceptions import ApiException

        try:
            steps = await self._scale(operation)
        except ApiException as error:
            operation.status = "failed"
            operation.detail = f"Kubernetes answered {error.status}: {error.reason}"
            return
        await checkpoint()
        if await self._registered(operation):
            phase, operation.status = "done", "done"
        elif operation.superseded:
            phase, operation.status = "done", "superseded"
        else:
            phase, operation.status = "timed_out", "failed"
            operation.detail = (
                f"the pools did not reach {operation.target.as_dict()} ready workers within "
                f"{self._settings.scale_timeout_s:.0f}s (now {self._ready(operation)})"
            )
        for step in steps:
            step.phase, step.finished_unix_s = phase, self._wall_clock()

    async def _scale(self, operation: Operation) -> list[ScaleStep]:
        """Set both Deployments' replicas, the growing pool first."""
        namespace = self._settings.scaler_namespace
        now_counts = self._ready_counts(operation.model)
        roles = sorted(PD_ROLES, key=lambda r: now_counts[r] - operation.wants(r))
        steps = []
        for role in roles:
            name = self._deployments[(operation.model, role.value)]
            scale = await asyncio.to_thread(
                self._api.read_namespaced_deployment_scale, name, namespace
            )
            step = ScaleStep(name, role, scale.spec.replicas or 0, operation.wants(role),
                             self._wall_clock())  # fmt: skip
            steps.append(step)
            operation.steps.append(step)
            if step.from_replicas != step.to_replicas:
                await asyncio.to_thread(
                    self._api.patch_namespaced_deployment_scale, name, namespace,
                    {"spec": {"replicas": step.to_replicas}},
                )  # fmt: skip
                log.info("scaled %s/%s: %d -> %d replicas", namespace, name,
                         step.from_replicas, step.to_replicas)  # fmt: skip
        return steps

    async def _registered(self, operation: Operation) -> bool:
        """Wait until the ready workers match the target; False on timeout or when a
        newer change supersedes this one."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._settings.scale_timeout_s
        while not operation.superseded and loop.time() < deadline:
            if self._ready(operation) == operation.target.as_dict():
                return True
            await asyncio.sleep(0.5)
        return self._ready(operation) == operation.target.as_dict()

    def _ready(self, operation: Operation) -> dict[str, int]:
        counts = self._ready_counts(operation.model)
        return {role.value: counts[role] for role in PD_ROLES}
