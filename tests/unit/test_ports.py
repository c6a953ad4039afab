"""Local ports come from below the kernel's ephemeral range, so the kernel never hands
one of them to another process's bind(0) or outgoing connection."""

from __future__ import annotations

import socket

from localrun.ports import _ephemeral_start, free_ports


def test_ports_are_distinct_bindable_and_below_the_ephemeral_range():
    ports = free_ports(20)
    assert len(set(ports)) == 20
    assert all(10_000 <= port < _ephemeral_start() for port in ports)
    for port in ports:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))


def test_a_port_in_use_is_not_offered(monkeypatch):
    (port,) = free_ports(1)
    with socket.socket() as held:
        held.bind(("127.0.0.1", port))
        held.listen()
        # The chooser draws the held port first, then others: it must skip the held one.
        draws = iter([port, port, port + 1 if port + 1 < _ephemeral_start() else port - 1])
        monkeypatch.setattr("random.SystemRandom.randrange", lambda self, a, b: next(draws))
        assert free_ports(1) != [port]


def test_two_choosers_at_once_get_disjoint_ports():
    """Free a moment ago is not enough: two launchers starting together (parallel test
    workers) must not both be handed a port neither has bound yet. Without reservations
    two draws of 200 from ~22k ports overlap most of the time."""
    first, second = free_ports(200), free_ports(200)
    assert not set(first) & set(second)
