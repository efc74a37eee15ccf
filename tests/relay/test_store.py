"""The log stores (SQLite, and Redis when there is a redis-server) on their own."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sqlite3
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from svc_server.relay import redis_store, sqlite_checkpoints, sqlite_store
from svc_server.relay.redis_store import RedisLogStore
from svc_server.relay.sqlite_checkpoints import Checkpointer
from svc_server.relay.sqlite_store import INLINE_MAX_BYTES, SqliteLogStore
from svc_server.relay.store import (
    MAX_PENDING_WELCOMES,
    CursorExpired,
    Entry,
    GroupConflict,
    LogStore,
    Pipeline,
    PipelineBroken,
    StaleMessages,
)

from ..support import RedisServer

pytestmark = pytest.mark.anyio


async def test_a_cancelled_caller_does_not_kill_the_writer(tmp_path: Path) -> None:
    store = SqliteLogStore(tmp_path / "relay.sqlite3")
    await store.start()
    try:
        # The caller gives up (a cancelled task) before the writer thread answers it.
        abandoned = store.append("a/b/c", b"s", b"first", 0)
        abandoned.cancel()
        entry = await asyncio.wait_for(store.append("a/b/c", b"s", b"second", 0), 5)
        assert entry.seq == 2, "the abandoned append was still stored, in order"
        assert [e.message for e in await store.read("a/b/c", 0, 10)] == [b"first", b"second"]
    finally:
        await store.close()


@pytest.fixture
async def store(tmp_path: Path, backend: str) -> AsyncIterator[LogStore]:
    made: LogStore = (
        RedisLogStore(backend, 3600) if backend else SqliteLogStore(tmp_path / "relay.sqlite3")
    )
    await made.start()
    try:
        yield made
    finally:
        await made.close()


async def _commit(
    store: LogStore, epoch: int, welcome: bytes, joiners: list[bytes], commit: bytes = b"c"
) -> None:
    """A commit at ``epoch`` with a stand-in group state (the stores keep it opaque)."""
    if not await store.group_version("a/b/c"):
        await store.create_group("a/b/c", b"group-0")
    version = await store.group_version("a/b/c")
    await store.commit(
        "a/b/c",
        b"committer",
        epoch,
        commit,
        welcome,
        joiners,
        (version, f"group-{epoch + 1}".encode()),
    )


def fail_the_next_append(store: LogStore, monkeypatch: pytest.MonkeyPatch) -> None:
    """The store cannot write the next append (SQLite: an I/O error in its statements;
    Redis: the connection drops under the pipeline of script calls)."""
    if isinstance(store, SqliteLogStore):
        row = SqliteLogStore._channel_row

        def failing(conn: sqlite3.Connection, channel: str) -> tuple[int, int]:
            monkeypatch.setattr(SqliteLogStore, "_channel_row", staticmethod(row))
            raise sqlite3.OperationalError("disk I/O error")

        monkeypatch.setattr(SqliteLogStore, "_channel_row", staticmethod(failing))
        return
    assert isinstance(store, RedisLogStore)
    client = store._redis
    pipeline = client.pipeline

    def dropped(*args: Any, **kwargs: Any) -> Any:
        monkeypatch.setattr(client, "pipeline", pipeline)
        raise ConnectionError("the connection dropped")

    monkeypatch.setattr(client, "pipeline", dropped)


async def test_an_append_behind_a_failed_one_of_its_pipeline_is_not_stored(
    store: LogStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stream's appends to a channel are sent without waiting for each: once one fails,
    the ones behind it fail too, unstored, so that none of them overtakes it when its
    sender sends it again. Other pipelines are not held up."""
    await store.append_many("a/b/c", b"s", [(b"zero", 0)], [b"0"], Pipeline())
    pipeline = Pipeline()
    fail_the_next_append(store, monkeypatch)
    first = store.append_many("a/b/c", b"s", [(b"one", 0)], [b"1"], pipeline)
    second = store.append_many("a/b/c", b"s", [(b"two", 0)], [b"2"], pipeline)
    with pytest.raises(Exception) as failed:
        await first
    assert not isinstance(failed.value, PipelineBroken)
    with pytest.raises(Exception):  # noqa: B017 - PipelineBroken, or the same failure in a batch
        await second
    assert [e.message for e in await store.read("a/b/c", 0, 10)] == [b"zero"]

    # Sent again in another pipeline (a new stream), in order.
    again = Pipeline()
    for message, id_ in ((b"one", b"1"), (b"two", b"2")):
        await store.append_many("a/b/c", b"s", [(message, 0)], [id_], again)
    assert [e.message for e in await store.read("a/b/c", 0, 10)] == [b"zero", b"one", b"two"]
    with pytest.raises(PipelineBroken):
        await store.append_many("a/b/c", b"s", [(b"three", 0)], [b"3"], pipeline)


