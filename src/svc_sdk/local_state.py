"""What the client keeps beside the MLS state in ``data_dir`` (``client.sqlite3``, 0600):
the channels it is in, the relay cursor of each (the last sequence number handled), and
the inbox of decrypted messages not yet handed to the application.

Decrypted messages go into the inbox in the same transaction that advances the cursor,
so a restart neither asks the relay for them again (their keys are gone: MLS deletes a
message key once used) nor loses them. A message handed straight to a waiting reader is
not stored. The cursor only moves forward: a late write of an older one changes nothing.

The outbox is not here: the engine keeps it in its own database, written in the
transaction that saves the ratchet state that encrypted each message (svc_sdk.outbox).

The inbox is plaintext at rest inside the agent's private data_dir, the same
place that holds the keys that decrypt them.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
from collections.abc import Iterable
from pathlib import Path

from svc_sdk.errors import InternalError

_SCHEMA = """
CREATE TABLE IF NOT EXISTS channels (
    name TEXT PRIMARY KEY,
    cursor INTEGER NOT NULL,
    joined_epoch INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS inbox (
    channel TEXT NOT NULL,
    seq INTEGER NOT NULL,
    sender BLOB NOT NULL,
    payload BLOB NOT NULL,
    PRIMARY KEY (channel, seq)
);
"""


class LocalState:
    def __init__(self, data_dir: str | os.PathLike[str]) -> None:
        path = Path(data_dir) / "client.sqlite3"
        # Created 0600 and exclusively before SQLite opens it; a file that exists already
        # was checked (ours, private) when the engine took data_dir.
        with contextlib.suppress(FileExistsError):
            os.close(os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600))
        db = None
        try:
            db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=NORMAL")
            db.executescript(_SCHEMA)
        except sqlite3.Error as exc:  # not a database file (overwritten, a folder…)
            if db is not None:
                db.close()
            raise InternalError(
                f"cannot use data_dir {path.parent}: {path.name} is not a usable database ({exc})"
            ) from None
        self._db = db
        self._lock = threading.Lock()

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def channels(self) -> list[tuple[str, int, int]]:
        """(name, cursor, joined_epoch) of every channel."""
        with self._lock:
            return list(self._db.execute("SELECT name, cursor, joined_epoch FROM channels"))

    def add_channel(self, name: str, cursor: int, joined_epoch: int) -> None:
        with self._lock:
            self._db.execute(
                "INSERT OR REPLACE INTO channels VALUES (?, ?, ?)", (name, cursor, joined_epoch)
            )

    def remove_channel(self, name: str) -> None:
        with self._lock, self._db:
            self._db.execute("BEGIN")
            self._db.execute("DELETE FROM inbox WHERE channel = ?", (name,))
            self._db.execute("DELETE FROM channels WHERE name = ?", (name,))

    def advance(self, name: str, cursor: int, received: Iterable[tuple[int, bytes, bytes]]) -> None:
        """Stores (seq, sender, payload) rows and the new cursor in one transaction."""
        with self._lock, self._db:
            self._db.execute("BEGIN")
            self._db.executemany(
                "INSERT OR IGNORE INTO inbox VALUES (?, ?, ?, ?)",
                ((name, seq, sender, payload) for seq, sender, payload in received),
            )
            self._db.execute(
                "UPDATE channels SET cursor = MAX(cursor, ?) WHERE name = ?", (cursor, name)
            )

    def inbox(
        self, name: str, after: int = 0, limit: int | None = None
    ) -> list[tuple[int, bytes, bytes]]:
        """(seq, sender, payload) of stored messages after ``after``, in order, at most
        ``limit`` of them."""
        with self._lock:
            return [
                (seq, bytes(sender), bytes(payload))
                for seq, sender, payload in self._db.execute(
                    "SELECT seq, sender, payload FROM inbox WHERE channel = ? AND seq > ? "
                    "ORDER BY seq LIMIT ?",
                    (name, after, -1 if limit is None else limit),
                )
            ]

    def inbox_count(self, name: str, after: int = 0) -> int:
        """How many stored messages come after ``after``."""
        with self._lock:
            row = self._db.execute(
                "SELECT count(*) FROM inbox WHERE channel = ? AND seq > ?", (name, after)
            ).fetchone()
            return int(row[0])

    def consumed(
        self, name: str, through_seq: int, extra: Iterable[int] = (), cursor: int = 0
    ) -> None:
        """The application has taken every message up to ``through_seq``, and the
        messages numbered ``extra`` beyond it; the channel was handled through
        ``cursor``."""
        with self._lock, self._db:
            self._db.execute("BEGIN")
            if through_seq > 0:
                self._db.execute(
                    "DELETE FROM inbox WHERE channel = ? AND seq <= ?", (name, through_seq)
                )
            self._db.executemany(
                "DELETE FROM inbox WHERE channel = ? AND seq = ?", ((name, s) for s in extra)
            )
            self._db.execute(
                "UPDATE channels SET cursor = MAX(cursor, ?) WHERE name = ?", (cursor, name)
            )
