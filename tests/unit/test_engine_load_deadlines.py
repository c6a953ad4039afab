"""In-flight prefills' deadlines: the earliest one under way, whatever order they end in."""

from __future__ import annotations

import random

from router.scheduling.load import InFlightLoad


def test_the_earliest_deadline_is_of_the_prefills_still_under_way():
    load = InFlightLoad()
    late = load.begin("w", 100, deadline_s=5.0)
    soon = load.begin("w", 100, deadline_s=2.0)
    load.begin("w", 100)  # no deadline: not counted
    assert load.of("w").earliest_deadline_s() == 2.0
    soon.prefilled()  # its first token came: no longer waiting on the prefill
    assert load.of("w").earliest_deadline_s() == 5.0
    late.end()
    assert load.of("w").earliest_deadline_s() is None
    assert load.of("idle").earliest_deadline_s() is None


def test_many_prefills_ending_out_of_order_leave_the_right_minimum_and_no_residue():
    rng = random.Random(5)
    load = InFlightLoad()
    open_tickets = {}
    for i in range(2000):
        deadline = rng.uniform(0, 100)
        open_tickets[i] = (deadline, load.begin("w", 10, deadline_s=deadline))
        if rng.random() < 0.6:
            gone = rng.choice(list(open_tickets))
            open_tickets.pop(gone)[1].end()
        expected = min((d for d, _ in open_tickets.values()), default=None)
        assert load.of("w").earliest_deadline_s() == expected
        # Departed entries are dropped lazily, but never pile up: the heap is compacted.
        assert len(load.of("w")._deadlines) <= 2 * len(open_tickets) + 65
    for _, ticket in open_tickets.values():
        ticket.end()
    assert load.of("w").earliest_deadline_s() is None and load.of("w").tokens == 0


def test_batch_lines_prefill_tokens_are_counted_apart_until_prefilled_or_ended():
    load = InFlightLoad()
    line = load.begin("w", 300, yields=True)
    other = load.begin("w", 100)
    assert (load.of("w").tokens, load.of("w").yielding_tokens) == (400, 300)
    line.prefilled()
    assert (load.of("w").tokens, load.of("w").yielding_tokens) == (100, 0)
    line.end()
    other.end()
    again = load.begin("w", 50, yields=True)
    again.end()
    assert (load.of("w").tokens, load.of("w").yielding_tokens, load.of("w").requests) == (0, 0, 0)
    assert load.snapshot()["w"].yielding_tokens == 0