async def test_a_dropped_group_s_version_is_never_reused(store: LogStore) -> None:
    """A creation that could not be finished drops its group; the next group of the
    channel gets a new version, so that no relay process takes its cached copy of the
    dropped one for it (a cache is current while its version is the stored one)."""
    assert await store.create_group("a/b/c", b"first") == 1
    assert await store.create_group("a/b/c", b"other") == 0, "the channel has a group"
    assert not await store.drop_group("a/b/c", 2), "not the stored version"
    assert await store.drop_group("a/b/c", 1)
    assert await store.group_version("a/b/c") == 0
    assert await store.group("a/b/c") is None
    assert not await store.drop_group("a/b/c", 1), "dropped already"

    assert await store.create_group("a/b/c", b"second") == 2
    assert await store.group("a/b/c") == (2, b"second")
    with pytest.raises(GroupConflict):  # a change validated against the dropped group
        await store.propose("a/b/c", b"leaver", 0, b"leave", (1, b"group-x"))
    await store.append("a/b/c", b"s", b"hello", 0)
    assert not await store.drop_group("a/b/c", 2), "the channel's log is not empty"
    assert await store.group("a/b/c") == (2, b"second")


async def test_a_proposal_is_stored_with_its_group_state_or_not_at_all(store: LogStore) -> None:
    await _commit(store, 0, b"", [])  # epoch 1, group version 2
    version = await store.group_version("a/b/c")
    head, epoch = await store.head("a/b/c")
    assert epoch == 1
    with pytest.raises(StaleMessages) as stale:
        await store.propose("a/b/c", b"leaver", 0, b"past", (version, b"group-x"))
    assert stale.value.current_epoch == 1
    with pytest.raises(GroupConflict):
        await store.propose("a/b/c", b"leaver", 1, b"moved", (version - 1, b"group-x"))
    assert await store.head("a/b/c") == (head, 1)
    assert await store.group("a/b/c") == (version, b"group-1")
    assert await store.read("a/b/c", head, 10) == []

    entry = await store.propose("a/b/c", b"leaver", 1, b"leave", (version, b"group-1p"))
    assert (entry.seq, entry.epoch, entry.handshake, entry.message) == (
        head + 1,
        1,
        False,
        b"leave",
    )
    assert await store.group("a/b/c") == (version + 1, b"group-1p")
    assert await store.head("a/b/c") == (head + 1, 1), "a proposal moves no epoch"
    stored = await store.read("a/b/c", head, 10)
    assert [(e.seq, e.sender, e.message) for e in stored] == [(head + 1, b"leaver", b"leave")]


async def test_a_welcome_for_many_joiners_is_stored_once(store: LogStore, backend: str) -> None:
    welcome = b"W" * 100_000
    joiners = [b"\x01" * 16 + f"j{i}".encode() for i in range(200)]
    await _commit(store, 0, welcome, joiners, b"commit")
    assert [w.welcome for w in await store.welcomes(joiners[-1])] == [welcome]
    if backend:
        assert isinstance(store, RedisLogStore)
        client = store.redis
        blobs = [k async for k in client.scan_iter(match="svc:{a/b/c}:welcome:*")]
        sizes = [await client.hstrlen(k, "w") for k in blobs]
        assert sizes == [len(welcome)], "one copy of the Welcome, whatever the joiners"
    else:
        assert isinstance(store, SqliteLogStore)
        conn = sqlite3.connect(store._path)
        (copies,) = conn.execute("SELECT count(*) FROM welcome_blobs").fetchone()
        (recipients,) = conn.execute("SELECT count(*) FROM welcome_recipients").fetchone()
        conn.close()
        assert (copies, recipients) == (1, len(joiners))


async def test_one_channel_s_keys_share_one_slot(store: LogStore, backend: str) -> None:
    """The condition for Redis Cluster: every script touches one slot, so every key of a
    channel must hash to the same slot (the channel is the hash tag)."""
    if not backend:
        pytest.skip("a Redis key layout")
    from redis.crc import key_slot

    assert isinstance(store, RedisLogStore)
    joiner = b"\x03" * 16 + b"j"
    for channel in ("a/b/c", "x/y/z"):
        await store.create_group(channel, b"group-0")
        await store.append(channel, b"s", b"m", 0)
        await store.commit(channel, b"c", 0, b"commit", b"welcome", [joiner], (1, b"group-1"))
        await store.read(channel, 0, 10)
    keys = [k async for k in store.redis.scan_iter(match="svc:*")]
    for channel in ("a/b/c", "x/y/z"):
        mine = [k for k in keys if channel.encode() in k and not k.startswith(b"svc:welcome:")]
        assert len(mine) == 4, mine  # log, meta, group, welcome (unindexed: emptied)
        assert len({key_slot(k) for k in mine}) == 1, mine
    assert [w.welcome for w in await store.welcomes(joiner)] == [b"welcome", b"welcome"]


