"""The route's part in a request's path: place it, screen it, mirror it, screen the answer.

    prepare -> place (stage, version) -> screen input -> [mirror to shadow] -> pipeline
            -> screen output (whole answer, or each relayed stream event)

A model without a route or without safety checks pays one dict lookup for each step.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from typing import Any

from fastapi.responses import Response, StreamingResponse

from contracts.logs import request_id_var
from contracts.rollout import RouteSpec
from contracts.safety import HookCheck
from router.errors import APIError, sse_error_event
from router.fleet.registry import WorkerState
from router.observability.metrics import RouterMetrics
from router.prepare.fan_out import split_choices
from router.prepare.prepare import PreparedRequest
from router.rollout.prepull import gate_open
from router.rollout.review import ReviewQueue
from router.rollout.rollout import Placement, Rollout
from router.rollout.safety import (
    Hit,
    Screen,
    StreamScreen,
    answer_text,
    blocking,
    event_texts,
    request_text,
)
from router.rollout.shadow import PrimaryOutcome, ShadowMirror, ShadowTicket

_DONE = b"data: [DONE]"


class RolloutPath:
    def __init__(
        self,
        rollout: Rollout,
        *,
        review: ReviewQueue,
        shadow: ShadowMirror,
        metrics: RouterMetrics,
        call_hook: Callable[[HookCheck, dict[str, Any]], Any],
        clock: Callable[[], float],
        workers: Callable[[], Iterable[WorkerState]] = tuple,
    ) -> None:
        self._rollout = rollout
        self._workers = workers  # the registry's: a canary's pre-pull gate counts them
        self.review = review
        self.shadow = shadow
        self._metrics = metrics
        self._call_hook = call_hook
        self._clock = clock
        self._screens: dict[str, Screen] = {}

    def __repr__(self) -> str:
        return f"RolloutPath({self._rollout!r})"

    # -- placement ----------------------------------------------------------------------

    def place(self, request: PreparedRequest, headers: Mapping[str, str]) -> PreparedRequest:
        route = self._rollout.route(request.model)
        if route is None:
            placement = self._rollout.place(request.model, None, "")
            return dataclasses.replace(request, version=placement.version)
        placement = self._rollout.place(
            request.model, _sticky_key(route.spec, request, headers), request_id_var.get()
        )
        if placement.stage == "canary" and not gate_open(route.spec, request.model, self._workers):
            placement = Placement("prod", route.spec.prod)  # not pre-pulled yet
        return dataclasses.replace(request, stage=placement.stage, version=placement.version)

    def mirror(
        self, request: PreparedRequest, busy: Callable[[PreparedRequest, str], bool]
    ) -> ShadowTicket | None:
        """Maybe mirror to the shadow (drawn at its sample rate); ``busy`` says whether
        the router or the shadow's engines are under load, which sheds the copy."""
        version = self._rollout.shadow_for(request.model)
        if version is None or not _one_choice(request):
            return None
        return self.shadow.mirror(request, version, busy=busy(request, version))

    # -- safety -------------------------------------------------------------------------

    def screen(self, model: str) -> Screen | None:
        safety = self._rollout.policy(model).policy.safety
        if not safety.checks:
            return None
        screen = self._screens.get(model)
        if screen is None or screen.policy != safety:
            screen = Screen(safety, model=model, call_hook=self._call_hook)
            self._screens[model] = screen
        return screen

    async def screen_input(self, request: PreparedRequest) -> None:
        """Raise the 400 of a blocking check; queue the flags. No worker is touched."""
        screen = self.screen(request.model)
        if screen is None or not screen.active("input"):
            return
        text = request_text(request.body, chat=request.chat)
        hits = await screen.check("input", text)
        await self._record(hits, request, screen, text)
        blocked = blocking(hits)
        if blocked is not None:
            raise blocked.error(request.endpoint.prompt_param)

    async def screen_output(self, request: PreparedRequest, response: Response) -> Response:
        screen = self.screen(request.model)
        if screen is None or not screen.active("output"):
            return response
        if isinstance(response, StreamingResponse):
            response.body_iterator = self._screened(
                response.body_iterator, StreamScreen(screen), request, screen
            )
            return response
        try:
            answer = json.loads(bytes(response.body))
        except ValueError:
            return response
        hits = await screen.check("output", answer_text(answer) if isinstance(answer, dict) else "")
        await self._record(hits, request, screen, request_text(request.body, chat=request.chat))
        blocked = blocking(hits)
        if blocked is not None:
            raise blocked.error(None)
        return response

    async def _screened(
        self,
        events: AsyncIterator[Any],
        stream: StreamScreen,
        request: PreparedRequest,
        screen: Screen,
    ) -> AsyncIterator[bytes]:
        """Relay ``events``, withholding the event that completes a blocked match: the
        stream then ends with an error event, and closing ``events`` aborts the engine."""
        try:
            async for piece in events:
                data = _bytes(piece)
                hits = stream.feed(data)
                if _DONE in data:
                    hits += await stream.finish()
                if hits:
                    prompt = request_text(request.body, chat=request.chat)
                    await self._record(hits, request, screen, prompt)
                    blocked = blocking(hits)
                    if blocked is not None:
                        yield sse_error_event(blocked.error(None))
                        return
                yield data
        finally:
            await _close(events)

    async def _record(
        self, hits: list[Hit], request: PreparedRequest, screen: Screen, text: str
    ) -> None:
        for hit in hits:
            self._metrics.safety_hits.labels(request.model, hit.direction, hit.action).inc()
        if hits:
            await self.review.add(
                hits, model=request.model, stage=request.stage,
                version=request.version if isinstance(request.version, str) else None,
                policy=screen.policy, prompt=text,
            )  # fmt: skip

    # -- the client's outcome -------------------------------------------------------------

    def answered(
        self,
        request: PreparedRequest,
        ticket: ShadowTicket | None,
        *,
        status: int,
        response: Response | None = None,
    ) -> None:
        """The client's outcome: for the gate (errors before a byte; a streamed or whole
        answer is counted as it ends, by the orchestrator) and the shadow's comparison."""
        if response is None and status >= 500:
            self._metrics.stages.answered(request.model, request.stage, error=True)
        if ticket is None:
            return
        if isinstance(response, StreamingResponse):
            response.body_iterator = self._gathered(response.body_iterator, request, ticket)
            return
        body = None if response is None else bytes(response.body)
        ticket.primary(PrimaryOutcome(status, self._clock() - request.arrived_s, body))

    async def _gathered(
        self, events: AsyncIterator[Any], request: PreparedRequest, ticket: ShadowTicket
    ) -> AsyncIterator[bytes]:
        """Relay a mirrored request's stream, keeping its text for the shadow's comparison."""
        texts: list[str] = []
        done = False
        try:
            async for piece in events:
                data = _bytes(piece)
                texts.extend(event_texts(data))
                done = done or _DONE in data
                yield data
        finally:
            ticket.primary(PrimaryOutcome(
                200, self._clock() - request.arrived_s, None,
                text="".join(texts) if done else None,
            ))  # fmt: skip
            await _close(events)


def _sticky_key(
    spec: RouteSpec, request: PreparedRequest, headers: Mapping[str, str]
) -> str | None:
    canary = spec.canary
    if canary is None:
        return None
    if canary.stickiness == "user":
        user = request.body.get("user")
        return user if isinstance(user, str) and user else None
    if canary.stickiness == "header":
        return headers.get(str(canary.sticky_header).lower()) or None
    # API key: the tenant's name (a digest for unnamed keys); anonymous callers share one
    # name, so they are placed per request instead.
    return None if request.tenant.name == "anonymous" else request.tenant.name


def _bytes(piece: Any) -> bytes:
    return piece if isinstance(piece, bytes) else str(piece).encode()


async def _close(events: AsyncIterator[Any]) -> None:
    """Close the wrapped stream: the relay's own ``finally`` then aborts the engine."""
    close = getattr(events, "aclose", None)
    if close is not None:
        await close()


def _one_choice(request: PreparedRequest) -> bool:
    """Only requests for one choice are mirrored: a fan-out's copy would cost the shadow
    several engine requests for one comparison."""
    try:
        return split_choices(request.body, chat=request.chat, max_choices=1) is None
    except APIError:
        return False
