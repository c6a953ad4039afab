"""Admission's forecast, on one prefill and one decode worker with a known prefill line:
what it refuses at once, and why (no engines: the pieces admission reads, on a fake clock)."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest

from contracts.workers import WorkerLoad, WorkerRegistration, WorkerRole
from router.admission.admit import Admission
from router.admission.tenants import Tenant, TenantPolicy
from router.admission.ttft_predictor import TTFTPredictor
from router.errors import Overloaded, RequestTooLarge
from router.fleet.registry import Pools, WorkerState
from router.observability.metrics import RouterMetrics
from router.prepare.prepare import Endpoint, PreparedRequest, PromptHead
from router.prepare.prompt_blocks import BlockHashers, PromptBlocks
from router.scheduling.load import InFlightLoad
from router.scheduling.prefix_tracking import PrefixTracker
from router.scheduling.routing_stats import RoutingStats
from router.scheduling.schedule import Scheduler
from router.settings import AdmissionSettings, IndexSettings, RoutingSettings
from router.state.memory import MemoryState

RATE = 1000.0  # tokens per second, no fixed cost: the prefill probe's line


def worker(worker_id: str, role: WorkerRole) -> WorkerState:
    registration = WorkerRegistration(
        worker_id=worker_id, role=role, model="m", engine_url="http://e", max_model_len=100_000
    )
    return WorkerState(registration, 0.0, load=WorkerLoad(kv_cache_capacity_tokens=10**9))


class Rig:
    def __init__(self, *, probed: bool = True, **settings: object) -> None:
        self.now = 0.0
        clock = lambda: self.now  # noqa: E731
        self.load = InFlightLoad()
        self.hashers = BlockHashers(memo_entries=1000)
        self.predictor = TTFTPredictor(prior_tokens_per_s=RATE)
        if probed:  # the agent's probe on the fresh engine: the same line, but measured
            self.predictor.seed("p", [(500, 500 / RATE), (2000, 2000 / RATE)])
        stats = RoutingStats(hotspot_window_requests=100)
        self.prefixes = prefixes = PrefixTracker(IndexSettings(), clock=clock,
                                                 on_event=lambda *_: None)  # fmt: skip
        scheduler = Scheduler(RoutingSettings(), load=self.load, prefixes=prefixes, stats=stats,
                              predictor=self.predictor, clock=clock)  # fmt: skip
        self.metrics = metrics = RouterMetrics(window_s=60, recent_ttft_samples=100,
                                               clock=clock)  # fmt: skip
        self.admission = Admission(
            AdmissionSettings(**{"ttft_slo_s": 2.0, "ttft_slo_headroom": 1.0, **settings}),
            state=MemoryState(clock=clock), scheduler=scheduler, load=self.load,
            predictor=self.predictor, metrics=metrics, clock=clock,
        )  # fmt: skip
        self.pools = Pools(prefill=[worker("p", WorkerRole.PREFILL)],
                           decode=[worker("d", WorkerRole.DECODE)], colocated=[])  # fmt: skip

    def request(self, *, slo_s: float | None = None, yields: bool = False) -> PreparedRequest:
        return PreparedRequest(
            endpoint=Endpoint.COMPLETIONS, body={"model": "m", "prompt": "x", "max_tokens": 1},
            model="m", stream=False, arrived_s=self.now, requested_model="m", ttft_slo_s=slo_s,
            yields=yields, priority=2 if yields else 1,  # batch lines are the lowest class
        )  # fmt: skip

    def blocks(self, ids: list[int]) -> PromptBlocks:
        return self.hashers.blocks(ids, block_size=16, algorithm="sha256", seed=None)

    def head(self, *, rest_chars: int) -> PromptHead:
        """A long prompt's first 2048 characters, measured: 512 tokens."""
        return PromptHead(self.blocks(list(range(512))), tokens=512, chars=2048,
                          rest_chars=rest_chars)  # fmt: skip

    def refusals_timed(self, reason: str, measured: str) -> float | None:
        return self.metrics.prometheus.get_sample_value(
            "pdserve_admission_rejection_seconds_count",
            {"model": "m", "reason": reason, "measured": measured},
        )  # fmt: skip

    def admit(self, tokens: int, *, slo_s: float | None = None, yields: bool = False):
        return asyncio.run(
            self.admission.admit(
                self.request(slo_s=slo_s, yields=yields), self.pools, PromptBlocks.unknown(tokens)
            )
        )