async def test_an_acknowledged_welcome_is_indexed_by_a_later_relay(
    store: LogStore, backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The joiners' index is written after the commit script (it lives in other slots).
    A relay that dies in between loses nothing: another relay indexes it on start."""
    if not backend:
        pytest.skip("SQLite stores the commit and its index in one transaction")
    assert isinstance(store, RedisLogStore)
    joiner = b"\x04" * 16 + b"j"

    async def dies(*args: Any) -> None:
        raise ConnectionError("the relay died here")

    monkeypatch.setattr(store, "_index", dies)
    await _commit(store, 0, b"the welcome", [joiner])  # acknowledged
    assert await store.welcomes(joiner) == []
    monkeypatch.setattr(redis_store, "REINDEX_AFTER", 0.0)
    later = RedisLogStore(backend, 3600)
    seen: list[Any] = []
    later.set_sink(lambda entries, welcomes: seen.extend(welcomes))
    await later.start()
    try:
        assert [w.welcome for w in await later.welcomes(joiner)] == [b"the welcome"]
        for _ in range(100):  # and it is announced to connected joiners
            if seen:
                break
            await asyncio.sleep(0.05)
        assert [(w.recipient, w.welcome) for w in seen] == [(joiner, b"the welcome")]
        assert await later._reindex(time.time() + 1) == 0, "indexed once"
    finally:
        await later.close()


async def test_a_second_store_follows_entries_and_welcomes(store: LogStore, backend: str) -> None:
    """What a second relay process sees: appends and commits of several channels (on a
    cluster, in slots of different primaries) and the Welcomes, in order, once."""
    if not backend:
        pytest.skip("one SQLite store per relay process")
    other = RedisLogStore(backend, 3600)
    entries: list[Entry] = []
    welcomes: list[Any] = []

    def sink(new: Any, announced: Any) -> None:
        entries.extend(new)
        welcomes.extend(announced)

    other.set_sink(sink)
    await other.start()
    channels = [f"a/b/c{i}" for i in range(6)]
    joiner = b"\x05" * 16 + b"j"
    try:
        for channel in channels:
            await store.create_group(channel, b"group-0")
            await store.append(channel, b"s", b"before", 0)
            other.watch(channel, 1)
        await asyncio.sleep(0.2)
        for channel in channels:
            await store.append_many(channel, b"s", [(b"m1", 0), (b"m2", 0)])
            await store.commit(channel, b"c", 0, b"commit", b"w", [joiner], (1, b"group-1"))
            await store.append(channel, b"s", b"m3", 1)
        for _ in range(200):
            if len(entries) >= 4 * len(channels) and len(welcomes) >= len(channels):
                break
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.3)  # nothing more arrives
        for channel in channels:
            got = [(e.seq, e.message) for e in entries if e.channel == channel]
            assert got == [(2, b"m1"), (3, b"m2"), (4, b"commit"), (5, b"m3")], channel
        assert sorted(w.channel for w in welcomes) == channels
    finally:
        await other.close()


async def test_a_second_store_that_fell_behind_reads_on_in_bounded_pages(
    store: LogStore, backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A relay process that falls behind on channels of large messages reads their logs
    on a page at a time, not all it missed in one reply: no batch it hands on passes a
    page's bytes by more than one message, and every entry comes once, in order."""
    if not backend:
        pytest.skip("one SQLite store per relay process")
    monkeypatch.setattr(redis_store, "FOLLOW_PAGE_BYTES", 256 * 1024)
    other = RedisLogStore(backend, 3600)
    batches: list[list[Entry]] = []
    other.set_sink(lambda new, announced: batches.append(list(new)) if new else None)
    channels = [f"b/e/hind{i}" for i in range(3)]
    message = 100_000
    for channel in channels:
        for i in range(20):  # 2 MB a channel
            await store.append(channel, b"s", bytes([i]) * message, 0)
    await other.start()
    try:
        for channel in channels:
            other.watch(channel, 0)  # from the start: all of it is behind
        for _ in range(200):
            if sum(map(len, batches)) >= 20 * len(channels):
                break
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.2)
        for channel in channels:
            got = [(e.seq, e.message[0]) for b in batches for e in b if e.channel == channel]
            assert got == [(i + 1, i) for i in range(20)], channel
        # The XREAD's few entries a channel, or a page and the message that reached it.
        bound = max(redis_store.FOLLOW_PEEK * message, 256 * 1024 + message)
        largest = max(sum(len(e.message) for e in b) for b in batches)
        assert largest <= bound, f"one batch of {largest} bytes"
    finally:
        await other.close()


