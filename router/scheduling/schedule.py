"""The schedule stage: which worker of a pool serves a request, and whether to disaggregate.

For a pool it builds one candidate per eligible worker (the blocks the prefix tracker
says it holds, the load this router has in flight there), runs the model's policy
(``scheduling_plugins``), and counts the choice. ``place`` is the other half: the chosen
worker is about to compute or receive the prompt, so the tracker records it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Sequence

from contracts.workers import WorkerRole
from router.admission.ttft_predictor import TTFTPredictor
from router.fleet.registry import WorkerState
from router.prepare.prompt_blocks import PromptBlocks
from router.scheduling.load import InFlight, InFlightLoad
from router.scheduling.prefix_tracking import PrefixTracker
from router.scheduling.routing_stats import RoutingStats
from router.scheduling.scheduling_plugins import (
    DECIDERS,
    Candidate,
    Decision,
    DisaggThresholds,
    PickContext,
    RouteQuery,
    candidate,
    choose,
    parse_weights,
)
from router.settings import RoutingSettings

_NO_LOAD = InFlight()


class Scheduler:
    def __init__(
        self,
        settings: RoutingSettings,
        *,
        load: InFlightLoad,
        prefixes: PrefixTracker,
        stats: RoutingStats,
        kv_overcommit: float = 1.0,
        preemption_cooldown_s: float = 0.0,
        predictor: TTFTPredictor | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._settings = settings
        self._kv_overcommit = kv_overcommit
        self._preemption_cooldown_s = preemption_cooldown_s
        self._clock = clock
        self._predictor = predictor
        self._load = load
        self._prefixes = prefixes
        self._stats = stats
        self._policies = settings.policies_by_model()  # parsed once, not per request
        self._weights = {
            WorkerRole.DECODE: parse_weights(settings.decode_scorers),
            WorkerRole.PREFILL: parse_weights(settings.prefill_scorers),
            WorkerRole.COLOCATED: parse_weights(settings.prefill_scorers),
        }
        self._decider = DECIDERS[settings.pd_decider]
        self._thresholds = DisaggThresholds(
            max_uncached_tokens=settings.conditional_disagg_max_uncached_tokens,
            max_kv_usage=settings.conditional_disagg_max_kv_usage,
        )
        self._turns: dict[tuple[str, WorkerRole], int] = {}

    def __repr__(self) -> str:
        return f"Scheduler(policy={self._settings.routing_policy!r}, by_model={self._policies})"

    def policy_of(self, routing_key: str) -> str:
        return self._policies.get(routing_key, self._settings.routing_policy)

    def pick(
        self,
        routing_key: str,
        role: WorkerRole,
        workers: Sequence[WorkerState],
        blocks: PromptBlocks,
        exclude: Collection[str] = (),
        *,
        kv_output_tokens: int | None = None,
        prefill_deadline_s: float | None = None,
        yields: bool = False,
    ) -> Decision | None:
        """``kv_output_tokens``: on the decode side, the output its KV must hold too.
        ``prefill_deadline_s``: on the first hop, when the prefill must end; ``yields``:
        there, a batch line's."""
        if all(w.worker_id in exclude for w in workers):
            return None
        query = self._query(blocks)
        turn = self._turns.get((routing_key, role), 0)
        self._turns[(routing_key, role)] = turn + 1
        settings = self._settings
        context = PickContext(
            query=query, turn=turn, weights=self._weights[role],
            epsilon=settings.bounded_load_epsilon, load_floor=settings.bounded_load_floor,
            token_floor=settings.bounded_load_token_floor, kv_output_tokens=kv_output_tokens,
            kv_overcommit=self._kv_overcommit, now_s=self._clock(),
            preemption_cooldown_s=self._preemption_cooldown_s,
            prefill_deadline_s=prefill_deadline_s, predict_prefill_s=self._predict_prefill_s,
            yields=yields,
        )  # fmt: skip
        decision = choose(self.policy_of(routing_key), workers, context, self._load.of, exclude)
        if decision is None:
            return None
        self._stats.chosen(role, decision.worker.worker_id)
        return decision

    def _predict_prefill_s(self, c: Candidate) -> float:
        if self._predictor is None:
            return 0.0
        return self._predictor.prefill_s(c.worker_id, c.inflight.tokens, c.uncached_tokens)

    def uncached_tokens(
        self, workers: Sequence[WorkerState], blocks: PromptBlocks
    ) -> dict[str, int]:
        """What each worker would have to prefill of this prompt (admission's forecast)."""
        query = self._query(blocks)
        return {w.worker_id: candidate(w, query, _NO_LOAD).uncached_tokens for w in workers}

    def _query(self, blocks: PromptBlocks) -> RouteQuery:
        return RouteQuery(
            prompt_tokens=max(1, blocks.token_count),
            block_size=blocks.block_size,
            matched=self._prefixes.match(blocks),
        )

    def place(self, blocks: PromptBlocks, decision: Decision) -> None:
        """The chosen worker is about to compute or receive these blocks."""
        worker_id = decision.worker.worker_id
        self._stats.routed(
            worker_id, decision.worker.role, blocks.token_count, decision.uncached_tokens
        )
        self._prefixes.record(worker_id, blocks)

    def prefill_on_decode(self, decode: Decision) -> bool:
        """The P/D decider: serve this request on the decode worker alone?"""
        return self._decider(decode, self._thresholds)
