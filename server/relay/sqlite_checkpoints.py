"""WAL checkpoints of the relay's SQLite log, on a thread of their own.

SQLite's automatic checkpoint runs inside the commit that crosses its threshold (1,000
pages: every ~130 messages of 256 B), and with ``synchronous=NORMAL`` a checkpoint is
where the disk is waited for: two fsyncs. The relay commits small writes on its event
loop (``SqliteLogStore._enqueue``), so that commit stalled every stream for the length of
the fsyncs (~6 ms here) — the tail of every round trip. The log's connections turn the
automatic checkpoint off (``wal_autocheckpoint=0``) and this thread checkpoints instead,
on its own connection, shortly after commits: a PASSIVE checkpoint waits for no reader
and no writer, and none of them waits for it.

Durability is unchanged: a commit is in the WAL either way, and the WAL is what recovery
reads after a crash; the checkpoint only copies it into the database file.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
from collections.abc import Callable

log = logging.getLogger("svc.relay.store")

#: How long after a commit the checkpoint follows: the WAL holds at most about this much
#: time's worth of writes (plus one checkpoint's duration) before it is copied back.
INTERVAL_SECONDS = 0.1


class Checkpointer:
    """Checkpoints the WAL of the database ``connect()`` opens, on its own thread, once
    :meth:`wrote` said there is something to copy."""

    def __init__(self, connect: Callable[[], sqlite3.Connection]) -> None:
        self._connect = connect
        self._wrote = threading.Event()
        self._stopping = False
        self._failing = False
        self._thread: threading.Thread | None = None
        self.checkpoints = 0  # completed, for tests and metrics

    def start(self) -> None:
        conn = self._connect()
        self._thread = threading.Thread(
            target=self._run, args=(conn,), name="svc-log-checkpoint", daemon=True
        )
        self._thread.start()

    def wrote(self) -> None:
        """A transaction committed (any thread): checkpoint soon."""
        self._wrote.set()

    def stop(self) -> None:
        """Stops the thread after one last checkpoint (blocks until it has ended)."""
        self._stopping = True
        self._wrote.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def _run(self, conn: sqlite3.Connection) -> None:
        try:
            while True:
                self._wrote.wait()
                if not self._stopping:
                    # Let a burst of commits finish first: one checkpoint copies each page
                    # once, however often it changed.
                    time.sleep(INTERVAL_SECONDS)
                self._wrote.clear()
                self._checkpoint(conn)
                if self._stopping:
                    return
        finally:
            conn.close()

    def _checkpoint(self, conn: sqlite3.Connection) -> None:
        try:
            conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
        except sqlite3.Error as exc:
            # A full disk or an I/O error: the WAL keeps every commit, and the next
            # commit asks again. Said once, not ten times a second.
            if not self._failing:
                log.warning("WAL checkpoint of the relay log failed (retried): %s", exc)
            self._failing = True
            return
        if self._failing:
            log.warning("WAL checkpoint of the relay log works again")
        self._failing = False
        self.checkpoints += 1
