"""The connection gate: how many connections are held in all, and still opening from one address."""

import pytest

from asr_server.transport.gate import RESERVED_DESCRIPTORS, ConnectionGate, GateOptions, Refusal, Ticket, connections_for


def test_past_the_servers_limit_a_connection_is_refused_until_one_closes():
    gate = ConnectionGate(GateOptions(max_connections=2, max_opening_per_address=0))
    first, second = gate.enter("a", 0.0), gate.enter("b", 0.0)
    assert isinstance(first, Ticket) and isinstance(second, Ticket) and gate.open == 2
    refused = gate.enter("c", 0.0)
    assert isinstance(refused, Refusal) and refused.reason == "connections" and "--max-connections" in refused.message
    first.close()
    first.close()  # twice is once
    assert gate.open == 1
    assert isinstance(gate.enter("c", 0.0), Ticket)


def test_connections_from_one_address_that_said_nothing_are_bounded_and_others_are_not_held_by_them():
    gate = ConnectionGate(GateOptions(max_connections=0, max_opening_per_address=2))
    idle = [gate.enter("10.0.0.9", 0.0) for _ in range(2)]
    refused = gate.enter("10.0.0.9", 0.0)
    assert isinstance(refused, Refusal) and refused.reason == "address" and "--max-opening-per-address" in refused.message
    assert isinstance(gate.enter("10.0.0.7", 0.0), Ticket)  # another address is not held up
    idle[0].opened()  # its request arrived: it no longer counts as opening, but still as open
    assert gate.open == 3
    assert isinstance(gate.enter("10.0.0.9", 0.0), Ticket)
    idle[1].close()  # closed while still opening: its address's count goes down too
    assert isinstance(gate.enter("10.0.0.9", 0.0), Ticket)
    assert isinstance(gate.enter("10.0.0.9", 0.0), Refusal)


def test_an_address_with_nothing_opening_is_forgotten():
    gate = ConnectionGate(GateOptions(max_opening_per_address=3))
    tickets = [gate.enter(f"10.0.0.{i}", 0.0) for i in range(100)]
    for t in tickets:
        assert isinstance(t, Ticket)
        t.opened()
        t.close()
    assert gate.opening == {} and gate.open == 0


def test_refusals_are_logged_once_in_a_while_with_how_many_were_not():
    gate = ConnectionGate(GateOptions(max_connections=1))
    gate.enter("a", 0.0)
    first = gate.enter("a", 0.0)
    assert isinstance(first, Refusal) and first.log and first.unlogged == 1
    quiet = [gate.enter("a", t) for t in (1.0, 2.0, 9.9)]
    assert not any(r.log for r in quiet)
    later = gate.enter("a", 10.0)
    assert later.log and later.unlogged == 4  # three left out, and this one


def test_zero_means_no_limit_and_negative_limits_are_refused():
    gate = ConnectionGate(GateOptions(max_connections=0, max_opening_per_address=0))
    assert all(isinstance(gate.enter("a", 0.0), Ticket) for _ in range(10000))
    with pytest.raises(ValueError):
        GateOptions(max_connections=-1)
    with pytest.raises(ValueError):
        GateOptions(max_opening_per_address=-1)


def test_the_automatic_limit_leaves_descriptors_for_the_rest_within_bounds():
    assert connections_for(1024) == 1024 - RESERVED_DESCRIPTORS
    assert connections_for(100) == 64  # a tiny limit still serves some
    assert connections_for(1 << 20) == 16384  # memory, not descriptors, bounds it then


def test_refused_connections_held_to_read_their_request_are_bounded():
    from asr_server.transport.gate import MAX_LINGERING

    gate = ConnectionGate(GateOptions(max_connections=1))
    gate.enter("a", 0.0)
    refusals = [gate.enter("a", 0.0) for _ in range(MAX_LINGERING + 5)]
    assert [r.linger for r in refusals] == [True] * MAX_LINGERING + [False] * 5  # the rest are closed at once
    refusals[0].close()
    refusals[0].close()  # twice is once
    refusals[-1].close()  # one closed at once held nothing
    assert gate.lingering == MAX_LINGERING - 1 and gate.enter("a", 0.0).linger
