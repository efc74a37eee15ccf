"""The gRPC service: authenticates each stream, runs its reader and writer, and owns the
store, the hub and the metrics shared by all streams."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import NoReturn, Protocol

from svc_sdk.protocol import Code

from ..auth import Claims, InvalidToken
from ..auth.key_packages import CredentialKeys
from ..config import Settings
from ..services.channels import Event, Member
from .access import Access
from .denials import Denials
from .frames import Frame
from .groups import Groups, Validated, roster
from .holds import Holds
from .hub import Hub
from .in_flight import MAX_RELAY_IN_FLIGHT_BYTES, Budget
from .metrics import RelayMetrics
from .session import StreamSession
from .store import Entry, LogStore, WelcomeEntry

log = logging.getLogger("svc_server.relay")

MAX_IDENTITY = 1024
RECORD_ATTEMPTS = 5  # writes of the roster mirror, backing off 50 ms, 100 ms, …
RECORD_DRAIN = 10.0  # how long closing waits for roster writes under way


class StreamContext(Protocol):
    """What :meth:`Relay.connect` needs of its stream besides the frames it reads
    (transport.ClientStream): the gRPC server context's calls, by their grpc.aio names."""

    def invocation_metadata(self) -> Sequence[tuple[str, str]]: ...

    async def send_initial_metadata(self, metadata: Sequence[tuple[str, str]], /) -> None: ...

    async def write(self, frame: bytes, /) -> None: ...

    async def abort(self, code: Code, details: str, /) -> NoReturn: ...


