"""A whole P/D fleet of sim engines replaying a workload on simulated time.

The engines are the sim's own (``SimEngine``, stepping as their profile says); what
the router and the agents do around them is played here, in its simplest form:
- a request goes to the serving prefill worker with the fewest uncached tokens plus
  queued prefill tokens (prefix affinity with load), then to the serving decode worker
  with the fewest sequences; the KV handoff takes the profile's transfer time;
- every ``interval_s`` a controller sees what happened (``Observation``) and may ask
  for another fleet size. Workers it adds start serving after ``start_s``; a worker
  that changes role drains, then reloads for ``start_s``; a removed worker drains and
  goes. A worker costs from the moment it is asked for until it is gone.

It runs on ``sim.fast_forward``: an hour of traffic takes seconds to a few minutes.
Nothing here knows what a controller decides with; the planner, or a peer's
autoscaler, is handed in.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from contracts.block_hashing import BlockHash, block_hashes
from sim.engine import SimEngine, SimRequest
from sim.fast_forward import run_fast_forward
from sim.profile import TimingProfile

TRACE_BLOCK_TOKENS = 512  # one trace hash_id is this many prompt tokens (unscaled)


class Arrival(Protocol):
    """A request of a Mooncake-format trace (loadgen.traces.TraceRequest is one)."""

    @property
    def send_at_s(self) -> float: ...
    @property
    def input_tokens(self) -> int: ...
    @property
    def output_tokens(self) -> int: ...
    @property
    def hash_ids(self) -> tuple[int, ...]: ...  # one per TRACE_BLOCK_TOKENS, prefix-chained


@dataclass(frozen=True, slots=True)
class FleetSize:
    prefill: int
    decode: int


@dataclass(slots=True)
class Served:
    at_s: float
    input_tokens: int
    output_tokens: int
    cached_tokens: int
    ttft_s: float
    itl_s: float  # mean over the request's tokens; 0 for a single token
    prefill_worker: str
    decode_worker: str


@dataclass(slots=True)
class WorkerSample:
    """One worker's engine over the last interval."""

    role: str
    busy_s: float
    finished: int  # requests the engine finished (a prefill worker: prefills)
    computed_tokens: int
    generated_tokens: int
    steps: int
    running: int
    waiting: int
    kv_usage: float
    preemptions: int


@dataclass(slots=True)
class Observation:
    now_s: float
    interval_s: float
    serving: FleetSize
    starting: FleetSize
    arrivals: int
    served: list[Served]
    workers: list[WorkerSample]


Controller = Callable[[Observation], FleetSize | None]


def _fast_hash(value: object) -> bytes:
    # Block identity is all a replay needs; sha256 over 12k-token prompts would be
    # most of the run's time.
    return hash(value).to_bytes(8, "little", signed=True)


_ROOT = BlockHash(b"fleet-replay-root")


@dataclass(eq=False)
class _Worker:
    name: str
    role: str
    engine: SimEngine
    ready_at_s: float
    asked_at_s: float
    draining: bool = False
    next_role: str | None = None
    task: asyncio.Task | None = None
    last: tuple[float, ...] = (0.0, 0, 0, 0, 0, 0)

    def idle(self) -> bool:
        e = self.engine
        return not e.running and not e.waiting and not e.leases


@dataclass
class ReplayResult:
    served: list[Served]
    worker_seconds: float
    changes: int
    fleet_timeline: list[tuple[float, int, int]] = field(default_factory=list)  # (t, P, D)
    decisions: list[tuple[float, FleetSize]] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class SloOutcome:
    """How a replay's requests fared against TTFT and ITL bounds."""

    requests: int
    ttft_met: int
    itl_met: int
    met: int  # both
    tokens: int  # in and out
    worker_hours: float

    def share(self, count: int) -> float:
        return count / self.requests if self.requests else 0.0


def slo_outcome(result: ReplayResult, *, ttft_s: float, itl_s: float) -> SloOutcome:
    served = result.served
    ttft = [s.ttft_s <= ttft_s for s in served]
    itl = [s.itl_s <= itl_s for s in served]
    return SloOutcome(
        requests=len(served), ttft_met=sum(ttft), itl_met=sum(itl),
        met=sum(a and b for a, b in zip(ttft, itl, strict=True)),
        tokens=sum(s.input_tokens + s.output_tokens for s in served),
        worker_hours=result.worker_seconds / 3600,
    )  # fmt: skip


def replay(
    profile: TimingProfile, arrivals: Sequence[Arrival], *, start: FleetSize, until_s: float,
    start_s: float = 60.0, interval_s: float = 30.0, controller: Controller | None = None,
    block_tokens: int = TRACE_BLOCK_TOKENS,
) -> ReplayResult:  # fmt: skip
    """Run one replay to its end on simulated time (its own event loop)."""
    fleet = FleetReplay(profile, start=start, start_s=start_s, interval_s=interval_s,
                        controller=controller, block_tokens=block_tokens)  # fmt: skip
    return run_fast_forward(fleet.run(arrivals, until_s=until_s))