def test_a_batch_line_yields_to_waiting_or_prefilling_work_and_holds_little_of_the_queue():
    # Queue limit 1000 tokens; batch_prefill_share 0.05 of the 2 s target at 1000 tokens/s:
    # batch lines together hold at most 100 tokens of it (one line per spare worker always may).
    rig = Rig(prefill_queue_tokens_per_worker=1000)

    async def scene() -> None:
        admit = rig.admission.admit
        batch = lambda: rig.request(yields=True)  # noqa: E731
        first = await admit(batch(), rig.pools, PromptBlocks.unknown(300))  # idle pool
        line = asyncio.create_task(admit(batch(), rig.pools, PromptBlocks.unknown(300)))
        for _ in range(20):
            await asyncio.sleep(0)
        assert not line.done()  # 300 + 300 of batch work is over its 100
        first.grant.release()
        (await asyncio.wait_for(line, 1)).grant.release()
        prefilling = rig.load.begin("p", 300)  # other work under way on the only worker
        with pytest.raises(Overloaded) as refused:
            await admit(batch(), rig.pools, PromptBlocks.unknown(50))
        assert refused.value.code == "batch_yields" and refused.value.retry_after_s == 1
        prefilling.end()
        full = await admit(rig.request(), rig.pools, PromptBlocks.unknown(900))
        waiter = asyncio.create_task(admit(rig.request(), rig.pools, PromptBlocks.unknown(200)))
        for _ in range(20):  # no clock involved: until it waits in the queue
            await asyncio.sleep(0)
        with pytest.raises(Overloaded) as refused:  # an interactive request waits
            await admit(batch(), rig.pools, PromptBlocks.unknown(50))
        assert refused.value.code == "batch_yields"
        full.grant.release()
        (await asyncio.wait_for(waiter, 1)).grant.release()
        (await admit(batch(), rig.pools, PromptBlocks.unknown(50))).grant.release()

    asyncio.run(scene())


def test_each_spare_prefill_worker_may_hold_one_batch_line_however_small_the_share():
    # Two workers, 200 tokens of share between them: one 300-token line per worker that
    # prefills no other work goes at once (the scheduler puts each on the spare worker
    # with the least batch work); a third waits. With other work on one worker, one line.
    rig = Rig(prefill_queue_tokens_per_worker=1000)
    pools = replace(rig.pools, prefill=[*rig.pools.prefill, worker("q", WorkerRole.PREFILL)])

    async def waits(line: asyncio.Task) -> bool:
        for _ in range(20):
            await asyncio.sleep(0)
        return not line.done()

    async def scene() -> None:
        line = lambda: rig.admission.admit(  # noqa: E731
            rig.request(yields=True), pools, PromptBlocks.unknown(300)
        )
        first, second = await line(), await asyncio.wait_for(line(), 1)
        third = asyncio.create_task(line())
        assert await waits(third)
        first.grant.release()
        (await asyncio.wait_for(third, 1)).grant.release()
        second.grant.release()
        other = rig.load.begin("q", 100)  # an interactive prefill on q
        first = await line()
        second = asyncio.create_task(line())
        assert await waits(second)
        first.grant.release()
        (await asyncio.wait_for(second, 1)).grant.release()
        other.end()

    asyncio.run(scene())


def test_batch_lines_yield_for_a_second_after_other_traffic_is_refused_for_room():
    rig = Rig()
    ahead = rig.load.begin("p", 1900)  # 1.9 s of prefill ahead: a 300-token prompt is late
    with pytest.raises(Overloaded, match="predicted time to first token"):
        rig.admit(300)
    ahead.end()
    with pytest.raises(Overloaded) as refused:
        rig.admit(50, yields=True)
    assert refused.value.code == "batch_yields"
    rig.now += 1.0
    rig.admit(50, yields=True).grant.release()


def test_a_request_that_would_make_an_admitted_one_late_is_refused_though_in_time_itself():
    rig = Rig()
    first = rig.admit(300, slo_s=0.5)  # due 0.5 s after arrival: 0.3 s of prefill
    rig.load.begin("p", 300, deadline_s=first.request.prefill_deadline_s)
    # 100 more tokens end both at 0.4 s: in time. 300 more end both at 0.6 s: the first late.
    assert rig.admit(100).request.predicted_ttft_s == pytest.approx(0.4)
    with pytest.raises(Overloaded) as refused:
        rig.admit(300)
    assert refused.value.code == "ttft_slo_unattainable"
    assert "already admitted" in str(refused.value)