async def test_a_channel_far_behind_does_not_hold_up_another_channels_entries(
    store: LogStore, backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A relay reading a long backlog of one channel, a page at a time, hands on another
    channel's new entry before that backlog is through."""
    if not backend:
        pytest.skip("one SQLite store per relay process")
    monkeypatch.setattr(redis_store, "FOLLOW_PAGE", 8)
    for _ in range(8):
        await store.append_many("far/be/hind", b"s", [(b"m", 0)] * 500)
    other = RedisLogStore(backend, 3600)
    seen: list[tuple[str, int]] = []
    started = asyncio.Event()

    def sink(new: Any, announced: Any) -> None:
        seen.extend((e.channel, e.seq) for e in new)
        started.set()

    other.set_sink(sink)
    await other.start()
    try:
        other.watch("far/be/hind", 0)
        other.watch("just/now/new", 0)
        await asyncio.wait_for(started.wait(), 10)
        await store.append("just/now/new", b"s", b"now", 0)
        for _ in range(400):
            if ("far/be/hind", 4000) in seen and ("just/now/new", 1) in seen:
                break
            await asyncio.sleep(0.05)
        assert seen.index(("just/now/new", 1)) < seen.index(("far/be/hind", 4000))
        assert [seq for ch, seq in seen if ch == "far/be/hind"] == list(range(1, 4001))
    finally:
        await other.close()


async def test_a_second_store_reads_on_through_a_burst_of_welcomes(
    store: LogStore, backend: str
) -> None:
    """More Welcomes announced at once than the follower reads at a time (commits in many
    channels at once): each comes, once."""
    if not backend:
        pytest.skip("one SQLite store per relay process")
    other = RedisLogStore(backend, 3600)
    welcomes: list[Any] = []
    other.set_sink(lambda new, announced: welcomes.extend(announced))
    await other.start()
    joiner = b"\x06" * 16 + b"j"
    channels = [f"w/b/urst{i}" for i in range(3 * redis_store.WELCOME_PAGE + 5)]

    async def commit(channel: str) -> None:
        await store.create_group(channel, b"group-0")
        await store.commit(channel, b"c", 0, b"commit", channel.encode(), [joiner], (1, b"g1"))

    try:
        await asyncio.gather(*(commit(ch) for ch in channels))
        for _ in range(200):
            if len(welcomes) >= len(channels):
                break
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.2)
        assert sorted(w.welcome for w in welcomes) == sorted(ch.encode() for ch in channels)
    finally:
        await other.close()


async def test_trim_covers_every_channel(store: LogStore) -> None:
    channels = [f"t/r/im{i}" for i in range(8)]  # on a cluster, on every primary
    for channel in channels:
        await store.append(channel, b"s", b"old", 0)
    assert await store.trim(time.time() + 1) == len(channels)
    for channel in channels:
        with pytest.raises(CursorExpired):
            await store.read(channel, 0, 10)


async def test_a_read_stops_at_the_entry_that_reaches_its_byte_bound(store: LogStore) -> None:
    """A catch-up page of large messages ends with the one that takes it to its bytes (so
    a page that stopped for them is never mistaken for the log's end): read page by
    page, the log comes back whole, in order."""
    sizes = [100, 3000, 3000, 10_000, 50, 50, 2000]
    for i, size in enumerate(sizes):
        await store.append("p/a/ge", b"s", bytes([i]) * size, 0)
    pages, after = [], 0
    while page := await store.read("p/a/ge", after, 512, 5000):
        pages.append([len(e.message) for e in page])
        after = page[-1].seq
    assert pages == [[100, 3000, 3000], [10_000], [50, 50, 2000]]
    assert [len(e.message) for e in await store.read("p/a/ge", 0, 3)] == sizes[:3]
    assert len(await store.read("p/a/ge", 0, 512, 10**9)) == len(sizes)


async def test_an_agent_gets_only_its_newest_pending_welcomes(store: LogStore) -> None:
    me = b"\x02" * 16 + b"me"
    for epoch in range(MAX_PENDING_WELCOMES + 10):
        await _commit(store, epoch, f"w{epoch}".encode(), [me])
    pending = await store.welcomes(me)
    assert len(pending) == MAX_PENDING_WELCOMES
    assert pending[-1].welcome == f"w{MAX_PENDING_WELCOMES + 9}".encode()
    assert [w.seq for w in pending] == sorted(w.seq for w in pending)


