"""The model registry and the routes, as this replica sees them, and where a request goes.

Three shared documents hold the truth (``router.state``): ``model_registry`` (model id
-> version -> ``RegisteredArtifact``), ``routes`` (model id -> its ``RouteSpec``, the
operators' part) and ``model_policies`` (model id -> its ``ModelPolicy`` and the
reviewers' decisions, the reviewers' part). Every replica follows them (``load``); a
change is validated here, then written with compare-and-set, so two replicas' changes
never interleave and a refused change leaves the old route in force.

Separation of duties: a route never sends prod traffic (or canary traffic above the
policy's weight) to a version its policy requires approved and no reviewer approved
(``check_approved``); with no route, such a model is served by its approved versions
only (``place``). Deleting a route keeps the policy.

Placement: a model without a route is served by all its workers, whatever version they
report. With a route, a request lands on ``canary`` when a hash of the model id and its
stickiness key falls under the canary's weight, else on ``prod``: a given key always lands
on the same side, and a share of the keys equal to the weight lands on the canary. A
request without its key (no API key, no ``user``, no header) is placed by its request id.
Shadowing is drawn per request, at the shadow's sample rate.

Invariants: versions are immutable once registered; a route names registered versions
only; ``prod``, ``canary`` and ``shadow`` are distinct; a route written under a policy
that requires approval serves approved versions only.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from contracts.rollout import (
    Approval,
    ModelArtifact,
    ModelPolicy,
    RegisteredArtifact,
    RouteSpec,
)
from contracts.workers import WorkerRegistration
from router.errors import Forbidden, InvalidRequest

REGISTRY_DOCUMENT = "model_registry"
ROUTES_DOCUMENT = "routes"
POLICIES_DOCUMENT = "model_policies"
_URI_SCHEMES = ("hf://", "s3://", "gs://", "https://", "http://")


# Which versions may serve: one, any (None), or a set (no route, approved versions only).
VersionFilter = str | frozenset[str] | None


@dataclass(frozen=True, slots=True)
class Placement:
    stage: str  # prod, canary (or shadow, for a mirrored copy)
    version: VersionFilter


NO_ROUTE = Placement("prod", None)


@dataclass(frozen=True, slots=True)
class RouteState:
    spec: RouteSpec

    def as_dict(self) -> dict[str, Any]:
        return {"spec": self.spec.model_dump(mode="json")}


@dataclass(frozen=True, slots=True)
class PolicyState:
    policy: ModelPolicy
    approvals: Mapping[str, Mapping[str, Any]]  # version -> {decision, by, at_unix_s, note}

    def approved(self, version: str) -> bool:
        return self.approvals.get(version, {}).get("decision") == "approve"

    def approved_versions(self) -> frozenset[str]:
        return frozenset(v for v in self.approvals if self.approved(v))

    def as_dict(self) -> dict[str, Any]:
        return {"policy": self.policy.model_dump(mode="json"), "approvals": dict(self.approvals)}


NO_POLICY = PolicyState(ModelPolicy(), {})


class Rollout:
    """This replica's copy of the registry and routes; pure (no I/O), clock-free."""

    def __init__(self, *, rng: random.Random | None = None) -> None:
        self._artifacts: dict[str, dict[str, RegisteredArtifact]] = {}
        self._routes: dict[str, RouteState] = {}
        self._policies: dict[str, PolicyState] = {}
        self.registry_version = 0
        self.routes_version = 0
        self.policies_version = 0
        self._rng = rng or random.Random()

    def __repr__(self) -> str:
        return f"Rollout(models={len(self._artifacts)}, routes={sorted(self._routes)})"

    # -- following the shared documents -----------------------------------------

    def load_registry(self, version: int, document: Mapping[str, Any]) -> None:
        self._artifacts = {
            model_id: {v: RegisteredArtifact.model_validate(a) for v, a in versions.items()}
            for model_id, versions in document.items()
        }
        self.registry_version = version

    def load_routes(self, version: int, document: Mapping[str, Any]) -> None:
        self._routes = {
            model_id: RouteState(RouteSpec.model_validate(r["spec"]))
            for model_id, r in document.items()
        }
        self.routes_version = version

    def load_policies(self, version: int, document: Mapping[str, Any]) -> None:
        self._policies = {
            model_id: PolicyState(ModelPolicy.model_validate(p["policy"]), p.get("approvals", {}))
            for model_id, p in document.items()
        }
        self.policies_version = version

    # -- reads ---------------------------------------------------------------------

    def artifacts(self) -> list[RegisteredArtifact]:
        return [a for versions in self._artifacts.values() for a in versions.values()]

    def artifact(self, model_id: str, version: str) -> RegisteredArtifact | None:
        return self._artifacts.get(model_id, {}).get(version)

    def route(self, model_id: str) -> RouteState | None:
        return self._routes.get(model_id)

    def routes(self) -> dict[str, RouteState]:
        return dict(self._routes)

    def policy(self, model_id: str) -> PolicyState:
        return self._policies.get(model_id, NO_POLICY)

    def policies(self) -> dict[str, PolicyState]:
        return dict(self._policies)

    # -- placement (the request path) ----------------------------------------------

    def place(self, model_id: str, sticky_key: str | None, request_id: str) -> Placement:
        route = self._routes.get(model_id)
        if route is None:
            policy = self._policies.get(model_id)
            if policy is None or not policy.policy.requires_approval:
                return NO_ROUTE
            return Placement("prod", policy.approved_versions())
        canary = route.spec.canary
        key = sticky_key or request_id
        if canary is not None and share_of(model_id, key) < canary.weight:
            return Placement("canary", canary.version)
        return Placement("prod", route.spec.prod)

    def shadow_for(self, model_id: str) -> str | None:
        route = self._routes.get(model_id)
        shadow = None if route is None else route.spec.shadow
        if shadow is None or self._rng.random() >= shadow.sample_rate:
            return None
        return shadow.version

    # -- changes (validated whole; the caller writes the returned document) --------

    def registered(self, artifact: ModelArtifact, *, by: str, at_unix_s: float) -> dict[str, Any]:
        """The registry document with ``artifact`` added; an identical re-registration is
        a no-op, a different one under a registered version is refused."""
        existing = self.artifact(artifact.model_id, artifact.version)
        fields = set(ModelArtifact.model_fields)
        if existing is not None:
            if existing.model_dump(include=fields) != artifact.model_dump():
                raise InvalidRequest(
                    f"{artifact.model_id} version {artifact.version!r} is registered with other "
                    "contents; versions are immutable: register a new version",
                    param="version", code="version_immutable",
                )  # fmt: skip
        else:
            _check_artifact_exists(artifact.artifact)
        document = self._registry_document()
        record = RegisteredArtifact(
            **artifact.model_dump(), registered_at_unix_s=at_unix_s, registered_by=by
        )
        if existing is None:
            document.setdefault(artifact.model_id, {})[artifact.version] = record.model_dump()
        return document

    def routed(self, model_id: str, spec: RouteSpec) -> dict[str, Any]:
        """Validate a route for ``model_id``; returns the routes document with it."""
        for stage in ("canary", "shadow"):
            if spec.versions().get(stage) == spec.prod:
                raise InvalidRequest(
                    f"{stage}.version {spec.prod!r} is the prod version; a {stage} is another "
                    "version", param=f"{stage}.version", code="stage_is_prod",
                )  # fmt: skip
        for stage, version in spec.versions().items():
            if self.artifact(model_id, version) is None:
                raise InvalidRequest(
                    f"{model_id} has no registered version {version!r} (for {stage}); "
                    "register it with POST /admin/v1/models first",
                    param=stage if stage == "prod" else f"{stage}.version",
                    code="unknown_version",
                )  # fmt: skip
        self.check_approved(model_id, spec)
        return self._routes_document({model_id: RouteState(spec)})

    def check_approved(self, model_id: str, spec: RouteSpec) -> None:
        """403 ``approval_required`` if ``spec`` would send traffic its model's policy
        keeps from unapproved versions to one."""
        for stage, version in self.unapproved_stages(model_id, spec):
            raise Forbidden(
                f"{model_id} version {version!r} needs a reviewer's approval before it "
                f"serves {stage} traffic under the model's policy (POST "
                f"/admin/v1/routes/{model_id}/approve with a reviewer token)",
                param=stage if stage == "prod" else f"{stage}.version",
                code="approval_required",
            )  # fmt: skip

    def unapproved_stages(self, model_id: str, spec: RouteSpec) -> list[tuple[str, str]]:
        """(stage, version) of each stage of ``spec`` whose version the policy wants
        approved and no reviewer approved."""
        policy = self.policy(model_id)
        weights = {"prod": 1.0, "canary": spec.canary.weight if spec.canary else 0.0}
        return [
            (stage, version) for stage, version in spec.versions().items()
            if policy.policy.needs_approval(stage, weights.get(stage, 0.0))
            and not policy.approved(version)
        ]  # fmt: skip

    def with_policy(self, model_id: str, policy: PolicyState) -> dict[str, Any]:
        policies = {**self._policies, model_id: policy}
        return {name: state.as_dict() for name, state in policies.items()}

    def without_route(self, model_id: str) -> dict[str, Any]:
        document = self._routes_document({})
        document.pop(model_id, None)
        return document

    def with_route(self, model_id: str, route: RouteState) -> dict[str, Any]:
        return self._routes_document({model_id: route})

    def check_worker(self, registration: WorkerRegistration) -> None:
        """A worker of a registered model must serve one of its registered versions, from
        the artifact's files when it reports their checksum."""
        versions = self._artifacts.get(registration.model)
        if not versions:
            return
        artifact = versions.get(registration.model_version or "")
        if artifact is None:
            raise InvalidRequest(
                f"worker {registration.worker_id} serves {registration.model} version "
                f"{registration.model_version!r}, which is not registered "
                f"(registered: {sorted(versions)})",
                param="model_version", code="unknown_version",
            )  # fmt: skip
        checksum = registration.model_checksum
        if checksum is not None and checksum != artifact.checksum:
            raise InvalidRequest(
                f"worker {registration.worker_id} loaded files with checksum {checksum}, not "
                f"{registration.model} {artifact.version}'s {artifact.checksum}",
                param="model_checksum", code="checksum_mismatch",
            )  # fmt: skip

    def _registry_document(self) -> dict[str, Any]:
        return {
            model_id: {v: a.model_dump() for v, a in versions.items()}
            for model_id, versions in self._artifacts.items()
        }

    def _routes_document(self, replaced: Mapping[str, RouteState]) -> dict[str, Any]:
        routes = {**self._routes, **replaced}
        return {model_id: route.as_dict() for model_id, route in routes.items()}


def share_of(model_id: str, key: str) -> float:
    """Where a key falls in [0, 1) for a model: stable across replicas and restarts."""
    digest = hashlib.blake2b(f"{model_id}\0{key}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64


def approval_record(approval: Approval, *, by: str, at_unix_s: float) -> dict[str, Any]:
    return {"decision": approval.decision, "by": by, "at_unix_s": at_unix_s,
            "note": approval.note}  # fmt: skip


def _check_artifact_exists(location: str) -> None:
    if location.startswith(_URI_SCHEMES):
        return  # fetched by the workers that load it; the router cannot see it
    if not Path(location).exists():
        raise InvalidRequest(
            f"artifact {location!r} does not exist on the router's host (a local path must "
            f"exist; remote ones start with one of {', '.join(_URI_SCHEMES)})",
            param="artifact", code="artifact_missing",
        )  # fmt: skip
