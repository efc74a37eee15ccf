"""Entries held for an access recheck (server/relay/holds.py): the bounds, as logic; the
relay's use of them is in test_subscriptions.py."""

from __future__ import annotations

from svc_server.relay.holds import Holds
from svc_server.relay.store import Entry


def _entry(channel: str, seq: int, size: int, handshake: bool = False) -> Entry:
    return Entry(channel, seq, b"s", handshake, 1, b"m" * size, 0.0)


def test_a_hold_releases_a_commits_worth_at_a_time_and_counts_its_bytes() -> None:
    holds = Holds(channel_bytes=100, relay_bytes=1000)
    hold = holds.start("a")
    for seq, handshake in ((2, False), (3, True), (4, False)):
        holds.add(hold, _entry("a", seq, 10, handshake))
    assert holds.bytes == hold.bytes == 30
    assert [e.seq for e in holds.release(hold)] == [2, 3]
    assert [e.seq for e in holds.release(hold)] == [4]
    assert holds.bytes == 0 and not hold.dropped
    holds.end("a")
    assert holds.get("a") is None


def test_past_a_channels_bound_its_held_entries_are_dropped_and_its_commits_remembered() -> None:
    holds = Holds(channel_bytes=25, relay_bytes=1000)
    hold = holds.start("a")
    holds.add(hold, _entry("a", 2, 40))  # one entry is always held, however large
    assert hold.entries and not hold.dropped
    holds.add(hold, _entry("a", 3, 10, handshake=True))
    assert hold.dropped and not hold.entries and holds.bytes == 0
    assert hold.take_dropped_handshake() and not hold.take_dropped_handshake()
    holds.add(hold, _entry("a", 4, 1, handshake=True))  # dropped too, and remembered
    assert not hold.entries and hold.take_dropped_handshake()
    assert holds.release(hold) == []


def test_the_relays_bound_drops_the_channel_that_would_pass_it() -> None:
    holds = Holds(channel_bytes=100, relay_bytes=30)
    first, second = holds.start("a"), holds.start("b")
    holds.add(first, _entry("a", 2, 20))
    holds.add(second, _entry("b", 2, 20))  # its first entry: held, though past the bound
    assert holds.bytes == 40
    holds.add(second, _entry("b", 3, 5))
    assert second.dropped and not first.dropped and holds.bytes == 20
    holds.end("b")
    holds.end("a")
    assert holds.bytes == 0