async def test_large_writes_and_trims_never_run_on_the_event_loop(tmp_path: Path) -> None:
    store = SqliteLogStore(tmp_path / "relay.sqlite3")
    await store.start()
    await store.create_group("a/b/c", b"group-0")
    ran_on: list[str] = []
    real = store._run_batch

    def recording(*args: Any) -> Any:
        ran_on.append(threading.current_thread().name)
        return real(*args)

    store._run_batch = recording
    try:
        await store.append("a/b/c", b"s", b"small", 0)
        await store.append("a/b/c", b"s", b"x" * (INLINE_MAX_BYTES + 1), 0)
        await _commit(store, 0, b"w" * INLINE_MAX_BYTES, [b"\x01" * 17])
        await store.trim(0.0)
    finally:
        await store.close()
    loop_thread = threading.current_thread().name
    assert ran_on == [loop_thread, "svc-log-write", "svc-log-write", "svc-log-write"]


async def test_checkpoints_run_on_their_own_thread_never_in_a_commit(tmp_path: Path) -> None:
    """SQLite's automatic checkpoint would run inside a commit on the event loop, with two
    fsyncs (synchronous=NORMAL): the WAL is copied back by the checkpoint thread instead."""
    path = tmp_path / "relay.sqlite3"
    store = SqliteLogStore(path)
    await store.start()
    try:
        assert store._conn is not None and store._read_conn is not None
        for conn in (store._conn, store._read_conn):
            assert conn.execute("PRAGMA wal_autocheckpoint").fetchone()[0] == 0
        before = path.stat().st_size
        body = b"m" * 4096
        for _ in range(300):  # ~2 pages each: past SQLite's automatic threshold of 1,000
            await store.append("a/b/c", b"s", body, 0)
        deadline = time.monotonic() + 10
        while path.stat().st_size < before + 300 * len(body) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert path.stat().st_size >= before + 300 * len(body), "the WAL was copied back"
        assert [e.seq for e in await store.read("a/b/c", 298, 10)] == [299, 300]
    finally:
        await store.close()


async def test_the_wal_starts_over_under_a_steady_stream_of_writes(tmp_path: Path) -> None:
    """A PASSIVE checkpoint never catches up with writes that keep coming, and SQLite
    starts the WAL over only once every frame is copied: without the checkpoint's second
    pass under the write lock the WAL grows by every page ever written (~400 MiB here)."""
    path = tmp_path / "relay.sqlite3"
    wal = tmp_path / "relay.sqlite3-wal"
    store = SqliteLogStore(path)
    await store.start()
    largest = 0
    try:
        for _ in range(5000):  # 40,000 appends, ~100,000 WAL frames, no pause
            await asyncio.gather(*(store.append("a/b/c", b"s", b"m" * 256, 0) for _ in range(8)))
            largest = max(largest, wal.stat().st_size)
        bound = sqlite_checkpoints.MAX_WAL_PAGES * 4096
        assert largest <= 4 * bound, f"WAL reached {largest >> 20} MiB"
        assert store._checkpointer is not None and store._checkpointer.restarts >= 1
        assert len(await store.read("a/b/c", 39_990, 100)) == 10
    finally:
        await store.close()


class _FullDisk:
    """A connection whose checkpoint fails as on a full disk, until ``full`` is false."""

    def __init__(self) -> None:
        self.full = True
        self.tries = 0

    def execute(self, sql: str) -> Any:
        self.tries += 1
        if self.full:
            raise sqlite3.OperationalError("database or disk is full")
        return self

    def fetchone(self) -> tuple[int, int, int]:
        return (0, 0, 0)

    def close(self) -> None:
        pass


def test_a_failing_checkpoint_is_retried_once_a_second_not_once_per_write() -> None:
    disk = _FullDisk()
    checkpoints = Checkpointer(lambda: disk)
    checkpoints.start()
    try:
        deadline = time.monotonic() + 0.5
        while time.monotonic() < deadline:
            checkpoints.wrote(sqlite_checkpoints.PAGES)
            time.sleep(0.001)
        assert 1 <= disk.tries <= 2, f"{disk.tries} tries in 0.5 s of writes"
        disk.full = False
        deadline = time.monotonic() + 5
        while checkpoints.checkpoints == 0 and time.monotonic() < deadline:
            checkpoints.wrote(1)
            time.sleep(0.01)
        assert checkpoints.checkpoints >= 1, "tried again once the disk had room"
    finally:
        checkpoints.stop()


