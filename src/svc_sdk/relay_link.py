"""The client's connection to the relay: one stream, kept open by a thread of its own.

The link's thread connects, and when the stream breaks it reconnects with exponential
backoff and jitter, moving through the relay addresses it was given, and resubscribes
every channel after the last sequence number it received, so nothing is lost and nothing
is delivered twice. The stream's reading thread (``relay_stream.py``) settles Replies
and hands deliveries to each channel's sink. Callers in any thread write their requests
themselves and wait on futures; no event loop is involved, so a program that only uses
the blocking client imports no asyncio.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import itertools
import logging
import os
import random
import threading
import time
from dataclasses import dataclass, field
from functools import partial
from typing import Protocol

from svc_sdk.errors import (
    AuthError,
    ChannelClosedError,
    InternalError,
    SvcError,
    TransportError,
    relay_error,
)
from svc_sdk.relay_frames import (
    RETRY_LATER,
    Deliveries,
    Delivery,
    Event,
    Lagged,
    Refresh,
    RelayError,
    Reply,
    Request,
    Subscribe,
    Unsubscribe,
    Welcome,
)
from svc_sdk.relay_stream import StreamConnection

log = logging.getLogger("svc_sdk.relay")

BACKOFF_FIRST = 0.05
BACKOFF_MAX = 5.0
# Reconnect jitter needs no cryptographic randomness, and a library must not draw from the
# global ``random``: that would move the state of an application that seeded it.
_jitter = random.Random()  # noqa: S311
# How long a relay may take to accept a stream once its TCP (and TLS) connection is up: a
# listener that takes the connection and then says nothing is passed over for the next
# address, not waited on until keepalive gives up (40 s).
OPEN_TIMEOUT = 5.0


class Sink(Protocol):
    """Where a channel's deliveries go. Called on the stream's reading thread; must not
    block, nor call back into the link."""

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
# A resubscribe sent (its Reply's future, if it was written) and on which connection.
Resubscribed = tuple["concurrent.futures.Future[Reply] | None", int]


@dataclass
class _Sub:
    sink: Sink
    received: int  # the last seq handed to the sink
    head: int = 0  # the relay's newest seq when last (re)subscribed
    ready: threading.Event = field(default_factory=threading.Event)
    # The id of the last Subscribe sent, or PAUSED. Deliveries of any other subscription
    # (one replaced by a resubscribe, still queued at the relay or in flight) are
    # dropped: the current one starts after ``received`` by itself.
    current: int = 0
    paused: bool = False


def _after_fork() -> None:  # the link's threads do not survive a fork
    _jitter.seed()  # as ``random`` does for its own: forked agents must not back off in step


os.register_at_fork(after_in_child=_after_fork)


class RelayLink:
    def __init__(self, endpoints: list[str], identity: bytes, tokens: TokenSource) -> None:
        if not endpoints:
            raise TransportError("no relay address given")
        self.endpoints = endpoints
        self.identity = identity
        self._tokens = tokens
        # Guards the connection and the subscriptions. Held while a frame's deliveries are
        # filtered and handed to the sinks, so a Subscribe's new id and its cursor are
        # taken between frames, never inside one.
        self._lock = threading.Lock()
        self._conn: StreamConnection | None = None
        self._subscribing_on: StreamConnection | None = None  # see _resubscribe_all
        self._connected = threading.Event()
        self._renew_after = 0.0  # monotonic: no token renewal before this
        self._subs: dict[str, _Sub] = {}
        self._subscription_ids = itertools.count(1)  # Subscribe.subscription, per link
        self._welcomes: dict[str, list[Welcome]] = {}
        self._welcome_arrived = threading.Condition()
        self._closing = False
        self._stop = threading.Event()  # wakes the link's thread out of its waits
        self._thread: threading.Thread | None = None
        self._error: SvcError | None = None  # why the last connection attempt failed
        self._fatal: AuthError | None = None  # the API refused the key itself
        self._endpoint_index = 0
        self.reconnects = 0
        #: Counts the connections made; a frame sent with ``pin`` goes out on that one only.
        self.generation = 0

    # -- lifecycle (any thread) --------------------------------------------------------

    def start(self, timeout: float) -> None:
        """Starts maintaining the connection and waits for it to come up."""
        self._thread = threading.Thread(target=self._maintain, name="svc-relay-link", daemon=True)
        self._thread.start()
        try:
            self._wait_connected(timeout)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """Closes the stream and stops reconnecting; waits up to 5 s for it."""
        if self._closing:
            return
        self._closing = True
        self._stop.set()
        with self._lock:
            conn = self._conn
        if conn is not None:
            conn.close()
        with self._welcome_arrived:
            self._welcome_arrived.notify_all()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(5)

    def send_soon(
        self, request: Request, *, timeout: float, pin: int | None = None
    ) -> concurrent.futures.Future[Reply]:
        """Writes ``request`` from the calling thread now and returns the future of its OK
        Reply (a non-OK one fails it with RelayError): the hot path (publishes) waits for
        nothing but the write. Frames of one thread leave in its call order.

        Without ``pin``, a connection lost before the Reply (or none up yet) makes it
        ``request(request, timeout=timeout)`` on a thread of its own, which resends after
        the reconnect. With ``pin`` (a :attr:`generation`), the frame goes on that
        connection or not at all: if it is gone, or goes before the Reply, the future fails
        with TransportError and nothing is resent (the outbox resends in order itself)."""
        if self._closing:
            raise ChannelClosedError("the client is closed")
        future: concurrent.futures.Future[Reply] = concurrent.futures.Future()
        future.set_running_or_notify_cancel()
        deadline = time.monotonic() + timeout
        pinned = pin is not None
        conn = self._conn
        if conn is None or (pinned and pin != self.generation) or not self.connected:
            self._unsent(future, request, deadline, pinned, "relay connection lost before sending")
            return future
        try:
            replied = conn.send(request)
        except ConnectionError as exc:
            self._unsent(future, request, deadline, pinned, f"relay connection lost: {exc}")
            return future
        replied.add_done_callback(
            lambda done: self._replied(future, request, deadline, pinned, done)
        )
        return future

    def _unsent(
        self,
        future: concurrent.futures.Future[Reply],
        request: Request,
        deadline: float,
        pinned: bool,
        why: str,
    ) -> None:
        """A send_soon that did not reach the relay: a pinned one fails, any other is
        resent after the reconnect."""
        if pinned:
            future.set_exception(TransportError(why))
        else:
            self._retry(future, request, deadline)

    def _replied(
        self,
        future: concurrent.futures.Future[Reply],
        request: Request,
        deadline: float,
        pinned: bool,
        done: concurrent.futures.Future[Reply],
    ) -> None:
        if done.cancelled() or done.exception() is not None:  # the stream broke first
            self._unsent(
                future, request, deadline, pinned, "relay connection lost before the Reply"
            )
        elif done.result().code != 0:
            future.set_exception(RelayError(done.result()))
        else:
            future.set_result(done.result())

    def _retry(
        self, future: concurrent.futures.Future[Reply], request: Request, deadline: float
    ) -> None:
        def again() -> None:
            try:
                reply = self.request(request, timeout=max(0.0, deadline - time.monotonic()))
            except BaseException as exc:
                future.set_exception(exc)
            else:
                future.set_result(reply)

        threading.Thread(target=again, name="svc-relay-resend", daemon=True).start()

    def abandon(self, generation: int, why: str) -> None:
        """Drops connection ``generation`` if it is still the current one: the relay
        left a request on it unanswered for too long. What waits on it fails as for a
        lost connection, and the link's thread reconnects. Any thread; does not block."""
        with self._lock:
            conn = self._conn if generation == self.generation else None
        if conn is None:
            return
        self._error = TransportError(why)  # what the reconnect's log line says
        conn.close()

    @property
    def connected(self) -> bool:
        return self._connected.is_set()

    @property
    def endpoint(self) -> str:
        return self.endpoints[self._endpoint_index % len(self.endpoints)]

    # -- operations (any thread; they block) ---------------------------------------------

    def request(self, request: Request, *, timeout: float, retry: bool = True) -> Reply:
        """Sends ``request`` and returns its OK Reply. Waits out reconnects (resending
        when ``retry``) until ``timeout``; a non-OK Reply raises RelayError, no answer in
        time TransportError, a client closed meanwhile ChannelClosedError."""
        deadline = time.monotonic() + timeout
        while True:
            conn = self._wait_connected(deadline - time.monotonic())
            future = None
            try:
                future = conn.send(request)
                reply = future.result(max(0.0, deadline - time.monotonic()))
            except ConnectionError as exc:
                if self._closing:
                    raise ChannelClosedError("the client is closed") from None
                if not retry or time.monotonic() >= deadline:
                    raise TransportError(f"relay connection lost: {exc}") from None
                self._lost(conn, deadline)
                continue
            except TimeoutError:
                # Cancelled, it is forgotten: no Reply is waited for any more. A Reply that
                # came in between is the answer after all.
                if future is None or future.cancel() or future.exception() is not None:
                    raise TransportError(self._why("no answer from the relay in time")) from None
                reply = future.result()
            if reply.code != 0:
                raise RelayError(reply)
            return reply

    def subscribe(self, channel: str, after_seq: int, sink: Sink, timeout: float) -> int:
        """Registers the sink and subscribes; returns the relay's head seq."""
        deadline = time.monotonic() + timeout
        sub = _Sub(sink, after_seq)
        subscribed = None
        with self._lock:
            self._subs[channel] = sub
            conn = self._subscribing_on
            if conn is not None:
                with contextlib.suppress(ConnectionError):  # the reconnect subscribes it
                    subscribed = self._send_subscribe(sub, channel, conn)
        try:
            if subscribed is not None:
                with contextlib.suppress(ConnectionError):  # the reconnect subscribes it
                    reply = subscribed.result(max(0.0, deadline - time.monotonic()))
                    self._subscribed(sub, channel, reply)
            while not sub.ready.wait(min(0.1, max(0.0, deadline - time.monotonic()))):
                if self._closing:
                    raise ChannelClosedError("the client is closed")
                if time.monotonic() >= deadline:
                    raise TimeoutError
        except TimeoutError:
            if subscribed is not None:
                subscribed.cancel()
            self._forget(channel, sub)
            raise TransportError(self._why(f"no subscription to {channel!r} in time")) from None
        except BaseException:
            self._forget(channel, sub)
            raise
        return sub.head

    def _forget(self, channel: str, sub: _Sub) -> None:
        with self._lock:
            if self._subs.get(channel) is sub:
                del self._subs[channel]

    def unsubscribe(self, channel: str) -> None:
        with self._lock:  # written under the lock: a later Subscribe goes after it
            self._subs.pop(channel, None)
            conn = self._conn
            if conn is not None:
                with contextlib.suppress(Exception):
                    conn.send(Unsubscribe(channel=channel))

    def wait_received(self, channel: str, seq: int, timeout: float) -> None:
        """Waits until the sink of ``channel`` was handed everything up to ``seq``."""
        deadline = time.monotonic() + timeout
        while True:
            sub = self._subs.get(channel)
            if sub is None or sub.received >= seq:
                return
            if time.monotonic() >= deadline:
                raise TransportError(f"the relay did not deliver {channel!r} up to seq {seq}")
            if self._stop.wait(0.005):
                raise ChannelClosedError("the client is closed")

    def welcome(self, channel: str, timeout: float) -> Welcome:
        """The next Welcome for ``channel`` (one that already arrived counts);
        TimeoutError if none comes within ``timeout``."""
        deadline = time.monotonic() + timeout
        with self._welcome_arrived:
            while not self._welcomes.get(channel):
                if self._closing:
                    raise ChannelClosedError("the client is closed")
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError(f"no Welcome for {channel!r} within {timeout:g} s")
                self._welcome_arrived.wait(remaining)
            return self._welcomes[channel].pop(0)

    # -- the link's thread ---------------------------------------------------------------

    def _why(self, default: str) -> str:
        where = ", ".join(self.endpoints)
        return (
            f"{default} ({where}): {self._error.detail}" if self._error else f"{default} ({where})"
        )

    def _wait_connected(self, timeout: float) -> StreamConnection:
        deadline = time.monotonic() + timeout
        while True:
            conn = self._conn
            if conn is not None and self._connected.is_set():
                return conn
            if self._closing:  # no reconnect is coming: fail now, not at the deadline
                raise ChannelClosedError("the client is closed")
            if self._fatal is not None:
                raise self._fatal
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                if isinstance(self._error, AuthError):
                    raise self._error
                raise TransportError(self._why("relay unreachable"))
            self._connected.wait(min(remaining, 0.1))

    def _lost(self, conn: StreamConnection, deadline: float) -> None:
        """The caller saw ``conn`` fail; wait until the link's thread noticed."""
        conn.ended.wait(max(0.0, min(1.0, deadline - time.monotonic())))
        while self._conn is conn and time.monotonic() < deadline and not self._closing:
            time.sleep(0.001)

    def _maintain(self) -> None:
        attempt = 0
        while not self._closing:
            endpoint = self.endpoint
            conn: StreamConnection | None = None
            try:
                token = self._tokens.token()
                conn = StreamConnection(endpoint, token, self.identity, on_frame=self._on_frame)
                with self._lock:
                    if self._stopping():
                        break
                    # close() closes it from here on. The generation moves with it, in one
                    # step: a frame pinned to the last connection is refused from now on,
                    # never written on this one.
                    self._conn = conn
                    self.generation += 1
                conn.open(OPEN_TIMEOUT)
                # The first Reply proves the stream is up and the token accepted.
                reply = conn.send(Refresh(token=token)).result(5.0 if attempt else 10.0)
                if reply.code != 0:
                    raise RelayError(reply)
                self._resubscribe_all(conn)
                self._error = None
                self._connected.set()
                if attempt:
                    self.reconnects += 1
                    log.info("reconnected to relay %s", endpoint)
                attempt = 0
                self._serve(conn)
                if conn.end is not None:
                    self._error = relay_error(conn.end)
                    log.warning("relay stream ended: %s", self._error)
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
                with self._lock:
                    self._conn = None
                    self._subscribing_on = None
                if conn is not None:
                    conn.close()
            if self._stopping():
                break
            if isinstance(self._error, AuthError):
                # A rejected token: get a fresh one. A revoked key fails here, at the API,
                # and callers waiting for the connection get that error at once.
                try:
                    self._tokens.refresh()
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
            self._stop.wait(delay * _jitter.uniform(0.5, 1.0))

    def _stopping(self) -> bool:  # a method: close() flips the flag from another thread
        return self._closing

    def _serve(self, conn: StreamConnection) -> None:
        """Waits for the stream's end, renewing the token on it when it is due. The
        renewal (an HTTP request to the account API) runs on a thread of its own, so a
        stream that ends meanwhile is noticed at once."""
        renewing: threading.Thread | None = None
        while not conn.ended.is_set() and not self._closing:
            due = self._tokens.refresh_due() - time.time()
            if due == float("inf"):
                conn.ended.wait()
                return
            wait = max(0.5, due, self._renew_after - time.monotonic())
            if conn.ended.wait(wait):
                return
            if renewing is None or not renewing.is_alive():
                renewing = threading.Thread(
                    target=self._renew, args=(conn,), name="svc-token-renew", daemon=True
                )
                renewing.start()

    def _renew(self, conn: StreamConnection) -> None:
        try:
            token = self._tokens.refresh()
        except SvcError as exc:
            log.warning("token refresh failed: %s", exc)
            self._error = exc
            self._renew_after = time.monotonic() + 5
            return
        with contextlib.suppress(Exception):
            conn.send(Refresh(token=token))

    # -- subscriptions -------------------------------------------------------------------

    def _resubscribe_all(self, conn: StreamConnection) -> None:
        """Subscribes every channel on a new connection, each after its cursor."""
        with self._lock:
            sent = [
                (sub, channel, self._send_subscribe(sub, channel, conn))
                for channel, sub in self._subs.items()
            ]
            # From here on a new subscription sends its own Subscribe on this connection.
            self._subscribing_on = conn
        for sub, channel, future in sent:
            if future is not None:
                self._subscribed(sub, channel, future.result(10.0))

    def _send_subscribe(
        self, sub: _Sub, channel: str, conn: StreamConnection
    ) -> concurrent.futures.Future[Reply] | None:
        """Writes the Subscribe (caller holds the lock); None while paused."""
        if sub.paused:  # resume() subscribes it
            sub.ready.set()
            return None
        # The new id and the cursor are taken together, between frames: from here on only
        # the new subscription's deliveries count, and it starts right after the cursor.
        sub.current = next(self._subscription_ids)
        return conn.send(
            Subscribe(channel=channel, after_seq=sub.received, subscription=sub.current)
        )

    def _subscribed(self, sub: _Sub, channel: str, reply: Reply) -> None:
        """Takes in a Subscribe's Reply: a refusal for good closes the channel; one for
        now (RETRY_LATER) raises its TransportError, and the caller subscribes again on
        a new connection, after the link's backoff."""
        if reply.code in RETRY_LATER:
            raise relay_error(RelayError(reply), channel)
        if reply.code != 0:
            sub.sink._failed(relay_error(RelayError(reply), channel))
        sub.head = reply.head_seq
        sub.ready.set()

    def _resubscribe(self, sub: _Sub, channel: str) -> Resubscribed:
        """Subscribes again, not waiting for the Reply (caller holds the lock; hand what
        it returns to :meth:`_when_subscribed` after releasing it): for the reading
        thread, and for resume(), which must not block. Returns the Reply's future (None
        if the next connection subscribes it with the others) and the connection's
        generation, taken under the lock with it."""
        conn = self._conn
        if conn is None:
            return None, self.generation
        try:
            return self._send_subscribe(sub, channel, conn), self.generation
        except ConnectionError:
            return None, self.generation  # the stream is ending: the next one subscribes it

    def _when_subscribed(self, sub: _Sub, channel: str, sent: Resubscribed) -> None:
        """Takes in the Reply to a resubscribe when it comes (not holding the lock: a
        refusal closes the channel, which may call back into the link)."""
        future, generation = sent
        if future is not None:
            future.add_done_callback(partial(self._on_resubscribed, sub, channel, generation))

    def _on_resubscribed(
        self, sub: _Sub, channel: str, generation: int, done: concurrent.futures.Future[Reply]
    ) -> None:
        if not done.cancelled() and done.exception() is None:
            try:
                self._subscribed(sub, channel, done.result())
            except TransportError as exc:
                # Refused for now: a new connection subscribes every channel again.
                self.abandon(generation, exc.detail)

    # -- the stream's reading thread -----------------------------------------------------

    def _on_frame(self, frame: Event) -> None:
        if isinstance(frame, Deliveries):
            with self._lock:
                by_channel: dict[str, list[Delivery]] = {}
                for item in frame.items:
                    name, seq, subscription = item.channel, item.seq, item.subscription
                    sub = self._subs.get(name)
                    if sub is None or seq <= sub.received:
                        continue  # already handed over before a reconnect
                    if subscription != sub.current and (subscription or sub.paused):
                        continue  # an earlier subscription's, or paused (0: an older relay's)
                    sub.received = seq
                    by_channel.setdefault(name, []).append(item)
                for channel, items in by_channel.items():
                    sub = self._subs.get(channel)
                    # Pausing needs a relay that numbers deliveries: with an older one,
                    # what the old subscription still sends could not be told from the new
                    # one's.
                    if sub is not None and sub.sink._deliver(items) and items[-1].subscription:
                        self._pause(sub, channel)
        elif isinstance(frame, Welcome):
            with self._welcome_arrived:
                self._welcomes.setdefault(frame.channel, []).append(frame)
                self._welcome_arrived.notify_all()
        elif isinstance(frame, Lagged):
            channel = frame.channel
            with self._lock:
                sub = self._subs.get(channel)
                if sub is None or sub.paused:
                    return
                resubscribed = self._resubscribe(sub, channel)
            self._when_subscribed(sub, channel, resubscribed)

    # -- a bounded backlog -------------------------------------------------------------

    def _pause(self, sub: _Sub, channel: str) -> None:
        """The sink's backlog is full: stop the subscription; what still arrives for it
        is dropped and comes again after :meth:`resume`, from the cursor. (Caller holds
        the lock, so the Unsubscribe is written before the Subscribe of a later resume.)"""
        if sub.paused:
            return
        sub.paused = True
        sub.current = PAUSED
        conn = self._conn
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.send(Unsubscribe(channel=channel))

    def resume(self, channel: str) -> None:
        """The sink of ``channel`` drained its backlog: subscribe again after the last
        seq it was handed, as a new subscription. Any thread; does not block."""
        if self._closing:
            return
        with self._lock:
            sub = self._subs.get(channel)
            if sub is None or not sub.paused:
                return
            sub.paused = False
            # Without a connection, the next one subscribes it with the others. (While
            # one is being set up, both may: the later Subscribe replaces the earlier.)
            resubscribed = self._resubscribe(sub, channel)
        self._when_subscribed(sub, channel, resubscribed)