def test_a_prompt_over_the_queue_limit_behind_a_busy_pool_is_refused_at_once_not_queued():
    # The queue holds 1000 tokens; 900 are admitted. A 1500-token prompt can only start once
    # the pool is empty: 0.9 s, then 1.5 s of its own, over the 2 s SLO. Forecast from the
    # engines' queue alone (0.9 + 1.5 = 2.4 s here too) the case is clear; with less
    # admitted than queued on the worker, only the grant's wait shows it.
    rig = Rig(prefill_queue_tokens_per_worker=1000)
    held = rig.admit(900)
    rig.load.begin("p", 200)  # the engine has 200 of those tokens still to prefill
    with pytest.raises(Overloaded) as refused:
        rig.admit(1500)
    assert refused.value.code == "ttft_slo_unattainable"
    held.grant.release()
    assert rig.admit(1500).request.predicted_ttft_s == pytest.approx(1.7)


def test_the_grants_wait_alone_is_a_queue_to_refuse_for():
    # 900 tokens granted (on their way to the engine, not there yet): the prefill worker
    # and the decode are idle, yet the 1500-token prompt waits for the grant.
    rig = Rig(prefill_queue_tokens_per_worker=1000)
    rig.admit(900)
    with pytest.raises(Overloaded) as refused:
        rig.admit(1500)
    assert refused.value.code == "ttft_slo_unattainable"


def test_a_tenant_within_its_share_waits_in_the_queue_instead_of_paying_for_anothers_burst():
    rig = Rig(prefill_queue_tokens_per_worker=1000)

    def admit(tenant: str, tokens: int):
        request = replace(rig.request(), tenant=Tenant(tenant, TenantPolicy()))
        return rig.admission.admit(request, rig.pools, PromptBlocks.unknown(tokens))

    async def scenario() -> None:
        held = await admit("noisy", 900)  # 900 of the queue's 1000 tokens
        rig.load.begin("p", 1600)  # and the engine's queue: 1.6 s
        # 1.6 s queued + 0.5 s of its own is over the 2 s SLO: noisy is refused at once ...
        with pytest.raises(Overloaded) as refused:
            await admit("noisy", 500)
        assert refused.value.code == "ttft_slo_unattainable"
        # ... while polite, within its share (500 of 1000), waits for the queue's grant,
        # where it goes first, rather than paying for noisy's burst.
        polite = asyncio.create_task(admit("polite", 500))
        await asyncio.sleep(0.05)
        assert not polite.done()
        held.grant.release()
        assert (await polite).request.tenant.name == "polite"

    asyncio.run(scenario())


def test_a_long_prompt_whose_cached_prefix_ends_in_its_head_is_refused_before_the_rest():
    rig = Rig()
    rig.load.begin("p", 1000)  # 1 s queued: alone, not a reason to refuse
    # 512 tokens in 2048 characters, then 4000 more: 1000 tokens at the head's density.
    head = rig.head(rest_chars=4000)
    # Nothing of it is cached: at least 512 + 1000 tokens, 1.5 s, after the queue's 1 s.
    with pytest.raises(Overloaded) as refused:
        rig.admission.precheck_head(rig.request(), rig.pools, head, rest_share=1.0)
    assert refused.value.code == "ttft_slo_unattainable"
    assert "at least" in str(refused.value)
    assert rig.refusals_timed("ttft_slo_unattainable", "head") == 1
    # Were the rest a quarter as dense (250 tokens), it might be in time: no refusal.
    rig.admission.precheck_head(rig.request(), rig.pools, head, rest_share=0.25)
    # The worker holds the whole head: how much more it holds is unknown, so no refusal.
    rig.prefixes.record("p", head.blocks)
    rig.admission.precheck_head(rig.request(), rig.pools, head, rest_share=1.0)


def test_a_prompt_that_could_not_be_refused_even_all_uncached_is_not_measured_in_part():
    rig = Rig()
    rig.load.begin("p", 1000)  # 1 s queued
    assert not rig.admission.could_refuse(rig.request(), rig.pools, tokens_at_most=900)
    assert rig.admission.could_refuse(rig.request(), rig.pools, tokens_at_most=1500)
    opened = Rig(ttft_slo_s=3600.0)  # admission's SLO opened, as benchmarks.router_cpu runs
    opened.load.begin("p", 1000)
    assert not opened.admission.could_refuse(opened.request(), opened.pools, 10**6)