async def test_messages_stay_stored_and_readable_while_checkpoints_fail(tmp_path: Path) -> None:
    """Checkpoints failing (a full disk) lose nothing: every commit is in the WAL."""
    disk = _FullDisk()
    original = sqlite_checkpoints.Checkpointer.__init__

    def failing(self: Checkpointer, connect: Any, writes: Any = None) -> None:
        original(self, lambda: disk, writes)

    store = SqliteLogStore(tmp_path / "relay.sqlite3")
    sqlite_checkpoints.Checkpointer.__init__ = failing
    try:
        await store.start()
    finally:
        sqlite_checkpoints.Checkpointer.__init__ = original
    try:
        for i in range(300):
            await store.append("a/b/c", b"s", b"m%d" % i + b"x" * 4096, 0)
        await asyncio.sleep(0.2)
        assert disk.tries >= 1, "a checkpoint was tried, and failed"
        read = await store.read("a/b/c", 0, 1000)
        assert [e.message[:4] for e in read[:2]] == [b"m0xx", b"m1xx"]
        assert len(read) == 300 and read[-1].message.startswith(b"m299")
    finally:
        await store.close()
    reopened = SqliteLogStore(tmp_path / "relay.sqlite3")
    await reopened.start()
    try:
        assert len(await reopened.read("a/b/c", 0, 1000)) == 300, "durable across a restart"
    finally:
        await reopened.close()


class _SwallowsOneCancel:
    """A follower connection whose XREAD loses the first cancellation, as redis-py's
    asyncio.wait_for around a socket write does on Python 3.11 when the cancel arrives
    just as the write completes (the call returns normally; the task is not cancelled)."""

    def __init__(self) -> None:
        self.swallowed = 0

    async def xread(self, *args: Any, **kwargs: Any) -> list[Any]:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            if self.swallowed:
                raise
            self.swallowed += 1
        return []

    async def aclose(self) -> None:
        pass


async def test_close_ends_a_follower_that_swallowed_its_cancellation(
    redis_server: Any,
) -> None:
    if redis_server is None:
        pytest.skip("no redis-server on this machine")
    store = RedisLogStore(redis_server.url, 3600)
    await store.start()
    real, store._follow_conn = store._follow_conn, _SwallowsOneCancel()
    await real.aclose()
    await asyncio.sleep(0.05)  # the follower is in its XREAD
    closing = asyncio.create_task(store.close())
    try:
        # Hung forever before: close() cancelled the follower once and awaited it.
        done, _ = await asyncio.wait({closing}, timeout=10)
        assert closing in done, "close() waits forever for a follower that goes on"
        assert store._follow_conn.swallowed == 1
    finally:
        if store._follower is not None and not store._follower.done():
            store._follower.cancel()  # the second cancel ends it, and close() with it
        await closing


async def test_close_does_not_wait_out_a_redis_that_stopped_answering() -> None:
    """A relay stopping while its Redis hangs (stopped, not gone: connections stay open
    and nothing is answered) closes its store in about CLOSE_GRACE, not after the
    client's socket timeout: tidying its wake stream is best effort."""
    try:
        server = RedisServer()
    except FileNotFoundError:
        pytest.skip("no redis-server on this machine")
    server.start()
    assert server.proc is not None
    try:
        store = RedisLogStore(server.url, 3600)
        await store.start()
        store.watch("a/b/hung", 0)
        await store.append("a/b/hung", b"s", b"m", 0)
        server.proc.send_signal(signal.SIGSTOP)
        try:
            started = time.monotonic()
            await asyncio.wait_for(store.close(), 30)
            took = time.monotonic() - started
        finally:
            server.proc.send_signal(signal.SIGCONT)
        assert took < redis_store.CLOSE_GRACE + 2.0, f"close() took {took:.1f} s"
    finally:
        server.stop()


@pytest.mark.slow
async def test_an_idle_follower_neither_times_out_nor_reconnects(
    redis_server: Any, caplog: pytest.LogCaptureFixture
) -> None:
    if redis_server is None:
        pytest.skip("no redis-server on this machine")
    store = RedisLogStore(redis_server.url, 3600)
    seen: list[int] = []
    store.set_sink(lambda entries, welcomes: seen.extend(e.seq for e in entries))
    await store.start()
    try:
        store.watch("a/b/idle", 0)
        # Past one whole XREAD block with nothing to read.
        await asyncio.sleep(redis_store.FOLLOW_BLOCK_MS / 1000 + 1.5)
        assert "following Redis streams failed" not in caplog.text
        await store.append("a/b/idle", b"s", b"m", 0)
        for _ in range(100):
            if seen:
                break
            await asyncio.sleep(0.02)
        assert seen == [1]
    finally:
        await store.close()


