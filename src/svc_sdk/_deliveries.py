"""Processing what the relay delivered to a channel.

Deliveries from the relay are queued raw by the link's thread and processed in channel
order by whichever caller needs them next (an iterator, a send, a commit), under the
channel's lock. Commits from other members are applied on the way. A decrypted message
that a waiting reader takes at once goes straight to it; the others go into the inbox
and wait there for a reader. The engine writes its new state (the used message keys
gone) only after that: a crash before it leaves the messages decryptable again.
"""

from __future__ import annotations

import contextlib
import logging
from typing import TYPE_CHECKING

from svc_sdk.agent_id import AgentId
from svc_sdk.errors import ChannelClosedError, InternalError, MlsError
from svc_sdk.message import Accept, Message

if TYPE_CHECKING:
    from svc_sdk.channel import Channel
    from svc_sdk.relay_frames import Delivery

log = logging.getLogger("svc_sdk.channel")  # one logger for all of a channel's parts

# RFC 9420 §6: an MLSMessage starts with version (u16) and wire_format (u16);
# 5 is mls_key_package. The relay has already parsed and checked every message.
KEY_PACKAGE = b"\x00\x05"


class Deliveries:
    """Turns a channel's queued deliveries (``Channel._raw``) into decrypted messages,
    applied commits and join requests."""

    def __init__(self, channel: Channel) -> None:
        self._channel = channel

    def wait(self, timeout: float) -> bool:
        """Waits up to ``timeout`` for unprocessed deliveries (for listener threads)."""
        channel = self._channel
        with channel._cond:
            if not channel._raw and channel._closed is None:
                channel._cond.wait(timeout)
            return bool(channel._raw)

    def process_for(self, accept: Accept | None, limit: int | None) -> list[Message]:
        """Processes deliveries on behalf of a waiting reader until some are for it: up
        to ``limit`` of those are handed to it and never written to the inbox. Later
        deliveries stay queued for the next read, still encrypted."""
        with self._channel._lock:
            handed = self.process_locked(accept, limit)
        self._channel._admissions.do_work()
        return handed

    def process_locked(self, accept: Accept | None, limit: int | None) -> list[Message]:
        """The part of ``process_for`` that needs no relay. Caller holds ``_lock``."""
        reader: Accept = accept or _any
        handed: list[Message] = []
        while not handed and self._channel._closed is None:
            items = self.take()
            if not items:
                break
            handed = self.handle(items, reader, limit)
        return handed

    def process_pending(self) -> None:
        """Processes everything the relay delivered so far (commits, messages, join
        requests). Reading and sending do this by themselves."""
        channel = self._channel
        with channel._lock:
            if channel._closed is None:
                channel._drain_available()
        channel._admissions.do_work()

    def take(self, limit: int = 4096) -> list[Delivery]:
        channel = self._channel
        with channel._cond:
            if len(channel._raw) <= limit:
                items = list(channel._raw)
                channel._raw.clear()
            else:
                items = [channel._raw.popleft() for _ in range(limit)]
            resume = channel._took(items)
        if resume:
            channel._resume()
        return items

    def drain(self) -> None:
        """Processes every queued delivery. Caller holds ``_lock``."""
        while True:
            items = self.take()
            if not items:
                return
            self.handle(items)

    def handle(
        self, items: list[Delivery], reader: Accept | None = None, limit: int | None = None
    ) -> list[Message]:
        """Processes deliveries in order. With ``reader`` (a reader is waiting, and none
        of the buffered messages is for it), returns the first ``limit`` messages it
        accepts instead of buffering and storing them.

        If storing fails (disk full, I/O error), the group returns to its stored state,
        the deliveries not yet durable go back to the front of the queue, and the caller
        gets an InternalError: nothing decrypted is lost, and the next read or send
        processes them again."""
        channel = self._channel
        progress = _Progress()
        try:
            handed = self._handle_items(items, reader, limit, progress)
        except (InternalError, OSError) as exc:
            rest = items[progress.durable :]
            with contextlib.suppress(InternalError, MlsError):
                channel._group.discard_unsaved()
            with channel._cond:
                channel._raw.extendleft(reversed(rest))
                channel._raw_bytes += sum(len(item.message) for item in rest)
            detail = str(exc).removeprefix("runtime error: ")
            error = InternalError(
                f"channel {channel.name!r}: could not store what it received ({detail}); "
                f"nothing is lost: {len(rest)} deliveries are processed again once storage "
                "works"
            )
            channel._faults.set_store(error)
            raise error from None
        channel._faults.set_store(None)
        return handed

    def _handle_items(
        self,
        items: list[Delivery],
        reader: Accept | None,
        limit: int | None,
        progress: _Progress,
    ) -> list[Message]:
        channel = self._channel
        inbox = channel._inbox
        admissions = channel._admissions
        me = channel._client.member_id
        group = channel._group
        run: list[Delivery] = []
        received: list[Message] = []
        stored = 0  # how many of ``received`` the inbox holds
        removed = False

        def flush_run() -> None:
            nonlocal removed
            if not run:
                return
            # Written by save() below, once what it decrypts is stored or handed over.
            results = group.process_batch([item.message for item in run], save=False)
            for item, result in zip(run, results, strict=True):
                if isinstance(result, InternalError):
                    raise result  # storage, not the message: handled by handle()
                if isinstance(result, MlsError):
                    # A message this agent cannot read: from before it joined, a replay
                    # after a sender's reconnect, or hostile. Skipped, never fatal.
                    log.debug("channel %s seq %d skipped: %s", channel.name, item.seq, result)
                elif result.kind == "application":
                    assert result.data is not None
                    assert result.sender is not None
                    sender = AgentId.from_member_id(result.sender)
                    received.append(Message(channel.name, item.seq, sender, result.data))
                elif result.kind == "commit":
                    admissions.proposals = False
                    removed = removed or result.self_removed
                    if me in result.updated:
                        channel._commits.updated_epoch = result.epoch
                elif result.kind == "proposal":
                    admissions.proposals = True
                    admissions.arrivals += 1
            run.clear()

        def store(through: int) -> None:
            """Stores what was decrypted from items[:through] before the engine's state
            is written: the inbox is never behind the stored state."""
            nonlocal stored
            if through and stored < len(received):
                rows = [(m.seq, m.sender.member_id, m.data) for m in received[stored:]]
                channel._client.state.advance(channel.name, items[through - 1].seq, rows)
                stored = len(received)
                inbox.saved_cursor = items[through - 1].seq

        def publish_stored() -> None:
            """Once the engine's state is written too, the stored messages are readers'."""
            nonlocal received, stored
            if stored:
                with channel._cond:
                    inbox.add(received[:stored])
                    channel._notify()
                received, stored = received[stored:], 0

        for index, item in enumerate(items):
            if removed:
                break
            if item.message[2:4] == KEY_PACKAGE:
                flush_run()
                # An invite redemption: its agent is added if this one is the owner or an
                # admin (Admissions; see join_with_token).
                admissions.join_requests.append((item.sender, item.message))
                admissions.arrivals += 1
                continue
            if item.epoch < channel._joined_epoch:
                continue  # from before this agent joined
            if item.handshake and group.has_pending_commit and item.epoch == group.epoch:
                flush_run()
                store(index)  # the commit below writes the engine's state
                if item.sender == me:
                    # Our own commit, echoed: the relay accepted it (its Reply may not
                    # have come yet, or was lost).
                    group.apply_pending_commit()
                    channel._commits.echoed = True
                    progress.durable = index + 1
                    publish_stored()
                    admissions.proposals = False
                    continue
                group.clear_pending_commit()  # another member's commit won this epoch
                progress.durable = index
                publish_stored()
            elif item.handshake and item.sender == me:
                continue  # our own commit, already applied when the relay acknowledged it
            run.append(item)
        flush_run()
        handed: list[Message] = []
        if reader is not None and len(received) > stored:
            with channel._cond:
                # Not past messages that wait on disk: the reader gets those first.
                if not inbox.spilled and not any(reader(m) for m in inbox.messages):
                    kept = received[:stored]
                    for message in received[stored:]:
                        if reader(message) and (limit is None or len(handed) < limit):
                            handed.append(message)
                        else:
                            kept.append(message)
                    received = kept
        cursor = items[-1].seq
        # Stored before the engine's state moves on on disk: a crash in between leaves
        # them decryptable again (the cursor has not moved), never lost.
        store(len(items))
        group.save()
        progress.durable = len(items)
        inbox.cursor = cursor
        with channel._cond:
            inbox.add(received)
            if received:
                channel._notify()
        if removed:
            channel._client._forget(
                channel, ChannelClosedError(f"removed from channel {channel.name!r}")
            )
        return handed


class _Progress:
    """How many of a batch's deliveries are durable: decrypted messages in the inbox and
    the engine's state written (``Deliveries.handle``)."""

    __slots__ = ("durable",)

    def __init__(self) -> None:
        self.durable = 0


def _any(message: Message) -> bool:
    return True
