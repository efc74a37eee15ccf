"""A local write that fails on the receiving agent (disk full, I/O error) loses nothing:
the reading call says so, and the same messages arrive once storage works again.

Faults are injected at the write sites — the receiver's inbox write (LocalState.advance)
and engine state write (Group.save), the sender's engine state write (inside
encrypt_queued, before a ciphertext leaves) — failing chosen calls, or calls hypothesis
chooses."""

from __future__ import annotations

import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from svc_sdk import Channel, InternalError
from svc_sdk.testing import LocalStack

from .helpers import client, pair

FULL = "storage failure: database or disk is full (injected)"


class FailingGroup:
    """The channel's engine group, with chosen calls of ``save`` (the receiver's state
    write) and ``encrypt_queued`` (the sender's, which writes before a ciphertext leaves)
    failing as a full disk makes them fail."""

    def __init__(self, inner: Any, fail: set[int], encrypt_fails: frozenset[int] = frozenset()):
        self._inner, self._fail, self.calls = inner, fail, 0
        self._encrypt_fails, self.encrypts = encrypt_fails, 0

    def save(self) -> None:
        self.calls += 1
        if self.calls in self._fail:
            raise InternalError(FULL)
        self._inner.save()

    def encrypt_queued(self, entries: list[tuple[int, bytes, bytes]]) -> tuple[int, list[bytes]]:
        self.encrypts += 1
        if self.encrypts in self._encrypt_fails:
            raise InternalError(FULL)
        result: tuple[int, list[bytes]] = self._inner.encrypt_queued(entries)
        return result

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def failing_inbox(client: Any, fail: set[int]) -> None:
    real = client.state.advance
    calls = [0]

    def advance(*args: Any) -> None:
        calls[0] += 1
        if calls[0] in fail:
            raise InternalError("runtime error: database or disk is full (injected)")
        real(*args)

    client.state.advance = advance


def read_all(channel: Channel, n: int) -> tuple[list[bytes], int]:
    """Reads ``n`` messages, retrying after storage faults; returns them and the faults."""
    got: list[bytes] = []
    faults = 0
    for _ in range(200):
        if len(got) >= n:
            break
        try:
            got.extend(m.data for m in channel.next_messages(timeout=2) or [])
        except InternalError as exc:
            assert "nothing is lost" in str(exc) and str(exc).startswith("runtime error: ")
            faults += 1
    return got, faults


@pytest.mark.parametrize(
    ("inbox_fails", "save_fails"),
    [({1}, set()), ({2, 3}, set()), (set(), {1}), (set(), {2}), ({1}, {2, 4})],
)
def test_failed_writes_on_the_receiving_side_lose_nothing(
    stack: LocalStack, channel_name: str, ids: Any, inbox_fails: set[int], save_fails: set[int]
) -> None:
    ca, chan_a, cb, chan_b = pair(stack, channel_name, ids("a"), ids("b"))
    with ca, cb:
        failing_inbox(cb, inbox_fails)
        chan_b._group = FailingGroup(chan_b._group, save_fails)  # type: ignore[assignment]
        sent = [f"m{i}".encode() for i in range(60)]
        faults = 0
        for start in range(0, 60, 10):
            chan_a.send_batch(sent[start : start + 10])
            time.sleep(0.2)  # delivered, waiting: the next call stores them in the inbox
            try:
                chan_b.members()  # processes what arrived, as any call does
            except InternalError as exc:
                assert "nothing is lost" in str(exc) and str(exc).startswith("runtime error: ")
                faults += 1
        got, more = read_all(chan_b, 60)
        assert got == sent, "every message exactly once, in order"
        assert faults + more >= 1, "the calling code learned of the fault"
        # Nothing left behind: a later message arrives, and only it.
        chan_a.send(b"after")
        assert read_all(chan_b, 1)[0] == [b"after"]


faults = st.frozensets(st.integers(1, 12), max_size=4)