async def test_a_repeated_message_id_is_stored_once_with_its_original_seq(store: LogStore) -> None:
    """Publish.message_id: a resend (same sender and id) is answered with the original seq
    and not stored again, even from a past epoch (checked before the epoch); a new id is
    still held to the current epoch; another sender's id is its own."""
    first = await store.append_many("a/b/c", b"s", [(b"m1", 0), (b"m2", 0)], [b"id1", b"id2"])
    assert [e.seq for e in first] == [1, 2]
    again = await store.append_many("a/b/c", b"s", [(b"m2'", 0), (b"m3", 0)], [b"id2", b"id3"])
    assert [e.seq for e in again] == [2, 3], "the repeat keeps its seq, the new one follows"
    await _commit(store, 0, b"", [])  # seq 4: the channel moves to epoch 1
    stale_repeat = await store.append_many(
        "a/b/c", b"s", [(b"m1", 0), (b"m3", 0)], [b"id1", b"id3"]
    )
    assert [e.seq for e in stale_repeat] == [1, 3]
    with pytest.raises(StaleMessages):
        await store.append_many("a/b/c", b"s", [(b"m1", 0), (b"m4", 0)], [b"id1", b"id4"])
    other = await store.append_many("a/b/c", b"t", [(b"x", 1)], [b"id1"])
    assert [e.seq for e in other] == [5], "ids are per sender"
    mixed = await store.append_many("a/b/c", b"s", [(b"m3", 0), (b"m4", 1)], [b"id3", b"id4"])
    assert [e.seq for e in mixed] == [3, 6]
    assert await store.head("a/b/c") == (6, 1)
    stored = [(e.seq, e.message) for e in await store.read("a/b/c", 0, 10)]
    assert stored == [(1, b"m1"), (2, b"m2"), (3, b"m3"), (4, b"c"), (5, b"x"), (6, b"m4")]
    plain = await store.append_many("a/b/c", b"s", [(b"m5", 1)])  # no ids: no dedupe
    assert [e.seq for e in plain] == [7]


async def test_repeats_are_found_in_a_full_frame_of_ids(store: LogStore) -> None:
    """A full Publish (1,024 messages) where every other id was stored before: each
    repeat, wherever it falls in the frame, keeps its seq and the rest follow in order."""
    ids = [f"id{i}".encode() for i in range(1024)]
    first = await store.append_many("a/b/c", b"s", [(b"m", 0)] * 512, ids[::2])
    assert [e.seq for e in first] == list(range(1, 513))
    frame = await store.append_many("a/b/c", b"s", [(b"n", 0)] * 1024, ids)
    assert [e.seq for e in frame[::2]] == list(range(1, 513)), "repeats keep their seq"
    assert [e.seq for e in frame[1::2]] == list(range(513, 1025)), "new ones follow in order"
    assert await store.head("a/b/c") == (1024, 0)


# The layout of logs written before message ids moved into ``messages`` (and, with
# ``without_rowid``, before messages moved to a rowid table).
EARLIER_LAYOUT = """
CREATE TABLE channels (
    name TEXT PRIMARY KEY, head_seq INTEGER NOT NULL DEFAULT 0,
    epoch INTEGER NOT NULL DEFAULT 0, trimmed_through INTEGER NOT NULL DEFAULT 0
) WITHOUT ROWID;
CREATE TABLE messages (
    channel TEXT NOT NULL, seq INTEGER NOT NULL, sender BLOB NOT NULL,
    handshake INTEGER NOT NULL, epoch INTEGER NOT NULL, message BLOB NOT NULL,
    stored_at REAL NOT NULL, PRIMARY KEY (channel, seq)
){rowid};
CREATE INDEX messages_stored_at ON messages (stored_at);
CREATE TABLE message_ids (
    channel TEXT NOT NULL, sender BLOB NOT NULL, id BLOB NOT NULL, seq INTEGER NOT NULL,
    stored_at REAL NOT NULL, PRIMARY KEY (channel, sender, id)
) WITHOUT ROWID;
CREATE INDEX message_ids_stored_at ON message_ids (stored_at);
"""


BIG = b"m2" * 10_000


def _write_earlier_log(path: Path, without_rowid: bool) -> None:
    """A log of EARLIER_LAYOUT: two channels, ids for two of a/b/c's messages."""
    now = time.time()
    with sqlite3.connect(path) as conn:
        conn.executescript(EARLIER_LAYOUT.format(rowid=" WITHOUT ROWID" if without_rowid else ""))
        conn.executemany(
            "INSERT INTO messages VALUES (?, ?, ?, ?, 0, ?, ?)",
            [
                ("a/b/c", 1, b"s", 0, b"m1", now),
                ("a/b/c", 2, b"s", 0, BIG, now),
                ("a/b/c", 3, b"c", 1, b"commit", now),
                ("a/b/d", 1, b"t", 0, b"other", now),
            ],
        )
        conn.executemany(
            "INSERT INTO message_ids VALUES (?, ?, ?, ?, ?)",
            [("a/b/c", b"s", b"i1", 1, now), ("a/b/c", b"s", b"i2", 2, now)],
        )
        conn.executemany(
            "INSERT INTO channels (name, head_seq) VALUES (?, ?)", [("a/b/c", 3), ("a/b/d", 1)]
        )
    conn.close()


