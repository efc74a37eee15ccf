"""The embedded log: SQLite (WAL) in the server's data directory, for one relay process.

Under load, writes go through one thread that drains every pending request into a
single transaction (group commit), so `synchronous=FULL` costs one fsync per batch, not
per message. When nothing is pending (and with `synchronous=NORMAL`), a request runs on
the event loop at once, which saves two thread hand-offs of latency: an application
append joins a transaction left open for a few milliseconds and is durable once its
record is in the append journal (sqlite_journal); other requests commit at once. Reads
use their own connection and thread; WAL lets them run beside writes. Checkpoints, where
`synchronous=NORMAL` waits for the disk, run on a thread of their own (sqlite_checkpoints).
"""

from __future__ import annotations

import asyncio
import logging
import os
import queue
import sqlite3
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from .sqlite_checkpoints import Checkpointer
from .sqlite_journal import (
    COMMIT_DELAY,
    MAX_JOURNAL_BYTES,
    Journal,
    JournalBusy,
    decode,
    encode,
)
from .store import (
    MAX_PENDING_WELCOMES,
    CommitRejected,
    CursorExpired,
    Entry,
    EntrySink,
    GroupConflict,
    Pipeline,
    PipelineBroken,
    StaleMessages,
    WelcomeEntry,
)

SCHEMA = """
CREATE TABLE IF NOT EXISTS channels (
    name TEXT PRIMARY KEY,
    head_seq INTEGER NOT NULL DEFAULT 0,
    epoch INTEGER NOT NULL DEFAULT 0,
    trimmed_through INTEGER NOT NULL DEFAULT 0
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS messages (
    channel TEXT NOT NULL,
    seq INTEGER NOT NULL,
    sender BLOB NOT NULL,
    handshake INTEGER NOT NULL,
    epoch INTEGER NOT NULL,
    message BLOB NOT NULL,
    stored_at REAL NOT NULL,
    -- Publish.message_id, for dedupe (NULL for commits and id-less publishes): kept
    -- with the message, so retention removes both in one delete.
    id BLOB,
    PRIMARY KEY (channel, seq)
);
CREATE INDEX IF NOT EXISTS messages_stored_at ON messages (stored_at);
CREATE UNIQUE INDEX IF NOT EXISTS messages_id ON messages (channel, sender, id)
    WHERE id IS NOT NULL;
-- A commit's Welcome is stored once, whatever the number of joiners it is for.
CREATE TABLE IF NOT EXISTS welcome_blobs (
    channel TEXT NOT NULL,
    seq INTEGER NOT NULL,
    epoch INTEGER NOT NULL,
    welcome BLOB NOT NULL,
    stored_at REAL NOT NULL,
    PRIMARY KEY (channel, seq)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS welcome_recipients (
    recipient BLOB NOT NULL,
    channel TEXT NOT NULL,
    seq INTEGER NOT NULL,
    PRIMARY KEY (recipient, channel, seq)
) WITHOUT ROWID;
DROP TABLE IF EXISTS welcomes;
-- The relay's tracked MLS group of each channel; version counts every stored change.
CREATE TABLE IF NOT EXISTS groups (
    channel TEXT PRIMARY KEY,
    version INTEGER NOT NULL,
    state BLOB NOT NULL
) WITHOUT ROWID;
"""

# Messages are stored in a rowid table: in a WITHOUT ROWID table each row lives in the
# primary key's b-tree, and SQLite reads a whole overflowing row (a 16 KiB message) into
# memory for every key comparison of an insert. Logs written before hold a WITHOUT ROWID
# table; _migrate moves its rows.
MIGRATE_MESSAGES = """
ALTER TABLE messages RENAME TO messages_without_rowid;
DROP INDEX IF EXISTS messages_stored_at;
{schema}
INSERT INTO messages (channel, seq, sender, handshake, epoch, message, stored_at)
    SELECT channel, seq, sender, handshake, epoch, message, stored_at
    FROM messages_without_rowid ORDER BY channel, seq;
DROP TABLE messages_without_rowid;
"""

# Message ids were a table of their own (with an index on stored_at for retention): two
# more b-trees, and a statement more, in every append. _migrate moves the ids of logs
# written before into messages.id.
MIGRATE_IDS_CHUNK = 1000

