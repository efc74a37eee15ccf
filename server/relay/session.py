"""One agent's stream: its identity and token, its subscriptions, and the handling of
every frame it sends. Each frame gets exactly one Reply with its request_id."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any

from svc_sdk.protocol import MAX_DECODED_PUBLISH, AgentId, Code, MlsError, encode_reply, inspect
from svc_sdk.protocol import is_valid_channel_name as valid_name
from svc_sdk.protocol import relay_pb2 as pb

from ..auth import Claims, InvalidToken
from ..services.channels import Event
from .frames import Frame, OversizedPublish, PublishFrame
from .groups import Invalid, PolicyBreach, Stale, Validated, events, roster, split
from .hub import Outbox, Subscription, welcome_frame
from .in_flight import MAX_IN_FLIGHT, MAX_IN_FLIGHT_BYTES, InFlight
from .store import (
    CommitRejected,
    CursorExpired,
    Entry,
    GroupConflict,
    Pipeline,
    PipelineBroken,
    StaleMessages,
)

if TYPE_CHECKING:
    from .service import Relay

log = logging.getLogger("svc_server.relay")

OK = Code.OK
INVALID = Code.INVALID_ARGUMENT
DENIED = Code.PERMISSION_DENIED
STALE = Code.FAILED_PRECONDITION
EXPIRED_CURSOR = Code.OUT_OF_RANGE
UNAUTHENTICATED = Code.UNAUTHENTICATED
UNAVAILABLE = Code.UNAVAILABLE
EXISTS = Code.ALREADY_EXISTS
THROTTLED = Code.RESOURCE_EXHAUSTED
# A catch-up read: at most this many entries, and none past the one that reaches this
# many bytes, so that a subscription catching up holds a few large messages at a time,
# not five hundred of them.
CATCH_UP_PAGE = 512
CATCH_UP_PAGE_BYTES = 4 * 1024 * 1024
# Replies a client has not read; beyond this it is not reading its stream at all.
MAX_UNREAD_REPLIES = 10_000
# Messages in one Publish frame (the extension decodes Publish frames up to this many).
MAX_PUBLISH_BATCH = MAX_DECODED_PUBLISH
# The longest Publish.message_id.
MAX_MESSAGE_ID = 32
TOO_MANY_MESSAGES = f"Publish takes 1 to {MAX_PUBLISH_BATCH} messages"
BAD_MESSAGE_IDS = (
    f"message_id takes none or one distinct id of 1 to {MAX_MESSAGE_ID} bytes per message"
)
# How long a stream's access check of a channel holds without asking again. Commits
# clear it at once in every relay process that follows the channel; this bounds the rest.
ACCESS_TTL = 2.0
# Channels one stream may be held back on before it is closed.
MAX_HELD_BACK = 1000
HELD_BACK = (
    "too many requests for channels this account may not use; this stream takes no more "
    "requests for this channel: retry on a new stream in a few seconds"
)
# Members one commit may add (each key package is verified before the commit is stored).
MAX_JOINERS = 1000
# The highest sequence number or epoch a store can hold (SQLite's and PostgreSQL's signed
# 64 bits).
MAX_SEQ = 2**63 - 1


class RequestError(Exception):
    def __init__(self, code: int, message: str, epoch: int = 0, cipher_suite: int = 0) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.epoch = epoch
        self.cipher_suite = cipher_suite


def _denied(channel: str) -> RequestError:
    # The same answer whether the channel exists or not: outsiders learn nothing.
    return RequestError(DENIED, f"no access to channel {channel!r}")


class StreamSession:
    def __init__(self, relay: Relay, claims: Claims, identity: bytes) -> None:
        self.relay = relay
        self.claims = claims
        self.identity = identity
        # Who this stream is: the token's account and the identity it claims, so one
        # account's agents can never receive as, or speak as, another account's.
        self.member = claims.account_id.bytes + identity
        settings = relay.settings
        self.outbox = Outbox(
            settings.subscriber_buffer, settings.subscriber_buffer_bytes, relay.hub.buffers
        )
        # A page goes out once the stream's queue is under half full, so it must fit in
        # the other half: a larger one would make every long catch-up lag, forever.
        limit = settings.subscriber_buffer
        self.page = min(CATCH_UP_PAGE, limit - limit // 2)
        self.subscriptions: dict[str, Subscription] = {}
        # Channels this stream may use, with when that was last checked.
        self.allowed: dict[str, float] = {}
        # Channels a request of this stream was refused for the account's budget of
        # refusals: its later requests for them are refused too (_check_denials).
        self.held_back: set[str] = set()
        # Per channel, this stream's appends in flight (store.Pipeline).
        self._pipelines: dict[str, Pipeline] = {}
        self.closed: tuple[Code, str] | None = None
        self.close_event = asyncio.Event()
        self._tasks: set[asyncio.Task[None]] = set()
        self._in_flight = InFlight(MAX_IN_FLIGHT, MAX_IN_FLIGHT_BYTES, relay.in_flight)
        self._expiry: asyncio.TimerHandle | None = None

    # -- lifecycle ---------------------------------------------------------------------

    def close(self, code: Code, message: str) -> None:
        if self.closed is None:
            self.closed = (code, message)
            self.close_event.set()
            self.outbox.close()

    def spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def watch_expiry(self) -> None:
        """Closes the stream when the token expires without a Refresh (a timer, not a
        task: one per stream adds up with thousands of idle streams)."""
        if self._expiry is not None:
            self._expiry.cancel()
        if self.closed is not None:
            return
        remaining = self.claims.expires_at - time.time()
        if remaining <= 0:
            self.close(Code.UNAUTHENTICATED, "token expired; send Refresh before exp")
            return
        self._expiry = asyncio.get_running_loop().call_later(
            min(remaining, 3600), self.watch_expiry
        )

    def shutdown(self) -> None:
        if self._expiry is not None:
            self._expiry.cancel()
        for task in list(self._tasks):
            task.cancel()
        for sub in list(self.subscriptions.values()):
            self._drop(sub)
        self.relay.hub.disconnect(self.member, self.outbox)

    # -- frames ------------------------------------------------------------------------

    def reply(self, request_id: int, code: int = OK, message: str = "", **fields: int) -> None:
        if self.outbox.pending_controls >= MAX_UNREAD_REPLIES:
            self.close(Code.RESOURCE_EXHAUSTED, "client is not reading its stream")
            return
        self.outbox.control(encode_reply(request_id, code, message, **fields))

    async def handle(self, frame: Frame | None) -> None:
        if frame is None:
            self.reply(0, INVALID, "malformed frame: not a ClientFrame")
            return
        if isinstance(frame, PublishFrame):
            kind: str | None = "publish"
            request: Any = frame
        elif isinstance(frame, OversizedPublish):
            kind = "oversized_publish"
            request = frame
        else:
            kind = frame.WhichOneof("kind")
            request = getattr(frame, kind) if kind is not None else None
        if frame.request_id == 0 or kind is None:
            self.reply(frame.request_id, INVALID, "frame needs a non-zero request_id and a kind")
            return
        handler = getattr(self, f"_on_{kind}")
        try:
            await handler(frame.request_id, request)
        except RequestError as exc:
            self.reply(
                frame.request_id,
                exc.code,
                exc.message,
                epoch=exc.epoch,
                cipher_suite=exc.cipher_suite,
            )
        except Exception:  # a bug or an unreachable backend must not kill the stream
            log.exception("relay request failed")
            self.reply(frame.request_id, UNAVAILABLE, "relay could not complete the request; retry")

    async def _check_channel(self, channel: str) -> None:
        if not valid_name(channel):
            raise RequestError(
                INVALID, f"invalid channel name: {channel!r}; expected org/namespace/service"
            )
        if channel in self.held_back:
            raise RequestError(THROTTLED, HELD_BACK)
        checked = self.allowed.get(channel)
        if checked is not None and time.monotonic() - checked < ACCESS_TTL:
            return
        account = self.claims.account_id
        if checked is None:  # a channel this stream was allowed is never held up
            self._check_denials(channel)
        if not await self.relay.may_use(channel, account):
            self.relay.denials.spend(account)
            self.allowed.pop(channel, None)
            raise _denied(channel)
        self.allowed[channel] = time.monotonic()

    def _check_denials(self, channel: str) -> None:
        """Refuses a request that needs an access check when the account has caused too
        many refusals lately (server/relay/denials.py), without the check. The stream
        then refuses every later request for ``channel`` as well, budget or not: requests
        pipelined behind this one must not be served before it is sent again (a Publish
        after a refused one stored first would reorder the sender's messages). The
        client sends it again on a new stream."""
        if self.relay.denials.exhausted(self.claims.account_id):
            self.held_back.add(channel)
            if len(self.held_back) > MAX_HELD_BACK:  # each name held costs memory
                self.close(THROTTLED, "too many requests refused for the account's budget")
            raise RequestError(THROTTLED, HELD_BACK)

    def revoke(self, channel: str) -> None:
        """The account lost access to ``channel``: this stream stops receiving it."""
        self.allowed.pop(channel, None)
        sub = self.subscriptions.get(channel)
        if sub is not None:
            self._drop(sub)

    def _check_size(self, data: bytes, what: str) -> None:
        limit = self.relay.settings.max_message_bytes
        if len(data) > limit:
            raise RequestError(INVALID, f"{what} is {len(data)} bytes; the limit is {limit}")

    @staticmethod
    def _inspect(data: bytes, channel: str, what: str) -> tuple[str, str | None, int | None]:
        try:
            info = inspect(data)
        except MlsError as exc:
            raise RequestError(INVALID, f"{what}: {exc}") from None
        group_message = info.wire_format in ("private_message", "public_message")
        if group_message and info.group_id != channel.encode():
            raise RequestError(INVALID, f"{what} belongs to another group than {channel!r}")
        if info.epoch is not None and info.epoch > MAX_SEQ:  # stored as a signed 64-bit
            raise RequestError(INVALID, f"{what} is for epoch {info.epoch}, past any epoch")
        return info.wire_format, info.content_type, info.epoch

    async def _on_create(self, request_id: int, req: pb.CreateChannel) -> None:
        if not req.group_info:  # the channel's head, for an agent with access
            await self._check_channel(req.channel)
            head, epoch = await self.relay.store.head(req.channel)
            self.reply(request_id, head_seq=head, epoch=epoch)
            return
        if not valid_name(req.channel):
            raise RequestError(
                INVALID, f"invalid channel name: {req.channel!r}; expected org/namespace/service"
            )
        self._check_size(req.group_info, "group_info")
        if req.channel in self.held_back:
            raise RequestError(THROTTLED, HELD_BACK)
        self._check_denials(req.channel)  # before the GroupInfo's checks, which cost more
        groups = self.relay.groups
        try:
            group = await groups.observe(req.channel, req.group_info, self.member)
        except Invalid as exc:
            raise RequestError(INVALID, f"group_info refused: {exc}") from None
        if await self.relay.access.create(req.channel, self.claims.account_id) == "denied":
            self.relay.denials.spend(self.claims.account_id)
            raise _denied(req.channel)
        async with groups.lock(req.channel):
            version = await groups.create(req.channel, group)
            if not version:
                raise RequestError(
                    EXISTS, f"channel {req.channel!r} already exists; join it with an invite"
                )
            created = Event("created", split(self.member), split(self.member), "owner")
            try:
                await self.relay.access.record(req.channel, 0, roster(group), False, [created])
            except Exception:
                # Without its roster the channel is not created: the group goes, so that
                # the agent (which drops its own on the error) can create it again.
                if not await groups.drop(req.channel, version):
                    log.error("a channel whose creation failed kept its group: %s", req.channel)
                raise
        self.allowed[req.channel] = time.monotonic()
        head, epoch = await self.relay.store.head(req.channel)
        self.reply(request_id, head_seq=head, epoch=epoch)

    async def _validated(self, channel: str, message: bytes, epoch: int) -> Validated:
        """``message`` validated against the channel's tracked group (call under the
        channel's lock); RequestError saying why not."""
        try:
            return await self.relay.groups.validate(channel, message, epoch)
        except Stale as exc:
            raise RequestError(STALE, str(exc), epoch=exc.current_epoch) from None
        except Invalid as exc:
            policy = isinstance(exc, PolicyBreach)
            self.relay.metrics.handshake_rejections.labels("policy" if policy else "invalid").inc()
            code = DENIED if policy else INVALID
            raise RequestError(code, f"handshake refused: {exc}") from None

    async def _on_oversized_publish(self, request_id: int, req: OversizedPublish) -> None:
        """A Publish of more messages or ids than a Publish takes, refused as
        ``_on_publish`` refuses it, without its messages ever decoded."""
        await self._check_channel(req.channel)
        if not 0 < req.messages <= MAX_PUBLISH_BATCH:
            raise RequestError(INVALID, TOO_MANY_MESSAGES)
        raise RequestError(INVALID, BAD_MESSAGE_IDS)

    async def _on_publish(self, request_id: int, req: pb.Publish | PublishFrame) -> None:
        await self._check_channel(req.channel)
        count = len(req.message)
        if not 0 < count <= MAX_PUBLISH_BATCH:
            raise RequestError(INVALID, TOO_MANY_MESSAGES)
        ids = list(req.message_id)
        if ids and (
            len(ids) != count
            or any(not 0 < len(i) <= MAX_MESSAGE_ID for i in ids)
            or len(set(ids)) != count
        ):
            raise RequestError(INVALID, BAD_MESSAGE_IDS)
        # Each read of a repeated bytes field copies every message out of the parsed frame:
        # read once.
        messages = list(req.message)
        epochs = []
        for i, message in enumerate(messages):
            what = "message" if count == 1 else f"message {i}"
            self._check_size(message, what)
            wire, content, epoch = self._inspect(message, req.channel, what)
            if content == "proposal":
                if count != 1:
                    raise RequestError(INVALID, "a proposal travels alone in its Publish")
                seq = await self._propose(req.channel, message, epoch or 0)
                self.relay.metrics.messages.labels("proposal").inc()
                self.relay.metrics.bytes.inc(len(message))
                self.reply(request_id, seq=seq)
                return
            if wire != "private_message" or content != "application":
                raise RequestError(
                    INVALID,
                    "Publish takes application messages (PrivateMessages) and proposals; "
                    "send commits with Commit",
                )
            epochs.append(epoch or 0)
        # Queued now, in frame order; the reader goes on to the next frame at once and the
        # Reply follows when the messages are durable (pipelined publishes).
        size = sum(map(len, messages))
        await self._in_flight.acquire(size)
        pipeline = self._pipelines.get(req.channel)
        if pipeline is None:
            pipeline = self._pipelines[req.channel] = Pipeline()
        stored = self.relay.store.append_many(
            req.channel, self.member, list(zip(messages, epochs, strict=True)), ids, pipeline
        )
        metrics = self.relay.metrics
        metrics.application_messages.inc(count)
        metrics.bytes.inc(size)
        if stored.done():
            self._stored(request_id, stored, size)  # an idle store commits at once: no task
        else:
            self.spawn(self._reply_when_stored(request_id, stored, size))

    async def _propose(self, channel: str, proposal: bytes, epoch: int) -> int:
        """A member's proposal (its leave or key update): validated, then stored in the
        log together with the tracked group that holds it, so that the commit carrying it
        validates too and the tracked group never holds a proposal the members cannot
        read. Returns its seq. One the group holds already (a Publish resent after a lost
        Reply) is acknowledged with the channel's head and not stored again: storing
        would write the whole group state for nothing."""
        groups = self.relay.groups
        async with groups.lock(channel):
            v = await self._validated(channel, proposal, epoch)
            if v.observed.kind == "repeat":
                head, _ = await self.relay.store.head(channel)
                return head
            try:
                entry = await self.relay.store.propose(
                    channel, self.member, epoch, proposal, (v.version, v.snapshot)
                )
            except (GroupConflict, StaleMessages) as exc:
                groups.evict(channel)
                current = exc.current_epoch if isinstance(exc, StaleMessages) else epoch
                raise RequestError(STALE, str(exc), epoch=current) from None
            groups.accepted(channel, v)
        return entry.seq

    async def _reply_when_stored(
        self, request_id: int, stored: asyncio.Future[list[Entry]], size: int
    ) -> None:
        try:
            await stored
        except asyncio.CancelledError:
            self._in_flight.release(size)
            raise
        except Exception:  # noqa: S110 - _stored reports it
            pass
        self._stored(request_id, stored, size)

    def _stored(self, request_id: int, stored: asyncio.Future[list[Entry]], size: int) -> None:
        self._in_flight.release(size)
        error = None if stored.cancelled() else stored.exception()
        if isinstance(error, StaleMessages):
            self.reply(request_id, STALE, str(error), epoch=error.current_epoch)
        elif isinstance(error, PipelineBroken):
            self.reply(request_id, UNAVAILABLE, f"{error}; send it again on a new stream")
        elif stored.cancelled() or error is not None:
            if error is not None:
                log.error("storing a message failed", exc_info=error)
            # Later appends of this stream to the channel fail too (store.Pipeline).
            self.reply(
                request_id,
                UNAVAILABLE,
                "relay could not store the message; send it again on a new stream",
            )
        else:
            self.reply(request_id, seq=stored.result()[-1].seq)

    async def _on_join(self, request_id: int, req: pb.JoinRequest) -> None:
        """Posts a redeemed invite's key package to the channel, for a member to add."""
        await self._check_channel(req.channel)
        join_id = _uuid(req.join_id, "join_id")
        self._check_denials(req.channel)  # each unknown id costs a database query
        found = await self.relay.access.join_request(join_id, req.channel, self.claims.account_id)
        if found is None:
            self.relay.denials.spend(self.claims.account_id)
            raise RequestError(DENIED, "no valid join request with this id for your account")
        identity, key_package = found
        if identity != self.identity:
            # The Welcome goes to the connected identity: it must be the key package's.
            raise RequestError(DENIED, "the join request is for another agent identity")
        await self._check_join_suite(req.channel, key_package)
        _, epoch = await self.relay.store.head(req.channel)
        entry = await self.relay.store.append(req.channel, self.member, key_package, epoch)
        self.relay.metrics.messages.labels("join").inc()
        self.reply(request_id, seq=entry.seq)

    async def _check_join_suite(self, channel: str, key_package: bytes) -> None:
        """A key package for another cipher suite than the channel's can never be added:
        refused before it reaches the log, with the channel's suite in the reply so that
        the joiner can redeem its invite again with a key package for that suite."""
        current = await self.relay.groups.current(channel)
        if current is None:
            return
        want = current.group.cipher_suite
        try:
            got = inspect(key_package).cipher_suite
        except MlsError:
            got = None  # checked when the invite was redeemed; the member refuses it
        if got is not None and got != want:
            raise RequestError(
                INVALID,
                f"the join request's key package is for cipher suite {got}; channel "
                f"{channel!r} uses cipher suite {want}",
                cipher_suite=want,
            )

    async def _on_commit(self, request_id: int, req: pb.Commit) -> None:
        await self._check_channel(req.channel)
        self._check_size(req.commit, "commit")
        self._check_size(req.welcome, "welcome")
        _, content, epoch = self._inspect(req.commit, req.channel, "commit")
        if content != "commit":
            raise RequestError(INVALID, "Commit takes an MLS commit")
        if epoch != req.epoch:
            raise RequestError(INVALID, f"commit is for epoch {epoch}, the frame says {req.epoch}")
        groups = self.relay.groups
        async with groups.lock(req.channel):
            v = await self._validated(req.channel, req.commit, req.epoch)
            joiners = self._joiners(req, v)
            await self._check_admissions(req.channel, v)
            try:
                entry = await self.relay.store.commit(
                    req.channel,
                    self.member,
                    req.epoch,
                    req.commit,
                    req.welcome,
                    joiners,
                    (v.version, v.snapshot),
                )
            except CommitRejected as exc:
                groups.evict(req.channel)
                self.relay.metrics.commit_rejections.inc()
                raise RequestError(STALE, str(exc), epoch=exc.current_epoch) from None
            groups.accepted(req.channel, v)
            # Mirrored before the Reply: once a commit that removes an agent is
            # acknowledged, the account API no longer counts that agent's account in the
            # channel (it could otherwise still mint an invite, or redeem one, to return).
            await self.relay.membership_changed(req.channel, v, events(v))
        self.relay.metrics.messages.labels("commit").inc()
        self.relay.metrics.bytes.inc(len(req.commit))
        self.reply(request_id, seq=entry.seq, epoch=entry.epoch + 1)

    async def _check_admissions(self, channel: str, v: Validated) -> None:
        """Refuses a commit that adds an agent with the key package of a join request
        whose invite is no longer valid: posted while the invite was good, it stays in the
        log, where an admin's client may read it after the invite ended (its account was
        removed, demoted, or it expired)."""
        if not v.observed.added:
            return
        added = [(*split(member), ref) for member, ref in v.observed.added]
        dead = await self.relay.access.dead_admissions(channel, added)
        if dead:
            self.relay.metrics.handshake_rejections.labels("policy").inc()
            who = ", ".join(str(AgentId(str(a), i)) for a, i in dead)
            raise RequestError(
                DENIED,
                f"handshake refused: {who} would join with the key package of an invite "
                "that is no longer valid; it needs a new invite (or hands over a fresh key "
                "package)",
            )

    def _joiners(self, req: pb.Commit, v: Validated) -> list[bytes]:
        """Whom the commit's Welcome goes to: the members the validated commit adds. The
        Welcome must be addressed to exactly their key packages, so it reaches only an
        agent that can use it and no committer can name recipients of its choosing."""
        added = v.observed.added
        if len(added) > MAX_JOINERS:
            raise RequestError(INVALID, f"a commit adds at most {MAX_JOINERS} members")
        if not req.welcome:
            if added:
                raise RequestError(INVALID, "a commit that adds members needs their Welcome")
            return []
        try:
            info = inspect(req.welcome)
        except MlsError as exc:
            raise RequestError(INVALID, f"welcome: {exc}") from None
        if info.wire_format != "welcome":
            raise RequestError(INVALID, f"welcome must be an MLS Welcome, not a {info.wire_format}")
        if sorted(ref for _, ref in added) != sorted(info.welcome_refs):
            raise RequestError(
                INVALID, "the welcome is not addressed to exactly the members the commit adds"
            )
        return [member for member, _ in added]

    async def _on_subscribe(self, request_id: int, req: pb.Subscribe) -> None:
        await self._check_channel(req.channel)
        if req.after_seq > MAX_SEQ:  # the stores keep signed 64-bit sequence numbers
            raise RequestError(INVALID, f"after_seq is above {MAX_SEQ}, past any message")
        old = self.subscriptions.pop(req.channel, None)
        if old is not None:
            self._drop(old)
        sub = Subscription(
            self.relay.hub, req.channel, self.member, self.outbox, req.after_seq, req.subscription
        )
        if self.relay.hub.add(sub):
            self.relay.store.watch(req.channel, req.after_seq)
        self.subscriptions[req.channel] = sub
        try:
            head, epoch = await self.relay.store.head(req.channel)
            # Fails now, not later, if the cursor fell behind retention.
            first = await self.relay.store.read(
                req.channel, req.after_seq, self.page, CATCH_UP_PAGE_BYTES
            )
        except CursorExpired as exc:
            self._drop(sub)
            raise RequestError(EXPIRED_CURSOR, str(exc)) from None
        self.reply(request_id, head_seq=head, epoch=epoch)
        self.spawn(self._catch_up(sub, first))

    async def _catch_up(self, sub: Subscription, page: list) -> None:  # type: ignore[type-arg]
        """Replays the log after the cursor at the pace the stream drains, then goes live."""
        try:
            while True:
                for entry in page:
                    sub.deliver(entry)
                # Checked after the read: entries dropped while it ran are read next.
                if not sub.active or (self._last_page(page) and not sub.take_held_dropped()):
                    break
                await self.outbox.wait_for_room()
                page = await self.relay.store.read(
                    sub.channel, sub.last, self.page, CATCH_UP_PAGE_BYTES
                )
            sub.go_live()
        except CursorExpired:
            sub.lag()

    def _last_page(self, page: list[Entry]) -> bool:
        """Whether a catch-up read reached the end of the log: it stopped short of both
        its number of entries and its bytes."""
        return len(page) < self.page and sum(len(e.message) for e in page) < CATCH_UP_PAGE_BYTES

    def _drop(self, sub: Subscription) -> None:
        sub.active = False
        self.outbox.withdraw(sub)
        if self.relay.hub.remove(sub):
            self.relay.store.unwatch(sub.channel)
        if self.subscriptions.get(sub.channel) is sub:
            del self.subscriptions[sub.channel]

    async def _on_unsubscribe(self, request_id: int, req: pb.Unsubscribe) -> None:
        sub = self.subscriptions.get(req.channel)
        if sub is not None:
            self._drop(sub)
        self.reply(request_id)

    async def _on_refresh(self, request_id: int, req: pb.Refresh) -> None:
        try:
            claims = await self.relay.verify(req.token)
        except InvalidToken as exc:
            self.reply(request_id, UNAUTHENTICATED, str(exc))
            self.close(Code.UNAUTHENTICATED, f"refresh rejected: {exc}")
            return
        if claims.account_id != self.claims.account_id:
            self.reply(request_id, UNAUTHENTICATED, "token is for another account")
            self.close(Code.UNAUTHENTICATED, "refresh with another account's token")
            return
        self.claims = claims
        self.watch_expiry()
        self.reply(request_id)

    async def send_pending_welcomes(self) -> None:
        for w in await self.relay.store.welcomes(self.member):
            self.outbox.control(welcome_frame(w))


def _uuid(value: str, field: str) -> uuid.UUID:
    try:
        return uuid.UUID(value)
    except ValueError:
        raise RequestError(INVALID, f"{field} is not a UUID") from None
