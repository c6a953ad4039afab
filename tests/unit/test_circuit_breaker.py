"""A worker's circuit breaker: when it opens, how long it stays open, what closes it."""

from __future__ import annotations

from router.fleet.circuit_breaker import CircuitBreaker, CircuitState

OPEN, HALF_OPEN, CLOSED = CircuitState.OPEN, CircuitState.HALF_OPEN, CircuitState.CLOSED


def test_it_opens_after_failures_in_a_row_and_a_success_between_resets_the_count():
    breaker = CircuitBreaker(failures_to_open=3, open_s=5)
    assert not breaker.failed(0) and not breaker.failed(1)
    assert not breaker.succeeded(2)  # closed: only the count resets
    assert not breaker.failed(3) and not breaker.failed(4)
    assert breaker.failed(5) and breaker.state(5) is OPEN
    assert breaker.allows(9.9, probe_passed=True) is False
    assert breaker.trips == 1


def test_an_unreachable_engine_opens_it_at_once():
    breaker = CircuitBreaker(failures_to_open=3, open_s=5)
    assert breaker.failed(0, at_once=True) and breaker.state(4.9) is OPEN


def test_after_the_wait_one_trial_goes_through_only_while_the_probe_passes():
    breaker = CircuitBreaker(open_s=5)
    breaker.failed(0, at_once=True)
    assert breaker.state(5) is HALF_OPEN
    assert not breaker.allows(5, probe_passed=False)
    assert breaker.allows(5, probe_passed=True)
    assert breaker.succeeded(6) and breaker.state(6) is CLOSED


def test_each_failed_trial_doubles_the_wait_up_to_its_cap_and_a_success_resets_it():
    breaker = CircuitBreaker(open_s=5, max_open_s=12)
    breaker.failed(0, at_once=True)
    assert breaker.failed(5) and breaker.open_for_s == 10  # the trial failed
    assert breaker.failed(15) and breaker.open_for_s == 12
    assert breaker.state(26.9) is OPEN and breaker.state(27) is HALF_OPEN
    breaker.succeeded(27)
    assert breaker.failed(30, at_once=True) and breaker.open_for_s == 5


def test_results_that_arrive_while_it_is_open_change_nothing():
    """A request that started before the circuit opened may still end either way."""
    breaker = CircuitBreaker(open_s=5)
    breaker.failed(0, at_once=True)
    assert not breaker.succeeded(1) and breaker.state(1) is OPEN
    assert not breaker.failed(2) and breaker.open_for_s == 5 and breaker.trips == 1