class Relay:
    def __init__(
        self,
        settings: Settings,
        store: LogStore,
        access: Access,
        verify: Callable[[str], Awaitable[Claims]],
        credential_keys: CredentialKeys,
        metrics: RelayMetrics | None = None,
    ) -> None:
        self.settings = settings
        self.store = store
        self.access = access
        self.verify = verify
        self.credential_keys = credential_keys
        self.metrics = metrics or RelayMetrics()
        self.hub = Hub(settings.relay_buffer_bytes)
        self.in_flight = Budget(MAX_RELAY_IN_FLIGHT_BYTES)  # publishes waiting to be stored
        self.denials = Denials()  # refused access checks, per account
        self.groups = Groups(store, credential_keys, settings.relay_group_cache_bytes)
        self.sessions: set[StreamSession] = set()
        self._streams_of: collections.Counter[uuid.UUID] = collections.Counter()
        self._rechecks: set[asyncio.Task[None]] = set()
        # Per channel, entries stored after a handshake whose access recheck is running.
        self.holds = Holds(settings.subscriber_buffer_bytes, settings.relay_buffer_bytes)
        self.metrics.tracked_groups.set_function(lambda: self.groups.cached[0])
        self.metrics.tracked_group_bytes.set_function(lambda: self.groups.cached[1])
        self.metrics.lagged.set_function(lambda: self.hub.lagged)
        self.metrics.buffered_bytes.set_function(lambda: self.hub.buffers.used)
        self.store.set_sink(self._stored)
        self._trimmer: asyncio.Task[None] | None = None
        # Roster writes for the account API (membership_changed): all under way, and each
        # channel's newest, which the channel's next write waits for.
        self._records: set[asyncio.Task[None]] = set()
        self._recording: dict[str, asyncio.Task[None]] = {}

    def _stored(self, entries: Sequence[Entry], welcomes: Sequence[WelcomeEntry]) -> None:
        """Fans newly stored entries out in order. After a handshake, a channel's later
        entries wait until every stream's access has been checked again, so a stream of
        an account the commit removed never receives what was sent after it."""
        now: list[Entry] = []
        for entry in entries:
            hold = self.holds.get(entry.channel)
            if hold is not None:
                self.holds.add(hold, entry)
                continue
            now.append(entry)
            if entry.handshake:
                self.holds.start(entry.channel)
                task = asyncio.ensure_future(self._recheck_and_release(entry.channel))
                self._rechecks.add(task)
                task.add_done_callback(self._rechecks.discard)
        self.hub.publish(now, welcomes)

    async def _recheck_and_release(self, channel: str) -> None:
        hold = self.holds.get(channel)
        assert hold is not None
        try:
            while True:
                await self._recheck(channel)
                if hold.dropped:
                    # Held past its bounds: dropped, to be read from the log once every
                    # commit among them has been rechecked for.
                    if hold.take_dropped_handshake():
                        continue
                    for sub in self.hub.subscriptions(channel):
                        sub.lag()
                    return
                released = self.holds.release(hold)
                self.hub.publish(released, ())
                if not (released and released[-1].handshake):
                    return
        finally:
            # Cancelled at shutdown: what is still held is stored; streams catch up.
            self.holds.end(channel)

    async def may_use(self, channel: str, account_id: uuid.UUID) -> bool:
        """Access follows membership: an account may use a channel while one of its agents
        is a member of the channel's tracked group, or while it holds a live invite
        redemption for it (to post its join request and get its Welcome)."""
        if account_id in await self.groups.accounts(channel):
            return True
        return await self.access.has_live_redemption(channel, account_id)

    async def _recheck(self, channel: str) -> None:
        """After a commit (from this relay process or another): every stream's access to
        the channel is checked again; streams of accounts that lost it stop receiving it
        at once (the commit that removed them is already in their outbox)."""
        try:
            for session in self.sessions:
                session.allowed.pop(channel, None)
            verdicts: dict[uuid.UUID, bool] = {}
            for session in [s for s in self.sessions if channel in s.subscriptions]:
                account = session.claims.account_id
                if account not in verdicts:
                    verdicts[account] = await self.may_use(channel, account)
                if not verdicts[account]:
                    session.revoke(channel)
        except Exception:
            log.exception("checking access to %s after a commit failed", channel)

    async def membership_changed(
        self, channel: str, validated: Validated, events: list[Event]
    ) -> None:
        """Mirrors an accepted commit's roster and audit events for the account API and
        returns once they are written (or given up on). The account API decides invites
        and access from this mirror, so the write belongs to the relay, not to the stream
        that committed: it runs to its end when that stream ends meanwhile (a cancelled
        write would leave a removed member, or an added member's spent redemption, in the
        mirror for good). A channel's writes run in commit order."""
        group = validated.group
        before = self._recording.get(channel)
        task = asyncio.ensure_future(
            self._record(
                before,
                channel,
                group.epoch,
                roster(group),
                group.roles().members_invite,
                events,
            )
        )
        self._recording[channel] = task
        self._records.add(task)

        def done(finished: asyncio.Task[None]) -> None:
            self._records.discard(finished)
            if self._recording.get(channel) is finished:
                del self._recording[channel]

        task.add_done_callback(done)
        await asyncio.shield(task)

    async def _record(
        self,
        before: asyncio.Task[None] | None,
        channel: str,
        epoch: int,
        members: list[Member],
        members_invite: bool,
        events: list[Event],
    ) -> None:
        if before is not None:
            await asyncio.wait({before})
        # A write that fails once (a busy database) must not leave a removed member in
        # the mirror either.
        for attempt in range(RECORD_ATTEMPTS):
            try:
                ended = await self.access.record(channel, epoch, members, members_invite, events)
            except Exception:
                if attempt == RECORD_ATTEMPTS - 1:
                    log.exception("recording the roster of %s failed", channel)
                    return
                log.warning("recording the roster of %s failed; trying again", channel)
                await asyncio.sleep(0.05 * 2**attempt)
                continue
            if ended:
                # Redemptions of the invites that ended no longer admit their accounts:
                # their streams stop receiving the channel now, not at the next commit
                # (the recheck after this commit ran before the write).
                await self._recheck(channel)
            return

    async def start(self) -> None:
        await self.store.start()
        self._trimmer = asyncio.create_task(self._trim_forever())

    async def close(self) -> None:
        for task in list(self._rechecks):
            task.cancel()
        if self._records:  # roster writes under way finish before the database goes
            await asyncio.wait(set(self._records), timeout=RECORD_DRAIN)
        if self._trimmer is not None:
            self._trimmer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._trimmer
        await self.store.close()

    async def _trim_forever(self) -> None:
        interval = min(60.0, self.settings.retention_seconds / 4)
        while True:
            try:
                await self.store.trim(time.time() - self.settings.retention_seconds)
            except Exception:
                log.exception("retention trim failed")
            await asyncio.sleep(interval)

    async def _authenticate(self, context: StreamContext) -> tuple[Claims, bytes]:
        metadata = {k: v for k, v in (context.invocation_metadata() or ())}
        header = metadata.get("authorization", "")
        scheme, _, token = str(header).partition(" ")
        if scheme.lower() != "bearer" or not token:
            await context.abort(Code.UNAUTHENTICATED, "missing authorization: Bearer <JWT>")
        try:
            identity = bytes.fromhex(str(metadata.get("svc-identity", "")))
        except ValueError:
            identity = b""
        if not 0 < len(identity) <= MAX_IDENTITY:
            await context.abort(
                Code.INVALID_ARGUMENT,
                "svc-identity metadata must be 1 to 1024 bytes, hex",
            )
        try:
            claims = await self.verify(token.strip())
        except InvalidToken as exc:
            await context.abort(Code.UNAUTHENTICATED, str(exc))
        return claims, identity

    async def connect(self, requests: AsyncIterator[Frame | None], context: StreamContext) -> None:
        claims, identity = await self._authenticate(context)
        account = claims.account_id
        # Each stream holds memory and buffers of its own: one account's streams must not
        # crowd out every other account's.
        limit = self.settings.relay_streams_per_account
        if self._streams_of[account] >= limit:
            self.metrics.streams_ended.labels(Code.RESOURCE_EXHAUSTED.name).inc()
            await context.abort(
                Code.RESOURCE_EXHAUSTED,
                f"the account already has its limit of {limit} open streams on this relay "
                "(SVC_RELAY_STREAMS_PER_ACCOUNT); close one or raise the limit",
            )
        # Tells the client the stream is accepted before it writes (RelayConnection.open).
        await context.send_initial_metadata(())
        session = StreamSession(self, claims, identity)
        self.sessions.add(session)
        self._streams_of[account] += 1
        self.hub.connect(session.member, session.outbox)
        self.metrics.streams.inc()
        reader = asyncio.create_task(self._read(session, requests))
        session.watch_expiry()
        writer: asyncio.Task[None] | None = None
        closing = asyncio.create_task(session.close_event.wait())
        try:
            try:
                await session.send_pending_welcomes()
            except Exception:
                log.exception("loading pending Welcomes failed")
                session.close(Code.UNAVAILABLE, "relay backend unavailable; reconnect")
            writer = asyncio.create_task(self._write(session, context))
            # The writer can be stuck in a write to a client that stopped reading; closing
            # must not wait for it.
            await asyncio.wait({writer, closing}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (writer, closing, reader):
                if task is not None:
                    task.cancel()
            session.shutdown()
            self.sessions.discard(session)
            self._streams_of[account] -= 1
            if not self._streams_of[account]:
                del self._streams_of[account]
            self.metrics.streams.dec()
        if session.closed is not None and session.closed[0] != Code.OK:
            self.metrics.streams_ended.labels(session.closed[0].name).inc()
            await context.abort(*session.closed)

    async def _read(self, session: StreamSession, requests: AsyncIterator[Frame | None]) -> None:
        try:
            async for frame in requests:
                await session.handle(frame)
            session.close(Code.OK, "client closed the stream")
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # transport error or a frame over the size limit
            session.close(Code.OK, f"stream ended: {exc}")

    async def _write(self, session: StreamSession, context: StreamContext) -> None:
        # Awaits the outbox itself, no task per frame: closing the session closes the
        # outbox, which ends the wait. A write to a client that stopped reading can still
        # hang here; connect() does not wait for it.
        outbox = session.outbox
        while session.closed is None:
            frames, delivered, stored_at = await outbox.next_frames()
            for frame in frames:
                await context.write(frame)
            if stored_at is not None:
                self.metrics.deliveries.inc(delivered)
                self.metrics.delivery_latency.observe(time.time() - stored_at)
            if len(outbox):
                # A backlog is written a frame per loop turn: other streams' turns come
                # between its frames, not after all of them (up to 16 of 256 KiB).
                await asyncio.sleep(0)


__all__ = ["Entry", "Relay", "WelcomeEntry"]