# The most a write may carry to be committed on the event loop (see _enqueue).
INLINE_MAX_BYTES = 64 * 1024
# The most an append may carry to go through the journal: a commit of a larger one
# writes mostly its own pages, and the journal would write it once more.
JOURNAL_MAX_BYTES = 8 * 1024
# After a failed commit of journaled appends, the next try comes this much later.
IDLE_RETRY = 0.1
# Message ids looked up per query: under SQLite's oldest limit of 999 bound parameters.
ID_LOOKUP_CHUNK = 500

log = logging.getLogger("svc.relay.store")

# An application message's row, as an append stores it and a journal replay puts it back.
APPLICATION_ROW = (
    "INTO messages (channel, seq, sender, handshake, epoch, message, stored_at, id)"
    " VALUES (?, ?, ?, 0, ?, ?, ?, ?)"
)

Op = Callable[[sqlite3.Connection], tuple[Any, list[Entry], list[WelcomeEntry]]]
# What the journal records of an append: the record of the entries it stored.
Record = Callable[[list[Entry]], bytes]
# A request's future and its result or error.
Outcome = tuple["asyncio.Future[Any]", Any, BaseException | None]


class _Piped:
    """An append of a pipeline (store.Pipeline): not run once an earlier one failed."""

    __slots__ = ("op", "pipeline")

    def __init__(self, op: Op, pipeline: Pipeline) -> None:
        self.op, self.pipeline = op, pipeline

    def __call__(self, conn: sqlite3.Connection) -> tuple[Any, list[Entry], list[WelcomeEntry]]:
        if self.pipeline.broken:
            raise PipelineBroken()
        return self.op(conn)


def _failed(op: Op, future: asyncio.Future[Any], error: BaseException) -> Outcome:
    """The outcome of ``op``, which failed; an append's pipeline breaks with it (a
    refusal such as StaleMessages is an answer, not a failure: it does not)."""
    if isinstance(op, _Piped) and not isinstance(error, StaleMessages):
        op.pipeline.broken = True
    return (future, None, error)


def _connect(path: Path, sync: str) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute(f"PRAGMA synchronous={'FULL' if sync == 'full' else 'NORMAL'}")
    conn.execute("PRAGMA busy_timeout=10000")
    # Never inside a commit (an fsync on the event loop): the Checkpointer's thread does it.
    conn.execute("PRAGMA wal_autocheckpoint=0")
    return conn


def _statements(script: str) -> list[str]:
    """The SQL statements of ``script``, in order, each with the comments before it."""
    statements, current = [], ""
    for line in script.splitlines(keepends=True):
        current += line
        if sqlite3.complete_statement(current):
            statements.append(current)
            current = ""
    return statements


def _migrate(conn: sqlite3.Connection) -> None:
    """Moves a log of an earlier layout to the current one in one transaction: a WITHOUT
    ROWID ``messages`` table to a rowid table, then the ids of a ``message_ids`` table
    into ``messages.id``. The layout is read under the write lock, so a second relay
    starting on the same log meanwhile finds the work done. The moved rows are rewritten
    (up to the log's size in the WAL), so the WAL is checkpointed and emptied after."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        moved = _move_to_rowids(conn)
        moved = _move_ids(conn) or moved
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    if moved:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")


def _move_to_rowids(conn: sqlite3.Connection) -> bool:
    row = conn.execute(
        "SELECT sql LIKE '%WITHOUT ROWID%' FROM sqlite_master"
        " WHERE type = 'table' AND name = 'messages'"
    ).fetchone()
    if row is None or not row[0]:
        return False
    for statement in _statements(MIGRATE_MESSAGES.format(schema=SCHEMA)):
        conn.execute(statement)
    return True


def _move_ids(conn: sqlite3.Connection) -> bool:
    tables = {name for (name,) in conn.execute("SELECT name FROM sqlite_master")}
    if "messages" not in tables:
        return False  # a new log: SCHEMA makes it
    columns = {row[1] for row in conn.execute("PRAGMA table_info(messages)")}
    if "id" in columns and "message_ids" not in tables:
        return False
    if "id" not in columns:
        conn.execute("ALTER TABLE messages ADD COLUMN id BLOB")
    if "message_ids" in tables:
        rows = conn.execute("SELECT id, channel, seq, sender FROM message_ids")
        while chunk := rows.fetchmany(MIGRATE_IDS_CHUNK):
            conn.executemany(
                "UPDATE messages SET id = ? WHERE channel = ? AND seq = ? AND sender = ?",
                chunk,
            )
        conn.execute("DROP TABLE message_ids")  # and its index
    return True


def _replay(conn: sqlite3.Connection, data: bytes) -> int:
    """Stores the entries of the journal's whole records (``data``) that the log does not
    hold — all of them after a crash with the transaction open, none after one between
    its commit and the journal's reset — in one transaction. Returns how many records."""
    records = 0
    conn.execute("BEGIN IMMEDIATE")
    try:
        for record in decode(data):
            records += 1
            for e, message_id in record:
                conn.execute("INSERT OR IGNORE INTO channels (name) VALUES (?)", (e.channel,))
                conn.execute(
                    "INSERT OR IGNORE " + APPLICATION_ROW,
                    (e.channel, e.seq, e.sender, e.epoch, e.message, e.stored_at, message_id),
                )
                conn.execute(
                    "UPDATE channels SET head_seq = MAX(head_seq, ?) WHERE name = ?",
                    (e.seq, e.channel),
                )
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    return records


