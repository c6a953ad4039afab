"""The reviewer's queue: what the safety policy flagged, shared by every replica.

An item says which request (its id), which route (model, stage, version), which check
and category, input or output, what was done (flagged, or blocked) and when. It holds
the request's text only when the route's policy says ``keep_prompt``, and then only for
``prompt_retention_s`` (the state expires it). Reviewers mark items (``mark``, free text
up to 200 characters, with who and when).
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Callable, Sequence
from typing import Any

from contracts.logs import request_id_var
from contracts.safety import SafetyPolicy
from router.rollout.safety import Hit
from router.state.base import ControlState, StateUnavailable

log = logging.getLogger("pdserve.router")


class ReviewQueue:
    def __init__(self, state: ControlState, *, wall_clock: Callable[[], float]) -> None:
        self._state = state
        self._wall_clock = wall_clock

    def __repr__(self) -> str:
        return f"ReviewQueue({self._state!r})"

    async def add(
        self,
        hits: Sequence[Hit],
        *,
        model: str,
        stage: str,
        version: str | None,
        policy: SafetyPolicy,
        prompt: str,
    ) -> None:
        """Queue each hit; the request goes on whatever happens to the queue."""
        for hit in hits:
            item = {
                "id": secrets.token_hex(8), "request_id": request_id_var.get(),
                "model": model, "stage": stage, "version": version, "check": hit.check,
                "category": hit.category, "direction": hit.direction,
                "action": "blocked" if hit.action == "block" else "flagged", "why": hit.why,
                "at_unix_s": self._wall_clock(), "mark": None,
            }  # fmt: skip
            try:
                await self._state.add_review(
                    item, text=prompt if policy.keep_prompt else None,
                    text_ttl_s=policy.prompt_retention_s,
                )  # fmt: skip
            except StateUnavailable as error:
                log.error("review item for check %s lost: %s", hit.check, error)

    async def items(self, *, limit: int) -> list[dict[str, Any]]:
        return await self._state.review_items(limit=limit)

    async def mark(self, item_id: str, mark: str, actor: str) -> dict[str, Any] | None:
        return await self._state.update_review(
            item_id, {"mark": mark, "marked_by": actor, "marked_at_unix_s": self._wall_clock()}
        )
