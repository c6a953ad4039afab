"""What a P/D fleet of a given size would do under a given load: the planner's model.

A model an SRE can check by hand, on the speeds the fleet itself was measured at:

- **Prefill** is a queue with ``P`` servers (M/G/P). Request ``i``'s service time is
  ``S_i = prefill_s_per_request + n x (prefill_s_per_token + per_token_per_ktoken x n /
  1000)``, ``n = uncached_i = input_i x (1 - prefix_hit)`` (the square is attention: a
  measured curve has it, a sim profile not), for every (input, output) pair in the
  recent window: the distribution, not its average, so a few long prompts count as long.
  The wait is Erlang C with the Allen-Cunneen correction for the spread of the service
  times and of the gaps between arrivals:
  ``P(wait > t) = C(P, a) x exp(-t (P - a) / E[S] x 2 / (ca^2 + cs^2))``, ``a = rate x E[S]``
  (``ca^2`` is 1 for Poisson arrivals; between clumps, where requests come in clumps).
  A clump's requests also wait for each other: a round of mean service for every ``P``
  of its own ahead of them (``Load.rounds_behind``).
- **Batch lines** (``batch``) are the lowest class: they take prefill capacity and delay
  a request only by the residual of a batch prefill under way; they share the decode
  batches. A fleet must keep their pace (``Prediction.batch_keeps_pace``).
- **Decode** runs one batch per worker; a step costs
  ``decode_step_s + B x (decode_s_per_seq + decode_s_per_ktoken x context / 1000)``
  with ``B`` the sequences on the worker. Little's law closes the loop: ``B = rate x
  E[output] x ITL / D``, so ``ITL = decode_step_s / (1 - rate x E[output] x c / D)``.
  Batch sizes vary (Poisson), so ITL is judged at the batch's 99th percentile, and the
  KV a batch holds must fit (``kv_capacity_tokens``) or the engine would preempt.
- **TTFT** of request ``i`` is its wait, its prefill, the KV handoff and one decode
  step (a measured handoff holds that step, and grows with the decode batch).
  Attainment is the fraction of the window's requests predicted under the TTFT SLO,
  times the fraction of decode steps under the ITL SLO.
- **Cost** is workers x $/hour, by role (prefill and decode may run on different kinds);
  $/1M tokens divides it by the tokens (in and out) the load brings per hour.

Invariants: pure (no clock, no I/O); more workers of a role never predict worse
attainment; a load past a pool's capacity predicts 0 attainment, never a negative wait.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from itertools import pairwise


@dataclass(frozen=True, slots=True, kw_only=True)
class Slo:
    ttft_s: float
    itl_s: float
    attainment: float = 0.95  # the fraction of requests that must meet both


def parse_slo(spec: str) -> Slo:
    """``ttft=SECONDS,itl=SECONDS[,attainment=FRACTION]``; ValueError saying what is wrong."""
    fields = dict(item.split("=", 1) for item in spec.split(",") if "=" in item)
    unknown = set(fields) - {"ttft", "itl", "attainment"}
    if unknown or not {"ttft", "itl"} <= set(fields):
        raise ValueError(
            "an SLO is ttft=SECONDS,itl=SECONDS[,attainment=FRACTION], e.g. ttft=2,itl=0.04"
        )
    try:
        slo = Slo(ttft_s=float(fields["ttft"]), itl_s=float(fields["itl"]),
                  attainment=float(fields.get("attainment", 0.95)))  # fmt: skip
    except ValueError:
        raise ValueError(f"SLO values must be numbers: {spec!r}") from None
    if slo.ttft_s <= 0 or slo.itl_s <= 0 or not 0 < slo.attainment <= 1:
        raise ValueError("SLO: ttft and itl above 0, attainment in (0, 1]")
    return slo


@dataclass(frozen=True, slots=True, kw_only=True)
class Speeds:
    """The fleet's measured speeds (per worker)."""

    prefill_s_per_request: float
    prefill_s_per_token: float
    decode_step_s: float
    decode_s_per_seq: float
    decode_s_per_ktoken: float
    handoff_s: float  # per request, plus handoff_s_per_ktoken of its prompt
    handoff_s_per_ktoken: float
    kv_capacity_tokens: int
    max_num_seqs: int
    # Measured by the router's TTFT predictor (``with_measured``); 0 in a sim profile.
    prefill_s_per_token_per_ktoken: float = 0.0  # attention: n^2 / 1000 tokens
    handoff_s_per_request: float = 0.0  # per request in flight on the decode worker
    # A measured handoff (prefill end to first token) holds the decode's first step.
    handoff_includes_first_step: bool = False

    def prefill_s(self, uncached_tokens: float) -> float:
        n = uncached_tokens
        return self.prefill_s_per_request + n * (
            self.prefill_s_per_token + self.prefill_s_per_token_per_ktoken * n / 1000
        )


