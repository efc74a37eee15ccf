"""The decrypted inbox is bounded in memory: past the bound, stored messages wait on disk
and are read back in order as readers take the older ones. Nothing is lost, repeated or
reordered, for plain and filtered reads, and across a restart."""

from __future__ import annotations

from typing import Any

import pytest

from svc_sdk import Channel, InternalError
from svc_sdk import _inbox as inbox_module
from svc_sdk.testing import LocalStack

from .helpers import client, pair

BOUND = 8


@pytest.fixture(autouse=True)
def small_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(inbox_module, "MEMORY_MESSAGES", BOUND)


def flood(sender: Channel, receiver: Channel, count: int) -> None:
    """``count`` messages reach ``receiver``'s inbox while it only sends (each send
    processes what arrived, so it encrypts in the newest epoch)."""
    for i in range(count):
        sender.send(f"m{i}".encode())
    sender.wait_stored(30)
    for _ in range(2000):
        if receiver._pending_count() >= count:
            return
        receiver.send(b"from the busy receiver")  # decrypts and stores what arrived
    raise AssertionError(f"{receiver._pending_count()} of {count} arrived")


def read_all(channel: Channel, count: int) -> list[bytes]:
    got: list[bytes] = []
    while len(got) < count:
        batch = channel.next_messages(5)
        assert batch, f"got {len(got)} of {count}"
        got += [m.data for m in batch]
    assert channel.next_message(0.3) is None, "nothing twice"
    return got


def test_a_receiver_that_only_sends_keeps_a_bounded_inbox_in_memory(
    stack: LocalStack, channel_name: str, ids: Any
) -> None:
    ca, chan_a, cb, chan_b = pair(stack, channel_name, ids("alice"), ids("bob"))
    with ca, cb:
        flood(chan_a, chan_b, 50)
        assert len(chan_b._inbox.messages) <= BOUND, "the rest waits on disk"
        assert chan_b._pending_count() == 50
        assert cb.health().channels[0].unread == 50
        got = read_all(chan_b, 50)
        assert got == [f"m{i}".encode() for i in range(50)], "all of them, once, in order"


def test_a_filtered_read_finds_what_waits_on_disk_in_order(
    stack: LocalStack, channel_name: str, ids: Any
) -> None:
    ca, chan_a, cb, chan_b = pair(stack, channel_name, ids("alice"), ids("bob"))
    with ca, cb:
        flood(chan_a, chan_b, 40)

        def odd(message: Any) -> bool:
            return int(message.data[1:]) % 2 == 1

        odds = [chan_b.next_message(5, accept=odd) for _ in range(20)]
        assert [m.data for m in odds if m] == [f"m{i}".encode() for i in range(1, 40, 2)]
        chan_a.send(b"m41")  # a new one while older ones wait: after them, not before
        evens = [chan_b.next_message(5) for _ in range(21)]
        expected = [f"m{i}".encode() for i in range(0, 40, 2)] + [b"m41"]
        assert [m.data for m in evens if m] == expected


def test_a_spilled_inbox_survives_a_restart(stack: LocalStack, channel_name: str, ids: Any) -> None:
    ca, chan_a, cb, chan_b = pair(stack, channel_name, ids("alice"), ids("bob"))
    with ca:
        with cb:
            flood(chan_a, chan_b, 30)
            first = [m.data for m in chan_b.next_messages(5, limit=3)]
        assert first == [b"m0", b"m1", b"m2"]
        with client(stack, ids("bob")) as again:
            chan = again.channel(channel_name)
            assert len(chan._inbox.messages) <= BOUND
            assert chan._pending_count() == 27
            assert read_all(chan, 27) == [f"m{i}".encode() for i in range(3, 30)]


def test_while_reading_back_fails_newer_messages_do_not_pass_the_stored_ones(
    stack: LocalStack, channel_name: str, ids: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    ca, chan_a, cb, chan_b = pair(stack, channel_name, ids("alice"), ids("bob"))
    with ca, cb:
        flood(chan_a, chan_b, 20)
        assert [m.data for m in chan_b.next_messages(5, limit=BOUND)] == [
            f"m{i}".encode() for i in range(BOUND)
        ]
        real = cb.state.inbox

        def failing(*args: Any, **kwargs: Any) -> Any:
            raise InternalError("runtime error: disk I/O error (injected)")

        monkeypatch.setattr(cb.state, "inbox", failing)
        chan_a.send(b"newer")
        assert chan_b.next_message(1) is None, "not before the ones that wait on disk"
        monkeypatch.setattr(cb.state, "inbox", real)
        got: list[bytes] = []
        while len(got) < 20 - BOUND + 1:
            message = chan_b.next_message(5)
            assert message is not None, f"got {got}"
            got.append(message.data)
        assert got == [f"m{i}".encode() for i in range(BOUND, 20)] + [b"newer"]