@pytest.mark.parametrize("without_rowid", [False, True], ids=["message_ids", "without_rowid"])
async def test_a_log_of_an_earlier_layout_is_moved_to_the_current_one(
    tmp_path: Path, without_rowid: bool
) -> None:
    """Logs written before keep every message, in order, and every id (a repeat is still
    answered with its seq); they go on from the same head, and retention still trims
    them. Afterwards ids are a column of ``messages`` and ``message_ids`` is gone."""
    path = tmp_path / "relay.sqlite3"
    _write_earlier_log(path, without_rowid)

    def layout() -> tuple[str, set[str], dict[str, str]]:
        with sqlite3.connect(path) as conn:
            table = conn.execute("SELECT sql FROM sqlite_master WHERE name = 'messages'")
            tables = {n for (n,) in conn.execute("SELECT name FROM sqlite_master")}
            indexes = dict(
                conn.execute("SELECT name, tbl_name FROM sqlite_master WHERE type = 'index'")
            )
            sql = table.fetchone()[0]
        conn.close()
        return sql, tables, indexes

    for _ in range(2):  # the second start finds nothing to move
        store = SqliteLogStore(path)
        await store.start()
        try:
            sql, tables, indexes = layout()
            assert "WITHOUT ROWID" not in sql and "id BLOB" in sql
            assert "message_ids" not in tables
            assert indexes["messages_stored_at"] == indexes["messages_id"] == "messages"
            stored = [(e.seq, e.message) for e in await store.read("a/b/c", 0, 10)]
            assert stored == [(1, b"m1"), (2, BIG), (3, b"commit")]
            repeat = await store.append_many("a/b/c", b"s", [(b"x", 0), (b"y", 0)], [b"i2", b"i1"])
            assert [e.seq for e in repeat] == [2, 1], "the ids moved with the log"
            assert [e.message for e in await store.read("a/b/d", 0, 10)] == [b"other"]
        finally:
            await store.close()
    store = SqliteLogStore(path)
    await store.start()
    try:
        assert (await store.append_many("a/b/c", b"s", [(b"m4", 0)], [b"i4"]))[0].seq == 4
        assert await store.head("a/b/c") == (4, 0)
        assert await store.trim(time.time() + 1) == 5
        with pytest.raises(CursorExpired):
            await store.read("a/b/c", 0, 10)
        fresh = await store.append_many("a/b/c", b"s", [(b"m5", 0)], [b"i4"])
        assert [e.seq for e in fresh] == [5], "a trimmed message's id goes with it"
    finally:
        await store.close()


@pytest.mark.parametrize("without_rowid", [False, True], ids=["message_ids", "without_rowid"])
def test_two_relays_starting_on_an_earlier_log_move_it_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, without_rowid: bool
) -> None:
    """A relay that starts while another is moving the same log waits for it and finds
    the work done: it neither moves the rows a second time (which would drop the ids)
    nor fails on the column the first one added."""
    path = tmp_path / "relay.sqlite3"
    _write_earlier_log(path, without_rowid)
    real = sqlite_store._move_ids
    moving = threading.Event()

    def slow_move(conn: sqlite3.Connection) -> bool:
        moved = real(conn)
        if threading.current_thread().name == "first":
            moving.set()
            time.sleep(0.5)  # the second relay starts meanwhile
        return moved

    monkeypatch.setattr(sqlite_store, "_move_ids", slow_move)
    errors: list[BaseException] = []

    def start(name: str) -> None:
        try:
            conn = sqlite_store._connect(path, "normal")
            try:
                sqlite_store._migrate(conn)
            finally:
                conn.close()
        except BaseException as exc:  # reported below
            errors.append(exc)

    first = threading.Thread(target=start, args=("first",), name="first")
    first.start()
    assert moving.wait(10)
    second = threading.Thread(target=start, args=("second",), name="second")
    second.start()
    first.join(20)
    second.join(20)
    assert errors == []
    with contextlib.closing(sqlite3.connect(path)) as conn:
        rows = conn.execute("SELECT channel, seq, id FROM messages ORDER BY channel, seq")
        assert rows.fetchall() == [
            ("a/b/c", 1, b"i1"),
            ("a/b/c", 2, b"i2"),
            ("a/b/c", 3, None),
            ("a/b/d", 1, None),
        ]