@settings(
    max_examples=12,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(inbox_fails=faults, save_fails=faults, send_fails=faults)
def test_any_failed_write_on_either_side_loses_and_repeats_nothing(
    stack: LocalStack,
    ids: Any,
    inbox_fails: frozenset[int],
    save_fails: frozenset[int],
    send_fails: frozenset[int],
) -> None:
    """Hypothesis picks which writes fail: the receiver's inbox writes and state writes,
    the sender's state writes. A send whose write failed raises and sends nothing; every
    send that returned arrives exactly once, in order, once storage works again."""
    tag = uuid.uuid4().hex[:8]
    ca, chan_a, cb, chan_b = pair(stack, f"acme/faults/c{tag}", ids(f"a{tag}"), ids(f"b{tag}"))
    with ca, cb:
        failing_inbox(cb, set(inbox_fails))
        chan_b._group = FailingGroup(chan_b._group, set(save_fails))  # type: ignore[assignment]
        chan_a._group = FailingGroup(chan_a._group, set(), send_fails)  # type: ignore[assignment]
        sent: list[bytes] = []
        for i in range(12):
            message = f"m{i}".encode()
            try:
                chan_a.send(message)
                sent.append(message)
            except InternalError as exc:
                assert str(exc).startswith("runtime error: ") and "disk is full" in str(exc)
            if i % 3 == 2:
                time.sleep(0.1)
                try:
                    chan_b.members()  # processes what arrived
                except InternalError as exc:
                    assert "nothing is lost" in str(exc)
        assert len(sent) == 12 - len(send_fails)
        got, _ = read_all(chan_b, len(sent))
        assert got == sent, "every sent message exactly once, in order; no unsent one"
        assert chan_b.next_messages(0.3) == []


def test_a_failed_record_of_what_was_read_hands_out_everything_once(
    stack: LocalStack, channel_name: str, ids: Any
) -> None:
    """The write that records which messages were read (inbox delete and cursor) failing
    used to raise its storage error out of next_messages, after the messages had
    left the buffer: the caller lost them. Now the read returns them and the record is
    written once the disk has room; an explicit flush() says it failed."""
    ca, chan_a, cb, chan_b = pair(stack, channel_name, ids("a"), ids("b"))
    with ca:
        full = disk_full(cb, "consumed")
        sent = [f"m{i}".encode() for i in range(40)]
        chan_a.send_batch(sent)
        time.sleep(0.3)
        chan_b.members()  # decrypted into the inbox, nobody reading yet
        got: list[bytes] = []
        while len(got) < len(sent):
            got.extend(m.data for m in chan_b.next_messages(timeout=5))
            chan_b._inbox.flushed_at = 0.0  # every read flushes: every read meets the full disk
        assert got == sent
        with pytest.raises(InternalError, match="could not record which messages were read"):
            chan_b.flush()
        full[0] = False
        chan_b.flush()
        cb.close()
        again = client_in(stack, cb)
        with again:
            assert again.channel(channel_name).next_messages(0.5) == [], "nothing twice"


def client_in(stack: LocalStack, old: Any) -> Any:
    """A new client on ``old``'s data_dir and identity (its restart)."""
    return client(stack, old.identity.decode(), data_dir=old.engine.data_dir)


def disk_full(client: Any, write: str = "advance") -> list[bool]:
    """Makes ``client``'s local-state ``write`` (the inbox write by default) fail as a
    full disk does, while the returned flag is true."""
    real = getattr(client.state, write)
    full = [True]

    def failing(*args: Any) -> None:
        if full[0]:
            raise InternalError("runtime error: database or disk is full (injected)")
        real(*args)

    setattr(client.state, write, failing)
    return full


def test_health_shows_a_storage_fault_until_storing_works(
    stack: LocalStack, channel_name: str, ids: Any
) -> None:
    """Besides the reading call's error, the client's health shows the standing fault
    (which channel, what, since when, how much waits), and clears once storage works."""
    ca, chan_a, cb, chan_b = pair(stack, channel_name, ids("a"), ids("b"))
    with ca, cb:
        assert cb.health().ok and cb.health().storage_errors == {}
        full = disk_full(cb)
        sent = [f"m{i}".encode() for i in range(20)]
        chan_a.send_batch(sent)
        time.sleep(0.3)
        before = time.time()
        with pytest.raises(InternalError, match="disk is full"):
            chan_b.members()  # processes what arrived, as any call does
        health = cb.health()
        assert not health.ok and health.connected
        assert list(health.storage_errors) == [channel_name]
        state = chan_b.health()
        assert state.storage_error is not None
        assert (
            state.storage_error.startswith("runtime error: ")
            and "nothing is lost" in state.storage_error
        )
        assert state.failing_since is not None and state.failing_since <= before + 1
        assert state.backlog >= 20 and state.unread == 0 and state.closed is None
        with pytest.raises(InternalError):  # still failing: it still stands, since then
            chan_b.members()
        assert chan_b.health().failing_since == state.failing_since
        full[0] = False
        got, _ = read_all(chan_b, 20)
        assert got == sent
        assert cb.health().ok
        after = chan_b.health()
        assert (after.storage_error, after.failing_since, after.backlog, after.unread) == (
            None,
            None,
            0,
            0,
        )
    assert chan_b.health().closed == "runtime error: the client is closed"


def test_the_managers_health_shows_what_its_listener_cannot_store(
    stack: LocalStack, channel_name: str, ids: Any
) -> None:
    """No one reads: the manager's listener meets the full disk, retries, and its
    health says so; once the disk has room it stores everything and health is ok."""
    alice, bob = stack.manager(ids("alice")), stack.manager(ids("bob"))
    with alice, bob:
        alice.create(channel_name)
        bob.join_with_token(channel_name, alice.invite(channel_name), timeout=15)
        full = disk_full(bob.client)
        for i in range(10):
            alice.send(channel_name, f"m{i}")
        deadline = time.monotonic() + 10
        while bob.health().ok and time.monotonic() < deadline:
            time.sleep(0.05)
        health = bob.health()
        assert not health.ok, "the listener's storage fault shows in the manager's health"
        assert "disk is full" in health.storage_errors[channel_name]
        full[0] = False
        deadline = time.monotonic() + 10
        while not bob.health().ok and time.monotonic() < deadline:
            time.sleep(0.05)
        assert bob.health().ok, "the listener stored everything once it could"
        assert bob.health().channels[0].unread == 10
        assert bob.receive(channel_name, timeout=5) == [f"m{i}" for i in range(10)]


def sql(db: Path, *statements: str) -> None:
    """Runs ``statements`` on an agent's database from another process: a second SQLite
    library in the agent's own process would break SQLite's locks (POSIX locks are per
    process; closing one connection drops the other library's), which shows as "file is
    not a database" in the agent."""
    script = "import sqlite3, sys\nwith sqlite3.connect(sys.argv[1]) as db:\n"
    script += "".join(f"    db.execute({s!r})\n" for s in statements)
    subprocess.run([sys.executable, "-c", script, str(db)], check=True, timeout=30)


def test_a_send_whose_write_fails_queues_nothing_and_loses_nothing(
    stack: LocalStack, channel_name: str, ids: Any
) -> None:
    """Alice's disk refuses the outbox row (a trigger in her real mls.sqlite3, so the
    transaction with the ratchet state fails): ``send`` raises InternalError and queues
    nothing. What she sent before, and what she sends once writes work again, arrives
    once and in order; the failed message never does."""
    ca, chan_a, cb, chan_b = pair(stack, channel_name, ids("a"), ids("b"))
    with ca, cb:
        for i in range(5):
            chan_a.send(f"m{i}".encode())
        chan_a.wait_stored(30)
        db = stack.agent_dir(ids("a")) / "mls.sqlite3"
        sql(
            db,
            "CREATE TRIGGER full BEFORE INSERT ON svc_outbox "
            "BEGIN SELECT RAISE(ABORT, 'database or disk is full'); END",
        )
        with pytest.raises(InternalError, match="database or disk is full"):
            chan_a.send(b"lost")
        assert chan_a.unsent == 0
        sql(db, "DROP TRIGGER full")
        chan_a.send(b"m5")
        chan_a.wait_stored(30)
        assert receive(chan_b, 6) == [f"m{i}".encode() for i in range(6)]
        assert chan_b.next_messages(timeout=0.5) == []


def test_a_group_whose_stored_state_cannot_be_read_back_is_read_again_later(
    stack: LocalStack, channel_name: str, ids: Any
) -> None:
    """A send fails and so does reading the stored state back (the engine's table is
    gone for a moment): the channel is not given up as if alice had been removed; once
    the state can be read, sending works and nothing is lost or repeated."""
    ca, chan_a, cb, chan_b = pair(stack, channel_name, ids("a"), ids("b"))
    with ca, cb:
        chan_a.send(b"m0")
        chan_a.wait_stored(30)
        db = stack.agent_dir(ids("a")) / "mls.sqlite3"
        sql(db, "ALTER TABLE mls_group RENAME TO mls_group_away")
        with pytest.raises(InternalError, match="mls_group"):
            chan_a.send(b"lost")
        with pytest.raises(InternalError, match="stored state"):
            chan_a.send(b"lost too")
        sql(db, "ALTER TABLE mls_group_away RENAME TO mls_group")
        chan_a.send(b"m1")
        chan_a.wait_stored(30)
        assert receive(chan_b, 2) == [b"m0", b"m1"]
        assert chan_b.next_messages(timeout=0.5) == []


def receive(channel: Channel, count: int) -> list[bytes]:
    got: list[bytes] = []
    deadline = time.monotonic() + 30
    while len(got) < count and time.monotonic() < deadline:
        got.extend(m.data for m in channel.next_messages(timeout=2))
    return got
