"""The admit stage: may this request start now, and under what limits? After prepare,
before schedule.

In order, cheapest first; each refusal is OpenAI's error shape, and every 429 carries
``Retry-After`` and ``x-pdserve-reject-reason``:
1. limits (``request_limits``): message count and size, and (``precheck``) a queue that
   alone would make the request late, both before tokenizing; then the model's and the
   tenant's prompt and output caps, and the default output cap;
2. the tenant's token buckets, requests and tokens per minute (shared through the
   control-plane state: Redis when replicas share it). A state that cannot be reached
   lets the request through, counted: rate limits fail open, serving does not stop;
3. decode KV headroom: some decode worker can hold the prompt blocks it lacks plus the
   expected output and has not preempted within the cooldown, else 429 now, before any
   prefill is spent on it (checked again after the queue wait);
4. predicted TTFT (``ttft_predictor``) on the best first-hop worker, plus its fair share
   of the router's queue and the decode handoff: over ``ttft_slo_headroom`` x the SLO
   (the model's, or the client's if lower), and only when a queue is the cause (work
   ahead, or its fastest workers busy), is a 429 at once: work that will miss is not
   worth accepting. A prompt whose own prefill
   alone comes within that margin of the target, or past it but within the SLO, may wait
   up to the margin past its alone time, to the SLO at most (``_line_s``): in a busy
   fleet some wait is always there. So is a request that would push, on every first-hop
   worker, a prefill already under way past its deadline (an engine prefills what waits
   in one step, so later work delays earlier work): admitted requests keep their
   promise. The grant carries the request's prefill deadline, which the scheduler's
   ``ttft_budget`` filter keeps to when it picks the worker. Neither refusal falls on a
   tenant within its weighted share of the queue's limit while another tenant is over
   its own: that request waits in the queue, where it goes first. A prompt forecast over
   the SLO itself even on idle workers, from their measured speed, gets a 413 at once
   (``refuse_prompts_past_slo``, on by default: no wait would help it, so no 429); with
   the switch off, or while the speed is only the prior, it is served, late, when the
   pool is idle, and else refused with 429 ``prompt_needs_idle_pool``;
   A batch line (``yields``) has no TTFT to keep, so none of this refuses it: it is
   refused at once (429 ``batch_yields``) while a higher class waits in the queue or
   within ``batch_yield_after_refusal_s`` of other traffic refused for want of room, or
   while every first-hop worker prefills other work;
5. the prefill queue (``admission_queue``): bounded in uncached prompt tokens (per
   worker, and in time); a request waits there by priority and tenant share, and is
   dropped with a 429 if it cannot start by its deadline (arrival + its line - its own
   prefill time). Batch lines together are granted at most ``batch_prefill_share`` of
   the TTFT target's worth of prefill (one line per worker prefilling no other work
   always may), spread over the workers: interactive prompts arriving behind them wait
   little for batch work. A line may wait ``batch_queue_wait_s``, and
   carries no prefill deadline.
The grant it returns is released once the request's prefill is done.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Literal

from router.admission.admission_queue import Grant, PrefillQueue, QueueDeadline, QueueFull
from router.admission.request_limits import (
    Caps,
    apply_output_cap,
    check_prompt_cap,
    check_shape,
    requested_output,
)
from router.admission.rest_density import RestDensity
from router.admission.token_bucket import BucketRate
from router.admission.ttft_predictor import TTFTPredictor
from router.errors import Overloaded, RequestTooLarge
from router.fleet.registry import Pools, WorkerState
from router.observability.metrics import RouterMetrics
from router.prepare.context_window import context_limit
from router.prepare.prepare import PreparedRequest, PromptHead, prompt_chars, tokens_at_most
from router.prepare.prompt_blocks import PromptBlocks
from router.scheduling.load import InFlightLoad
from router.scheduling.schedule import Scheduler
from router.scheduling.scheduling_plugins import has_kv_room, thrashing
from router.settings import AdmissionSettings
from router.state.base import ControlState, StateUnavailable

log = logging.getLogger("pdserve.router")


# Refusals for want of room: a batch line yields for ``batch_yield_after_refusal_s``
# after one of these falls on other traffic.
_NO_ROOM = frozenset({"ttft_slo_unattainable", "queue_full", "queue_deadline", "decode_kv_full",
                      "decode_thrashing", "prompt_needs_idle_pool"})  # fmt: skip

# How much of the prompt was tokenized before a refusal: most of what the refusal cost.
Measured = Literal["none", "head", "whole"]


@dataclass(frozen=True, slots=True)
class Admitted:
    request: PreparedRequest  # with its output cap, KV reservation and predicted TTFT
    grant: Grant
    blocks: PromptBlocks  # the prompt, measured whole


@dataclass(frozen=True, slots=True)
class PromptMeasures:
    """How admission has a prompt measured on its pool's tokenizer: its head only (cheap,
    for an early refusal) or whole."""

    head: Callable[[PreparedRequest, Pools], PromptHead | None]
    whole: Callable[[PreparedRequest, Pools], Awaitable[PromptBlocks]]


@dataclass(frozen=True, slots=True)
class _Forecast:
    ttft_s: float
    own_prefill_s: float  # its own prefill (and handoff) on the best workers, with no queue
    alone_s: float  # the same on the workers where it is fastest: it cannot beat this
    alone_measured: bool  # every first-hop worker's alone_s is measured, not the prior
    uncached_tokens: int
    queued: bool  # work is ahead of it somewhere: waiting could help it
    handoff_s: float  # the predicted KV handoff after the prefill (0 colocated)
    # On every first-hop worker, its prefill would push one already under way there past
    # that one's deadline (an engine prefills what waits together, in one step).
    crowded: bool = False


class Admission:
    def __init__(
        self,
        settings: AdmissionSettings,
        *,
        state: ControlState,
        scheduler: Scheduler,
        load: InFlightLoad,
        predictor: TTFTPredictor,
        metrics: RouterMetrics,
        clock: Callable[[], float],
        head_chars: int = 0,
        rest_samples: int = 0,
    ) -> None:
        self._settings = settings
        self._head_chars = head_chars
        self._rest_samples = rest_samples
        # Per model (its tokenizer and its traffic): how dense a long prompt's rest is.
        self._rest_densities: dict[str, RestDensity] = {}
        self._state = state
        self._scheduler = scheduler
        self._load = load
        self._predictor = predictor
        self._metrics = metrics
        self._clock = clock
        self._queues: dict[str, PrefillQueue] = {}
        # Per model: when a request that was not a batch line was last refused for want of
        # room (a late forecast, the queue); batch lines yield for a while after.
        self._pressed_at_s: dict[str, float] = {}

    def __repr__(self) -> str:
        return f"Admission(queues={self._queues})"

    def queues(self) -> dict[str, PrefillQueue]:
        return dict(self._queues)

    def check_limits(self, request: PreparedRequest) -> None:
        """The request's shape, before its prompt is tokenized."""
        check_shape(request, self._settings)

    async def admit_prompt(
        self, request: PreparedRequest, pools: Pools, measures: PromptMeasures
    ) -> Admitted:
        """The one entry point for a choice: refuse before tokenizing if the queue alone
        makes it late; for a long prompt that could be refused, measure its head and
        refuse on that; else measure it whole and admit or refuse it. Raises to refuse."""
        self._yield_to_waiting(request, pools)  # a batch line refused before any tokenizing
        head = None
        if (
            self.precheck(request, pools)
            and self._head_chars > 0 and prompt_chars(request) > 2 * self._head_chars
            and self.could_refuse(request, pools, tokens_at_most(request))
        ):  # fmt: skip
            head = measures.head(request, pools)  # None: too short for a head after all
        if head is not None:
            density = self._rest_density(request.model)
            self.precheck_head(request, pools, head, rest_share=density.share())
        blocks = await measures.whole(request, pools)
        if head is not None:
            density.observe(
                head_tokens=head.tokens, head_chars=head.chars, rest_chars=head.rest_chars,
                rest_tokens=blocks.token_count - head.tokens,
            )  # fmt: skip
            self._metrics.head_rest_share.labels(request.model).set(density.share())
        return await self.admit(request, pools, blocks)

    def _rest_density(self, model: str) -> RestDensity:
        density = self._rest_densities.get(model)
        if density is None:  # one per served model: the registry bounds how many
            density = self._rest_densities[model] = RestDensity(max_samples=self._rest_samples)
        return density

    def precheck(self, request: PreparedRequest, pools: Pools) -> bool:
        """Before tokenizing: refuse at once when the queue ahead alone would make it late
        (its own prefill only adds), so an overloaded pool's 429 costs no tokenization.
        True: a queue is ahead of it, or admitted work that a long prompt would wait
        for (the queue's grant), or a long prompt may miss the SLO even alone, so
        ``precheck_head`` may then refuse it."""
        if not (pools.first_hop and (pools.colocated or pools.decode)):
            return False
        forecast = self._forecast(request, pools, _each(pools.first_hop, 0), _each(pools.decode, 0))
        self._refuse_if_past_slo_alone(request, forecast, at_least=True, measured="none")
        self._refuse_if_late(request, pools, forecast, measured="none")
        queue = self._queues.get(request.model)
        return (
            forecast.queued
            or bool(queue is not None and queue.admitted_tokens)
            or (self._settings.refuse_prompts_past_slo and forecast.alone_measured)
        )

    def could_refuse(self, request: PreparedRequest, pools: Pools, tokens_at_most: int) -> bool:
        """Could the prompt, all of its ``tokens_at_most`` uncached, be refused? If not,
        measuring its head for ``precheck_head`` is wasted work."""
        forecast = self._forecast(
            request, pools, _each(pools.first_hop, tokens_at_most),
            _each(pools.decode, tokens_at_most),
        )  # fmt: skip
        return self._past_slo_alone(request, forecast) or (
            self._late(request, forecast) and not self._sheltered(request, pools, forecast)
        )

    def precheck_head(
        self, request: PreparedRequest, pools: Pools, head: PromptHead, *, rest_share: float
    ) -> None:
        """Before tokenizing a long prompt whole: on a worker whose cached prefix ends
        inside the head, the rest is uncached too (a cached prefix is contiguous from the
        first block); on one that holds the whole head, nothing more is known. Refuse at
        once if even that makes it late, the rest's tokens estimated low (``rest_share``
        of the head's per character)."""
        block_size = head.blocks.block_size
        rest_tokens = head.rest_tokens(rest_share)
        lacking = {
            worker_id: n + rest_tokens if n >= block_size else 1
            for worker_id, n in self._scheduler.uncached_tokens(
                [*pools.first_hop, *pools.decode], head.blocks
            ).items()
        }
        forecast = self._forecast(request, pools, lacking, lacking)
        self._refuse_if_past_slo_alone(request, forecast, at_least=True, measured="head")
        self._refuse_if_late(request, pools, forecast, at_least=True, measured="head")

    async def admit(self, request: PreparedRequest, pools: Pools, blocks: PromptBlocks) -> Admitted:
        """Raise to refuse; return to let the request be scheduled."""
        request = self._with_output_cap(request, blocks)
        output = requested_output(request.body, chat=request.chat)
        if output is None:  # as vLLM: the rest of the context, which KV may have to hold
            limit = context_limit(pools.first_hop)
            output = max(0, limit - blocks.token_count) if limit else 0
        await self.rate_limit(request, blocks.token_count + output)
        # The KV its output is expected to need: most requests stop well short of a large
        # max_tokens (or of the context, with none); one that runs on may be preempted.
        output = min(output, self._settings.expected_output_tokens)
        decode_pool = pools.decode if pools.disaggregated else pools.colocated
        if not pools.first_hop or not decode_pool:
            return Admitted(request, Grant(None, 0), blocks)  # no capacity: the orchestrator's 503
        self._check_decode_room(request, decode_pool, blocks, output)
        # One prefix lookup for both pools: what each worker lacks of the prompt.
        lacking = self._scheduler.uncached_tokens([*pools.first_hop, *pools.decode], blocks)
        forecast = self._forecast(request, pools, lacking, lacking)
        self._refuse_if_past_slo_alone(request, forecast)
        self._refuse_if_late(request, pools, forecast)
        self._yield_to_waiting(request, pools)  # again: other work may have come meanwhile
        line_s = self._line_s(request, forecast)
        grant = await self._queue(request, pools.first_hop, forecast, line_s)
        try:
            # Again after the wait, with nothing awaited between this and the decode pick:
            # the room seen before queueing may have been taken meanwhile.
            self._yield_to_waiting(request, pools)
            self._check_decode_room(request, decode_pool, blocks, output)
        except Overloaded:
            grant.release()
            raise
        admitted = dataclasses.replace(
            request, max_output_tokens=output, predicted_ttft_s=forecast.ttft_s,
            prefill_deadline_s=None if request.yields
            else request.arrived_s + line_s - forecast.handoff_s,
        )  # fmt: skip
        self._metrics.predicted_ttft.labels(request.model).observe(forecast.ttft_s)
        return Admitted(admitted, grant, blocks)

    def _with_output_cap(self, request: PreparedRequest, blocks: PromptBlocks) -> PreparedRequest:
        tenant = request.tenant.policy
        caps = (
            Caps("model", *self._settings.model_caps(request.model)),
            Caps("tenant", tenant.max_prompt_tokens, tenant.max_output_tokens),
        )
        check_prompt_cap(blocks.token_count, caps, request.endpoint.prompt_param)
        default = self._settings.default_max_tokens_of(request.model)
        body = apply_output_cap(request, caps, default)
        return request if body is None else dataclasses.replace(request, body=body)

    async def rate_limit(self, request: PreparedRequest, tokens: int) -> None:
        """Charge the tenant's rpm and tpm limits (a prompt's tokens, with its output cap, or
        an embedding request's inputs); raise 429 with Retry-After past either."""
        policy, name = request.tenant.policy, request.tenant.name
        for unit, per_minute, cost in (("rpm", policy.rpm, 1), ("tpm", policy.tpm, tokens)):
            if not per_minute:
                continue
            try:
                wait_s = await self._state.take_tokens(
                    f"{name}:{unit}", cost, BucketRate(per_minute)
                )
            except StateUnavailable as error:
                self._metrics.state_unavailable.inc()
                log.warning("rate limit unchecked for %s: %s", name, error)
                return
            if wait_s > 0:
                raise self._refused(
                    request, f"rate_limit_{unit}",
                    f"rate limit reached for {name}: {per_minute:g} "
                    f"{'requests' if unit == 'rpm' else 'tokens'} per minute",
                    wait_s=wait_s,
                )  # fmt: skip

    def _check_decode_room(
        self,
        request: PreparedRequest,
        pool: Sequence[WorkerState],
        blocks: PromptBlocks,
        output_tokens: int,
    ) -> None:
        """Room on some calm decode worker for the prompt blocks it does not hold yet
        (held ones are shared, as vLLM shares them) plus the whole output."""
        now, s = self._clock(), self._settings
        calm = [w for w in pool if not thrashing(w, now, s.preemption_cooldown_s)]
        if not calm:
            raise self._refused(
                request, "decode_thrashing",
                "every decode worker is preempting requests (KV cache exhausted); retry shortly",
                wait_s=s.preemption_cooldown_s,
            )  # fmt: skip
        uncached = self._scheduler.uncached_tokens(calm, blocks)
        if not any(has_kv_room(w, self._load.of(w.worker_id),
                               uncached[w.worker_id] + output_tokens, s.decode_kv_overcommit)
                   for w in calm):  # fmt: skip
            raise self._refused(
                request, "decode_kv_full",
                f"no decode worker has KV room for this prompt and {output_tokens} output tokens; "
                "retry shortly",
                wait_s=1.0,
            )  # fmt: skip

    def _yield_to_waiting(self, request: PreparedRequest, pools: Pools) -> None:
        """A yielding request (a batch line) is refused at once (429 ``batch_yields``)
        while a request of a higher class waits in the router's queue, within
        ``batch_yield_after_refusal_s`` of one refused for want of room, or while every
        first-hop worker is prefilling other work: interactive traffic needs the room, and the
        batch's runner sends the line again shortly. Else it may enter the queue, where
        batch work holds at most ``_own_limit_tokens`` of the engines' queue."""
        if not request.yields:
            return
        queue = self._queues.get(request.model)
        pressed_s = self._clock() - self._pressed_at_s.get(request.model, -math.inf)
        busy = bool(pools.first_hop) and all(
            self._load.of(w.worker_id).prefills_other_work for w in pools.first_hop
        )
        if (
            pressed_s < self._settings.batch_yield_after_refusal_s
            or busy
            or (queue is not None and queue.waiting_above(request.priority))
        ):
            raise self._refused(
                request, "batch_yields",
                "interactive traffic needs the room now; this batch line runs later",
                wait_s=1.0,
            )  # fmt: skip

    def _own_limit_tokens(self, request: PreparedRequest, first_hop: Sequence[WorkerState],
                          cost: int) -> int | None:  # fmt: skip
        """A yielding request's own queue limit: batch work in the engines' queue stays
        within ``batch_prefill_share`` of the TTFT target's worth of prefill at the
        first-hop workers' rate, and one line (``cost``) per worker prefilling no other
        work always may. The scheduler spreads it (``spare_for_batch``), so an interactive
        prompt arriving behind it waits at most about that long, or for one line."""
        if not request.yields:
            return None
        target_s = self._slo_s(request) * self._settings.ttft_slo_headroom
        rate = sum(self._predictor.tokens_per_s(w.worker_id) for w in first_hop)
        spare = sum(not self._load.of(w.worker_id).prefills_other_work for w in first_hop)
        return max(1, cost * spare, int(rate * target_s * self._settings.batch_prefill_share))

    def _slo_s(self, request: PreparedRequest) -> float:
        """The model's TTFT SLO, or the client's if lower."""
        model_slo_s = self._settings.ttft_slo_of(request.model)
        return min(model_slo_s, request.ttft_slo_s or model_slo_s)

    def _line_s(self, request: PreparedRequest, forecast: _Forecast) -> float:
        """The forecast a wait may bring the request to: the target (the SLO less the
        predictor's margin, ``ttft_slo_headroom``); for a prompt whose own prefill alone
        comes within that margin of the target, or past it but within the SLO, its time
        alone plus the margin, at most the SLO. A busy fleet always has some wait; were
        such a prompt refused for any wait, it would be refused as long as the fleet is
        busy, though it can meet the SLO. One that misses the SLO even alone is past the
        line with any wait (served only when the pool is idle, or 413 with
        ``refuse_prompts_past_slo``). Never falling as the prompt grows, and rising no
        faster than the forecast, the line keeps ``precheck_head``'s low estimate of the
        tokens on the safe side."""
        slo_s = self._slo_s(request)
        target_s = slo_s * self._settings.ttft_slo_headroom
        return min(slo_s, max(target_s, forecast.alone_s + slo_s - target_s))

    def _refuse_if_past_slo_alone(
        self, request: PreparedRequest, forecast: _Forecast, *,
        at_least: bool = False, measured: Measured = "whole",
    ) -> None:  # fmt: skip
        """A prompt that would miss the SLO on idle workers: no wait helps it, so with
        ``refuse_prompts_past_slo`` it gets a 413 that says why, not a 429 to retry. The
        line is the SLO itself, not the target, and the workers' speed must be measured
        (their probe or their own prefills), not the prior: only a miss the forecast is
        sure of. ``at_least``: the forecast counts only part of the prompt (before it is
        tokenized, or from its head), so the prompt is at least that slow: the same
        answer whether the pool is busy or idle."""
        if not self._past_slo_alone(request, forecast):
            return
        slo_s = self._slo_s(request)
        self._count_refusal(request, "prompt_exceeds_ttft_slo", measured)
        tokens = "" if at_least else f" ({forecast.uncached_tokens} uncached tokens)"
        raise RequestTooLarge(
            f"this prompt{tokens} is forecast to take {'at least ' if at_least else ''}"
            f"{forecast.alone_s:.3g}s to the first token even on idle workers, over the "
            f"{slo_s:.3g}s time-to-first-token SLO; shorten the prompt",
            param=request.endpoint.prompt_param,
            code="prompt_exceeds_ttft_slo",
        )

    def _past_slo_alone(self, request: PreparedRequest, forecast: _Forecast) -> bool:
        return (
            self._settings.refuse_prompts_past_slo
            and forecast.alone_measured
            and forecast.alone_s > self._slo_s(request)
        )

    def _sheltered(self, request: PreparedRequest, pools: Pools, forecast: _Forecast) -> bool:
        """A tenant within its share while another is over its own waits in the queue, where
        it goes first, rather than being refused for a queue the other made."""
        queue = self._queues.get(request.model)
        if queue is None:
            return False
        limit = self._queue_limit_tokens(request.model, pools.first_hop)
        policy = request.tenant.policy
        return queue.sheltered(request.tenant.name, policy.weight, forecast.uncached_tokens, limit)

    def _late(self, request: PreparedRequest, forecast: _Forecast) -> bool:
        # Late only when a wait is the cause: alone on idle workers a request is as fast
        # as it can be, and serving it keeps the predictor learning. A batch line has no
        # TTFT to keep: it waits for room in the queue, behind interactive work.
        return (
            not request.yields
            and forecast.queued
            and (forecast.crowded or forecast.ttft_s > self._line_s(request, forecast))
        )

    def _refuse_if_late(
        self, request: PreparedRequest, pools: Pools, forecast: _Forecast, *,
        at_least: bool = False, measured: Measured = "whole",
    ) -> None:  # fmt: skip
        if not self._late(request, forecast) or self._sheltered(request, pools, forecast):
            return
        line_s, slo_s = self._line_s(request, forecast), self._slo_s(request)
        if forecast.alone_s > slo_s:  # no wait is short enough: say so, and when it is served
            raise self._refused(
                request, "prompt_needs_idle_pool",
                f"this prompt is forecast to take {'at least ' if at_least else ''}"
                f"{forecast.alone_s:.3g}s to the first token even on idle workers, over the "
                f"{slo_s:.3g}s time-to-first-token SLO, so it is served only when the pool "
                "is idle; retry later, or shorten it",
                wait_s=forecast.ttft_s - forecast.alone_s, measured=measured,
            )  # fmt: skip
        if forecast.ttft_s > line_s:
            raise self._refused(
                request, "ttft_slo_unattainable",
                f"predicted time to first token {'at least ' if at_least else ''}"
                f"{forecast.ttft_s:.3g}s is over the "
                f"{line_s:.3g}s target; the prefill queue is full, retry later",
                wait_s=forecast.ttft_s - line_s, measured=measured,
            )  # fmt: skip
        raise self._refused(
            request, "ttft_slo_unattainable",
            "every prefill worker is at its limit: more work there would make requests "
            "already admitted miss their time to first token target; retry later",
            wait_s=forecast.ttft_s, measured=measured,
        )  # fmt: skip

    def _forecast(
        self, request: PreparedRequest, pools: Pools, uncached: dict[str, int],
        pulled: dict[str, int],
    ) -> _Forecast:  # fmt: skip
        """``uncached``: what each first-hop worker would prefill of the prompt;
        ``pulled``: what each decode worker would pull of its KV (disaggregated)."""
        first_hop, predictor, now = pools.first_hop, self._predictor, self._clock()

        ahead_there = {w.worker_id: self._tokens_ahead(request, pools, w) for w in first_hop}
        prefill_s = {
            w.worker_id: predictor.prefill_s(
                w.worker_id, ahead_there[w.worker_id], uncached[w.worker_id]
            )
            for w in first_hop
        }

        def crowds(worker: WorkerState) -> bool:
            """Would its prefill there push one already under way past its deadline?"""
            earliest = self._load.of(worker.worker_id).earliest_deadline_s()
            return earliest is not None and now + prefill_s[worker.worker_id] > earliest

        roomy = [w for w in first_hop if not crowds(w)]
        best = min(roomy or first_hop, key=lambda w: prefill_s[w.worker_id])
        own_tokens = uncached[best.worker_id]
        pool_tokens_per_s = sum(predictor.tokens_per_s(w.worker_id) for w in first_hop)
        ahead, grant_wait_s = self._router_queue(request, first_hop, own_tokens, pool_tokens_per_s)
        handoff_s, idle_handoff_s, decode_busy = self._handoff(pools, pulled)
        ttft_s = handoff_s + max(
            prefill_s[best.worker_id] + ahead / pool_tokens_per_s,
            grant_wait_s + predictor.prefill_s(best.worker_id, 0, own_tokens),
        )
        alone_s = idle_handoff_s + min(
            predictor.prefill_s(w.worker_id, 0, uncached[w.worker_id]) for w in first_hop
        )
        return _Forecast(
            ttft_s=ttft_s,
            own_prefill_s=predictor.prefill_s(best.worker_id, 0, own_tokens) + idle_handoff_s,
            alone_s=alone_s,
            alone_measured=all(predictor.measured(w.worker_id) for w in first_hop),
            uncached_tokens=own_tokens,
            # Slower than it could be: work ahead, or its fastest workers busy (one that
            # holds its prefix is queued, so an idle one without it is best).
            queued=bool(ahead or grant_wait_s or ahead_there[best.worker_id] or decode_busy)
            or ttft_s > alone_s * (1 + 1e-9),
            handoff_s=handoff_s,
            crowded=not roomy,
        )

    def _tokens_ahead(self, request: PreparedRequest, pools: Pools, worker: WorkerState) -> int:
        """The prompt tokens sent to the worker that this prompt would wait for: not batch
        lines' prefills, which a prompt that does not yield takes back when it is sent to a
        prefill worker (``batch_prefill_take_back``; ``orchestration/take_back.py``)."""
        there = self._load.of(worker.worker_id)
        if request.yields or not (pools.disaggregated and self._settings.batch_prefill_take_back):
            return there.tokens
        return there.tokens - there.yielding_tokens

    def _router_queue(
        self, request: PreparedRequest, first_hop: Sequence[WorkerState], own_tokens: int,
        pool_tokens_per_s: float,
    ) -> tuple[int, float]:  # fmt: skip
        """The uncached tokens ahead of it in the router's queue, and its wait for the grant."""
        queue = self._queues.get(request.model)
        if queue is None:
            return 0, 0.0
        ahead = queue.tokens_ahead(
            priority=request.priority, tenant=request.tenant.name,
            weight=request.tenant.policy.weight, cost=own_tokens,
        )  # fmt: skip
        admitted = queue.admitted_tokens
        # The queue grants it once what is admitted (and ahead of it) has drained enough to
        # fit it under the limit, all of it for a prompt over the limit: a long prompt
        # behind a busy pool waits for the pool to empty, which the queue ahead misses.
        limit = self._queue_limit_tokens(request.model, first_hop, pool_tokens_per_s)
        over_limit = admitted + ahead + own_tokens - limit
        return ahead, min(admitted + ahead, max(0, over_limit)) / pool_tokens_per_s

    def _handoff(self, pools: Pools, pulled: dict[str, int]) -> tuple[float, float, bool]:
        """The KV handoff on the best decode worker now and on an idle one, and whether
        every decode worker is busy; nothing colocated."""
        if not pools.disaggregated:
            return 0.0, 0.0, False
        predictor = self._predictor
        in_flight = {w.worker_id: self._load.of(w.worker_id).requests for w in pools.decode}
        return (
            min(predictor.handoff_s(w, n + 1, pulled[w]) for w, n in in_flight.items()),
            min(predictor.handoff_s(w, 1, pulled[w]) for w in in_flight),
            min(in_flight.values()) > 0,
        )

    def _queue_limit_tokens(
        self, model: str, first_hop: Sequence[WorkerState], rate: float | None = None
    ) -> int:
        """Uncached tokens the engines may hold queued: the per-worker cap, and no more
        than a fraction of the model's SLO of work at their learned rates (``rate``: their
        sum, when the caller has it)."""
        s = self._settings
        if rate is None:
            rate = sum(self._predictor.tokens_per_s(w.worker_id) for w in first_hop)
        in_time = rate * s.ttft_slo_of(model) * s.prefill_queue_slo_fraction
        return max(1, int(min(s.prefill_queue_tokens_per_worker * len(first_hop), in_time)))

    async def _queue(
        self,
        request: PreparedRequest,
        first_hop: Sequence[WorkerState],
        forecast: _Forecast,
        line_s: float,
    ) -> Grant:
        queue = self._queues.get(request.model)
        if queue is None:
            queue = self._queues[request.model] = PrefillQueue(
                max_waiting=self._settings.max_queued_requests, clock=self._clock
            )
        entered_s = self._clock()
        try:
            grant = await queue.enter(
                tenant=request.tenant.name, priority=request.priority,
                weight=request.tenant.policy.weight, cost=forecast.uncached_tokens,
                limit_tokens=self._queue_limit_tokens(request.model, first_hop),
                deadline_s=request.arrived_s + (
                    self._settings.batch_queue_wait_s if request.yields
                    else line_s - forecast.own_prefill_s
                ),
                own_limit_tokens=self._own_limit_tokens(
                    request, first_hop, forecast.uncached_tokens
                ),
            )  # fmt: skip
        except QueueFull as error:
            raise self._refused(request, "queue_full", str(error), wait_s=forecast.ttft_s) from None
        except QueueDeadline:
            raise self._refused(
                request, "queue_deadline",
                f"waited in the prefill queue past its {line_s:.3g}s TTFT target",
                wait_s=forecast.ttft_s,
            ) from None  # fmt: skip
        self._metrics.stage.labels(request.model, "queue").observe(self._clock() - entered_s)
        return grant

    def _refused(
        self, request: PreparedRequest, reason: str, message: str, *, wait_s: float,
        measured: Measured = "whole",
    ) -> Overloaded:  # fmt: skip
        self._count_refusal(request, reason, measured)
        if not request.yields and reason in _NO_ROOM:
            self._pressed_at_s[request.model] = self._clock()
        return Overloaded(message, code=reason, retry_after_s=max(1, math.ceil(wait_s)))

    def _count_refusal(self, request: PreparedRequest, reason: str, measured: Measured) -> None:
        """``measured``: how much of the prompt was tokenized before the refusal (none, its
        head, the whole), which is most of what a refusal costs the router."""
        self._metrics.admission_rejections.labels(request.model, reason).inc()
        waited_s = self._clock() - request.arrived_s
        self._metrics.rejection_latency.labels(request.model, reason, measured).observe(waited_s)


def _each(workers: Sequence[WorkerState], tokens: int) -> dict[str, int]:
    return dict.fromkeys((w.worker_id for w in workers), tokens)
