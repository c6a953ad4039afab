"""A fleet of sim engines on simulated time: sim/fast_forward.py and sim/fleet_replay.py."""

from __future__ import annotations

import asyncio
import time

import pytest

from loadgen.traces import TraceRequest
from sim.fast_forward import run_fast_forward
from sim.fleet_replay import FleetReplay, FleetSize, Observation
from sim.profile import load_profile

PROFILE = load_profile("llama3-8b-h100")


def test_simulated_time_runs_timers_in_order_without_waiting() -> None:
    async def main() -> tuple[list[tuple[str, float]], float]:
        loop = asyncio.get_running_loop()
        seen: list[tuple[str, float]] = []

        async def after(name: str, delay_s: float) -> None:
            await asyncio.sleep(delay_s)
            seen.append((name, loop.time()))

        await asyncio.gather(after("hour", 3600), after("second", 1), after("now", 0))
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(asyncio.Event().wait(), 10)
        return seen, loop.time()

    started = time.perf_counter()
    seen, end_s = run_fast_forward(main())
    assert seen == [("now", 0.0), ("second", 1.0), ("hour", 3600.0)]
    assert end_s == 3610.0
    assert time.perf_counter() - started < 5  # an hour and ten seconds, without the waiting


def test_a_wait_with_nothing_scheduled_is_a_deadlock_not_a_hang() -> None:
    async def stuck() -> None:
        await asyncio.Event().wait()

    with pytest.raises(RuntimeError, match="no timer is pending"):
        run_fast_forward(stuck())


def requests(count: int, *, every_s: float, input_tokens: int = 2048, output: int = 64,
             shared_blocks: int = 2) -> list[TraceRequest]:  # fmt: skip
    """Prompts of 4 trace blocks, the first ``shared_blocks`` shared by all."""
    return [
        TraceRequest(
            send_at_s=i * every_s,
            input_tokens=input_tokens,
            output_tokens=output,
            hash_ids=(*tuple(range(shared_blocks)), 1000 + 2 * i, 1001 + 2 * i),
        )
        for i in range(count)
    ]


def replay(workload, *, start: FleetSize, controller=None, until_s: float = 60.0):
    fleet = FleetReplay(PROFILE, start=start, start_s=20.0, interval_s=10.0, controller=controller)
    return run_fast_forward(fleet.run(workload, until_s=until_s))


def test_a_fixed_fleet_serves_every_request_with_prefix_hits() -> None:
    result = replay(requests(50, every_s=0.5), start=FleetSize(1, 1))
    assert len(result.served) == 50
    assert all(s.output_tokens == 64 and s.ttft_s > 0 and s.itl_s > 0 for s in result.served)
    # After the first, every prompt finds the shared 1,024 tokens on the one prefill worker.
    assert all(s.cached_tokens == 1024 for s in result.served[1:])
    # Light load: TTFT is about one prefill of the uncached part plus the handoff.
    fastest = min(s.ttft_s for s in result.served)
    assert fastest == pytest.approx(
        PROFILE.prefill_chunk_ms(1024, 1024) / 1000 + PROFILE.transfer_s(2048), rel=0.5
    )
    # Two workers for the whole run, and the run ends when the last answer does.
    assert result.worker_seconds >= 2 * 24.5 and result.changes == 0


def test_a_controller_grows_and_re_roles_the_fleet_and_pays_for_starts() -> None:
    seen: list[Observation] = []
    plans = {10.0: FleetSize(2, 1), 40.0: FleetSize(1, 2)}

    def control(observation: Observation) -> FleetSize | None:
        seen.append(observation)
        return plans.get(observation.now_s)

    result = replay(requests(180, every_s=0.5), start=FleetSize(1, 1), controller=control,
                    until_s=100.0)  # fmt: skip
    assert len(result.served) == 180
    assert [d for _, d in result.decisions] == [FleetSize(2, 1), FleetSize(1, 2)]
    by_time = {round(o.now_s): o for o in seen}
    # Asked for at 10 s, the new prefill worker starts for 20 s: serving from 30 s on.
    assert by_time[20].serving == FleetSize(1, 1) and by_time[20].starting == FleetSize(1, 0)
    assert by_time[30].serving == FleetSize(2, 1)
    # At 40 s a prefill worker drains, then reloads as decode (20 s): 1P+2D serving by 70 s
    # at the latest (the drain ends at the next interval, the reload takes two more).
    assert by_time[50].serving.prefill == 1
    assert by_time[70].serving == FleetSize(1, 2)
    # Three workers paid from 10 s on (the re-roled one through its reload), two before.
    assert result.worker_seconds == pytest.approx(2 * 10 + 3 * (result_end(result) - 10), rel=0.02)
    # Each observation counts what the interval brought.
    assert sum(o.arrivals for o in seen) <= 180
    assert all(w.busy_s >= 0 for o in seen for w in o.workers)


def result_end(result) -> float:
    return max(s.at_s + s.ttft_s + s.itl_s * (s.output_tokens - 1) for s in result.served)
