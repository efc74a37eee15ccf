"""A channel's outbox: what ``send()`` accepted and the relay has not acknowledged yet.

``Channel.send`` has the engine encrypt the message and store its outbox row in the
transaction that saves the ratchet state (``Group.encrypt_queued``, ``mls.sqlite3``),
then returns; when nothing is in flight it also queues the frame itself. A pump thread
per channel (while it has work: it ends after PUMP_IDLE_SECONDS without) sends the rest
in order: what was sent while a frame was on its way leaves in one frame when its Reply
comes (Nagle's rule), and full frames pipeline, several in flight; each Reply retires
its messages (their rows are deleted in batches). A Reply that leaves the pump nothing
to send is taken where it arrives, without waking it. Every message carries a 16-byte id,
stored with its row, and the relay stores an id at most once per sender and channel, so
resending after a lost connection, a failover or a restart never duplicates.

Ordering: frames go out pinned to one connection (``RelayLink.send_soon(pin=...)``); when
any frame fails, nothing more is sent until every frame in flight has settled, and then
the pump starts again from the oldest unacknowledged message. Messages of two epochs are
never in flight together. A message refused as stale (a commit reached the relay first)
is re-encrypted, with everything after it, in the new epoch under the same id, once the
channel has processed the commit; if the commit removed this agent, the messages fail
with ChannelClosedError. A failure after ``send()`` returned is kept and raised by the
channel's next send, send_batch or wait_stored call (docs/client.md, Sending).
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from svc_sdk._waiters import AsyncWaiters
from svc_sdk.errors import (
    ChannelClosedError,
    InternalError,
    SvcError,
    TransportError,
    relay_error,
)
from svc_sdk.relay_frames import RETRY_LATER, Code, Publish, RelayError, Reply

if TYPE_CHECKING:
    import concurrent.futures

    from svc_sdk.channel import Channel
    from svc_sdk.relay_link import RelayLink

log = logging.getLogger("svc_sdk.outbox")

STALE = Code.FAILED_PRECONDITION
#: How many messages, and payload bytes, may wait in one channel's outbox; ``send()``
#: blocks (up to the client's timeout) while it is full.
OUTBOX_MESSAGES = 10_000
OUTBOX_BYTES = 16 * 1024 * 1024  # payload; memory holds the ciphertexts only
#: Publish frames in flight per channel.
WINDOW = 8
# How often a caller of wait(), or the pump, looks again without being woken: a safety
# net only, every change either waits for wakes it.
POLL_SECONDS = 0.5
MAX_FRAME_MESSAGES = 1024  # the relay's MAX_PUBLISH_BATCH
# The relay accepts frames up to its message limit plus 64 KiB (1 MiB + 64 KiB by
# default); a frame stays under the message limit itself.
MAX_FRAME_BYTES = 960 * 1024
RETRY_SECONDS = 0.05
RETIRE_EVERY = 256
RETIRE_IDLE_SECONDS = 0.005
# The longest the pump waits between looks for that pause while Replies keep coming.
RETIRE_PATIENCE_SECONDS = 0.5
# A pump with nothing to do for this long ends its thread; the next send starts another.
# An agent in many channels then holds threads only for the ones it is sending on.
PUMP_IDLE_SECONDS = 2.0
# A message id is 8 random bytes drawn when the outbox opens, then the message's position:
# unique per sender without a system call per message, which costs a GIL hand-off. Only
# the sender itself can publish under its identity, so ids need not be unpredictable.
ID_PREFIX_BYTES = 8


@dataclass(slots=True)
class Entry:
    pos: int
    id: bytes
    epoch: int
    #: The payload's length: the payload itself is needed only to re-encrypt after a
    #: stale refusal, and is read back from the outbox rows then, so memory holds one
    #: copy of each message, not two.
    size: int
    ciphertext: bytes
    #: Ciphertext bytes queued through this entry since the outbox opened: how much waits
    #: after an entry is a subtraction, not a walk (an estimate once re-encrypted).
    mark: int = 0


class Unencrypted(Exception):
    """Stands in for a failed frame when the outbox opens with rows that a release which
    stored plaintexts only wrote without their ciphertext: the pump encrypts the queue
    (``Outbox._reencrypt``) before anything is sent."""


class Outbox:
    def __init__(self, channel: Channel) -> None:
        self._channel = channel
        lock = threading.RLock()
        self._cond = threading.Condition(lock)
        # The pump waits on a condition of its own over the same lock: a Reply collected
        # where it arrives (``_settled``) wakes the callers of wait(), and the pump only
        # when something is left for it (messages to send, a failure, rows to delete).
        self._pump_cond = threading.Condition(lock)
        rows = channel._group.outbox()
        self._entries: deque[Entry] = deque(
            Entry(pos, mid, epoch, len(payload), ct) for pos, mid, epoch, payload, ct in rows
        )
        self._bytes = sum(e.size for e in self._entries)
        self._marked = 0  # ciphertext bytes queued since the outbox opened
        for entry in self._entries:
            # A row stored without its ciphertext (see Unencrypted) counts its payload.
            self._marked += len(entry.ciphertext) or entry.size
            entry.mark = self._marked
        self._next_pos = rows[-1][0] + 1 if rows else 1
        self._done_through = self._next_pos - 1  # every pos up to here stored or failed
        self._sent = 0  # entries at the head of _entries in flight
        # (number of entries, future, when it was sent) per frame in flight, oldest first.
        self._inflight: deque[tuple[int, concurrent.futures.Future[Reply], float]] = deque()
        self._pinned = 0  # the connection (RelayLink.generation) the frames in flight are on
        self._abandoned = 0  # the last connection given up on for a missing Reply
        # A frame failed: resend from the head (encrypting first rows stored without
        # their ciphertext, see Unencrypted).
        self._halted: BaseException | None = (
            Unencrypted() if any(not e.ciphertext for e in self._entries) else None
        )
        self._deferred: SvcError | None = None  # to raise on the next call
        self._failed_through = 0  # the last pos dropped with _deferred
        self._stopped = False
        self._retired = self._done_through  # rows deleted up to here
        self._active = time.monotonic()  # when a Reply last retired something
        # The pump is waiting out RETIRE_IDLE_SECONDS after _active: a Reply need not
        # wake it.
        self._retire_timer = False
        self._thread: threading.Thread | None = None
        self._id_prefix = os.urandom(ID_PREFIX_BYTES)
        # Tasks of svc_sdk.aio waiting for room or acknowledgements.
        self._async_waiters = AsyncWaiters(self._cond)
        if self._entries:
            self._start()

    def _notify(self) -> None:
        """Wakes waiting threads and tasks (each on its own loop), the pump included.
        Caller holds _cond."""
        self._cond.notify_all()
        self._pump_cond.notify()
        self._async_waiters.wake_all()

    def _full(self, count: int, size: int) -> bool:
        """Whether ``count`` more messages of ``size`` bytes must wait (an empty outbox
        takes anything). Caller holds _cond."""
        return bool(self._entries) and (
            len(self._entries) + count > OUTBOX_MESSAGES or self._bytes + size > OUTBOX_BYTES
        )

    async def _until(self, ready: Callable[[], bool], timeout: float | None, what: str) -> None:
        """Awaits ``ready()`` (checked under _cond) without blocking the loop;
        TransportError naming ``what`` after ``timeout``."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            with self._cond:
                if ready():
                    return
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    raise TransportError(f"channel {self._channel.name!r}: {what}")
                waiting = self._async_waiters.add()
            await self._async_waiters.park(
                waiting, 0.5 if remaining is None else min(remaining, 0.5)
            )

    async def wait_for_room_async(self, count: int, size: int, timeout: float) -> None:
        """``wait_for_room`` for a coroutine."""
        await self._until(
            lambda: not self._full(count, size) or self._deferred is not None or self._stopped,
            timeout,
            f"the outbox is full ({len(self._entries)} messages not yet acknowledged by the relay)",
        )

    async def wait_async(self, through: int, timeout: float | None) -> None:
        """``wait`` for a coroutine."""
        await self._until(
            lambda: self._done_through >= through or self._deferred is not None or self._stopped,
            timeout,
            f"{len(self._entries)} messages not acknowledged by the relay in time (they stay "
            "in the outbox)",
        )
        self.wait(through, None)  # settled: raises what there is to raise, at once

    # -- the caller's side (any thread) -------------------------------------------------

    def __len__(self) -> int:
        with self._cond:
            return len(self._entries)

    def raise_deferred(self) -> None:
        """Raises (once) an error that came after ``send()`` returned."""
        with self._cond:
            error, self._deferred = self._deferred, None
        if error is not None:
            raise error

    def wait_for_room(self, count: int, size: int, timeout: float) -> None:
        """Blocks while the outbox is full (an empty outbox takes anything)."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while self._full(count, size):
                if self._deferred is not None or self._stopped:
                    return  # the caller raises it
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TransportError(
                        f"channel {self._channel.name!r}: the outbox is full "
                        f"({len(self._entries)} messages not yet acknowledged by the relay)"
                    )
                self._cond.wait(min(remaining, 0.5))

    def add(self, payloads: list[bytes]) -> int:
        """Encrypts and queues messages: the engine stores their rows in the transaction
        that saves the ratchet state. Returns the last one's position. Caller holds the
        channel's lock, so positions follow encryption order."""
        with self._cond:
            first = self._next_pos
        prefix = self._id_prefix
        queued = [
            (pos, prefix + pos.to_bytes(8, "big"), p) for pos, p in enumerate(payloads, start=first)
        ]
        epoch, ciphertexts = self._channel._group.encrypt_queued(queued)
        with self._cond:
            self._next_pos = first + len(payloads)
        link = self._channel._client.link
        with self._cond:
            for (pos, mid, payload), ct in zip(queued, ciphertexts, strict=True):
                self._marked += len(ct)
                self._entries.append(Entry(pos, mid, epoch, len(payload), ct, self._marked))
            self._bytes += sum(len(p) for p in payloads)
            if not self._stopped and link.connected:
                # The fast path: sent from here, without waking the pump (a GIL hand-off
                # per send). What it leaves waits for a Reply, which wakes the pump (started
                # below if it had ended).
                self._send_locked(link)
            else:
                self._notify()
        if self._thread is None:
            try:
                self._start()
            except RuntimeError as exc:
                # No thread (a thread limit, interpreter shutdown): the message is stored
                # and the next send tries again; raising would have the caller send twice.
                log.warning(
                    "channel %s: the outbox pump did not start: %s", self._channel.name, exc
                )
        return first + len(payloads) - 1

    def last_pos(self) -> int:
        with self._cond:
            return self._next_pos - 1

    def wait(self, through: int, timeout: float | None) -> None:
        """Waits until every message up to position ``through`` is acknowledged, then
        raises the deferred error if there is one."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while self._done_through < through and self._deferred is None:
                if self._stopped:
                    break
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    raise TransportError(
                        f"channel {self._channel.name!r}: {len(self._entries)} messages not "
                        "acknowledged by the relay in time (they stay in the outbox)"
                    )
                self._cond.wait(POLL_SECONDS if remaining is None else min(remaining, POLL_SECONDS))
            error, self._deferred = self._deferred, None
            stopped = self._stopped and self._done_through < through
        if error is not None:
            raise error
        if stopped:
            self._channel._check_open()
            raise ChannelClosedError(f"channel {self._channel.name!r} is closed")

    def stop(self, error: SvcError | None = None) -> None:
        """The channel is closing; ``error``: its unsent messages are dropped with it."""
        with self._cond:
            self._stopped = True
            if error is not None and self._entries:
                self._drop_all(error, delete=False)
            self._notify()
        if error is None:
            with contextlib.suppress(Exception):  # the state may be closed already
                self._retire()

    def _retire(self) -> None:
        """Deletes the rows of what the relay acknowledged (or what failed)."""
        with self._cond:
            through = self._done_through
            if through <= self._retired:
                return
        self._channel._group.retire_outbox(through)
        with self._cond:
            self._retired = max(self._retired, through)

    # -- the pump (its own thread) ------------------------------------------------------

    def _start(self) -> None:
        with self._cond:
            if self._thread is not None or self._stopped:
                return
            thread = self._thread = threading.Thread(
                target=self._run, name=f"svc-outbox-{self._channel.name}", daemon=True
            )
        try:
            thread.start()
        except BaseException:  # no thread (shutdown, a thread limit): the next send tries
            with self._cond:
                if self._thread is thread:
                    self._thread = None
            raise

    def _settled(self, future: concurrent.futures.Future[Reply]) -> None:
        """A frame's Reply or failure, on the thread that settled it (the relay loop's).
        With messages waiting to be sent (Nagle's rule), or a failure, the pump takes
        it: collecting it here would let the next send() leave alone, ahead of the
        batch. Otherwise it is taken here, and the pump stays asleep: a sender that
        waits for each Reply wakes no second thread (a GIL hand-off) per message."""
        with self._cond:
            if self._stopped:
                self._notify()  # callers of wait() see it, the pump ends
                return
            if self._sent < len(self._entries) or self._halted is not None:
                self._pump_cond.notify()
                return
            collected = self._collect()
            if collected:
                self._active = time.monotonic()
                self._cond.notify_all()
                self._async_waiters.wake_all()
            if (
                self._halted is not None
                or self._done_through - self._retired >= RETIRE_EVERY
                # Rows to delete, and the pump not yet timing the pause it waits for.
                or (collected and not self._retire_timer)
            ):
                self._pump_cond.notify()

    def _run(self) -> None:
        try:
            self._pump()
        except Exception:  # a bug must not lose the outbox silently: it stays on disk
            log.exception("channel %s: the outbox pump failed", self._channel.name)
        finally:
            with self._cond:  # a pump that ended for any reason: the next send starts one
                if self._thread is threading.current_thread():
                    self._thread = None

    def _pump(self) -> None:
        link = self._channel._client.link
        while True:
            with self._cond:
                idle = False
                patience = RETIRE_IDLE_SECONDS
                overdue = None
                while not self._stopped and not self._work():
                    overdue = self._overdue()
                    if overdue is not None:
                        break
                    # Rows go in one delete per RETIRE_EVERY acknowledged messages, or
                    # once no Reply retired anything for RETIRE_IDLE_SECONDS: a delete
                    # per Reply would be a commit per message. A crash before the delete
                    # resends them, and the relay answers them as repeats.
                    behind = self._done_through - self._retired
                    if behind >= RETIRE_EVERY:
                        break
                    if behind > 0 and not idle:
                        left = self._active + RETIRE_IDLE_SECONDS - time.monotonic()
                        if left <= 0:
                            idle = True
                            break
                        # While Replies keep coming, look less and less often (up to
                        # RETIRE_PATIENCE_SECONDS): a look per pause would be a wake-up
                        # per Reply again, and the count rule deletes meanwhile.
                        self._retire_timer = True
                        try:
                            self._pump_cond.wait(max(left, patience))
                        finally:
                            self._retire_timer = False
                        patience = min(patience * 2, RETIRE_PATIENCE_SECONDS)
                        continue
                    if self._quiet():
                        if not self._pump_cond.wait(PUMP_IDLE_SECONDS) and self._quiet():
                            self._thread = None  # under _cond: add() starts a new one
                            return
                        continue
                    self._pump_cond.wait(POLL_SECONDS)
                if self._stopped:
                    return
                if self._collect():  # Replies _settled left to the pump
                    self._active = time.monotonic()
                    self._notify()
                due = self._done_through > self._retired and (
                    idle or self._done_through - self._retired >= RETIRE_EVERY
                )
            if due:
                self._retire()
            if overdue is not None:
                link.abandon(overdue, "no Reply to a Publish within the client's timeout")
            with self._cond:
                halted = self._halted if not self._inflight else None
            if halted is not None:
                self._recover(halted)
                continue
            self._send_more(link)

    def _overdue(self) -> int | None:
        """The connection (a :attr:`RelayLink.generation`) to give up on, if the oldest
        frame in flight has waited longer than the client's timeout for its Reply: a
        relay that keeps the stream up (and answers pings) but never answers that frame
        would hold every later one back for as long as the connection lasts. Dropping
        it fails the frames pinned to it, and the pump resends from the first of them on
        the next connection (the relay answers the ones it stored as repeats, by id).
        Once per connection. Caller holds _cond."""
        if not self._inflight or self._inflight[0][1].done():
            return None
        if self._abandoned == self._pinned:
            return None
        if time.monotonic() - self._inflight[0][2] <= self._channel._client.timeout:
            return None
        self._abandoned = self._pinned
        return self._pinned

    def _quiet(self) -> bool:
        """Nothing queued, in flight, to resend or to delete. Caller holds _cond."""
        return (
            not self._entries
            and not self._inflight
            and self._halted is None
            and self._done_through <= self._retired
        )

    def _work(self) -> bool:
        """Caller holds _cond."""
        if self._inflight and self._inflight[0][1].done():
            return True
        if self._halted is not None:
            return not self._inflight
        if self._sent >= len(self._entries) or len(self._inflight) >= WINDOW:
            return False
        return not self._inflight or self._fills_frame(self._sent)

    def _fills_frame(self, index: int) -> bool:
        """Whether the frame starting at ``_entries[index]`` is full; cheap when it
        clearly is not. Caller holds _cond."""
        first = self._entries[index]
        waiting = self._marked - first.mark + len(first.ciphertext)
        if len(self._entries) - index < MAX_FRAME_MESSAGES and waiting <= MAX_FRAME_BYTES:
            return False
        return self._next_frame(index)[1]

    def _collect(self) -> int:
        """Takes settled frames off the head; returns the last pos stored (0: none).
        Caller holds _cond."""
        retired = 0
        while self._inflight and self._inflight[0][1].done():
            count, future, _ = self._inflight.popleft()
            error = future.exception()
            if error is None and self._halted is None:
                for _ in range(count):
                    entry = self._entries.popleft()
                    self._bytes -= entry.size
                    retired = entry.pos
                self._sent -= count
                self._done_through = retired
            else:
                # This frame and everything after it go again (or fail) once in-flight
                # frames have settled; an OK after a failure is a duplicate next time.
                self._halted = self._halted or error or TransportError("frame lost")
                self._sent -= count
        if self._halted is not None and not self._inflight:
            self._sent = 0
        return retired

    def _send_more(self, link: RelayLink) -> None:
        if not link.connected:
            time.sleep(RETRY_SECONDS)
            return
        with self._cond:
            self._send_locked(link)

    def _next_frame(self, index: int) -> tuple[list[Entry], bool]:
        """The frame that starts at ``_entries[index]``, and whether it is full (more
        would not fit). Frames hold one epoch: the head's. Caller holds _cond."""
        epoch = self._entries[0].epoch
        frame: list[Entry] = []
        size = 0
        for entry in itertools.islice(self._entries, index, None):
            if entry.epoch != epoch:
                break  # never two epochs in flight: the older may come back stale
            if len(frame) >= MAX_FRAME_MESSAGES or (
                frame and size + len(entry.ciphertext) > MAX_FRAME_BYTES
            ):
                return frame, True
            frame.append(entry)
            size += len(entry.ciphertext)
        return frame, len(frame) >= MAX_FRAME_MESSAGES

    def _send_locked(self, link: RelayLink) -> None:
        """Sends what is unsent, as far as the window and the one-epoch rule allow.
        Caller holds _cond (so frames are queued in position order).

        A frame that is not full goes out only when nothing is in flight (Nagle's rule):
        messages sent while a frame is on its way wait for its Reply and then leave
        together, so a fast sender pays the per-frame cost once per batch, not once per
        message, and a lone message still leaves at once. Full frames fill the window."""
        generation = link.generation
        channel = self._channel.name
        frames: list[list[Entry]] = []
        if self._halted is not None or not self._entries:
            return
        if self._inflight and self._pinned != generation:
            # Frames of a connection that is gone: they fail, and everything from the
            # first of them goes again in order once they have all settled. A frame sent
            # on the new connection meanwhile would be stored ahead of them.
            return
        index = self._sent
        room = WINDOW - len(self._inflight)
        while index < len(self._entries) and len(frames) < room:
            if (self._inflight or frames) and not self._fills_frame(index):
                break
            frame, _ = self._next_frame(index)
            if not frame:
                break
            frames.append(frame)
            index += len(frame)
        sent: list[concurrent.futures.Future[Reply]] = []
        for frame in frames:
            try:
                future = link.send_soon(
                    Publish(
                        channel=channel,
                        message=[e.ciphertext for e in frame],
                        message_id=[e.id for e in frame],
                    ),
                    timeout=self._channel._client.timeout,
                    pin=generation,
                )
            except ChannelClosedError:
                self._stopped = True
                break
            self._inflight.append((len(frame), future, time.monotonic()))
            self._pinned = generation
            self._sent += len(frame)
            sent.append(future)
        # After the loop: a frame that failed at once runs _settled here, which takes it
        # off _inflight; in the loop, the frames after it would be counted from the wrong
        # entry.
        for future in sent:
            future.add_done_callback(self._settled)

    def _recover(self, error: BaseException) -> None:
        """Every frame in flight settled and one failed: the next round starts from the
        oldest unacknowledged message, re-encrypted first if its epoch was refused."""
        channel = self._channel
        stale = isinstance(error, RelayError) and error.code == STALE
        if stale or isinstance(error, Unencrypted):
            try:
                self._reencrypt(error.reply.epoch if isinstance(error, RelayError) else 0)
            except ChannelClosedError:
                # Removed (the channel's state, outbox included, is deleted and the
                # messages failed with the reason) or the client closing (they stay on
                # disk for the next start).
                with self._cond:
                    self._stopped = True
                    self._notify()
                return
            except TransportError as exc:
                log.info("channel %s: %s; trying again", channel.name, exc)
                time.sleep(RETRY_SECONDS)
                if isinstance(error, Unencrypted):
                    return  # still not encrypted: the pump comes back here
            except Exception as exc:
                failure = exc if isinstance(exc, SvcError) else InternalError(str(exc))
                with self._cond:
                    self._drop_all(failure)
                self._retire()
        elif isinstance(error, RelayError) and error.code not in RETRY_LATER:
            with self._cond:
                self._drop_all(relay_error(error, channel.name))
            self._retire()
        elif isinstance(error, ChannelClosedError):
            with self._cond:
                self._stopped = True
            return
        else:
            if isinstance(error, RelayError):  # refused for now (RETRY_LATER)
                # The relay's stream takes no more of this channel's messages (so that
                # none sent after the refused frame is stored before it): resent on a
                # new one.
                channel._client.link.abandon(self._pinned, relay_error(error, channel.name).detail)
            time.sleep(RETRY_SECONDS)  # a lost connection: resent once it is back
        with self._cond:
            self._halted = None
            self._notify()

    def _reencrypt(self, epoch: int) -> None:
        channel = self._channel
        with channel._lock:
            channel._check_open()
            channel._catch_up(epoch)
            channel._check_open()
            with self._cond:
                entries = list(self._entries)
            if not entries:
                return
            # Every entry's row is on disk: rows go only once acknowledged, and nothing is
            # acknowledged while this runs (every frame has settled).
            payloads = {row[0]: row[3] for row in channel._group.outbox()}
            missing = [e.pos for e in entries if e.pos not in payloads]
            if missing:
                raise InternalError(f"outbox rows {missing[:5]} are missing from the state")
            current, ciphertexts = channel._group.encrypt_queued(
                [(e.pos, e.id, payloads[e.pos]) for e in entries]
            )
            for entry, ct in zip(entries, ciphertexts, strict=True):
                entry.epoch, entry.ciphertext = current, ct

    def _drop_all(self, error: SvcError, delete: bool = True) -> None:
        """Fails every unacknowledged message with ``error`` (raised by the next call).
        Caller holds _cond; the caller deletes the rows (``retire``) when ``delete``."""
        if self._entries:
            log.warning(
                "channel %s: %d messages not sent: %s",
                self._channel.name,
                len(self._entries),
                error,
            )
            self._failed_through = self._entries[-1].pos
            self._done_through = self._entries[-1].pos
            self._entries.clear()
            self._bytes = 0
            self._deferred = error
        self._sent = 0
        self._notify()