def test_a_prompt_that_would_miss_the_slo_alone_is_refused_for_good_when_that_is_measured():
    """1800 tokens at 1000 tok/s, plus a handoff that grows with the KV pulled: 1.8 s of
    prefill and 0.36 s of handoff on idle workers, over the 2 s SLO. By default it is a
    413 that no retry would change, not a 429. Served (late, as fast as it can be) with
    ``refuse_prompts_past_slo`` off, or while the prefill worker's speed is only the
    prior: a cold pool does not refuse for good on a guess."""
    strict, lenient, unprobed = Rig(), Rig(refuse_prompts_past_slo=False), Rig(probed=False)
    for rig in (strict, lenient, unprobed):
        for requests, pulled in ((1, 100), (2, 1000), (1, 2000), (3, 400)):
            rig.predictor.observe_handoff("d", requests, pulled, 0.01 * requests + pulled / 5000)
    for rig in (lenient, unprobed):
        assert rig.admit(1800).request.predicted_ttft_s == pytest.approx(1.8 + 0.01 + 0.36)
    with pytest.raises(RequestTooLarge) as refused:
        strict.admit(1800)
    assert refused.value.status == 413 and refused.value.code == "prompt_exceeds_ttft_slo"
    assert refused.value.param == "prompt" and not refused.value.headers()
    assert "2.17s" in str(refused.value)
    # A shorter prompt fits alone: the handoff's share shrinks with it.
    assert strict.admit(1500).request.predicted_ttft_s == pytest.approx(1.5 + 0.01 + 0.3)


def test_a_long_prompt_may_wait_up_to_the_margin_past_its_own_time_within_the_slo():
    rig = Rig(ttft_slo_headroom=0.8)  # SLO 2 s, target 1.6 s, margin 0.4 s
    rig.load.begin("p", 100)  # 0.1 s queued: a busy fleet always has some wait
    # 1700 tokens take 1.7 s alone, past the target: the wait keeps it within the SLO.
    admitted = rig.admit(1700)
    assert admitted.request.predicted_ttft_s == pytest.approx(1.8, abs=0.05)
    admitted.grant.release()
    # 1300 tokens (1.3 s alone) may wait up to the margin: to 1.7 s, not the SLO.
    rig.load.begin("p", 300)  # 0.4 s queued in all
    with pytest.raises(Overloaded):
        rig.admit(1300)
    rig.load.begin("p", 200)  # 0.6 s queued: past the margin of a 1.7-s prompt too
    with pytest.raises(Overloaded) as refused:
        rig.admit(1700)
    assert refused.value.code == "ttft_slo_unattainable"


def test_a_slo_even_an_empty_prompt_misses_is_the_same_413_before_tokenizing_busy_or_idle():
    """A handoff of 10 ms at the least, and a client's SLO of 5 ms: no prompt can meet it.
    The check before tokenizing says so, whether the pool is busy or idle, rather than a
    429 (retry) while busy and a 413 once idle."""
    rigs = Rig(), Rig(refuse_prompts_past_slo=False)
    for rig in rigs:
        for requests, pulled in ((1, 100), (2, 1000), (1, 2000), (3, 400)):
            rig.predictor.observe_handoff("d", requests, pulled, 0.01 * requests + pulled / 5000)
    strict, lenient = rigs
    for busy in (False, True):
        queued = strict.load.begin("p", 100) if busy else None
        with pytest.raises(RequestTooLarge) as refused:
            strict.admission.precheck(strict.request(slo_s=0.005), strict.pools)
        assert refused.value.code == "prompt_exceeds_ttft_slo"
        assert "at least 0.01s to the first token even on idle workers" in str(refused.value)
        assert "over the 0.005s time-to-first-token SLO" in str(refused.value)
        if queued is not None:
            queued.end()
    lenient.load.begin("p", 100)
    with pytest.raises(Overloaded) as refused:
        lenient.admission.precheck(lenient.request(slo_s=0.005), lenient.pools)
    assert refused.value.code == "prompt_needs_idle_pool"


