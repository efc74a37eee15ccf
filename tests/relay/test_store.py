"""The log stores (SQLite, and Redis when there is a redis-server) on their own."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from svc_server.relay.sqlite_store import INLINE_MAX_BYTES, SqliteLogStore
from svc_server.relay.store import MAX_PENDING_WELCOMES, LogStore

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
    made: LogStore
    if backend:
        from svc_server.relay.redis_store import RedisLogStore

        made = RedisLogStore(backend, 3600)
    else:
        made = SqliteLogStore(tmp_path / "relay.sqlite3")
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


async def test_a_welcome_for_many_joiners_is_stored_once(store: LogStore, backend: str) -> None:
    welcome = b"W" * 100_000
    joiners = [b"\x01" * 16 + f"j{i}".encode() for i in range(200)]
    await _commit(store, 0, welcome, joiners, b"commit")
    assert [w.welcome for w in await store.welcomes(joiners[-1])] == [welcome]
    if backend:
        import redis.asyncio as aioredis

        client = aioredis.from_url(backend)
        blobs = [k async for k in client.scan_iter(match="svc:welcome-blob:*")]
        sizes = [await client.strlen(k) for k in blobs]
        await client.aclose()
        assert sizes == [len(welcome)], "one copy of the Welcome, whatever the joiners"
    else:
        assert isinstance(store, SqliteLogStore)
        conn = sqlite3.connect(store._path)
        (copies,) = conn.execute("SELECT count(*) FROM welcome_blobs").fetchone()
        (recipients,) = conn.execute("SELECT count(*) FROM welcome_recipients").fetchone()
        conn.close()
        assert (copies, recipients) == (1, len(joiners))


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

    store._run_batch = recording  # type: ignore[method-assign]
    try:
        await store.append("a/b/c", b"s", b"small", 0)
        await store.append("a/b/c", b"s", b"x" * (INLINE_MAX_BYTES + 1), 0)
        await _commit(store, 0, b"w" * INLINE_MAX_BYTES, [b"\x01" * 17])
        await store.trim(0.0)
    finally:
        await store.close()
    loop_thread = threading.current_thread().name
    assert ran_on == [loop_thread, "svc-log-write", "svc-log-write", "svc-log-write"]


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
    from svc_server.relay.redis_store import RedisLogStore

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


@pytest.mark.slow
async def test_an_idle_follower_neither_times_out_nor_reconnects(
    redis_server: Any, caplog: pytest.LogCaptureFixture
) -> None:
    if redis_server is None:
        pytest.skip("no redis-server on this machine")
    from svc_server.relay.redis_store import FOLLOW_BLOCK_MS, RedisLogStore

    store = RedisLogStore(redis_server.url, 3600)
    seen: list[int] = []
    store.set_sink(lambda entries, welcomes: seen.extend(e.seq for e in entries))
    await store.start()
    try:
        store.watch("a/b/idle", 0)
        # Past one whole XREAD block with nothing to read.
        await asyncio.sleep(FOLLOW_BLOCK_MS / 1000 + 1.5)
        assert "following Redis streams failed" not in caplog.text
        await store.append("a/b/idle", b"s", b"m", 0)
        for _ in range(100):
            if seen:
                break
            await asyncio.sleep(0.02)
        assert seen == [1]
    finally:
        await store.close()
