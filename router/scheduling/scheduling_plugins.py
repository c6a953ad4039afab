"""Routing plug-ins, registered by name: filters, scorers, pickers and P/D deciders.

The shape is llm-d's scheduler: filters narrow or mark the candidates, scorers add
``weight x value`` (in token units) to each candidate's cost, a picker chooses. A
*policy* names its filters and its picker; scorers and weights are configuration
(``uncached_tokens=1,queued_tokens=0.02``), per pool.

Built in:
- filters: ``known_load`` (a worker whose load its agent could not read looks idle:
  use it only when no worker's load is known); ``kv_headroom`` (decode side: drop workers
  whose free KV cannot hold the prompt plus max output, or that preempted requests within
  the cooldown, while another worker can take it); ``ttft_budget`` (first hop: keep the
  workers that end this prefill by its deadline without pushing one under way there past
  its own, else the least late); ``bounded_load`` (consistent hashing
  with bounded loads, decided per candidate: one whose in-flight requests reached
  max(floor, ceil((1 + epsilon) x mean)) keeps its eligibility but loses its prefix
  hits, so a hot prefix spills to the next best worker instead of melting one);
- pickers: ``round_robin``, ``least_loaded`` (fewest in flight, then KV usage),
  ``lowest_cost`` (the scorers' sum; ties to fewer in flight, then rotation);
- policies: ``round_robin``, ``least_loaded``, ``prefix_affinity`` (default);
- P/D deciders: ``always_disaggregate``, ``conditional_disagg`` (prefill on the decode
  worker when the prompt's uncached part there is short and its KV has room).

Everything here is pure and synchronous; ``register_*`` adds a plug-in under a new name.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import TypeVar

from router.fleet.registry import WorkerState
from router.scheduling.load import InFlight


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
    """What the scheduler knows about the request."""

    prompt_tokens: int
    block_size: int
    matched: dict[str, int]  # worker id -> leading blocks it holds


@dataclass(frozen=True, slots=True)
class Decision:
    worker: WorkerState
    # prefix_hit: the deepest cached prefix; bounded_load_spill: that worker was at its
    # bound; load: it lost on queue cost; cold: nothing cached anywhere; or the picker name.
    reason: str
    matched_blocks: int
    uncached_tokens: int


@dataclass(frozen=True, slots=True, kw_only=True)
class PickContext:
    """What filters and pickers are told besides the candidates."""

    query: RouteQuery
    turn: int  # this pool's decision count: rotation breaks ties
    weights: dict[str, float]
    epsilon: float = 0.5
    load_floor: int = 0
    token_floor: int = 0
    # Decode side (None: not checked): the output the KV must hold besides the uncached
    # prompt, and what a worker may promise.
    kv_output_tokens: int | None = None
    kv_overcommit: float = 1.0
    now_s: float = 0.0
    preemption_cooldown_s: float = 0.0
    # First hop only (None: not checked): when this request's prefill must end, and the
    # predicted prefill seconds of a candidate sent it now.
    prefill_deadline_s: float | None = None
    predict_prefill_s: Callable[[Candidate], float] | None = None
    # First hop only: a batch line's (it yields to other work).
    yields: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class DisaggThresholds:
    max_uncached_tokens: int
    max_kv_usage: float


@dataclass(frozen=True, slots=True)
class Policy:
    filters: tuple[str, ...]
    picker: str


P = TypeVar("P")
Filter = Callable[[list[Candidate], PickContext], list[Candidate]]
Scorer = Callable[[Candidate], float]
Picker = Callable[[list[Candidate], PickContext], tuple[Candidate, str]]
Decider = Callable[[Decision, DisaggThresholds], bool]  # True: prefill on the decode worker

FILTERS: dict[str, Filter] = {}
SCORERS: dict[str, Scorer] = {
    "uncached_tokens": lambda c: c.uncached_tokens,
    "queued_tokens": lambda c: c.inflight.tokens,
    "running_requests": lambda c: c.inflight.requests,
    "kv_usage": lambda c: c.worker.load.kv_cache_usage_perc,
    "engine_waiting": lambda c: c.worker.load.num_requests_waiting,
}
PICKERS: dict[str, Picker] = {}
DECIDERS: dict[str, Decider] = {}
POLICIES: dict[str, Policy] = {
    "round_robin": Policy(("known_load", "kv_headroom"), "round_robin"),
    "least_loaded": Policy(("known_load", "kv_headroom"), "least_loaded"),
    "prefix_affinity": Policy(
        ("known_load", "kv_headroom", "spare_for_batch", "ttft_budget", "bounded_load"),
        "lowest_cost",
    ),
}


def _registrar(registry: dict[str, P], name: str) -> Callable[[P], P]:
    def register(plugin: P) -> P:
        if name in registry:  # a second plugin under a taken name would be silently ignored
            raise ValueError(f"a plugin named {name!r} is already registered")
        registry[name] = plugin
        return plugin

    return register


def register_filter(name: str) -> Callable[[Filter], Filter]:
    return _registrar(FILTERS, name)


def register_picker(name: str) -> Callable[[Picker], Picker]:
    return _registrar(PICKERS, name)


def register_decider(name: str) -> Callable[[Decider], Decider]:
    return _registrar(DECIDERS, name)


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


def candidate(worker: WorkerState, query: RouteQuery, inflight: InFlight) -> Candidate:
    blocks = query.matched.get(worker.worker_id, 0)
    # vLLM always computes the last prompt token, so a full hit still costs one.
    uncached = max(1, query.prompt_tokens - blocks * query.block_size)
    return Candidate(worker, blocks, uncached, inflight)


def choose(
    policy_name: str,
    workers: Sequence[WorkerState],
    context: PickContext,
    inflight: Callable[[str], InFlight],
    exclude: Collection[str] = (),
) -> Decision | None:
    """One candidate per usable worker (in id order), then the policy; None: no worker."""
    usable = sorted((w for w in workers if w.worker_id not in exclude),
                    key=lambda w: w.worker_id)  # fmt: skip
    if not usable:
        return None
    candidates = [candidate(w, context.query, inflight(w.worker_id)) for w in usable]
    return run_policy(POLICIES[policy_name], candidates, context)


def run_policy(policy: Policy, candidates: list[Candidate], context: PickContext) -> Decision:
    """Filters in order, then the picker; ``candidates`` must not be empty."""
    for name in policy.filters:
        candidates = FILTERS[name](candidates, context)
    chosen, reason = PICKERS[policy.picker](candidates, context)
    return Decision(chosen.worker, reason, chosen.matched_blocks, chosen.uncached_tokens)


@register_filter("known_load")
def _known_load(candidates: list[Candidate], _: PickContext) -> list[Candidate]:
    return [c for c in candidates if c.worker.load.known] or candidates


def kv_free_tokens(worker: WorkerState, inflight: InFlight, overcommit: float) -> float:
    """KV tokens a worker can still promise, out of its capacity x ``overcommit``: less
    what its engine reports in use, and less what this router has reserved there,
    whichever leaves less. Unknown capacity: unbounded (the engine's own admission decides)."""
    capacity = worker.registration.kv_capacity_tokens
    if not capacity:
        return math.inf
    promised = capacity * overcommit
    in_use = capacity * worker.load.kv_cache_usage_perc
    return promised - max(in_use, inflight.kv_tokens)


def has_kv_room(worker: WorkerState, inflight: InFlight, needed: int, overcommit: float) -> bool:
    """Room for ``needed`` more tokens; an idle worker takes any request (vLLM's
    max_model_len bounds one request, not the router)."""
    return inflight.kv_tokens == 0 or kv_free_tokens(worker, inflight, overcommit) >= needed


def thrashing(worker: WorkerState, now_s: float, cooldown_s: float) -> bool:
    at = worker.preempted_at_s
    return at is not None and now_s - at < cooldown_s


@register_filter("kv_headroom")
def _kv_headroom(candidates: list[Candidate], context: PickContext) -> list[Candidate]:
    output = context.kv_output_tokens
    if output is None:
        return candidates
    room = [
        c for c in candidates
        if has_kv_room(c.worker, c.inflight, c.uncached_tokens + output, context.kv_overcommit)
        and not thrashing(c.worker, context.now_s, context.preemption_cooldown_s)
    ]  # fmt: skip
    return room or candidates


@register_filter("spare_for_batch")
def spare_for_batch(candidates: list[Candidate], context: PickContext) -> list[Candidate]:
    """A batch line goes to a worker prefilling nothing but batch work, where it delays
    no interactive prompt under way (admission lets it in only while one exists), and of
    those to one holding the least batch work: an interactive prompt that lands behind
    batch work then waits for one worker's share of it, not for the whole batch's
    allowance stacked on its best prefix hit. Affinity chooses among equals; none left by
    the time the line is placed: among all."""
    if not context.yields:
        return candidates
    spare = [c for c in candidates if not c.inflight.prefills_other_work]
    if not spare:
        return candidates
    least = min(c.inflight.yielding_tokens for c in spare)
    return [c for c in spare if c.inflight.yielding_tokens == least]


@register_filter("ttft_budget")
def ttft_budget(candidates: list[Candidate], context: PickContext) -> list[Candidate]:
    """Keep the workers that would end this prefill by its deadline without pushing a
    prefill already under way there past its own; none: the one least late.

    An engine prefills what waits in one step, so a request sent to a busy worker also
    delays the ones sent just before it. Affinity still decides among the workers in
    time; it no longer stacks a hot prefix's worker past what it can serve in time while
    another worker could."""
    deadline_s, predict = context.prefill_deadline_s, context.predict_prefill_s
    if deadline_s is None or predict is None or len(candidates) < 2:
        return candidates

    def lateness_s(c: Candidate) -> float:
        earliest = c.inflight.earliest_deadline_s()
        due_s = deadline_s if earliest is None else min(deadline_s, earliest)
        return context.now_s + predict(c) - due_s

    late = {c.worker_id: lateness_s(c) for c in candidates}
    in_time = [c for c in candidates if late[c.worker_id] <= 0]
    return in_time or [min(candidates, key=lambda c: late[c.worker_id])]


@register_filter("bounded_load")
def bounded_load(candidates: list[Candidate], context: PickContext) -> list[Candidate]:
    """Take affinity from candidates at or over their load bound.

    Two bounds, either one takes affinity away:
    - requests: ceil((1+epsilon) x mean in-flight requests), never below ``load_floor``
      (at low load the mean is a fraction and ceil() would allow one request only);
    - tokens (when ``token_floor`` > 0): the candidate's queued uncached tokens plus this
      request's would exceed (1+epsilon) x the mean queued tokens and ``token_floor``.
      A request count treats a 16k-token prompt like a 100-token one; a short prompt
      sent by affinity behind it waits for the whole long prefill.
    """
    epsilon, token_floor = context.epsilon, context.token_floor
    total = sum(c.inflight.requests for c in candidates) + 1  # this request included
    capacity = max(context.load_floor, math.ceil((1 + epsilon) * total / len(candidates)))
    token_capacity = 0.0
    if token_floor > 0:
        queued = sum(c.inflight.tokens for c in candidates)
        mean = (queued + min(c.uncached_tokens for c in candidates)) / len(candidates)
        token_capacity = max(token_floor, (1 + epsilon) * mean)
    for c in candidates:
        over_tokens = token_floor > 0 and c.inflight.tokens + c.uncached_tokens > token_capacity
        if c.inflight.requests >= capacity or over_tokens:
            c.affinity = False
    return candidates


@register_picker("round_robin")
def _round_robin(candidates: list[Candidate], context: PickContext) -> tuple[Candidate, str]:
    return candidates[context.turn % len(candidates)], "round_robin"


@register_picker("least_loaded")
def _least_loaded(candidates: list[Candidate], _: PickContext) -> tuple[Candidate, str]:
    best = min(candidates, key=lambda c: (c.inflight.requests, c.worker.load.kv_cache_usage_perc))
    return best, "least_loaded"


@register_picker("lowest_cost")
def _lowest_cost(candidates: list[Candidate], context: PickContext) -> tuple[Candidate, str]:
    for c in candidates:
        if not c.affinity:
            c.uncached_tokens = context.query.prompt_tokens
        c.cost = sum(w * SCORERS[name](c) for name, w in context.weights.items())
    # Rotation breaks exact ties, so equal workers share load instead of the first
    # one by name taking everything.
    turn, count = context.turn, len(candidates)
    order = {c.worker_id: (i - turn) % count for i, c in enumerate(candidates)}
    best = min(candidates, key=lambda c: (c.cost, c.inflight.requests, order[c.worker_id]))
    return best, _why(best, candidates)


def _why(best: Candidate, candidates: list[Candidate]) -> str:
    deepest = max(candidates, key=lambda c: c.matched_blocks)
    if not deepest.matched_blocks:
        return "cold"  # nothing cached anywhere: chosen by load
    if best.matched_blocks >= deepest.matched_blocks and best.affinity:
        return "prefix_hit"
    if any(c.matched_blocks > best.matched_blocks and not c.affinity for c in candidates):
        return "bounded_load_spill"
    return "load"  # a deeper prefix elsewhere lost on queue cost


@register_decider("always_disaggregate")
def _always(_: Decision, __: DisaggThresholds) -> bool:
    return False


@register_decider("conditional_disagg")
def _conditional(decode: Decision, limits: DisaggThresholds) -> bool:
    """Is the prompt's uncached part short enough to prefill on the decode worker,
    which has the room, rather than ship KV?"""
    return (
        decode.uncached_tokens <= limits.max_uncached_tokens
        and decode.worker.load.kv_cache_usage_perc < limits.max_kv_usage
    )