def test_a_prompt_that_misses_the_slo_even_alone_keeps_the_target():
    rig = Rig(ttft_slo_headroom=0.8, refuse_prompts_past_slo=False)
    queued = rig.load.begin("p", 100)  # 0.1 s queued
    with pytest.raises(Overloaded) as refused:  # 2.5 s alone: a wait is no help to it
        rig.admit(2500)
    assert refused.value.code == "prompt_needs_idle_pool"
    assert "served only when the pool is idle" in str(refused.value)
    queued.end()
    assert rig.admit(2500).request.predicted_ttft_s == pytest.approx(2.5, abs=0.05)  # idle


def test_admitted_work_a_long_prompt_would_wait_for_lets_its_head_be_measured():
    rig = Rig(refuse_prompts_past_slo=False)
    assert not rig.admission.precheck(rig.request(), rig.pools)  # idle: nothing to refuse for
    held = rig.admit(300)  # granted, its prefill not done: a long prompt waits for it
    assert rig.admission.precheck(rig.request(), rig.pools)
    held.grant.release()
    assert not rig.admission.precheck(rig.request(), rig.pools)


def test_on_an_idle_pool_a_head_is_measured_only_if_the_prompt_could_miss_the_slo_alone():
    rig = Rig()  # SLO 2 s at 1000 tokens/s, the speed measured by the probe
    assert rig.admission.precheck(rig.request(), rig.pools)  # idle, but the head may tell
    assert not rig.admission.could_refuse(rig.request(), rig.pools, tokens_at_most=1500)
    assert rig.admission.could_refuse(rig.request(), rig.pools, tokens_at_most=2500)
    unprobed = Rig(probed=False)  # on the prior alone, nothing is refused for good
    assert not unprobed.admission.precheck(unprobed.request(), unprobed.pools)
    assert not unprobed.admission.could_refuse(unprobed.request(), unprobed.pools, 2500)
    # Its head proves it: 512 tokens in 2048 characters, and 8000 more at that density.
    with pytest.raises(RequestTooLarge) as refused:
        rig.admission.precheck_head(rig.request(), rig.pools, rig.head(rest_chars=8000),
                                    rest_share=1.0)  # fmt: skip
    assert refused.value.code == "prompt_exceeds_ttft_slo"
    assert rig.refusals_timed("prompt_exceeds_ttft_slo", "head") == 1


def test_a_prompt_slower_than_it_could_be_because_its_prefix_holder_is_busy_is_refused():
    """p holds the first 1600 of 2100 tokens (0.5 s alone there) but has 1.8 s queued; q,
    idle, lacks them all (2.1 s). Nothing is queued where it would go, yet it would miss
    the 2 s SLO only because of p's queue: a 429 to retry, not an admission (it was
    admitted, forecast over the SLO, and came in late in admission run 28)."""
    rig = Rig()
    rig.predictor.seed("q", [(500, 500 / RATE), (2000, 2000 / RATE)])
    pools = Pools(prefill=[*rig.pools.prefill, worker("q", WorkerRole.PREFILL)],
                  decode=rig.pools.decode, colocated=[])  # fmt: skip
    ids = list(range(2100))
    blocks = rig.blocks(ids)
    rig.prefixes.record("p", rig.blocks(ids[:1600]))
    queued = rig.load.begin("p", 1800)
    with pytest.raises(Overloaded) as refused:
        asyncio.run(rig.admission.admit(rig.request(), pools, blocks))
    assert refused.value.code == "ttft_slo_unattainable"
    queued.end()  # p is free again: 0.5 s there
    admitted = asyncio.run(rig.admission.admit(rig.request(), pools, blocks))
    assert admitted.request.predicted_ttft_s == pytest.approx(0.5, abs=0.01)


@pytest.mark.parametrize("take_back", [True, False])
def test_a_prompt_is_forecast_past_the_batch_prefills_it_takes_back(take_back):
    # 1.5 s of batch prefill at the only prefill worker. A 300-token prompt sent there takes
    # it back (the engine aborts it): 0.3 s. Without take-back it waits: 1.8 s.
    rig = Rig(batch_prefill_take_back=take_back)
    with rig.load.begin("p", 1500, yields=True):
        admitted = rig.admit(300)
        assert admitted.request.predicted_ttft_s == pytest.approx(0.3 if take_back else 1.8)
        admitted.grant.release()
        with rig.load.begin("p", 100):
            assert rig.admit(300).request.predicted_ttft_s == pytest.approx(
                0.4 if take_back else 1.9
            )
