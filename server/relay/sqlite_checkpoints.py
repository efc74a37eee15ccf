"""WAL checkpoints of the relay's SQLite log, on a thread of their own.

SQLite's automatic checkpoint runs inside the commit that crosses its threshold (1,000
pages: every ~130 messages of 256 B), and with ``synchronous=NORMAL`` a checkpoint is
where the disk is waited for: two fsyncs. The relay commits small writes on its event
loop (``SqliteLogStore._enqueue``), so that commit stalled every stream for the length of
the fsyncs (~6 ms here) — the tail of every round trip. The log's connections turn the
automatic checkpoint off (``wal_autocheckpoint=0``) and this thread checkpoints instead,
on its own connection, as often as SQLite would (every ~1,000 pages written, estimated
by the store; a smaller trickle after a second): a PASSIVE checkpoint waits for no
reader and no writer, and none of them waits for it.

A PASSIVE checkpoint copies the frames that were in the WAL when it began, and SQLite
starts the WAL over only when a write finds every frame copied. Under a steady stream of
writes that never happens — frames arrive while the checkpoint runs — and the WAL grows
without bound (2 GB in 15 s of appends here). So once the WAL holds more than
:data:`MAX_WAL_PAGES`, the checkpoint copies what came in meanwhile while holding the
store's write lock: the writer thread waits for that short second pass (the event loop
does not; it queues to the writer meanwhile), and the next write starts the WAL over.

Durability is unchanged: a commit is in the WAL either way, and the WAL is what recovery
reads after a crash; the checkpoint only copies it into the database file.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
from collections.abc import Callable
from contextlib import AbstractContextManager

log = logging.getLogger("svc.relay.store")

#: Pages written (estimated) that make a checkpoint due: SQLite's own threshold, so
#: checkpoints come as often as before, each copying as much.
PAGES = 1000
#: WAL frames past which a checkpoint makes sure the WAL starts over (16 MiB at 4 KiB).
MAX_WAL_PAGES = 4 * PAGES
#: A trickle of writes is checkpointed this long after it began.
IDLE_SECONDS = 1.0


class Checkpointer:
    """Checkpoints the WAL of the database ``connect()`` opens, on its own thread, once
    :meth:`wrote` has counted enough pages (or a second after a smaller write).
    ``writes`` is the lock the store's writes hold: taken for the second pass that lets a
    long WAL start over."""

    def __init__(
        self,
        connect: Callable[[], sqlite3.Connection],
        writes: AbstractContextManager[object] | None = None,
    ) -> None:
        self._connect = connect
        self._writes = writes
        self._lock = threading.Lock()
        self._pages = 0
        self._due = threading.Event()
        self._stopped = threading.Event()  # set by stop(): ends a wait between retries
        self._stopping = False
        self._failing = False
        self._thread: threading.Thread | None = None
        self.checkpoints = 0  # completed, for tests and metrics
        self.failures = 0
        self.restarts = 0  # second passes under the write lock

    def start(self) -> None:
        conn = self._connect()
        self._thread = threading.Thread(
            target=self._run, args=(conn,), name="svc-log-checkpoint", daemon=True
        )
        self._thread.start()

    def wrote(self, pages: int) -> None:
        """About ``pages`` pages are being written to the WAL (any thread)."""
        with self._lock:
            self._pages += pages
            due = self._pages >= PAGES
        if due:
            self._due.set()

    def stop(self) -> None:
        """Stops the thread after one last checkpoint (blocks until it has ended)."""
        self._stopping = True
        self._stopped.set()
        self._due.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def _run(self, conn: sqlite3.Connection) -> None:
        try:
            while True:
                self._due.wait(IDLE_SECONDS)
                self._due.clear()
                with self._lock:
                    pages, self._pages = self._pages, 0
                if (pages or self._stopping) and not self._checkpoint(conn):
                    with self._lock:
                        self._pages += pages  # still to copy
                    if not self._stopping:
                        # Not once per write while the disk is full: once a second.
                        self._stopped.wait(IDLE_SECONDS)
                if self._stopping:
                    return
        finally:
            conn.close()

    def _checkpoint(self, conn: sqlite3.Connection) -> bool:
        try:
            _, frames, _ = conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
            if frames > MAX_WAL_PAGES and self._writes is not None:
                with self._writes:  # no frame can arrive: every one is copied
                    conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
                self.restarts += 1
        except sqlite3.Error as exc:
            # A full disk or an I/O error: the WAL keeps every commit, and the checkpoint
            # is tried again. Said once, not at every try.
            if not self._failing:
                log.warning("WAL checkpoint of the relay log failed (retried): %s", exc)
            self._failing = True
            self.failures += 1
            return False
        if self._failing:
            log.warning("WAL checkpoint of the relay log works again")
        self._failing = False
        self.checkpoints += 1
        return True
