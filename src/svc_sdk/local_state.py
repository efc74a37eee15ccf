"""What the client keeps beside the MLS state in ``data_dir`` (``client.sqlite3``, 0600):
the channels it is in, the relay cursor of each (the last sequence number handled), and
the inbox of decrypted messages not yet handed to the application.

Decrypted messages go into the inbox in the same transaction that advances the cursor,
so a restart neither asks the relay for them again (their keys are gone: MLS deletes a
message key once used) nor loses them. A message handed straight to a waiting reader is
not stored. The cursor only moves forward: a late write of an older one changes nothing.

The outbox is not here: the engine keeps it in its own database, written in the
transaction that saves the ratchet state that encrypted each message (svc_sdk.outbox).

The database is kept by the native extension (``_native.LocalStore``), not the standard
library's ``sqlite3``, which cannot be keyed: in a data_dir encrypted at rest
(svc_sdk.state_key, docs/security.md) the inbox is encrypted under the same key as the
engine's database. Without a key it is plaintext inside the agent's private data_dir,
the same place that holds the keys that decrypt them. The schema is unchanged.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

from svc_sdk._native import Engine, LocalStore


class LocalState:
    """``client.sqlite3`` of one data_dir. Errors are ``InternalError``
    (``runtime error: ``), and ``ChannelClosedError`` once closed; a data_dir encrypted
    at rest needs ``state_key``."""

    def __init__(self, data_dir: str | os.PathLike[str], state_key: bytes | None = None) -> None:
        self._store = LocalStore(data_dir, state_key=state_key)

    @classmethod
    def of(cls, engine: Engine) -> LocalState:
        """The client database of ``engine``'s data_dir, under the engine's state key."""
        state = cls.__new__(cls)
        state._store = engine.local_store()
        return state

    def close(self) -> None:
        self._store.close()

    def channels(self) -> list[tuple[str, int, int]]:
        """(name, cursor, joined_epoch) of every channel."""
        return self._store.channels()

    def add_channel(self, name: str, cursor: int, joined_epoch: int) -> None:
        self._store.add_channel(name, cursor, joined_epoch)

    def remove_channel(self, name: str) -> None:
        self._store.remove_channel(name)

    def advance(self, name: str, cursor: int, received: Iterable[tuple[int, bytes, bytes]]) -> None:
        """Stores (seq, sender, payload) rows and the new cursor in one transaction."""
        self._store.advance(name, cursor, list(received))

    def inbox(
        self, name: str, after: int = 0, limit: int | None = None
    ) -> list[tuple[int, bytes, bytes]]:
        """(seq, sender, payload) of stored messages after ``after``, in order, at most
        ``limit`` of them."""
        return self._store.inbox(name, after, limit)

    def inbox_count(self, name: str, after: int = 0) -> int:
        """How many stored messages come after ``after``."""
        return self._store.inbox_count(name, after)

    def consumed(
        self, name: str, through_seq: int, extra: Iterable[int] = (), cursor: int = 0
    ) -> None:
        """The application has taken every message up to ``through_seq``, and the
        messages numbered ``extra`` beyond it; the channel was handled through
        ``cursor``."""
        self._store.consumed(name, through_seq, list(extra), cursor)