def with_measured(
    speeds: Speeds, *, prefill: Sequence[float] | None, handoff: Sequence[float] | None
) -> Speeds:
    """``speeds`` with the TTFT predictor's measured curves in place of the prior's: a
    prefill alone (intercept, per token, per token per 1000 tokens) and the handoff
    (intercept, per request in flight on the decode worker, per prompt token pulled)."""
    if prefill is not None:
        speeds = replace(speeds, prefill_s_per_request=prefill[0],
                         prefill_s_per_token=prefill[1],
                         prefill_s_per_token_per_ktoken=prefill[2])  # fmt: skip
    if handoff is not None:
        speeds = replace(speeds, handoff_s=handoff[0], handoff_s_per_request=handoff[1],
                         handoff_s_per_ktoken=handoff[2] * 1000,
                         handoff_includes_first_step=True)  # fmt: skip
    return speeds


def speeds_from_profile(profile: Mapping[str, object]) -> Speeds:
    """A sim timing profile's speeds (its JSON fields, sim/profiles/*.json), as the
    planner's prior before it has fitted any: the what-if and the benchmarks plan on them."""

    def number(name: str) -> float:
        return float(profile[name])  # type: ignore[arg-type]

    return Speeds(
        prefill_s_per_request=number("floor_ms") / 1000,
        prefill_s_per_token=number("prefill_ms_per_token") / 1000,
        decode_step_s=number("floor_ms") / 1000,
        decode_s_per_seq=number("decode_ms_per_seq") / 1000,
        decode_s_per_ktoken=number("decode_ms_per_kv_ktoken") / 1000,
        handoff_s=number("transfer_overhead_ms") / 1000,
        handoff_s_per_ktoken=number("kv_bytes_per_token") / number("transfer_gbytes_per_s") / 1e6,
        kv_capacity_tokens=int(number("kv_capacity_tokens")),
        max_num_seqs=int(number("max_num_seqs")),
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class Load:
    rate_per_s: float
    lengths: tuple[tuple[int, int], ...]  # (input, output) tokens of recent requests
    prefix_hit: float  # the fraction of input tokens found cached
    # The squared coefficient of variation of the gaps between arrivals (between clumps,
    # where requests come in clumps): 1 for Poisson, more for bursts.
    arrival_cv2: float = 1.0
    # The sizes of the clumps the requests came in (requests arriving at once, as a
    # client's burst or a trace's rounded timestamps): empty when each came alone.
    clump_sizes: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if not self.lengths:
            raise ValueError("a load needs at least one (input, output) sample")
        if not 0 <= self.prefix_hit <= 1:
            raise ValueError("prefix_hit is a fraction of input tokens, in [0, 1]")
        if self.arrival_cv2 <= 0:
            raise ValueError("arrival_cv2 must be positive (1 for Poisson arrivals)")
        if any(size < 1 for size in self.clump_sizes):
            raise ValueError("a clump holds at least one request")

    @property
    def tokens_per_request(self) -> float:
        return sum(i + o for i, o in self.lengths) / len(self.lengths)

    def scaled(self, factor: float) -> Load:
        return replace(self, rate_per_s=self.rate_per_s * factor)

    def rounds_behind(self, servers: int) -> dict[int, float]:
        """The share of requests that find ``r`` rounds of their own clump ahead of them
        on ``servers`` (the clump's first ``servers`` none, the next ``servers`` one...)."""
        if not self.clump_sizes:
            return {0: 1.0}
        shares: dict[int, float] = defaultdict(float)
        total = sum(self.clump_sizes)
        for size in self.clump_sizes:
            for position in range(size):
                shares[position // servers] += 1 / total
        return dict(shares)


def arrival_cv2(times_s: Sequence[float]) -> float:
    """The squared coefficient of variation of the gaps between sorted arrival times (1
    with fewer than three arrivals: nothing to tell a clump from Poisson by)."""
    gaps = [b - a for a, b in pairwise(times_s)]
    if len(gaps) < 2:
        return 1.0
    mean = sum(gaps) / len(gaps)
    if mean <= 0:
        return 1.0
    return max(1e-3, sum((g - mean) ** 2 for g in gaps) / len(gaps) / mean**2)


def arrival_clumps(
    times_s: Sequence[float], within_s: float = 1e-3
) -> tuple[tuple[int, ...], float]:
    """Sorted arrival times as clumps (arrivals within ``within_s`` of the clump's first):
    their sizes, and the ``arrival_cv2`` of the gaps between clumps."""
    starts: list[float] = []
    sizes: list[int] = []
    for t in times_s:
        if starts and t - starts[-1] <= within_s:
            sizes[-1] += 1
        else:
            starts.append(t)
            sizes.append(1)
    return tuple(sizes), arrival_cv2(starts)


@dataclass(frozen=True, slots=True, kw_only=True)
class Fleet:
    prefill: int
    decode: int

    @property
    def workers(self) -> int:
        return self.prefill + self.decode

    def __str__(self) -> str:
        return f"{self.prefill}P+{self.decode}D"


@dataclass(frozen=True, slots=True)
class Prices:
    """$/hour of a worker by role: the pools may run on different kinds."""

    prefill: float
    decode: float

    @classmethod
    def by_role(cls, prefill: float, decode: float | None = None) -> Prices:
        """``decode`` None: a decode worker costs what a prefill worker does."""
        return cls(prefill, prefill if decode is None else decode)

    def of(self, fleet: Fleet) -> float:
        return fleet.prefill * self.prefill + fleet.decode * self.decode


@dataclass(frozen=True, slots=True, kw_only=True)
class Prediction:
    fleet: Fleet
    prefill_utilization: float
    ttft_attainment: float
    itl_s: float  # at the 99th percentile batch
    decode_batch: float  # mean sequences per decode worker
    itl_attainment: float
    usd_per_hour: float
    usd_per_million_tokens: float
    batch_keeps_pace: bool = True  # the batch backlog's lines meet their deadlines

    @property
    def attainment(self) -> float:
        return self.ttft_attainment * self.itl_attainment

    def meets(self, slo: Slo) -> bool:
        return self.attainment >= slo.attainment and self.batch_keeps_pace


def erlang_c(servers: int, offered: float) -> float:
    """The probability an arrival waits in M/M/``servers`` at ``offered`` Erlangs (< servers),
    through Erlang B's recursion (stable for thousands of servers)."""
    blocking = 1.0
    for k in range(1, servers + 1):
        blocking = offered * blocking / (k + offered * blocking)
    return servers * blocking / (servers - offered * (1 - blocking))


def _services(load: Load, speeds: Speeds) -> list[float]:
    return [speeds.prefill_s(i * (1 - load.prefix_hit)) for i, _ in load.lengths]


def _batch_residual(fleet: Fleet, batch: Load | None, speeds: Speeds) -> tuple[float, float]:
    """(the batch's offered prefill load in Erlangs, the mean delay it adds to a request of
    a higher class): an engine serving by priority still finishes the batch prefill under
    way, so an arrival waits its residual (E[S^2] / 2E[S]) when it lands on one."""
    if batch is None or batch.rate_per_s <= 0:
        return 0.0, 0.0
    services = _services(batch, speeds)
    mean = sum(services) / len(services)
    offered = batch.rate_per_s * mean
    residual = sum(s * s for s in services) / len(services) / (2 * mean)
    return offered, min(1.0, offered / fleet.prefill) * residual


def _prefill(
    fleet: Fleet, load: Load, speeds: Speeds, slo: Slo, after_s: float, batch: Load | None
) -> tuple[float, float]:
    """(utilization, batch lines included; the share of requests in time). ``after_s``:
    what every request waits past its prefill and its KV's own transfer (the handoff's
    fixed part, the decode's first step). Batch lines are the lowest class: they take
    capacity, but delay a request only by the batch prefill it may find under way."""
    services = _services(load, speeds)
    mean = sum(services) / len(services)
    offered = load.rate_per_s * mean
    batch_offered, batch_delay_s = _batch_residual(fleet, batch, speeds)
    utilization = (offered + batch_offered) / fleet.prefill
    if offered >= fleet.prefill:
        return utilization, 0.0
    after_s += batch_delay_s
    spread = sum((s - mean) ** 2 for s in services) / len(services) / mean**2
    waits = erlang_c(fleet.prefill, offered)
    decay = (fleet.prefill - offered) / mean * 2 / (load.arrival_cv2 + spread)
    # A clump's requests also wait for each other: P of them start, the next P wait a
    # round of service, and so on, whatever queue the clump found.
    rounds = load.rounds_behind(fleet.prefill)
    met = 0.0
    for service, (prompt, _) in zip(services, load.lengths, strict=True):
        room = slo.ttft_s - service - speeds.handoff_s_per_ktoken * prompt / 1000 - after_s
        for behind, share in rounds.items():
            left = room - behind * mean
            met += 0.0 if left < 0 else share * (1 - waits * math.exp(-decay * left))
    return utilization, met / len(services)


def _poisson_cdf(mean: float, k: int) -> float:
    if k < 0:
        return 0.0
    term = total = math.exp(-mean)
    for j in range(1, k + 1):
        term *= mean / j
        total += term
    return min(1.0, total)


def _poisson_quantile(mean: float, q: float) -> int:
    k = math.floor(mean)
    while _poisson_cdf(mean, k) < q:
        k += 1
    return k


@dataclass(frozen=True, slots=True)
class _DecodeView:
    batch: float  # mean sequences per worker
    p99_itl_s: float
    itl_attainment: float
    kv_wait: float  # the fraction of requests that wait for a decode slot (KV or seqs)


def _decode(fleet: Fleet, loads: Sequence[Load], speeds: Speeds, slo: Slo) -> _DecodeView:
    """Every load's sequences share the decode batches (priority does not split a batch)."""
    # Output tokens per second, and the context each decode step of theirs carries. A
    # sequence stays in the batch for as many steps as it has output tokens, so the batch
    # holds long answers more often than the arrivals do: weigh contexts by output.
    tokens_per_s = sum(x.rate_per_s * sum(o for _, o in x.lengths) / len(x.lengths)
                       for x in loads)  # fmt: skip
    weighted = sum(x.rate_per_s * sum((i + o / 2) * o for i, o in x.lengths) / len(x.lengths)
                   for x in loads)  # fmt: skip
    context = weighted / tokens_per_s if tokens_per_s > 0 else 0.0
    per_seq = speeds.decode_s_per_seq + speeds.decode_s_per_ktoken * context / 1000
    busy = tokens_per_s * per_seq / fleet.decode
    if busy >= 1:
        return _DecodeView(math.inf, math.inf, 0.0, 1.0)
    itl = speeds.decode_step_s / (1 - busy)
    in_flight = tokens_per_s * itl
    slots = min(speeds.max_num_seqs, math.floor(speeds.kv_capacity_tokens / max(context, 1.0)))
    if in_flight >= slots * fleet.decode:
        return _DecodeView(in_flight / fleet.decode, math.inf, 0.0, 1.0)
    batch = in_flight / fleet.decode
    within_slo = math.floor((slo.itl_s - speeds.decode_step_s) / per_seq)
    return _DecodeView(
        batch=batch,
        p99_itl_s=speeds.decode_step_s + min(slots, _poisson_quantile(batch, 0.99)) * per_seq,
        itl_attainment=1.0 if within_slo >= slots else _poisson_cdf(batch, within_slo),
        kv_wait=erlang_c(slots * fleet.decode, in_flight),
    )


def predict(
    fleet: Fleet, load: Load, speeds: Speeds, slo: Slo, price: float | Prices,
    batch: Load | None = None,
) -> Prediction:  # fmt: skip
    """``price``: $/hour of a worker, or ``Prices`` by role. ``load``: interactive
    traffic, judged against the SLO; ``batch``: batch lines at
    the pace their deadlines need, served at the lowest priority (no SLO of their own,
    but the fleet must keep that pace: ``Prediction.batch_keeps_pace``)."""
    if fleet.prefill < 1 or fleet.decode < 1:
        raise ValueError("a P/D fleet needs at least one prefill and one decode worker")
    decode = _decode(fleet, [load] if batch is None else [load, batch], speeds, slo)
    overflow = math.isinf(decode.p99_itl_s)
    after_s = speeds.handoff_s
    if speeds.handoff_includes_first_step:
        after_s += speeds.handoff_s_per_request * (1 + (0.0 if overflow else decode.batch))
    else:
        after_s += speeds.decode_step_s if overflow else decode.p99_itl_s
    utilization, ttft_attainment = _prefill(fleet, load, speeds, slo, after_s, batch)
    usd = (price if isinstance(price, Prices) else Prices.by_role(price)).of(fleet)
    tokens_per_hour = sum(x.rate_per_s * 3600 * x.tokens_per_request
                          for x in (load, batch) if x is not None)  # fmt: skip
    return Prediction(
        batch_keeps_pace=batch is None or (utilization < 1 and not overflow),
        fleet=fleet,
        prefill_utilization=utilization,
        # A request waiting for a decode slot waits for one to finish: seconds, not ms.
        ttft_attainment=ttft_attainment * (1 - decode.kv_wait),
        itl_s=decode.p99_itl_s,
        decode_batch=decode.batch,
        itl_attainment=decode.itl_attainment,
        usd_per_hour=usd,
        usd_per_million_tokens=usd / tokens_per_hour * 1e6 if tokens_per_hour else math.inf,
    )


def fleets(min_workers: int, max_workers: int) -> Sequence[Fleet]:
    """Every P/D split of every size in the bounds (at least one worker of each role)."""
    return [
        Fleet(prefill=p, decode=total - p)
        for total in range(max(2, min_workers), max_workers + 1)
        for p in range(1, total)
    ]
