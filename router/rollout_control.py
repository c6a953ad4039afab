"""Changing the registry and routes: validated, written with compare-and-set, audited.

Every change reads this replica's view (``Rollout``), builds the whole new document,
and writes it only if nobody wrote since (``expected_version``); on a conflict it
re-reads and tries again, up to ``_ATTEMPTS``. A refused change writes nothing. Each
change, refused or not, is in the audit log with the caller's name; the gate's automatic
rollbacks with the name ``gate``.

Promotion: the canary becomes prod when its gate's verdict is within bounds (409
otherwise, with the figures) and, if the route requires it, a reviewer approved that
version (403 otherwise). Rollback drops the canary. ``judge_forever`` rolls a canary back
on its own when the gate breaches and says ``auto_rollback``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from contracts.rollout import Approval, ModelArtifact, RouteSpec
from router.errors import APIError, Forbidden, InvalidRequest, NotFound, RequestTooLarge
from router.rollout import (
    REGISTRY_DOCUMENT,
    ROUTES_DOCUMENT,
    Rollout,
    RouteState,
    approval_record,
)
from router.rollout_gate import StageWindows, Verdict, judge
from router.state.base import AuditEntry, ControlState, StateConflict, StateFull

log = logging.getLogger("pdserve.router")

_ATTEMPTS = 5
GATE_ACTOR = "gate"


def _summary(spec: RouteSpec) -> dict[str, Any]:
    """A route as the audit log keeps it: the stages and the names of its checks (a
    policy's blocklist may be large, and the log keeps thousands of entries)."""
    return {
        **spec.model_dump(mode="json", include={"prod", "canary", "shadow", "requires_approval"}),
        "safety_checks": [check.name for check in spec.safety.checks],
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

    # -- changes ----------------------------------------------------------------------

    async def register(self, artifact: ModelArtifact, actor: str) -> None:
        target = f"{artifact.model_id}@{artifact.version}"
        await self._write(
            REGISTRY_DOCUMENT, "register_model", target, actor,
            lambda: self.rollout.registered(artifact, by=actor, at_unix_s=self._wall_clock()),
            detail={"artifact": artifact.artifact, "checksum": artifact.checksum},
        )  # fmt: skip

    async def set_route(self, model_id: str, body: Any, actor: str) -> RouteSpec:
        chosen: list[RouteSpec] = []

        def build() -> dict[str, Any]:
            spec, document = self.rollout.routed(model_id, body)
            chosen.append(spec)
            return document

        def detail() -> dict[str, Any]:
            return _summary(chosen[-1]) if chosen else {}

        await self._write(ROUTES_DOCUMENT, "set_route", model_id, actor, build, detail=detail)
        return chosen[-1]

    async def delete_route(self, model_id: str, actor: str) -> None:
        def build() -> dict[str, Any]:
            self._route(model_id)
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
            if route.spec.requires_approval and not route.approved(canary.version):
                raise Forbidden(
                    f"{model_id} version {canary.version!r} needs a reviewer's approval "
                    "before prod (POST .../approve with a reviewer token)",
                    code="approval_required",
                )  # fmt: skip
            if not verdict.within:
                why = "; ".join(verdict.breaches or verdict.notes)
                raise GateNotMet(f"the canary's gate is not met: {why}", code="gate_not_met")
            spec = route.spec.model_copy(update={"prod": canary.version, "canary": None})
            return self.rollout.with_route(model_id, RouteState(spec, route.approvals))

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
            return self.rollout.with_route(model_id, RouteState(spec, route.approvals))

        await self._write(ROUTES_DOCUMENT, "rollback", model_id, actor, build,
                          detail={"why": why} if why else {})  # fmt: skip
        return self._route(model_id).spec

    async def approve(self, model_id: str, approval: Approval, actor: str) -> None:
        def build() -> dict[str, Any]:
            route = self._route(model_id)
            if self.rollout.artifact(model_id, approval.version) is None:
                raise InvalidRequest(
                    f"{model_id} has no registered version {approval.version!r}",
                    param="version", code="unknown_version",
                )  # fmt: skip
            record = approval_record(approval, by=actor, at_unix_s=self._wall_clock())
            approvals = {**route.approvals, approval.version: record}
            return self.rollout.with_route(model_id, RouteState(route.spec, approvals))

        await self._write(ROUTES_DOCUMENT, approval.decision, f"{model_id}@{approval.version}",
                          actor, build, detail={"note": approval.note})  # fmt: skip

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
        between; a refusal (an ``APIError`` from ``build``) is audited and re-raised."""
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
            await self._audit(action, target, actor, f"refused: {error.message}", detail)
            raise

    def _version_of(self, document: str) -> int:
        """The version this replica's view of ``document`` was read at."""
        if document == REGISTRY_DOCUMENT:
            return self.rollout.registry_version
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
