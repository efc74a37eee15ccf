"""The relay log's append journal: appends acknowledged before SQLite commits them."""

from __future__ import annotations

import asyncio
import contextlib
import os
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from svc_server.relay import sqlite_journal
from svc_server.relay.sqlite_journal import Journal, JournalBusy, decode, encode
from svc_server.relay.sqlite_store import SqliteLogStore
from svc_server.relay.store import Entry

pytestmark = pytest.mark.anyio

CHANNEL = "a/b/c"


def _rows(path: Path) -> list[tuple[int, bytes]]:
    """What SQLite itself holds (committed), read beside any store."""
    with contextlib.closing(sqlite3.connect(path)) as conn:
        rows = conn.execute(
            "SELECT seq, message FROM messages WHERE channel = ? ORDER BY seq", (CHANNEL,)
        ).fetchall()
    return [(seq, bytes(message)) for seq, message in rows]


def test_records_round_trip_and_a_cut_or_corrupt_record_ends_them() -> None:
    entries = [Entry(CHANNEL, 7 + i, b"sender", False, 3, b"m%d" % i, 1.5) for i in range(3)]
    one = encode(entries, [b"id0", None, b"id2"])
    two = encode(entries[:1], [None])
    assert [[(e, i) for e, i in r] for r in decode(one + two)] == [
        list(zip(entries, [b"id0", None, b"id2"], strict=True)),
        [(entries[0], None)],
    ]
    assert len(list(decode(one + two[:-1]))) == 1, "a record cut short is not read"
    corrupt = bytearray(one)
    corrupt[-1] ^= 1
    assert list(decode(bytes(corrupt) + two)) == [], "nothing after a record that fails its CRC"


def test_a_member_s_message_cannot_forge_a_record() -> None:
    """A hostile member's message holding a whole record of its own (for another channel,
    at another seq), or a length that would run past it, comes back as the one message it
    is: records are framed by their length, never by what the bytes inside look like."""
    forged = encode([Entry("x/y/z", 99, b"victim", False, 0, b"injected", 0.0)], [b"id"])
    messages = [forged, forged * 3 + b"\xff" * 64, b"\xff\xff\xff\x7f" + forged]
    entries = [Entry(CHANNEL, 1 + i, b"hostile", False, 0, m, 2.0) for i, m in enumerate(messages)]
    records = list(decode(encode(entries, [None] * 3) + encode(entries[:1], [None])))
    assert [[e for e, _ in r] for r in records] == [entries, entries[:1]]


async def test_an_acknowledged_append_is_durable_before_its_transaction_commits(
    tmp_path: Path,
) -> None:
    """The process dies (SIGKILL) right after its appends were acknowledged and before
    the open transaction's commit: SQLite has none of them, the journal has all, and the
    next start puts them in the log, in order, with their ids."""
    path = tmp_path / "relay.sqlite3"
    script = textwrap.dedent(
        f"""
        import asyncio, os, signal
        from pathlib import Path
        from svc_server.relay.sqlite_store import SqliteLogStore

        async def main():
            store = SqliteLogStore(Path({str(path)!r}))
            await store.start()
            for i in range(20):
                # Acknowledged: the future is done; awaiting it runs nothing else, so
                # the open transaction's commit (a timer on the loop) never comes.
                await store.append_many({CHANNEL!r}, b"s", [(b"m%d" % i, 0)], [b"id%d" % i])
            print("acknowledged", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)

        asyncio.run(main())
        """
    )
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False
    )
    assert proc.stdout.strip() == "acknowledged", proc.stderr
    assert proc.returncode == -9
    assert _rows(path) == [], "the transaction was open: SQLite rolled it back"
    assert (tmp_path / "relay.sqlite3-appends").stat().st_size > 0

    store = SqliteLogStore(path)
    await store.start()
    try:
        read = await store.read(CHANNEL, 0, 100)
        assert [(e.seq, e.message) for e in read] == [(i + 1, b"m%d" % i) for i in range(20)]
        assert await store.head(CHANNEL) == (20, 0)
        again = await store.append_many(CHANNEL, b"s", [(b"m3", 0), (b"new", 0)], [b"id3", b"x"])
        assert [e.seq for e in again] == [4, 21], "the replayed ids still dedupe"
    finally:
        await store.close()
    assert (tmp_path / "relay.sqlite3-appends").stat().st_size == 0
    assert len(_rows(path)) == 21


async def test_a_read_sees_the_appends_of_the_open_transaction(tmp_path: Path) -> None:
    """A subscriber's catch-up reads on another connection: acknowledged appends that
    wait in the open transaction are committed first, so no read misses them."""
    store = SqliteLogStore(tmp_path / "relay.sqlite3")
    await store.start()
    try:
        await store.append_many(CHANNEL, b"s", [(b"one", 0), (b"two", 0)])
        assert _rows(tmp_path / "relay.sqlite3") == [], "still open"
        assert [e.message for e in await store.read(CHANNEL, 0, 10)] == [b"one", b"two"]
        assert await store.head(CHANNEL) == (2, 0)
    finally:
        await store.close()


