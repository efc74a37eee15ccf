"""The SQLite log store on its own."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from svc_server.relay.sqlite_store import SqliteLogStore

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
