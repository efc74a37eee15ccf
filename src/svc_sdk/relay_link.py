"""The client's connection to the relay: one stream, kept open by a background thread.

The thread runs an asyncio loop holding a :class:`RelayConnection`. When the stream
breaks it reconnects with exponential backoff and jitter, moving through the relay
addresses it was given, and resubscribes every channel after the last sequence number
it received, so nothing is lost and nothing is delivered twice. Blocking callers in any
thread use :meth:`RelayLink.request`; deliveries go to each channel's sink.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import itertools
import logging
import os
import random
import threading
import time
from collections import deque
from collections.abc import Coroutine
from dataclasses import dataclass, field
from functools import partial
from typing import Any, NamedTuple, Protocol, TypeVar

from svc_sdk import _loop
from svc_sdk._relay_pb import relay_pb2 as pb
from svc_sdk.errors import (
    AuthError,
    ChannelClosedError,
    InternalError,
    SvcError,
    TransportError,
    relay_error,
)
from svc_sdk.relay_client import RelayConnection, RelayError, Request

log = logging.getLogger("svc_sdk.relay")

T = TypeVar("T")
BACKOFF_FIRST = 0.05
BACKOFF_MAX = 5.0
# Reconnect jitter needs no cryptographic randomness, and a library must not draw from the
# global ``random``: that would move the state of an application that seeded it.
_jitter = random.Random()  # noqa: S311
# How long a relay may take to accept a stream once its TCP (and TLS) connection is up: a
# listener that takes the connection and then says nothing is passed over for the next
# address, not waited on until keepalive gives up (40 s).
OPEN_TIMEOUT = 5.0


class Delivery(NamedTuple):
    """One delivery of a frame, its fields read out once (``pb.Delivery``'s meaning).

    Not the parsed ``pb.Delivery`` itself: that keeps its whole frame's parse alive
    (about twice the frame's bytes) while any delivery of it waits in a channel's
    backlog, and copies the message each time ``message`` is read."""

    channel: str
    seq: int
    message: bytes
    sender: bytes
    handshake: bool
    epoch: int
    subscription: int


class Sink(Protocol):
    """Where a channel's deliveries go. Called on the link's thread; must not block."""

    def _deliver(self, items: list[Delivery]) -> bool:
        """Queues ``items``; True if the sink's backlog is over its bound: the link then
        pauses the subscription until the sink calls :meth:`RelayLink.resume`."""
        ...

    def _failed(self, error: SvcError) -> None: ...


class TokenSource(Protocol):
    def token(self) -> str: ...

    def refresh(self) -> str: ...

    def refresh_due(self) -> float: ...


# ``_Sub.current`` while paused: no delivery carries it (subscription ids are uint64).
PAUSED = -1


@dataclass
class _Sub:
    sink: Sink
    received: int  # the last seq handed to the sink
    head: int = 0  # the relay's newest seq when last (re)subscribed
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    # The id of the last Subscribe sent, or PAUSED. Deliveries of any other subscription
    # (one replaced by a resubscribe, still queued at the relay or in flight) are
    # dropped: the current one starts after ``received`` by itself.
    current: int = 0
    paused: bool = False


_io_lock = threading.Lock()
_io: asyncio.AbstractEventLoop | None = None


def io_loop() -> asyncio.AbstractEventLoop:
    """The process's one asyncio loop for relay streams, in a daemon thread: every
    client shares this one, and it is never closed, so closing one client cannot break
    another."""
    global _io
    with _io_lock:
        if _io is None:
            loop = _loop.new_event_loop()
            threading.Thread(target=loop.run_forever, name="svc-io", daemon=True).start()
            _io = loop
        return _io


def _after_fork() -> None:  # the thread does not survive a fork; the child starts anew
    global _io
    _io = None
    _jitter.seed()  # as ``random`` does for its own: forked agents must not back off in step


os.register_at_fork(after_in_child=_after_fork)


class RelayLink:
    def __init__(self, endpoints: list[str], identity: bytes, tokens: TokenSource) -> None:
        if not endpoints:
            raise TransportError("no relay address given")
        self.endpoints = endpoints
        self.identity = identity
        self._tokens = tokens
        self._loop = io_loop()
        self._conn: RelayConnection | None = None
        self._connected: asyncio.Event | None = None
        self._subs: dict[str, _Sub] = {}
        self._subscription_ids = itertools.count(1)  # Subscribe.subscription, per link
        self._welcomes: dict[str, list[pb.Welcome]] = {}
        self._welcome_waiters: dict[str, list[asyncio.Future[pb.Welcome]]] = {}
        self._closing = False
        self._error: SvcError | None = None  # why the last connection attempt failed
        self._fatal: AuthError | None = None  # the API refused the key itself
        self._tasks: list[asyncio.Task[None]] = []
        self._started = False
        self._endpoint_index = 0
        self.reconnects = 0
        #: Counts the connections made; a frame sent with ``pin`` goes out on that one only.
        self.generation = 0
        # Unpinned frames from send_soon, written by one task in the order they were queued.
        self._queued: deque[tuple[Request, concurrent.futures.Future[pb.Reply], float]] = deque()
        self._queued_wake: asyncio.Event | None = None

    # -- lifecycle (any thread) --------------------------------------------------------

    def start(self, timeout: float) -> None:
        """Starts maintaining the connection and waits for it to come up."""
        self._started = True
        asyncio.run_coroutine_threadsafe(self._begin(), self._loop).result(5)
        try:
            self.call(self._wait_connected(timeout), timeout + 1)
        except BaseException:
            self.close()
            raise

    async def _begin(self) -> None:
        self._connected = asyncio.Event()
        self._queued_wake = asyncio.Event()
        self._tasks = [
            asyncio.create_task(self._maintain()),
            asyncio.create_task(self._refresh_tokens()),
            asyncio.create_task(self._write_queued()),
        ]

    def close(self) -> None:
        """Closes the stream and stops reconnecting; waits up to 5 s for it."""
        if self._closing:
            return
        self._closing = True
        if self._started:
            with contextlib.suppress(Exception):
                asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop).result(5)

    def call(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """Runs ``coro`` on the link's loop and waits for it (from another thread)."""
        future = self.submit(coro)
        try:
            return future.result(timeout)
        except TimeoutError:
            if future.done():
                raise  # the operation's own timeout, not ours
            future.cancel()
            raise TransportError(self._why("no answer from the relay in time")) from None

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Schedules ``coro`` on the link's loop now (calls keep their order)."""
        if self._closing:
            coro.close()
            raise ChannelClosedError("the client is closed")
        return asyncio.run_coroutine_threadsafe(coro, self._loop)

    def send_soon(
        self, request: Request, *, timeout: float, pin: int | None = None
    ) -> concurrent.futures.Future[pb.Reply]:
        """``submit(request(request, timeout=timeout))`` for the hot path (publishes):
        requests are queued for one writer task instead of each getting a task of its own,
        which takes a thread hand-off and an event-loop turn off every send. They are
        written in the order they were queued; a connection lost before the Reply falls
        back to ``request``, which resends after the reconnect.

        With ``pin`` (a :attr:`generation`), the frame is written at once from the calling
        thread (no hop through the loop), on that connection or not at all: if it is
        gone, or goes before the Reply, the future fails with TransportError and nothing
        is resent (the outbox resends in order itself)."""
        if self._closing:
            raise ChannelClosedError("the client is closed")
        future: concurrent.futures.Future[pb.Reply] = concurrent.futures.Future()
        if pin is not None:
            self._write_pinned(request, future, pin)
            return future
        self._queued.append((request, future, time.monotonic() + timeout))
        assert self._queued_wake is not None
        self._loop.call_soon_threadsafe(self._queued_wake.set)
        return future

    async def _write_queued(self) -> None:
        assert self._queued_wake is not None
        try:
            while True:
                await self._queued_wake.wait()
                self._queued_wake.clear()
                while self._queued:
                    request, future, deadline = self._queued.popleft()
                    if not future.set_running_or_notify_cancel():
                        continue  # the caller gave up
                    try:
                        conn = await self._wait_connected(deadline - time.monotonic())
                        replied = await conn.send(request)
                    except asyncio.CancelledError:
                        future.set_exception(ChannelClosedError("the client is closed"))
                        raise
                    except (ConnectionError, asyncio.InvalidStateError):
                        self._retry(future, request, deadline)
                        continue
                    except Exception as exc:  # e.g. no connection in time: this send fails
                        future.set_exception(exc)
                        continue
                    replied.add_done_callback(partial(self._replied, future, request, deadline))
        finally:  # closing: nothing queued may wait forever
            while self._queued:
                _, future, _ = self._queued.popleft()
                if future.set_running_or_notify_cancel():
                    future.set_exception(ChannelClosedError("the client is closed"))

    def _write_pinned(
        self, request: Request, future: concurrent.futures.Future[pb.Reply], pin: int
    ) -> None:
        """Writes from the calling thread, straight onto the native stream: a publish
        takes no hop through the loop. Any thread; the connection is read once."""
        conn = self._conn
        if conn is None or pin != self.generation or not self.connected:
            future.set_exception(TransportError("relay connection lost before sending"))
            return
        try:
            replied = conn.send_threadsafe(request)
        except ConnectionError as exc:
            future.set_exception(TransportError(f"relay connection lost: {exc}"))
            return
        replied.add_done_callback(partial(self._replied_pinned, future))

    @staticmethod
    def _replied_pinned(
        future: concurrent.futures.Future[pb.Reply], done: concurrent.futures.Future[pb.Reply]
    ) -> None:
        if done.cancelled() or done.exception() is not None:
            future.set_exception(TransportError("relay connection lost before the Reply"))
        elif done.result().code != 0:
            future.set_exception(RelayError(done.result()))
        else:
            future.set_result(done.result())

    def _replied(
        self,
        future: concurrent.futures.Future[pb.Reply],
        request: Request,
        deadline: float,
        done: asyncio.Future[pb.Reply],
    ) -> None:
        if done.cancelled() or done.exception() is not None:
            self._retry(future, request, deadline)  # the stream broke before the Reply
        elif done.result().code != 0:
            future.set_exception(RelayError(done.result()))
        else:
            future.set_result(done.result())

    def _retry(
        self, future: concurrent.futures.Future[pb.Reply], request: Request, deadline: float
    ) -> None:
        async def again() -> None:
            try:
                reply = await self.request(request, timeout=max(0.0, deadline - time.monotonic()))
            except asyncio.CancelledError:
                future.set_exception(ChannelClosedError("the client is closed"))
                raise
            except Exception as exc:
                future.set_exception(exc)
            else:
                future.set_result(reply)

        self._loop.create_task(again())

    @property
    def connected(self) -> bool:
        return self._connected is not None and self._connected.is_set()

    @property
    def endpoint(self) -> str:
        return self.endpoints[self._endpoint_index % len(self.endpoints)]

    # -- operations (call through ``call``) --------------------------------------------

    async def request(self, request: Request, *, timeout: float, retry: bool = True) -> pb.Reply:
        """Sends ``request`` and returns its OK Reply. Waits out reconnects (resending
        when ``retry``) until ``timeout``; a non-OK Reply raises RelayError."""
        deadline = time.monotonic() + timeout
        while True:
            conn = await self._wait_connected(deadline - time.monotonic())
            try:
                # asyncio.timeout, not wait_for: no extra task per request on the hot path.
                async with asyncio.timeout(max(0.0, deadline - time.monotonic())):
                    reply = await (await conn.send(request))
            except (ConnectionError, asyncio.InvalidStateError) as exc:
                if not retry or time.monotonic() >= deadline:
                    raise TransportError(f"relay connection lost: {exc}") from None
                await self._lost(conn)
                continue
            except TimeoutError:
                raise TransportError(self._why("no answer from the relay in time")) from None
            if reply.code != 0:
                raise RelayError(reply)
            return reply

    async def subscribe(self, channel: str, after_seq: int, sink: Sink, timeout: float) -> int:
        """Registers the sink and subscribes; returns the relay's head seq."""
        sub = _Sub(sink, after_seq)
        self._subs[channel] = sub
        if self.connected:
            try:
                await self._subscribe(sub, channel)
            except BaseException:
                self._subs.pop(channel, None)
                raise
        else:
            await asyncio.wait_for(sub.ready.wait(), timeout)
        return sub.head

    async def unsubscribe(self, channel: str) -> None:
        self._subs.pop(channel, None)
        if self._conn is not None:
            with contextlib.suppress(Exception):
                await self._conn.send(pb.Unsubscribe(channel=channel))

    async def wait_received(self, channel: str, seq: int, timeout: float) -> None:
        """Waits until the sink of ``channel`` was handed everything up to ``seq``."""
        deadline = time.monotonic() + timeout
        while True:
            sub = self._subs.get(channel)
            if sub is None or sub.received >= seq:
                return
            if time.monotonic() >= deadline:
                raise TransportError(f"the relay did not deliver {channel!r} up to seq {seq}")
            await asyncio.sleep(0.005)

    async def welcome(self, channel: str, timeout: float) -> pb.Welcome:
        """The next Welcome for ``channel`` (one that already arrived counts)."""
        waiting = self._welcomes.get(channel)
        if waiting:
            return waiting.pop(0)
        future: asyncio.Future[pb.Welcome] = self._loop.create_future()
        self._welcome_waiters.setdefault(channel, []).append(future)
        try:
            return await asyncio.wait_for(future, timeout)
        finally:
            waiters = self._welcome_waiters.get(channel, [])
            if future in waiters:
                waiters.remove(future)

    # -- the loop ----------------------------------------------------------------------

    async def _shutdown(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(BaseException):
                await task

    def _why(self, default: str) -> str:
        where = ", ".join(self.endpoints)
        return (
            f"{default} ({where}): {self._error.detail}" if self._error else f"{default} ({where})"
        )

    async def _wait_connected(self, timeout: float) -> RelayConnection:
        assert self._connected is not None
        deadline = time.monotonic() + timeout
        while not self._connected.is_set():
            if self._closing:  # no reconnect is coming: fail now, not at the deadline
                raise ChannelClosedError("the client is closed")
            if self._fatal is not None:
                raise self._fatal
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                if isinstance(self._error, AuthError):
                    raise self._error
                raise TransportError(self._why("relay unreachable"))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._connected.wait(), min(remaining, 0.1))
        assert self._conn is not None
        return self._conn

    async def _lost(self, conn: RelayConnection) -> None:
        """The caller saw ``conn`` fail; wait until the maintainer noticed."""
        if self._conn is conn and conn.closed is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(asyncio.shield(conn.closed), 1.0)
        await asyncio.sleep(0)

    async def _maintain(self) -> None:
        assert self._connected is not None
        attempt = 0
        while not self._closing:
            endpoint = self.endpoint
            conn: RelayConnection | None = None
            try:
                token = await asyncio.to_thread(self._tokens.token)
                conn = RelayConnection(endpoint, token, self.identity, on_frame=self._on_frame)
                await asyncio.wait_for(conn.open(), OPEN_TIMEOUT)
                # The first Reply proves the stream is up and the token accepted.
                reply = await asyncio.wait_for(
                    await conn.send(pb.Refresh(token=token)), 5.0 if attempt else 10.0
                )
                if reply.code != 0:
                    raise RelayError(reply)
                self._conn = conn
                self.generation += 1
                for channel, sub in list(self._subs.items()):
                    await self._subscribe(sub, channel)
                self._error = None
                self._connected.set()
                if attempt:
                    self.reconnects += 1
                    log.info("reconnected to relay %s", endpoint)
                attempt = 0
                assert conn.closed is not None
                status = await conn.closed
                if status is not None:
                    self._error = relay_error(status)
                    log.warning("relay stream ended: %s", self._error)
            except asyncio.CancelledError:
                raise
            except SvcError as exc:
                self._error = exc
            except TimeoutError:
                self._error = TransportError(f"relay {endpoint} did not answer in time")
            except (ConnectionError, RelayError) as exc:
                self._error = relay_error(exc)
            except Exception as exc:  # a bug must not stop reconnecting
                log.exception("relay connection failed")
                self._error = InternalError(str(exc))
            finally:
                self._connected.clear()
                self._conn = None
                if conn is not None:
                    with contextlib.suppress(Exception):
                        await conn.close()
            if self._stopping():
                break
            if isinstance(self._error, AuthError):
                # A rejected token: get a fresh one. A revoked key fails here, at the API,
                # and callers waiting for the connection get that error at once.
                try:
                    await asyncio.to_thread(self._tokens.refresh)
                    self._fatal = None
                except AuthError as exc:
                    self._fatal = exc
                except SvcError:
                    pass  # the API is unreachable for now: the next attempt tries again
            attempt += 1
            if attempt > 1 or len(self.endpoints) > 1:
                self._endpoint_index += 1
            delay = min(BACKOFF_MAX, BACKOFF_FIRST * 2 ** min(attempt - 1, 10))
            # One line per failed attempt, the first of a run included: quiet enough for
            # a relay that is down for long (the delay grows to BACKOFF_MAX).
            log.warning(
                "relay %s: %s; reconnecting (attempt %d, next in %.1f s)",
                endpoint,
                self._error.detail if self._error else "connection failed",
                attempt,
                delay,
            )
            # Jitter spreads reconnecting clients out.
            await asyncio.sleep(delay * _jitter.uniform(0.5, 1.0))

    def _stopping(self) -> bool:  # a method: close() flips the flag from another thread
        return self._closing

    async def _subscribe(self, sub: _Sub, channel: str) -> None:
        assert self._conn is not None
        if sub.paused:  # resume() subscribes it
            sub.ready.set()
            return
        # The new id and the cursor are taken together, on this loop: from here on only
        # the new subscription's deliveries count, and it starts right after the cursor.
        sub.current = next(self._subscription_ids)
        subscribe = pb.Subscribe(channel=channel, after_seq=sub.received, subscription=sub.current)
        reply = await asyncio.wait_for(await self._conn.send(subscribe), 10.0)
        if reply.code != 0:
            sub.sink._failed(relay_error(RelayError(reply), channel))
        sub.head = reply.head_seq
        sub.ready.set()

    async def _refresh_tokens(self) -> None:
        while True:
            wait = self._tokens.refresh_due() - time.time()
            if wait == float("inf"):
                return
            await asyncio.sleep(max(0.5, wait))
            try:
                token = await asyncio.to_thread(self._tokens.refresh)
            except SvcError as exc:
                log.warning("token refresh failed: %s", exc)
                self._error = exc
                await asyncio.sleep(5)
                continue
            conn = self._conn
            if conn is not None:
                with contextlib.suppress(Exception):
                    await conn.request(pb.Refresh(token=token), timeout=10)

    def _on_frame(self, frame: pb.ServerFrame) -> None:
        kind = frame.WhichOneof("kind")
        if kind == "deliveries":
            by_channel: dict[str, list[Delivery]] = {}
            for item in frame.deliveries.items:
                name, seq, subscription = item.channel, item.seq, item.subscription
                sub = self._subs.get(name)
                if sub is None or seq <= sub.received:
                    continue  # already handed over before a reconnect
                if subscription != sub.current and (subscription or sub.paused):
                    continue  # an earlier subscription's, or paused (0: an older relay's)
                sub.received = seq
                by_channel.setdefault(name, []).append(
                    Delivery(
                        name,
                        seq,
                        item.message,
                        item.sender,
                        item.handshake,
                        item.epoch,
                        subscription,
                    )
                )
            for channel, items in by_channel.items():
                sub = self._subs.get(channel)
                # Pausing needs a relay that numbers deliveries: with an older one, what
                # the old subscription still sends could not be told from the new one's.
                if sub is not None and sub.sink._deliver(items) and items[-1].subscription:
                    self._pause(sub, channel)
        elif kind == "welcome":
            w = frame.welcome
            waiters = self._welcome_waiters.get(w.channel)
            while waiters:
                future = waiters.pop(0)
                if not future.done():
                    future.set_result(w)
                    return
            self._welcomes.setdefault(w.channel, []).append(w)
        elif kind == "lagged":
            channel = frame.lagged.channel
            sub = self._subs.get(channel)
            if sub is not None and not sub.paused and self._conn is not None:
                self._loop.create_task(self._resubscribe(sub, channel))

    async def _resubscribe(self, sub: _Sub, channel: str) -> None:
        with contextlib.suppress(Exception):
            await self._subscribe(sub, channel)

    # -- a bounded backlog -------------------------------------------------------------

    def _pause(self, sub: _Sub, channel: str) -> None:
        """The sink's backlog is full: stop the subscription; what still arrives for it
        is dropped and comes again after :meth:`resume`, from the cursor. (On the loop.)"""
        if sub.paused:
            return
        sub.paused = True
        sub.current = PAUSED
        conn = self._conn
        if conn is not None:
            # A task, so the Unsubscribe is written before the Subscribe of a later
            # resume (the connection writes in call order).
            self._loop.create_task(self._send_unsubscribe(conn, channel))

    @staticmethod
    async def _send_unsubscribe(conn: RelayConnection, channel: str) -> None:
        with contextlib.suppress(Exception):
            await conn.send(pb.Unsubscribe(channel=channel))

    def resume(self, channel: str) -> None:
        """The sink of ``channel`` drained its backlog: subscribe again after the last
        seq it was handed, as a new subscription. Any thread; does not block."""
        if not self._closing:
            self._loop.call_soon_threadsafe(self._resume, channel)

    def _resume(self, channel: str) -> None:
        sub = self._subs.get(channel)
        if sub is None or not sub.paused:
            return
        sub.paused = False
        # Without a connection, the next one subscribes it with the others. (While one
        # is being set up, both may: the later Subscribe replaces the earlier.)
        if self._conn is not None:
            self._loop.create_task(self._resubscribe(sub, channel))
