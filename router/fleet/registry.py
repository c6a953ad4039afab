"""The in-memory worker registry: who exists, who is ready, with what load.

Invariant: ``eligible()`` returns a worker only if all hold at ``now``:
- its agent's latest heartbeat said ready (weights loaded, not draining);
- that heartbeat is younger than ``heartbeat_timeout_s``;
- the router's own health probe has not failed ``failures_to_eject`` times in a
  row since (``healthy``);
- its circuit breaker lets traffic through (``circuit_breaker.py``): failed requests
  open it, and it lets a trial through again only after a wait and a passing probe.

Pure state: no I/O, and the clock is a parameter, so it is unit-testable.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from contracts.workers import WorkerHeartbeat, WorkerLoad, WorkerRegistration, WorkerRole
from router.fleet.circuit_breaker import CircuitBreaker


class RegistryFull(RuntimeError):
    """The registry is at ``max_workers``."""


@dataclass(slots=True)
class WorkerState:
    registration: WorkerRegistration
    last_seen_s: float
    ready: bool = True
    draining: bool = False
    healthy: bool = True
    probe_failures: int = 0  # consecutive failed health probes
    load: WorkerLoad = field(default_factory=WorkerLoad)
    breaker: CircuitBreaker = field(default_factory=CircuitBreaker)
    # When a heartbeat last showed the engine's preemption count rising (KV ran out).
    preempted_at_s: float | None = None
    # Versions of its model in its node's cache, as its last heartbeat reported.
    pulled_versions: frozenset[str] = frozenset()

    @property
    def worker_id(self) -> str:
        return self.registration.worker_id

    @property
    def role(self) -> WorkerRole:
        return self.registration.role

    @property
    def engine_url(self) -> str:
        return self.registration.engine_url


@dataclass(frozen=True, slots=True)
class Pools:
    """The eligible workers of one model, by role, at one instant."""

    prefill: list[WorkerState]
    decode: list[WorkerState]
    colocated: list[WorkerState]
    # Set when a P/D model lost one pool and the other serves whole requests (in
    # ``colocated``): the role of the pool that was left.
    degraded: WorkerRole | None = None
    embed: list[WorkerState] = field(default_factory=list)  # an embedding model's workers

    @staticmethod
    def of(
        prefill: list[WorkerState],
        decode: list[WorkerState],
        colocated: list[WorkerState],
        *,
        serve_degraded: bool,
        embed: list[WorkerState] | None = None,
    ) -> Pools:
        """A model's pools. With no ready prefill worker the decode workers compute the
        prompt themselves, and with no ready decode worker the prefill workers decode
        (vLLM's P/D engines answer a request without kv_transfer_params as plain ones):
        the pool left is then served as a colocated one, unless ``serve_degraded`` is off
        or a colocated worker serves the model."""
        if serve_degraded and not colocated and bool(prefill) != bool(decode):
            left = WorkerRole.DECODE if decode else WorkerRole.PREFILL
            return Pools([], [], decode or prefill, degraded=left, embed=embed or [])
        return Pools(prefill, decode, colocated, embed=embed or [])

    @property
    def disaggregated(self) -> bool:
        return bool(self.prefill and self.decode)

    @property
    def first_hop(self) -> list[WorkerState]:
        """The workers that would compute the prompt: its tokenizer and context limit."""
        return self.prefill if self.disaggregated else self.colocated


class WorkerRegistry:
    def __init__(
        self,
        *,
        heartbeat_timeout_s: float,
        forget_after_s: float,
        max_workers: int,
        serve_degraded: bool = True,
        circuit_failures_to_open: int = 3,
        circuit_open_s: float = 5.0,
        circuit_max_open_s: float = 60.0,
    ) -> None:
        self._serve_degraded = serve_degraded
        self._circuit = (circuit_failures_to_open, circuit_open_s, circuit_max_open_s)
        self._heartbeat_timeout_s = heartbeat_timeout_s
        self._forget_after_s = forget_after_s
        self._max_workers = max_workers
        self._workers: dict[str, WorkerState] = {}
        # Workers an operator or the pool controller holds out of rotation; kept across
        # re-registration (a drained worker's engine restart must not put it back).
        self._held: set[str] = set()

    def __repr__(self) -> str:
        return f"WorkerRegistry(workers={len(self._workers)})"

    def register(self, registration: WorkerRegistration, now_s: float) -> WorkerState:
        """Add or replace a worker. A new incarnation starts healthy and ready, its
        circuit closed."""
        if registration.worker_id not in self._workers and len(self._workers) >= self._max_workers:
            raise RegistryFull(f"registry holds {self._max_workers} workers (max_workers)")
        breaker = CircuitBreaker(*self._circuit)
        state = WorkerState(registration=registration, last_seen_s=now_s, breaker=breaker)
        self._workers[registration.worker_id] = state
        return state

    def get(self, worker_id: str) -> WorkerState | None:
        return self._workers.get(worker_id)

    def heartbeat(self, heartbeat: WorkerHeartbeat, now_s: float) -> bool:
        """Apply a heartbeat; False if the worker is unknown (it must re-register)."""
        state = self._workers.get(heartbeat.worker_id)
        if state is None:
            return False
        if heartbeat.incarnation > state.registration.incarnation:
            return False  # a newer engine than the one registered: re-register it
        if heartbeat.incarnation < state.registration.incarnation:
            return True  # a late beat from a previous engine: ignore it
        state.last_seen_s = now_s
        state.ready = heartbeat.ready
        state.draining = heartbeat.draining
        if heartbeat.load.num_preemptions > state.load.num_preemptions:
            state.preempted_at_s = now_s
        state.load = heartbeat.load
        state.pulled_versions = frozenset(heartbeat.pulled_versions)
        return True

    def deregister(self, worker_id: str) -> bool:
        """Remove a worker at once (an SRE retiring it); False if it was unknown."""
        self._held.discard(worker_id)
        return self._workers.pop(worker_id, None) is not None

    def request_failed(self, worker_id: str, now_s: float, *, at_once: bool = False) -> bool:
        """A request to the worker failed (``at_once``: it could not be reached); True if
        that opened its circuit."""
        state = self._workers.get(worker_id)
        return state is not None and state.breaker.failed(now_s, at_once=at_once)

    def request_succeeded(self, worker_id: str, now_s: float) -> bool:
        """A request to the worker succeeded; True if that closed its circuit."""
        state = self._workers.get(worker_id)
        return state is not None and state.breaker.succeeded(now_s)

    def record_probe(self, worker_id: str, passed: bool, failures_to_eject: int) -> bool:
        """Apply one health-probe result; True if it changed the worker's health."""
        state = self._workers.get(worker_id)
        if state is None:
            return False
        was_healthy = state.healthy
        if passed:
            state.probe_failures = 0
            state.healthy = True
        else:
            state.probe_failures += 1
            if state.probe_failures >= failures_to_eject:
                state.healthy = False
        return state.healthy != was_healthy

    def hold(self, worker_id: str) -> None:
        """No new work for this worker until ``release``; in-flight work finishes."""
        self._held.add(worker_id)

    def release(self, worker_id: str) -> None:
        self._held.discard(worker_id)

    def is_held(self, worker_id: str) -> bool:
        return worker_id in self._held

    def held(self) -> set[str]:
        return set(self._held)

    def set_held(self, worker_ids: set[str]) -> None:
        """Adopt the shared view of which workers are held (another replica changed it)."""
        self._held = set(worker_ids)

    def is_eligible(self, state: WorkerState, now_s: float) -> bool:
        return (
            state.ready
            and state.worker_id not in self._held
            and state.healthy
            and not state.draining
            and state.last_seen_s >= now_s - self._heartbeat_timeout_s
            and state.breaker.allows(now_s, probe_passed=state.probe_failures == 0)
        )

    def eligible(
        self,
        model: str,
        role: WorkerRole,
        now_s: float,
        version: str | frozenset[str] | None = None,
    ) -> list[WorkerState]:
        """``version`` None: the model's workers whatever version they serve; a set: those
        serving one of its versions."""
        versions = frozenset((version,)) if isinstance(version, str) else version
        return [
            w
            for w in self._workers.values()
            if w.role is role
            and w.registration.model == model
            and self.is_eligible(w, now_s)
            and (versions is None or w.registration.model_version in versions)
        ]

    def pools(self, model: str, now_s: float, version: str | frozenset[str] | None = None) -> Pools:
        return Pools.of(
            *(self.eligible(model, role, now_s, version) for role in
              (WorkerRole.PREFILL, WorkerRole.DECODE, WorkerRole.COLOCATED)),
            serve_degraded=self._serve_degraded,
            embed=self.eligible(model, WorkerRole.EMBED, now_s, version),
        )  # fmt: skip

    def embeds(self, model: str) -> bool:
        """Whether ``model`` is an embedding model: its registered workers, ready or not,
        are embedding workers (a model is served by one kind of engine)."""
        roles = {w.role for w in self._workers.values() if w.registration.model == model}
        return WorkerRole.EMBED in roles

    def models(self) -> list[str]:
        """Every model some registered worker serves, ready or not (a request for one gets
        a 503 while it cannot be served, a 404 only when nothing serves it)."""
        return sorted({w.registration.model for w in self._workers.values()})

    def servable_models(self, now_s: float) -> list[str]:
        """The models some path can serve at ``now_s``: a ready prefill and a ready decode
        worker, or a ready colocated one (what ``/v1/models`` lists)."""
        ready = {(w.registration.model, w.role) for w in self._workers.values()
                 if self.is_eligible(w, now_s)}  # fmt: skip
        if self._serve_degraded:  # any ready worker serves its model
            return sorted({model for model, _ in ready})
        return sorted(
            model for model in {model for model, _ in ready}
            if (model, WorkerRole.COLOCATED) in ready or (model, WorkerRole.EMBED) in ready
            or {(model, WorkerRole.PREFILL), (model, WorkerRole.DECODE)} <= ready
        )  # fmt: skip

    def workers(self) -> list[WorkerState]:
        return list(self._workers.values())

    def forget_silent(self, now_s: float) -> list[str]:
        """Drop workers silent for ``forget_after_s``; returns their ids."""
        deadline = now_s - self._forget_after_s
        gone = [wid for wid, w in self._workers.items() if w.last_seen_s < deadline]
        for wid in gone:
            del self._workers[wid]
            self._held.discard(wid)
        return gone