async def test_the_open_transaction_commits_within_its_delay_and_on_close(
    tmp_path: Path,
) -> None:
    path = tmp_path / "relay.sqlite3"
    store = SqliteLogStore(path)
    await store.start()
    try:
        await store.append_many(CHANNEL, b"s", [(b"one", 0)])
        for _ in range(200):
            if _rows(path):
                break
            await asyncio.sleep(sqlite_journal.COMMIT_DELAY)
        assert _rows(path) == [(1, b"one")]
        assert (tmp_path / "relay.sqlite3-appends").stat().st_size == 0
        await store.append_many(CHANNEL, b"s", [(b"two", 0)])
    finally:
        await store.close()
    assert _rows(path) == [(1, b"one"), (2, b"two")]


async def test_a_commit_or_welcome_after_appends_keeps_the_channel_s_order(
    tmp_path: Path,
) -> None:
    """A request that is not an append commits the open transaction first."""
    store = SqliteLogStore(tmp_path / "relay.sqlite3")
    await store.start()
    try:
        await store.create_group(CHANNEL, b"state")
        await store.append_many(CHANNEL, b"s", [(b"one", 0)])
        entry = await store.commit(CHANNEL, b"s", 0, b"commit", b"", [], (1, b"state2"))
        assert entry.seq == 2
        await store.append_many(CHANNEL, b"s", [(b"two", 1)])
        read = await store.read(CHANNEL, 0, 10)
        assert [(e.seq, e.message, e.handshake) for e in read] == [
            (1, b"one", False),
            (2, b"commit", True),
            (3, b"two", False),
        ]
    finally:
        await store.close()


async def test_a_journal_that_cannot_be_written_fails_the_append_and_loses_nothing(
    tmp_path: Path,
) -> None:
    """The journal's disk is full (its file descriptor points at /dev/full): the append
    that could not be recorded fails, unacknowledged and not stored; those before it stay;
    the ones after it are committed to SQLite directly."""
    path = tmp_path / "relay.sqlite3"
    store = SqliteLogStore(path)
    await store.start()
    journal = store._journal
    assert journal is not None
    saved = os.dup(journal._fd)
    try:
        await store.append_many(CHANNEL, b"s", [(b"before", 0)], [b"b"])
        full = os.open("/dev/full", os.O_RDWR)
        os.dup2(full, journal._fd)
        os.close(full)
        with pytest.raises(OSError):
            await store.append_many(CHANNEL, b"s", [(b"lost", 0)], [b"l"])
        after = await store.append_many(CHANNEL, b"s", [(b"after", 0)], [b"a"])
        assert [e.seq for e in after] == [2], "the failed append took no sequence number"
        read = await store.read(CHANNEL, 0, 10)
        assert [e.message for e in read] == [b"before", b"after"]
        os.dup2(saved, journal._fd)
        assert [e.seq for e in await store.append_many(CHANNEL, b"s", [(b"x", 0)])] == [3]
    finally:
        os.close(saved)
        await store.close()
    assert [m for _, m in _rows(path)] == [b"before", b"after", b"x"]


async def test_a_large_append_commits_at_once_without_the_journal(tmp_path: Path) -> None:
    """Most of what a large append's commit writes is its own pages: journaling it would
    write it once more."""
    path = tmp_path / "relay.sqlite3"
    store = SqliteLogStore(path)
    await store.start()
    try:
        await store.append_many(CHANNEL, b"s", [(b"x" * 16384, 0)])
        assert _rows(path) == [(1, b"x" * 16384)], "committed, not waiting"
        assert (tmp_path / "relay.sqlite3-appends").stat().st_size == 0
    finally:
        await store.close()


async def test_a_second_relay_on_the_same_log_leaves_the_first_one_s_journal_alone(
    tmp_path: Path,
) -> None:
    """Two relay processes on one data directory (a misconfiguration): the second may
    neither replay nor empty the records of the first one's open transaction, so it gets
    no journal and commits every append itself."""
    path = tmp_path / "relay.sqlite3"
    held = Journal(tmp_path / "relay.sqlite3-appends")  # as the first relay holds it
    held.append(b"the first relay's record")
    with pytest.raises(JournalBusy):
        Journal(tmp_path / "relay.sqlite3-appends")
    store = SqliteLogStore(path)
    await store.start()
    try:
        assert store._journal is None
        await store.append_many(CHANNEL, b"s", [(b"second", 0)])
        assert _rows(path) == [(1, b"second")], "committed at once"
    finally:
        await store.close()
        held.close()
    assert (tmp_path / "relay.sqlite3-appends").read_bytes() == b"the first relay's record"
