"""The relay log's append journal: what makes an append durable before SQLite commits it.

A commit of one 300 B append to SQLite's WAL writes every b-tree page the append touched
(5.5 pages of 4 KiB on average), and those pages are written once more when the WAL is
checkpointed: ~40 MB/s at a conversation's pace, which is what the checkpoints' stalls
grow with (performance-log.md). So when the store is idle, application appends run in a
write transaction that stays open for up to :data:`COMMIT_DELAY` seconds, and each one
is acknowledged once its record — the rows it added, and nothing else — is written to
this file. The open transaction's commit then writes the pages of all of them once, and
the journal starts over.

A record is written with one ``write`` to a file opened ``O_APPEND``: after the call
returns, a crash of the relay process keeps it, as a commit to the WAL at
``synchronous=NORMAL`` is kept (neither survives the loss of the machine's power; the
journal is not used with ``synchronous=FULL``). On start, the store puts every whole
record (:func:`decode`) back into the log; a record cut short by a crash, or by a full
disk, ends the replay — nothing after it was acknowledged (see :meth:`Journal.append`).
"""

from __future__ import annotations

import fcntl
import os
import struct
import zlib
from collections.abc import Iterator, Sequence
from pathlib import Path

from .store import Entry

#: How long appends may wait in the open transaction before it is committed.
COMMIT_DELAY = 0.010
#: Journal bytes after which the open transaction is committed at once.
MAX_JOURNAL_BYTES = 1024 * 1024

_HEADER = struct.Struct("<II")  # body length, CRC-32 of the body
_START = struct.Struct("<HHI")  # channel length, sender length, entry count
_ENTRY = struct.Struct("<qqdHI")  # seq, epoch, stored_at, id length, message length


def encode(entries: Sequence[Entry], ids: Sequence[bytes | None]) -> bytes:
    """One record: ``entries`` (of one channel and sender) and their message ids."""
    first = entries[0]
    channel = first.channel.encode()
    parts = [_START.pack(len(channel), len(first.sender), len(entries)), channel, first.sender]
    for entry, message_id in zip(entries, ids, strict=True):
        mid = message_id or b""
        parts += [
            _ENTRY.pack(entry.seq, entry.epoch, entry.stored_at, len(mid), len(entry.message)),
            mid,
            entry.message,
        ]
    body = b"".join(parts)
    return _HEADER.pack(len(body), zlib.crc32(body)) + body


def decode(data: bytes) -> Iterator[list[tuple[Entry, bytes | None]]]:
    """The whole records at the start of ``data``, in order; stops at the first one that
    is cut short or does not match its checksum."""
    view = memoryview(data)
    at = 0
    while at + _HEADER.size <= len(view):
        length, crc = _HEADER.unpack_from(view, at)
        body = view[at + _HEADER.size : at + _HEADER.size + length]
        if length < _START.size or len(body) != length or zlib.crc32(body) != crc:
            return
        try:
            entries = _entries(bytes(body))
        except (struct.error, UnicodeDecodeError):  # not a record this module wrote
            return
        yield entries
        at += _HEADER.size + length


def _entries(body: bytes) -> list[tuple[Entry, bytes | None]]:
    channel_len, sender_len, count = _START.unpack_from(body, 0)
    at = _START.size
    channel = body[at : at + channel_len].decode()
    at += channel_len
    sender = body[at : at + sender_len]
    at += sender_len
    out = []
    for _ in range(count):
        seq, epoch, stored_at, id_len, message_len = _ENTRY.unpack_from(body, at)
        at += _ENTRY.size
        message_id = body[at : at + id_len] or None
        at += id_len
        message = body[at : at + message_len]
        at += message_len
        out.append((Entry(channel, seq, sender, False, epoch, message, stored_at), message_id))
    return out


class JournalBusy(Exception):
    """Another process holds the journal: a second relay on the same log."""


class Journal:
    """The journal file beside the log (created 0600). Used under the store's write lock.

    Held with an exclusive lock for as long as it is open: a second relay process on the
    same log must neither replay nor empty the records of the first one's open
    transaction (it gets :class:`JournalBusy`, and commits every append itself)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._fd)
            raise JournalBusy(f"{path} is held by another relay process") from None
        self.size = os.fstat(self._fd).st_size
        # Set when a failed write could not be cut back off: the file ends in a torn
        # record, after which nothing more may be written until reset() succeeds.
        self.broken = False

    def read(self) -> bytes:
        """What was written since the last reset."""
        chunks, at = [], 0
        while at < self.size:
            chunk = os.pread(self._fd, self.size - at, at)
            if not chunk:
                break
            chunks.append(chunk)
            at += len(chunk)
        return b"".join(chunks)

    def append(self, record: bytes) -> None:
        """Writes ``record``, or raises OSError with the file as it was before."""
        before = self.size
        try:
            written = os.write(self._fd, record)
            if written != len(record):
                raise OSError(f"journal write cut short: {written} of {len(record)} bytes")
        except OSError:
            try:
                os.ftruncate(self._fd, before)
            except OSError:
                self.broken = True
            raise
        self.size = before + written

    def reset(self) -> None:
        """Empties the journal (its records are committed to the log)."""
        os.ftruncate(self._fd, 0)
        self.size = 0
        self.broken = False

    def close(self) -> None:
        os.close(self._fd)