class FleetReplay:
    def __init__(
        self,
        profile: TimingProfile,
        *,
        start: FleetSize,
        start_s: float,
        interval_s: float,
        controller: Controller | None = None,
        block_tokens: int = TRACE_BLOCK_TOKENS,
    ) -> None:
        self._profile = profile
        self._block_tokens = block_tokens  # a trace read with length_scale L: 512 / L
        self._start_s = start_s
        self._interval_s = interval_s
        self._controller = controller
        self._names = itertools.count()
        self._ids = itertools.count()
        self._workers: list[_Worker] = []
        self._retired_s = 0.0
        self._retired_tasks: list[asyncio.Task] = []
        self._served: list[Served] = []
        self._interval_served: list[Served] = []
        self._arrivals = 0
        self._result = ReplayResult(served=self._served, worker_seconds=0.0, changes=0)
        self._start = start

    def _clock(self) -> float:
        return asyncio.get_running_loop().time()

    def _add(self, role: str, ready_in_s: float) -> None:
        engine = SimEngine(profile=self._profile, hash_fn=_fast_hash,
                           root_hash=_ROOT, lease_s=60.0, clock=self._clock)  # fmt: skip
        now = self._clock()
        worker = _Worker(f"{role}-{next(self._names)}", role, engine, now + ready_in_s, now)
        worker.task = asyncio.create_task(engine.run())
        self._workers.append(worker)

    def _serving(self, role: str) -> list[_Worker]:
        now = self._clock()
        return [w for w in self._workers
                if w.role == role and not w.draining and w.ready_at_s <= now]  # fmt: skip

    def _count(self, ready: bool) -> FleetSize:
        now = self._clock()
        counted = [w for w in self._workers
                   if not w.draining and (w.ready_at_s <= now) == ready]  # fmt: skip
        return FleetSize(sum(w.role == "prefill" for w in counted),
                         sum(w.role == "decode" for w in counted))  # fmt: skip

    async def run(self, arrivals: Sequence[Arrival], *, until_s: float) -> ReplayResult:
        for role, count in (("prefill", self._start.prefill), ("decode", self._start.decode)):
            for _ in range(count):
                self._add(role, 0.0)
        control = asyncio.create_task(self._control_loop(until_s))
        requests: list[asyncio.Task] = []
        for arrival in arrivals:
            if arrival.send_at_s >= until_s:
                break
            await asyncio.sleep(max(0.0, arrival.send_at_s - self._clock()))
            self._arrivals += 1
            requests.append(asyncio.create_task(self._serve(arrival)))
        await asyncio.gather(*requests)
        now = self._clock()
        self._result.worker_seconds = self._retired_s + sum(now - w.asked_at_s
                                                            for w in self._workers)  # fmt: skip
        tasks = [control, *(w.task for w in self._workers), *self._retired_tasks]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        return self._result

    async def _control_loop(self, until_s: float) -> None:
        while True:
            await asyncio.sleep(self._interval_s)
            self._reap()
            now = self._clock()
            serving = self._count(ready=True)
            self._result.fleet_timeline.append((now, serving.prefill, serving.decode))
            if self._controller is None:
                continue
            observation = Observation(
                now_s=now, interval_s=self._interval_s, serving=serving,
                starting=self._count(ready=False), arrivals=self._arrivals,
                served=self._interval_served, workers=self._samples(),
            )  # fmt: skip
            self._arrivals, self._interval_served = 0, []
            wanted = self._controller(observation)
            if wanted is not None and wanted != self._target():
                self._result.changes += 1
                self._result.decisions.append((now, wanted))
                self._resize(wanted)

    def _samples(self) -> list[WorkerSample]:
        samples = []
        for w in self._workers:
            if w.draining or w.ready_at_s > self._clock():
                continue
            s = w.engine.stats
            computed = s.prompt_tokens_by_source["local_compute"]
            finished = sum(s.finished.values())
            now = (s.busy_s, computed, s.generation_tokens, s.steps, s.preemptions, finished)
            d = [a - b for a, b in zip(now, w.last, strict=True)]
            w.last = now
            pool = w.engine.pool
            samples.append(WorkerSample(
                role=w.role, busy_s=d[0], computed_tokens=int(d[1]), generated_tokens=int(d[2]),
                steps=int(d[3]), preemptions=int(d[4]), finished=int(d[5]),
                running=len(w.engine.running),
                waiting=len(w.engine.waiting), kv_usage=pool.usage,
            ))  # fmt: skip
        return samples

    def _target(self) -> FleetSize:
        active = [w for w in self._workers if not w.draining or w.next_role]
        roles = [w.next_role or w.role for w in active]
        return FleetSize(roles.count("prefill"), roles.count("decode"))

    def _resize(self, wanted: FleetSize) -> None:
        """Re-role surplus into deficit first (no new worker to pay for), then add or drain."""
        target = self._target()
        gap = {"prefill": wanted.prefill - target.prefill, "decode": wanted.decode - target.decode}
        for surplus, deficit in (("prefill", "decode"), ("decode", "prefill")):
            while gap[surplus] < 0 and gap[deficit] > 0:
                worker = self._least_busy(surplus)
                worker.draining, worker.next_role = True, deficit
                gap[surplus] += 1
                gap[deficit] -= 1
        for role, missing in gap.items():
            for _ in range(max(0, missing)):
                self._add(role, self._start_s)
            for _ in range(max(0, -missing)):
                self._least_busy(role).draining = True

    def _least_busy(self, role: str) -> _Worker:
        candidates = [w for w in self._workers if w.role == role and not w.draining]
        return min(candidates, key=lambda w: (len(w.engine.running) + len(w.engine.waiting),
                                              -w.ready_at_s))  # fmt: skip

    def _reap(self) -> None:
        """Drained workers go, or come back in their next role after a reload."""
        now = self._clock()
        for worker in [w for w in self._workers if w.draining and w.idle()]:
            self._workers.remove(worker)
            worker.task.cancel()
            self._retired_tasks.append(worker.task)
            if worker.next_role is None:
                self._retired_s += now - worker.asked_at_s
                continue
            self._add(worker.next_role, self._start_s)
            self._workers[-1].asked_at_s = worker.asked_at_s  # paid for all along

    def _prompt(self, arrival: Arrival) -> list[int]:
        tokens: list[int] = []
        for block_id in arrival.hash_ids:
            base = block_id * self._block_tokens
            tokens.extend(range(base, base + self._block_tokens))
        return tokens[: arrival.input_tokens]

    def _pick_prefill(self, hashes: list[BlockHash]) -> _Worker | None:
        best, best_cost = None, None
        for w in self._serving("prefill"):
            cached = w.engine.pool.cached_prefix_blocks(hashes) * self._profile.block_size_tokens
            queued = sum(len(r.prompt_token_ids) - r.computed_tokens
                         for r in itertools.chain(w.engine.waiting, w.engine.running))  # fmt: skip
            cost = len(hashes) * self._profile.block_size_tokens - cached + queued
            if best_cost is None or cost < best_cost:
                best, best_cost = w, cost
        return best

    def _pick_decode(self) -> _Worker | None:
        serving = self._serving("decode")
        return min(serving, key=lambda w: len(w.engine.running) + len(w.engine.waiting),
                   default=None)  # fmt: skip

    async def _wait_for(self, pick: Callable[[], _Worker | None]) -> _Worker:
        # Every worker of the role is starting: poll (on simulated time, nearly free).
        while (worker := pick()) is None:  # noqa: ASYNC110
            await asyncio.sleep(0.05)
        return worker

    async def _serve(self, arrival: Arrival) -> None:
        started = self._clock()
        prompt = self._prompt(arrival)
        request_id = str(next(self._ids))
        hashes = block_hashes(prompt, self._profile.block_size_tokens, _fast_hash, _ROOT)
        prefill_worker = await self._wait_for(lambda: self._pick_prefill(hashes))
        cached = prefill_worker.engine.pool.cached_prefix_blocks(hashes)
        ask = SimRequest(request_id, prompt, [0], hold_kv=True)
        prefill_worker.engine.add(ask)
        while await ask.tokens.get() is not None:
            pass
        decode_worker = await self._wait_for(self._pick_decode)
        await asyncio.sleep(self._profile.transfer_s(arrival.input_tokens))
        prefill_worker.engine.release_lease(request_id)
        answer = SimRequest(request_id, prompt, list(range(max(1, arrival.output_tokens))),
                            kv_pulled=True)  # fmt: skip
        decode_worker.engine.add(answer)
        await answer.tokens.get()
        first_s = self._clock()
        tokens = 1
        while await answer.tokens.get() is not None:
            tokens += 1
        last_s = self._clock()
        served = Served(
            at_s=started, input_tokens=arrival.input_tokens, output_tokens=tokens,
            cached_tokens=cached * self._profile.block_size_tokens, ttft_s=first_s - started,
            itl_s=(last_s - first_s) / (tokens - 1) if tokens > 1 else 0.0,
            prefill_worker=prefill_worker.name, decode_worker=decode_worker.name,
        )  # fmt: skip
        self._served.append(served)
        self._interval_served.append(served)
