"""Changing the registry, routes and policies: validated, written with compare-and-set,
audited.

Every change reads this replica's view (``Rollout``), builds the whole new document,
and writes it only if nobody wrote since (``expected_version``); on a conflict it
re-reads and tries again, up to ``_ATTEMPTS``. A refused change writes nothing, to the
documents or the audit log (a policy's refusal is logged as a warning). Each change made
is in the audit log with the caller's name; the gate's automatic rollbacks with the name
``gate``.

Promotion: the canary becomes prod when its gate's verdict is within bounds (409
otherwise, with the figures) and, if the model's policy requires it, a reviewer approved
that version (403 otherwise). Every route change (put, delete, promote) is held to the
policy the same way (``Rollout.check_approved``). Rollback drops the canary. The policy
is the reviewers': an operator may only tighten it (``set_policy``). ``judge_forever``
rolls a canary back on its own when the gate breaches and says ``auto_rollback``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from contracts.rollout import Approval, ModelArtifact, ModelPolicy, RouteSpec
from router.errors import APIError, Forbidden, InvalidRequest, NotFound, RequestTooLarge, parsed
from router.rollout.rollout import (
    POLICIES_DOCUMENT,
    REGISTRY_DOCUMENT,
    ROUTES_DOCUMENT,
    PolicyState,
    Rollout,
    RouteState,
    approval_record,
)
from router.rollout.rollout_gate import StageWindows, Verdict, judge
from router.state.base import AuditEntry, ControlState, StateConflict, StateFull

log = logging.getLogger("pdserve.router")

_ATTEMPTS = 5
GATE_ACTOR = "gate"


def _summary(spec: RouteSpec) -> dict[str, Any]:
    """A route as the audit log keeps it: its stages."""
    return spec.model_dump(mode="json", include={"prod", "canary", "shadow"})


def _policy_summary(policy: ModelPolicy) -> dict[str, Any]:
    """A policy as the audit log keeps it: the names of its checks, not their contents (a
    blocklist may be large, and the log keeps thousands of entries)."""
    return {
        **policy.model_dump(mode="json", exclude={"safety"}),
        "safety_checks": [check.name for check in policy.safety.checks],
    }


class GateNotMet(APIError):
    status = 409
    type = "conflict_error"


class RolloutControl:
    def __init__(
        self,
        state: ControlState,
        rollout: Rollout,
        windows: StageWindows,
        *,
        wall_clock: Callable[[], float],
        on_rollback: Callable[[str], None] = lambda model: None,
    ) -> None:
        self._state = state
        self.rollout = rollout
        self.windows = windows
        self._wall_clock = wall_clock
        self._on_rollback = on_rollback

    def __repr__(self) -> str:
        return f"RolloutControl({self.rollout!r})"

    # -- following ------------------------------------------------------------------

    async def reload(self, name: str | None = None) -> None:
        """Re-read one document (or both): a write announced by any replica."""
        if name in (None, REGISTRY_DOCUMENT):
            found = await self._state.document(REGISTRY_DOCUMENT)
            self.rollout.load_registry(*(found or (0, {})))
        if name in (None, ROUTES_DOCUMENT):
            found = await self._state.document(ROUTES_DOCUMENT)
            self.rollout.load_routes(*(found or (0, {})))
        if name in (None, POLICIES_DOCUMENT):
            found = await self._state.document(POLICIES_DOCUMENT)
            self.rollout.load_policies(*(found or (0, {})))

    # -- changes ----------------------------------------------------------------------

    async def register(self, artifact: ModelArtifact, actor: str) -> None:
        target = f"{artifact.model_id}@{artifact.version}"
        await self._write(
            REGISTRY_DOCUMENT, "register_model", target, actor,
            lambda: self.rollout.registered(artifact, by=actor, at_unix_s=self._wall_clock()),
            detail={"artifact": artifact.artifact, "checksum": artifact.checksum},
        )  # fmt: skip

    async def set_route(self, model_id: str, body: Any, actor: str) -> RouteSpec:
        spec = parsed(RouteSpec, body)
        await self._write(
            ROUTES_DOCUMENT, "set_route", model_id, actor,
            lambda: self.rollout.routed(model_id, spec), detail=_summary(spec),
        )  # fmt: skip
        return spec

    async def delete_route(
        self, model_id: str, actor: str, worker_versions: frozenset[str | None] = frozenset()
    ) -> None:
        """Drop the route. Under a policy that requires approval, refused (403) while a
        worker of an unapproved version is registered: without a route, the workers say
        what serves (though placement still keeps such a model to approved versions)."""

        def build() -> dict[str, Any]:
            self._route(model_id)
            policy = self.rollout.policy(model_id)
            unapproved = sorted(str(v) for v in worker_versions
                                if v is None or not policy.approved(v))  # fmt: skip
            if policy.policy.requires_approval and unapproved:
                raise Forbidden(
                    f"{model_id}'s policy requires approval and workers of unapproved "
                    f"versions are registered ({', '.join(unapproved)}): keep a route, or "
                    "have a reviewer approve them first",
                    code="approval_required",
                )  # fmt: skip
            return self.rollout.without_route(model_id)

        await self._write(ROUTES_DOCUMENT, "delete_route", model_id, actor, build)

    async def promote(self, model_id: str, actor: str) -> tuple[RouteSpec, Verdict]:
        verdicts: list[Verdict] = []

        def build() -> dict[str, Any]:
            route = self._route(model_id)
            canary = route.spec.canary
            if canary is None:
                raise InvalidRequest(f"{model_id} has no canary to promote", param="canary")
            verdict = self.verdict(model_id)
            verdicts.append(verdict)
            spec = route.spec.model_copy(update={"prod": canary.version, "canary": None})
            self.rollout.check_approved(model_id, spec)
            if not verdict.within:
                why = "; ".join(verdict.breaches or verdict.notes)
                raise GateNotMet(f"the canary's gate is not met: {why}", code="gate_not_met")
            return self.rollout.with_route(model_id, RouteState(spec))

        def detail() -> dict[str, Any]:
            return {"gate": verdicts[-1].as_dict()} if verdicts else {}

        await self._write(ROUTES_DOCUMENT, "promote", model_id, actor, build, detail=detail)
        route = self._route(model_id)
        return route.spec, verdicts[-1]

    async def rollback(self, model_id: str, actor: str, *, why: str = "") -> RouteSpec:
        def build() -> dict[str, Any]:
            route = self._route(model_id)
            if route.spec.canary is None:
                raise InvalidRequest(f"{model_id} has no canary to roll back", param="canary")
            spec = route.spec.model_copy(update={"canary": None})
            return self.rollout.with_route(model_id, RouteState(spec))

        await self._write(ROUTES_DOCUMENT, "rollback", model_id, actor, build,
                          detail={"why": why} if why else {})  # fmt: skip
        return self._route(model_id).spec

    async def approve(self, model_id: str, approval: Approval, actor: str) -> None:
        def build() -> dict[str, Any]:
            if self.rollout.artifact(model_id, approval.version) is None:
                raise InvalidRequest(
                    f"{model_id} has no registered version {approval.version!r}",
                    param="version", code="unknown_version",
                )  # fmt: skip
            current = self.rollout.policy(model_id)
            record = approval_record(approval, by=actor, at_unix_s=self._wall_clock())
            approvals = {**current.approvals, approval.version: record}
            return self.rollout.with_policy(model_id, PolicyState(current.policy, approvals))

        await self._write(POLICIES_DOCUMENT, approval.decision, f"{model_id}@{approval.version}",
                          actor, build, detail={"note": approval.note})  # fmt: skip

    async def set_policy(
        self, model_id: str, body: Any, actor: str, *, may_loosen: bool
    ) -> ModelPolicy:
        """Replace ``model_id``'s policy. Without ``may_loosen`` (a reviewer's scope) only
        a stricter policy is accepted: 403 ``reviewer_required`` names what loosens."""
        policy = parsed(ModelPolicy, body)
        changes: list[str] = []

        def build() -> dict[str, Any]:
            current = self.rollout.policy(model_id)
            changes[:] = current.policy.loosened_by(policy)
            if changes and not may_loosen:
                raise Forbidden(
                    f"only a reviewer may loosen {model_id}'s policy: {'; '.join(changes)}",
                    code="reviewer_required",
                )  # fmt: skip
            return self.rollout.with_policy(model_id, PolicyState(policy, current.approvals))

        def detail() -> dict[str, Any]:
            return {**_policy_summary(policy), "loosened": list(changes)}

        await self._write(POLICIES_DOCUMENT, "set_policy", model_id, actor, build, detail=detail)
        return policy

    # -- the gate --------------------------------------------------------------------

    def verdict(self, model_id: str) -> Verdict:
        route = self._route(model_id)
        gate = route.spec.gate
        prod = self.windows.figures(model_id, "prod", gate.window_s)
        canary = self.windows.figures(model_id, "canary", gate.window_s)
        return judge(gate, prod, canary)

    async def judge_once(self) -> list[str]:
        """Roll back every judged canary that breaches an auto-rollback gate."""
        rolled = []
        for model_id, route in self.rollout.routes().items():
            if route.spec.canary is None or not route.spec.gate.auto_rollback:
                continue
            verdict = self.verdict(model_id)
            if verdict.judged and not verdict.within:
                why = "; ".join(verdict.breaches)
                log.warning("canary of %s breaches its gate, rolling back: %s", model_id, why)
                try:
                    await self.rollback(model_id, GATE_ACTOR, why=why)
                except APIError as error:  # another replica rolled it back first
                    log.info("rollback of %s not needed: %s", model_id, error.message)
                    continue
                self._on_rollback(model_id)
                rolled.append(model_id)
        return rolled

    async def judge_forever(self, interval_s: float) -> None:
        while True:
            await asyncio.sleep(interval_s)
            await self.judge_once()

    # -- helpers ----------------------------------------------------------------------

    def _route(self, model_id: str) -> RouteState:
        route = self.rollout.route(model_id)
        if route is None:
            raise NotFound(f"{model_id} has no route", param="model_id", code="route_not_found")
        return route

    async def _write(
        self,
        document: str,
        action: str,
        target: str,
        actor: str,
        build: Callable[[], dict[str, Any]],
        *,
        detail: dict[str, Any] | Callable[[], dict[str, Any]] | None = None,
    ) -> None:
        """Build the new document from the current view and write it if nobody wrote in
        between. A refusal (an ``APIError`` from ``build``) is re-raised and changes no
        state, the audit log included: the log says what changed, and who changed it. A
        refusal the policy made (403) is logged as a warning with who tried what."""
        try:
            for _ in range(_ATTEMPTS):
                value = build()
                try:
                    await self._state.put_document(
                        document, value, expected_version=self._version_of(document)
                    )
                except StateConflict:
                    await self.reload(document)
                    continue
                except StateFull as error:
                    raise RequestTooLarge(
                        f"the {document} document would be too large: {error}",
                        code="document_too_large",
                    ) from None
                await self.reload(document)
                await self._audit(action, target, actor, "ok", detail)
                return
            raise APIError(f"{document} kept changing under this write; try again")
        except APIError as error:
            if error.status == 403:
                log.warning("%s refused to %s for %s: %s", action, actor, target, error.message)
            raise

    def _version_of(self, document: str) -> int:
        """The version this replica's view of ``document`` was read at."""
        if document == REGISTRY_DOCUMENT:
            return self.rollout.registry_version
        if document == POLICIES_DOCUMENT:
            return self.rollout.policies_version
        return self.rollout.routes_version

    async def _audit(
        self,
        action: str,
        target: str,
        actor: str,
        outcome: str,
        detail: dict[str, Any] | Callable[[], dict[str, Any]] | None,
    ) -> None:
        details = detail() if callable(detail) else dict(detail or {})
        entry = AuditEntry(at_unix_s=self._wall_clock(), actor=actor, action=action,
                           target=target, outcome=outcome[:500], detail=details)  # fmt: skip
        try:
            await self._state.append_audit(entry)
        except Exception as error:  # the change stands; its record is lost, and said so
            log.error("audit entry for %s %s lost: %s", action, target, error)