def _entry(channel: str, row: tuple[Any, ...]) -> Entry:
    seq, sender, handshake, epoch, message, stored_at = row
    return Entry(channel, seq, bytes(sender), bool(handshake), epoch, bytes(message), stored_at)


class SqliteLogStore:
    def __init__(self, path: Path, sync: str = "normal") -> None:
        self._path = path
        self._sync = sync
        self._sink: EntrySink = lambda entries, welcomes: None
        self._queue: queue.SimpleQueue[tuple[Op, asyncio.Future[Any]] | None] = queue.SimpleQueue()
        self._writer: threading.Thread | None = None
        self._reads = ThreadPoolExecutor(max_workers=1, thread_name_prefix="svc-log-read")
        self._read_conn: sqlite3.Connection | None = None
        self._checkpointer: Checkpointer | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._conn: sqlite3.Connection | None = None  # the writer's; used under _busy
        self._journal: Journal | None = None  # used under _busy
        self._busy = threading.Lock()
        self._count_lock = threading.Lock()
        self._queued = 0  # requests queued for or being run by the writer thread
        self._inline = sync != "full"

    def set_sink(self, sink: EntrySink) -> None:
        self._sink = sink

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        if not self._path.exists():
            os.close(os.open(self._path, os.O_CREAT | os.O_WRONLY, 0o600))
        conn = _connect(self._path, self._sync)
        _migrate(conn)
        conn.executescript(SCHEMA)
        try:
            self._journal = Journal(self._path.with_name(self._path.name + "-appends"))
        except JournalBusy as exc:
            log.warning("relay log: %s; every append commits at once in this one", exc)
        if self._journal is not None and self._journal.size:
            # The relay stopped with appends not yet committed.
            records = _replay(conn, self._journal.read())
            log.info("relay log: %d journaled appends replayed", records)
            self._journal.reset()
        self._conn = conn
        self._writer = threading.Thread(
            target=self._write_loop, args=(conn,), name="svc-log-write", daemon=True
        )
        self._writer.start()
        self._read_conn = _connect(self._path, self._sync)
        self._checkpointer = Checkpointer(lambda: _connect(self._path, self._sync), self._busy)
        self._checkpointer.start()

    async def close(self) -> None:
        self._inline = False
        if self._writer is not None:
            self._queue.put(None)
            await asyncio.to_thread(self._writer.join)
            self._writer = None
        self._reads.shutdown(wait=True)
        if self._checkpointer is not None:
            await asyncio.to_thread(self._checkpointer.stop)
            self._checkpointer = None
        if self._read_conn is not None:
            self._read_conn.close()

    # -- writes: one thread, one transaction per batch of requests --------------------

    def _write_loop(self, conn: sqlite3.Connection) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                with self._busy:
                    try:
                        self._commit_open()
                    except Exception:  # the journal keeps them: replayed on the next start
                        log.exception("relay log: committing the last appends failed")
                    conn.close()
                    self._conn = None
                    if self._journal is not None:
                        self._journal.close()
                return
            with self._busy:
                batch = [item]
                while len(batch) < 512:
                    try:
                        more = self._queue.get_nowait()
                    except queue.Empty:
                        break
                    if more is None:
                        self._queue.put(None)
                        break
                    batch.append(more)
                outcome = self._run_batch(conn, batch)
                with self._count_lock:
                    self._queued -= len(batch)
            # One wake-up of the event loop per batch, not per request.
            assert self._loop is not None
            self._loop.call_soon_threadsafe(self._settle, *outcome)

    def _run_batch(
        self, conn: sqlite3.Connection, batch: list[tuple[Op, asyncio.Future[Any]]]
    ) -> tuple[list[Entry], list[WelcomeEntry], list[Outcome]]:
        results: list[Outcome] = []
        entries: list[Entry] = []
        welcomes: list[WelcomeEntry] = []
        # A lone request needs no savepoint: if it fails, the whole transaction goes.
        alone = len(batch) == 1
        try:
            self._commit_open()
            conn.execute("BEGIN IMMEDIATE")
            for op, future in batch:
                if not alone:
                    conn.execute("SAVEPOINT op")
                try:
                    value, new_entries, new_welcomes = op(conn)
                except Exception as exc:  # this request fails; the others go on
                    if alone:
                        conn.execute("ROLLBACK")
                        return [], [], [_failed(op, future, exc)]
                    conn.execute("ROLLBACK TO op")
                    conn.execute("RELEASE op")
                    results.append(_failed(op, future, exc))
                    continue
                if not alone:
                    conn.execute("RELEASE op")
                entries.extend(new_entries)
                welcomes.extend(new_welcomes)
                results.append((future, value, None))
            conn.execute("COMMIT")
        except Exception as exc:  # the batch could not be stored: nothing of it happened
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            return [], [], [_failed(op, future, exc) for op, future in batch]
        return entries, welcomes, results

    def _settle(
        self, entries: list[Entry], welcomes: list[WelcomeEntry], results: list[Outcome]
    ) -> None:
        if entries or welcomes:
            self._sink(entries, welcomes)
        for future, value, error in results:
            if future.done():  # the caller gave up (cancelled); its write still happened
                continue
            if error is not None:
                future.set_exception(error)
            else:
                future.set_result(value)

    def _enqueue(self, op: Op, size: int, record: Record | None = None) -> asyncio.Future[Any]:
        """Runs ``op`` in the writer's transaction order (call from the event loop).

        When nothing is queued or running, a small request (``size`` bytes to write, at
        most INLINE_MAX_BYTES) is committed right here instead of through the writer
        thread: at low load that saves two thread hand-offs on the path every message
        takes (publish → durable → fan-out and reply). Only with ``synchronous=NORMAL``,
        where a commit does not wait for the disk. Large writes, and retention's
        deletes, always go to the writer thread: they would stall every stream.

        An op with a ``record`` (an application append) runs inline in the open
        transaction, and is done once the journal holds its record (:meth:`_run_open`)."""
        assert self._loop is not None, "start() the store first"
        inline = self._inline and size <= INLINE_MAX_BYTES
        if size > JOURNAL_MAX_BYTES or self._journal is None:
            # Its own pages are most of what its commit writes, or there is no journal.
            record = None
        # An inline append's pages are counted when the open transaction commits.
        if self._checkpointer is not None and not (inline and record is not None):
            # Pages this write adds to the WAL, roughly: its bytes, plus the rows and
            # index entries around them.
            self._checkpointer.wrote(size // 4096 + 4)
        future: asyncio.Future[Any] = self._loop.create_future()
        if inline and self._queued == 0 and self._busy.acquire(blocking=False):
            try:
                # The writer holds _busy from taking a request until it has counted it
                # done, so no earlier request can still be on its way: order is kept.
                if self._queued == 0 and self._conn is not None:
                    if record is not None:
                        self._settle(*self._run_open(self._conn, op, future, record))
                    else:
                        self._settle(*self._run_batch(self._conn, [(op, future)]))
                    return future
            finally:
                self._busy.release()
        with self._count_lock:
            self._queued += 1
        self._queue.put((op, future))
        return future

    # -- the open transaction and its journal (under _busy) ---------------------------

    def _run_open(
        self, conn: sqlite3.Connection, op: Op, future: asyncio.Future[Any], record: Record
    ) -> tuple[list[Entry], list[WelcomeEntry], list[Outcome]]:
        """Runs an append in the open transaction (begun if there is none, and committed
        within COMMIT_DELAY); it is durable once the journal holds its record."""
        journal = self._journal
        assert journal is not None and self._loop is not None
        if journal.broken:  # a torn record at its end: nothing more goes after it
            return self._run_batch(conn, [(op, future)])
        try:
            if not conn.in_transaction:
                self._commit_open()  # only if a commit or a reset failed before
                conn.execute("BEGIN IMMEDIATE")
                self._loop.call_later(COMMIT_DELAY, self._commit_due)
            conn.execute("SAVEPOINT op")
        except Exception as exc:
            return [], [], [_failed(op, future, exc)]
        try:
            value, entries, welcomes = op(conn)
            if entries:
                journal.append(record(entries))
        except Exception as exc:  # this append did not happen; the others stand
            try:
                conn.execute("ROLLBACK TO op")
                conn.execute("RELEASE op")
            except sqlite3.Error:
                # SQLite rolled the whole transaction back (an I/O error): the journal
                # holds what it had, and _commit_open puts that back before anything else.
                pass
            return [], [], [_failed(op, future, exc)]
        conn.execute("RELEASE op")
        if journal.size >= MAX_JOURNAL_BYTES:
            self._commit_quietly()
        return entries, welcomes, [(future, value, None)]

    def _commit_open(self) -> None:
        """Commits the open transaction and empties the journal. When a commit failed
        before (SQLite may have rolled its transaction back), the journal's records are
        put back into the log first: until then the log is not what was acknowledged."""
        conn, journal = self._conn, self._journal
        if conn is None or journal is None:
            return
        if conn.in_transaction:
            conn.execute("COMMIT")
            if self._checkpointer is not None:
                self._checkpointer.wrote(journal.size // 4096 + 4)
        elif journal.size:
            _replay(conn, journal.read())
        if journal.size or journal.broken:
            try:
                journal.reset()
            except OSError as exc:
                # Its records are in the log now; replaying them again changes nothing.
                log.warning("relay log: emptying the append journal failed: %s", exc)

    def _commit_quietly(self) -> None:
        try:
            self._commit_open()
        except Exception as exc:  # the journal holds the appends; tried again later
            log.warning("relay log: committing journaled appends failed (retried): %s", exc)
            assert self._loop is not None
            self._loop.call_later(IDLE_RETRY, self._commit_due)

    def _commit_due(self) -> None:
        """The open transaction's time is up (on the event loop)."""
        if not self._pending_appends():
            return
        if not self._busy.acquire(blocking=False):
            # The writer or a read holds the lock, and commits first; if it was the
            # checkpointer, the transaction is still open when it is done.
            assert self._loop is not None
            self._loop.call_later(COMMIT_DELAY / 10, self._commit_due)
            return
        try:
            self._commit_quietly()
        finally:
            self._busy.release()

    def _pending_appends(self) -> bool:
        """Whether appends wait in the open transaction or the journal (any thread)."""
        conn, journal = self._conn, self._journal
        return bool(conn is not None and conn.in_transaction) or bool(journal and journal.size)

    async def _write(self, op: Op, size: int) -> Any:
        return await self._enqueue(op, size)

    @staticmethod
    def _channel_row(conn: sqlite3.Connection, channel: str) -> tuple[int, int]:
        select = "SELECT head_seq, epoch FROM channels WHERE name = ?"
        row = conn.execute(select, (channel,)).fetchone()
        if row is None:
            conn.execute("INSERT INTO channels (name) VALUES (?)", (channel,))
            row = conn.execute(select, (channel,)).fetchone()
        head, epoch = row
        return head, epoch

    def append(
        self, channel: str, sender: bytes, message: bytes, epoch: int
    ) -> asyncio.Future[Entry]:
        def op(conn: sqlite3.Connection) -> tuple[Entry, list[Entry], list[WelcomeEntry]]:
            head, _ = self._channel_row(conn, channel)
            entry = Entry(channel, head + 1, sender, False, epoch, message, time.time())
            self._insert(conn, entry)
            conn.execute("UPDATE channels SET head_seq = ? WHERE name = ?", (entry.seq, channel))
            return entry, [entry], []

        return self._enqueue(op, len(message))

    def append_many(
        self,
        channel: str,
        sender: bytes,
        messages: Sequence[tuple[bytes, int]],
        ids: Sequence[bytes] = (),
        pipeline: Pipeline | None = None,
    ) -> asyncio.Future[list[Entry]]:
        def op(conn: sqlite3.Connection) -> tuple[list[Entry], list[Entry], list[WelcomeEntry]]:
            head, current = self._channel_row(conn, channel)
            # Ids this sender stored already: answered with the original seq, before (and
            # whatever) the epoch check, in the same transaction as the append.
            known: dict[bytes, int] = {}
            for start in range(0, len(ids), ID_LOOKUP_CHUNK):
                chunk = ids[start : start + ID_LOOKUP_CHUNK]
                marks = ",".join("?" * len(chunk))  # placeholders only: every value is bound
                select = (
                    "SELECT id, seq FROM messages WHERE channel = ? AND sender = ? "  # noqa: S608
                    f"AND id IN ({marks})"
                )
                known.update(conn.execute(select, (channel, sender, *chunk)).fetchall())
            fresh: list[int] = []
            seen: set[bytes] = set()
            for i in range(len(messages)):
                if ids:
                    if ids[i] in known or ids[i] in seen:
                        continue
                    seen.add(ids[i])
                fresh.append(i)
            if any(messages[i][1] != current for i in fresh):
                raise StaleMessages(current)
            now = time.time()
            stored = [
                Entry(channel, head + 1 + n, sender, False, messages[i][1], messages[i][0], now)
                for n, i in enumerate(fresh)
            ]
            journaled[:] = [ids[i] if ids else None for i in fresh]
            if stored:
                conn.executemany(
                    "INSERT " + APPLICATION_ROW,
                    [
                        (channel, e.seq, sender, e.epoch, e.message, now, ids[i] if ids else None)
                        for e, i in zip(stored, fresh, strict=True)
                    ],
                )
                conn.execute(
                    "UPDATE channels SET head_seq = ? WHERE name = ?", (stored[-1].seq, channel)
                )
            result: list[Entry] = []
            new = iter(stored)
            for i, (message, epoch) in enumerate(messages):
                if ids and ids[i] in known:
                    result.append(Entry(channel, known[ids[i]], sender, False, epoch, message, now))
                    continue
                entry = next(new)
                result.append(entry)
                if ids:
                    # A repeated id inside one frame is stored once, like a resend.
                    known[ids[i]] = entry.seq
            return result, stored, []

        journaled: list[bytes | None] = []  # the ids of what op stored, for its record
        return self._enqueue(
            op if pipeline is None else _Piped(op, pipeline),
            sum(len(m) for m, _ in messages),
            lambda stored: encode(stored, journaled),
        )

    async def commit(
        self,
        channel: str,
        sender: bytes,
        epoch: int,
        commit: bytes,
        welcome: bytes,
        joiners: Sequence[bytes],
        group: tuple[int, bytes],
    ) -> Entry:
        version, state = group

        def op(conn: sqlite3.Connection) -> tuple[Entry, list[Entry], list[WelcomeEntry]]:
            head, current = self._channel_row(conn, channel)
            if epoch != current or not self._advance_group(conn, channel, version, state):
                raise CommitRejected(current)
            now = time.time()
            entry = Entry(channel, head + 1, sender, True, epoch, commit, now)
            self._insert(conn, entry)
            conn.execute(
                "UPDATE channels SET head_seq = ?, epoch = ? WHERE name = ?",
                (entry.seq, epoch + 1, channel),
            )
            new_welcomes = (
                [WelcomeEntry(channel, joiner, entry.seq, epoch + 1, welcome) for joiner in joiners]
                if welcome
                else []
            )
            if new_welcomes:
                conn.execute(
                    "INSERT OR REPLACE INTO welcome_blobs VALUES (?, ?, ?, ?, ?)",
                    (channel, entry.seq, epoch + 1, welcome, now),
                )
                conn.executemany(
                    "INSERT OR REPLACE INTO welcome_recipients VALUES (?, ?, ?)",
                    [(w.recipient, channel, w.seq) for w in new_welcomes],
                )
            return entry, [entry], new_welcomes

        result: Entry = await self._write(op, len(commit) + len(welcome) + len(state))
        return result

    async def propose(
        self, channel: str, sender: bytes, epoch: int, proposal: bytes, group: tuple[int, bytes]
    ) -> Entry:
        version, state = group

        def op(conn: sqlite3.Connection) -> tuple[Entry, list[Entry], list[WelcomeEntry]]:
            head, current = self._channel_row(conn, channel)
            if epoch != current:
                raise StaleMessages(current)
            if not self._advance_group(conn, channel, version, state):
                raise GroupConflict(channel)
            entry = Entry(channel, head + 1, sender, False, epoch, proposal, time.time())
            self._insert(conn, entry)
            conn.execute("UPDATE channels SET head_seq = ? WHERE name = ?", (entry.seq, channel))
            return entry, [entry], []

        result: Entry = await self._write(op, len(proposal) + len(state))
        return result

    async def create_group(self, channel: str, state: bytes) -> int:
        # A dropped group's row stays, its version negated: the next one counts on.
        def op(conn: sqlite3.Connection) -> tuple[int, list[Entry], list[WelcomeEntry]]:
            self._channel_row(conn, channel)
            row = conn.execute("SELECT version FROM groups WHERE channel = ?", (channel,))
            found = row.fetchone()
            if found is None:
                conn.execute("INSERT INTO groups VALUES (?, 1, ?)", (channel, state))
                return 1, [], []
            if found[0] > 0:
                return 0, [], []
            version = 1 - found[0]
            conn.execute(
                "UPDATE groups SET version = ?, state = ? WHERE channel = ?",
                (version, state, channel),
            )
            return version, [], []

        result: int = await self._write(op, len(state))
        return result

    async def drop_group(self, channel: str, version: int) -> bool:
        def op(conn: sqlite3.Connection) -> tuple[bool, list[Entry], list[WelcomeEntry]]:
            head, _ = self._channel_row(conn, channel)
            if head:
                return False, [], []
            dropped = conn.execute(
                "UPDATE groups SET version = -version, state = x'' "
                "WHERE channel = ? AND version = ?",
                (channel, version),
            ).rowcount
            return dropped == 1, [], []

        result: bool = await self._write(op, 0)
        return result

    @staticmethod
    def _advance_group(conn: sqlite3.Connection, channel: str, version: int, state: bytes) -> bool:
        """Stores ``state`` as the version after ``version``, if that is still the stored
        one."""
        moved = conn.execute(
            "UPDATE groups SET version = version + 1, state = ? WHERE channel = ? AND version = ?",
            (state, channel, version),
        )
        return moved.rowcount == 1

    @staticmethod
    def _insert(conn: sqlite3.Connection, e: Entry) -> None:
        conn.execute(
            "INSERT INTO messages (channel, seq, sender, handshake, epoch, message, stored_at)"
            " VALUES (?, ?, ?, ?, ?, ?, ?)",
            (e.channel, e.seq, e.sender, int(e.handshake), e.epoch, e.message, e.stored_at),
        )

    async def trim(self, older_than: float) -> int:
        def op(conn: sqlite3.Connection) -> tuple[int, list[Entry], list[WelcomeEntry]]:
            conn.execute(
                """UPDATE channels SET trimmed_through = MAX(trimmed_through, (
                       SELECT MAX(seq) FROM messages
                       WHERE messages.channel = channels.name AND stored_at < ?))
                   WHERE EXISTS (SELECT 1 FROM messages
                       WHERE messages.channel = channels.name AND stored_at < ?)""",
                (older_than, older_than),
            )
            removed = conn.execute("DELETE FROM messages WHERE stored_at < ?", (older_than,))
            conn.execute(
                "DELETE FROM welcome_recipients WHERE (channel, seq) IN "
                "(SELECT channel, seq FROM welcome_blobs WHERE stored_at < ?)",
                (older_than,),
            )
            conn.execute("DELETE FROM welcome_blobs WHERE stored_at < ?", (older_than,))
            return removed.rowcount, [], []

        result: int = await self._write(op, size=INLINE_MAX_BYTES + 1)  # unbounded work
        return result

    # -- reads ------------------------------------------------------------------------

    async def _read(self, fn: Callable[[sqlite3.Connection], Any]) -> Any:
        assert self._read_conn is not None, "store not started"
        conn = self._read_conn

        def run(conn: sqlite3.Connection) -> Any:
            if self._pending_appends():  # a read sees every acknowledged append
                with self._busy:
                    self._commit_open()
            return fn(conn)

        return await asyncio.get_running_loop().run_in_executor(self._reads, run, conn)

    async def head(self, channel: str) -> tuple[int, int]:
        def fn(conn: sqlite3.Connection) -> tuple[int, int]:
            row = conn.execute(
                "SELECT head_seq, epoch FROM channels WHERE name = ?", (channel,)
            ).fetchone()
            return (row[0], row[1]) if row else (0, 0)

        result: tuple[int, int] = await self._read(fn)
        return result

    async def group_version(self, channel: str) -> int:
        def fn(conn: sqlite3.Connection) -> int:
            row = conn.execute(
                "SELECT version FROM groups WHERE channel = ? AND version > 0", (channel,)
            ).fetchone()
            return int(row[0]) if row else 0

        result: int = await self._read(fn)
        return result

    async def group(self, channel: str) -> tuple[int, bytes] | None:
        def fn(conn: sqlite3.Connection) -> tuple[int, bytes] | None:
            row = conn.execute(
                "SELECT version, state FROM groups WHERE channel = ? AND version > 0", (channel,)
            ).fetchone()
            return (int(row[0]), bytes(row[1])) if row else None

        result: tuple[int, bytes] | None = await self._read(fn)
        return result

    async def read(
        self, channel: str, after_seq: int, limit: int, max_bytes: int | None = None
    ) -> list[Entry]:
        def fn(conn: sqlite3.Connection) -> list[Entry]:
            conn.execute("BEGIN")  # one snapshot for the retention check and the rows
            try:
                row = conn.execute(
                    "SELECT trimmed_through FROM channels WHERE name = ?", (channel,)
                ).fetchone()
                if row and after_seq < row[0]:
                    raise CursorExpired(row[0])
                rows = conn.execute(
                    "SELECT seq, sender, handshake, epoch, message, stored_at FROM messages "
                    "WHERE channel = ? AND seq > ? ORDER BY seq LIMIT ?",
                    (channel, after_seq, limit),
                )
                # Row by row: SQLite reads a message only when the cursor reaches it.
                entries: list[Entry] = []
                size = 0
                for r in rows:
                    entries.append(_entry(channel, r))
                    size += len(r[4])
                    if max_bytes is not None and size >= max_bytes:
                        break
                rows.close()
            finally:
                conn.execute("COMMIT")
            return entries

        result: list[Entry] = await self._read(fn)
        return result

    async def welcomes(self, recipient: bytes) -> list[WelcomeEntry]:
        def fn(conn: sqlite3.Connection) -> list[WelcomeEntry]:
            rows = conn.execute(
                "SELECT b.channel, b.seq, b.epoch, b.welcome FROM welcome_recipients r "
                "JOIN welcome_blobs b ON b.channel = r.channel AND b.seq = r.seq "
                "WHERE r.recipient = ? ORDER BY r.seq DESC LIMIT ?",
                (recipient, MAX_PENDING_WELCOMES),
            ).fetchall()
            return [WelcomeEntry(c, recipient, s, e, bytes(w)) for c, s, e, w in reversed(rows)]

        result: list[WelcomeEntry] = await self._read(fn)
        return result

    # In one process the sink sees every entry as it is stored: nothing to watch.
    def watch(self, channel: str, after_seq: int) -> None:
        return None

    def unwatch(self, channel: str) -> None:
        return None
