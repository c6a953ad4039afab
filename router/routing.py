"""Worker choice: filters, then weighted scorers, then a picker (llm-d's shape).

A *policy* is a named pipeline:
- ``round_robin``: rotate; nothing is scored;
- ``least_loaded``: the fewest requests this router has in flight on the worker,
  then the lowest KV usage;
- ``prefix_affinity`` (default): the lowest cost, where each scorer adds
  ``weight x value`` in token units; ``uncached_tokens`` (what the worker would
  have to compute, from the prefix index) plus ``queued_tokens`` (uncached tokens
  already in flight there) is ``prefill_cost(uncached) + queue_wait``.
  The ``bounded_load`` filter first takes affinity away from any candidate whose
  in-flight requests have reached max(floor, ceil((1 + epsilon) x mean)): consistent
  hashing with bounded loads, decided per candidate. Such a worker is still eligible, but
  is scored as if it held nothing, so a hot prefix spills to the next best worker
  instead of melting one.
Ties go to the worker with fewer requests in flight, then rotate.

Scorers and weights are configuration (``uncached_tokens=1,queued_tokens=0.02``):
one plug-in per name in ``SCORERS``. Everything here is pure and synchronous.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field

from router.registry import WorkerState

POLICIES = ("round_robin", "least_loaded", "prefix_affinity")


@dataclass(slots=True)
class InFlight:
    requests: int = 0
    tokens: int = 0  # uncached prompt tokens this router sent and has not seen finish


@dataclass(slots=True)
class Candidate:
    worker: WorkerState
    matched_blocks: int
    uncached_tokens: int
    inflight: InFlight
    affinity: bool = True  # False: bounded_load took its prefix hits away
    cost: float = 0.0

    @property
    def worker_id(self) -> str:
        return self.worker.worker_id


@dataclass(frozen=True, slots=True)
class RouteQuery:
    """What the pipeline knows about the request."""

    prompt_tokens: int
    block_size: int
    matched: dict[str, int]  # worker id -> leading blocks it holds


@dataclass(frozen=True, slots=True)
class Decision:
    worker: WorkerState
    # prefix_hit: the deepest cached prefix; bounded_load_spill: that worker was at its
    # bound; load: it lost on queue cost; cold: nothing cached anywhere; or the policy name.
    reason: str
    matched_blocks: int
    uncached_tokens: int


Scorer = Callable[[Candidate], float]

SCORERS: dict[str, Scorer] = {
    "uncached_tokens": lambda c: c.uncached_tokens,
    "queued_tokens": lambda c: c.inflight.tokens,
    "running_requests": lambda c: c.inflight.requests,
    "kv_usage": lambda c: c.worker.load.kv_cache_usage_perc,
    "engine_waiting": lambda c: c.worker.load.num_requests_waiting,
}


def parse_weights(spec: str) -> dict[str, float]:
    """``"uncached_tokens=1,queued_tokens=0.25"`` -> weights; unknown names are refused."""
    weights: dict[str, float] = {}
    for item in filter(None, (part.strip() for part in spec.split(","))):
        name, _, value = item.partition("=")
        if name not in SCORERS:
            raise ValueError(f"unknown scorer {name!r}; known: {sorted(SCORERS)}")
        try:
            weights[name] = float(value)
        except ValueError:
            raise ValueError(f"scorer {name!r} needs a numeric weight, got {value!r}") from None
    return weights


def bounded_load(
    candidates: list[Candidate], epsilon: float, floor: int = 0, token_floor: int = 0
) -> None:
    """Take affinity from candidates at or over their load bound.

    Two bounds, either one takes affinity away:
    - requests: ceil((1+epsilon) x mean in-flight requests), never below ``floor``
      (at low load the mean is a fraction and ceil() would allow one request only);
    - tokens (when ``token_floor`` > 0): the candidate's queued uncached tokens plus this
      request's would exceed (1+epsilon) x the mean queued tokens and ``token_floor``.
      A request count treats a 16k-token prompt like a 100-token one; a short prompt
      sent by affinity behind it waits for the whole long prefill.
    """
    total = sum(c.inflight.requests for c in candidates) + 1  # this request included
    capacity = max(floor, math.ceil((1 + epsilon) * total / len(candidates)))
    token_capacity = 0.0
    if token_floor > 0:
        queued = sum(c.inflight.tokens for c in candidates)
        mean = (queued + min(c.uncached_tokens for c in candidates)) / len(candidates)
        token_capacity = max(token_floor, (1 + epsilon) * mean)
    for candidate in candidates:
        queue_if_chosen = candidate.inflight.tokens + candidate.uncached_tokens
        if candidate.inflight.requests >= capacity or (
            token_floor > 0 and queue_if_chosen > token_capacity
        ):
            candidate.affinity = False


@dataclass(slots=True)
class Pipeline:
    policy: str
    weights: dict[str, float]
    epsilon: float
    load_floor: int = 0
    token_floor: int = 0
    _cursor: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise ValueError(f"unknown routing policy {self.policy!r}; known: {POLICIES}")

    def pick(
        self,
        pool_key: str,
        workers: Sequence[WorkerState],
        query: RouteQuery,
        inflight: Callable[[str], InFlight],
        exclude: Collection[str] = (),
    ) -> Decision | None:
        usable = sorted((w for w in workers if w.worker_id not in exclude),
                        key=lambda w: w.worker_id)  # fmt: skip
        if not usable:
            return None
        # A worker whose load its agent could not read looks idle; use it only when no
        # worker's load is known.
        usable = [w for w in usable if w.load.known] or usable
        turn = self._cursor.get(pool_key, 0)
        self._cursor[pool_key] = turn + 1
        candidates = [self._candidate(w, query, inflight(w.worker_id)) for w in usable]
        if self.policy == "round_robin":
            return self._decide(candidates[turn % len(candidates)], "round_robin")
        if self.policy == "least_loaded":
            best = min(candidates, key=lambda c: (c.inflight.requests,
                                                  c.worker.load.kv_cache_usage_perc))  # fmt: skip
            return self._decide(best, "least_loaded")
        bounded_load(candidates, self.epsilon, self.load_floor, self.token_floor)
        for candidate in candidates:
            if not candidate.affinity:
                candidate.uncached_tokens = query.prompt_tokens
            candidate.cost = sum(w * SCORERS[name](candidate) for name, w in self.weights.items())
        # Rotation breaks exact ties, so equal workers share load instead of the first
        # one by name taking everything.
        order = {c.worker_id: (i - turn) % len(candidates) for i, c in enumerate(candidates)}
        best = min(candidates, key=lambda c: (c.cost, c.inflight.requests, order[c.worker_id]))
        deepest = max(candidates, key=lambda c: c.matched_blocks)
        if not deepest.matched_blocks:
            reason = "cold"  # nothing cached anywhere: chosen by load
        elif best.matched_blocks >= deepest.matched_blocks and best.affinity:
            reason = "prefix_hit"
        elif any(c.matched_blocks > best.matched_blocks and not c.affinity for c in candidates):
            reason = "bounded_load_spill"
        else:
            reason = "load"  # a deeper prefix elsewhere lost on queue cost
        return self._decide(best, reason)

    @staticmethod
    def _candidate(worker: WorkerState, query: RouteQuery, inflight: InFlight) -> Candidate:
        blocks = query.matched.get(worker.worker_id, 0)
        # vLLM always computes the last prompt token, so a full hit still costs one.
        uncached = max(1, query.prompt_tokens - blocks * query.block_size)
        return Candidate(worker, blocks, uncached, inflight)

    @staticmethod
    def _decide(candidate: Candidate, reason: str) -> Decision:
        return Decision(candidate.worker, reason, candidate.matched_blocks,
                        candidate.uncached_tokens)  # fmt: skip
