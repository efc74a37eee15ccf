"""``SvcClient``: one agent's MLS engine, relay connection and channels.

>>> client = SvcClient("http://127.0.0.1:50051", "/tmp/svc-alice", b"alice",
...                    api_key=key, api_url="http://127.0.0.1:8000")   # doctest: +SKIP
>>> channel = client.create_channel("acme/support/triage")            # doctest: +SKIP
>>> channel.send(b"hello")                                             # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
import uuid
from pathlib import Path
from typing import Any, cast

from svc_sdk import _inbox
from svc_sdk._native import PQ_CIPHER_SUITE, Engine
from svc_sdk.agent_id import AgentId
from svc_sdk.api_client import ApiClient
from svc_sdk.audit import ChannelEvent, ChannelMember, ChannelSummary
from svc_sdk.channel import Channel
from svc_sdk.errors import (
    AuthError,
    ChannelClosedError,
    InviteError,
    MlsError,
    SvcError,
    TransportError,
    relay_error,
)
from svc_sdk.health import ClientHealth
from svc_sdk.local_state import LocalState
from svc_sdk.names import check_channel_name
from svc_sdk.relay_frames import CreateChannel, JoinRequest, RelayError, Reply, Request
from svc_sdk.relay_link import RelayLink
from svc_sdk.state_key import resolve_state_key

log = logging.getLogger("svc_sdk")
MAX_IDENTITY = 1024
#: The most events ``channel_events`` returns at once (the API's limit).
MAX_EVENTS_PAGE = 1000
#: A credential is renewed when this fraction of its lifetime has passed.
RENEW_AT = 0.75
#: After a failed renewal, the next try.
RENEW_RETRY_SECONDS = 30.0
# How long close() waits, in all, for the relay to acknowledge what was sent.
CLOSE_SEND_SECONDS = 5.0
NO_API_KEY = "no API key: pass api_key (or set SVC_API_KEY, or run `svc signup`)"


def parse_endpoints(endpoint: str) -> list[str]:
    """``"http://a:50051, http://b:50051"`` → both addresses, in order."""
    if not isinstance(endpoint, str):
        raise TypeError("endpoint must be a str")
    endpoints = [part.strip() for part in endpoint.split(",") if part.strip()]
    if not endpoints:
        raise TransportError("no relay address given (endpoint is empty)")
    return endpoints


class SvcClient:
    """An agent: its identity, its private ``data_dir`` and its channels.

    ``endpoint`` is the relay address, or several separated by commas (tried in turn
    when one fails). The ``api_key`` is exchanged at once for a relay JWT at ``api_url``
    and again before each token expires. The client also gets the agent's credential
    from the API (docs/security.md, "Agent credentials"): the statement, checked by every
    member, that this MLS key belongs to this identity of this account. It is renewed
    when three quarters of its lifetime have passed, and the renewal reaches every
    channel by an update commit.

    Channels the agent is in are restored from ``data_dir`` and resume listening where
    they stopped. Close the client (or use it as a context manager) when done.

    ``state_key`` encrypts ``data_dir`` at rest (32 bytes, or 64 hex characters); without
    it the key comes from ``SVC_STATE_KEY`` or the file ``SVC_STATE_KEY_FILE``, and with
    none of them the data_dir is not encrypted (svc_sdk.state_key). An encrypted data_dir
    never opens without its key.
    """

    def __init__(
        self,
        endpoint: str,
        data_dir: str | os.PathLike[str],
        identity: bytes,
        api_key: str | None = None,
        api_url: str | None = None,
        *,
        timeout: float = 30.0,
        connect_timeout: float = 10.0,
        state_key: str | bytes | None = None,
        _api: ApiClient | None = None,
    ) -> None:
        if isinstance(cast(object, identity), str):
            raise TypeError("identity must be bytes (SvcChannelManager accepts str)")
        if not isinstance(identity, bytes) or not 0 < len(identity) <= MAX_IDENTITY:
            raise ValueError("identity must be 1 to 1024 bytes")
        endpoints = parse_endpoints(endpoint)
        key = resolve_state_key(state_key)  # a bad key fails before anything else
        #: The relay address(es) as given, comma-separated.
        self.endpoint = ",".join(endpoints)
        self.identity = identity
        self.timeout = timeout
        self.api: ApiClient | None = None
        self._channels: dict[str, Channel] = {}
        self._lock = threading.Lock()
        self._closed = False
        self._stop = threading.Event()
        if _api is not None:  # the manager's, which already exchanged the key
            self.api = _api
        elif api_key:
            if not api_url:
                raise AuthError("api_url is required when api_key is set")
            self.api = ApiClient(api_url, api_key)
            try:
                self.api.token()  # exchanged at creation, so a bad key fails here
            except BaseException:
                self.api.close()
                raise
        else:
            raise AuthError(NO_API_KEY)
        try:
            self.engine = Engine(Path(data_dir), identity, state_key=key)
            del key
            renewed = self._ensure_credential()
            self.state = LocalState.of(self.engine)
            self.link = RelayLink(endpoints, identity, self.api)
            self.link.start(connect_timeout)
            self._restore()
        except BaseException:
            self.close()
            raise
        self._renewer = threading.Thread(
            target=self._renew_loop, args=(renewed,), name="svc-credential", daemon=True
        )
        self._renewer.start()

    # -- the agent credential ----------------------------------------------------------

    @property
    def agent_id(self) -> AgentId:
        """This agent as channel members see it: its account and identity."""
        return AgentId.from_member_id(self.member_id)

    @property
    def member_id(self) -> bytes:
        """``account (16 bytes) || identity``: how MLS groups and the relay name this
        agent (``agent_id`` in bytes)."""
        member_id = self.engine.member_id
        assert member_id is not None, "a client always holds a credential"
        return member_id

    def _renewal_due(self) -> float:
        """When the installed credential should be replaced (epoch seconds)."""
        cred = self.engine.credential
        if cred is None:
            return 0.0
        return cred.not_before + (cred.not_after - cred.not_before) * RENEW_AT

    def _ensure_credential(self, force: bool = False) -> bool:
        """Trusts the API's current credential keys, and gets a credential unless
        (without ``force``) the one in data_dir is still good for a while. True if a new
        one was installed."""
        api = self._api()
        self.engine.set_trust_anchors(api.credential_keys())
        cred = self.engine.credential
        if (
            not force
            and cred is not None
            and time.time() < self._renewal_due()
            and cred.issuer in self.engine.trust_anchors
            # Another account's key on this data_dir: the new credential is refused below.
            and cred.account == uuid.UUID(api.account_id()).bytes
        ):
            return False
        self.engine.install_credential(api.agent_credential(self.engine))
        return True

    def renew_credential(self) -> None:
        """Gets a new credential now and moves every channel's leaf to it (one update
        commit per channel). The client does this by itself before expiry."""
        self._check_open()
        self._ensure_credential(force=True)
        self._update_channels()

    def _send_outboxes(self, channels: list[Channel]) -> None:
        """What was sent goes to the relay first, for up to CLOSE_SEND_SECONDS in all;
        anything left stays in the outbox and goes after the next start."""
        deadline = time.monotonic() + CLOSE_SEND_SECONDS
        for channel in channels:
            if channel.unsent and getattr(self, "link", None) is not None and self.link.connected:
                try:
                    channel._outbox.wait(
                        channel._outbox.last_pos(), max(0.0, deadline - time.monotonic())
                    )
                except SvcError as exc:
                    log.warning("channel %s: %s", channel.name, exc)

    def _update_channels(self) -> None:
        with self._lock:
            channels = list(self._channels.values())
        self._send_outboxes(channels)
        for channel in channels:
            try:
                channel.update_keys()
            except SvcError as exc:  # MlsError included
                if not self._closed:
                    log.warning(
                        "channel %s: renewed credential not committed yet: %s", channel.name, exc
                    )

    def _renew_loop(self, renewed_at_start: bool) -> None:
        if renewed_at_start:
            self._update_channels()  # leaves still carry the credential that lapsed
        while not self._stop.wait(max(0.0, self._renewal_due() - time.time())):
            try:
                self._ensure_credential(force=True)
            except SvcError as exc:  # MlsError included
                log.warning(
                    "credential renewal failed (%s); next try in %g s", exc, RENEW_RETRY_SECONDS
                )
                if self._stop.wait(RENEW_RETRY_SECONDS):
                    return
                continue
            self._update_channels()

    # -- plumbing ----------------------------------------------------------------------

    def _request(self, request: Request, *, channel: str, retry: bool = True) -> Reply:
        """``request`` (about ``channel``), waited for; a refusal as a library error."""
        try:
            return self.link.request(request, timeout=self.timeout, retry=retry)
        except RelayError as exc:
            raise relay_error(exc, channel) from None

    def _register(self, name: str, group: Any, cursor: int, joined_epoch: int) -> Channel:
        inbox = self.state.inbox(name, limit=_inbox.MEMORY_MESSAGES)
        channel = Channel(self, name, group, cursor, joined_epoch, inbox)
        with self._lock:
            self._channels[name] = channel
        try:
            self.link.subscribe(name, cursor, channel, self.timeout)
        except RelayError as exc:
            self._drop(name)
            channel._outbox.stop()
            raise relay_error(exc, name) from None
        except BaseException:
            self._drop(name)
            channel._outbox.stop()
            raise
        return channel

    def _drop(self, name: str) -> None:
        with self._lock:
            self._channels.pop(name, None)

    def _restore(self) -> None:
        stored = set(self.engine.group_ids())
        for name, cursor, joined_epoch in self.state.channels():
            if name.encode() not in stored:
                self.state.remove_channel(name)  # removed while we were away
                continue
            self._register(name, self.engine.group(name.encode()), cursor, joined_epoch)

    def _forget(self, channel: Channel, reason: SvcError) -> None:
        """The agent is no longer in ``channel``: stop listening, delete its state."""
        channel._outbox.stop(reason)  # its unsent messages fail with the reason
        channel._close(reason)
        self._drop(channel.name)
        if not self._closed:
            with contextlib.suppress(SvcError):
                self.link.unsubscribe(channel.name)
        self.state.remove_channel(channel.name)
        if channel.name.encode() in self.engine.group_ids():
            self.engine.delete_group(channel.name.encode())

    def _check_open(self) -> None:
        if self._closed:
            raise ChannelClosedError("the client is closed")

    # -- the core API ------------------------------------------------------------------

    def create_channel(self, name: str, *, cipher_suite: int | None = None) -> Channel:
        """Creates channel ``name`` (org/namespace/service) with this agent as its first
        member. Returns the existing Channel if this agent already created or joined it.

        ``cipher_suite`` is the channel's MLS cipher suite, fixed for its lifetime: by
        default this agent's own (1, X25519 and Ed25519), or ``PQ_CIPHER_SUITE`` (65100),
        the hybrid post-quantum ML-KEM-768+X25519 suite with Ed25519 signatures, whose
        key exchange resists an attacker who records traffic now and has a quantum
        computer later (docs/security.md). Joiners need an agent of this library that
        can use that suite (``join_with_token`` makes a key package for it); a suite this
        agent cannot use raises MlsError."""
        check_channel_name(name)
        suite = self._check_suite(cipher_suite)
        self._check_open()
        with self._lock:
            existing = self._channels.get(name)
        if existing is not None:
            return existing
        # The relay tracks the group from here on: it must see the group as created, with
        # this agent its only member and owner.
        group = self.engine.create_group(name.encode(), suite)
        try:
            self._request(CreateChannel(channel=name, group_info=group.group_info()), channel=name)
            self.state.add_channel(name, 0, 0)
        except BaseException:
            self.engine.delete_group(name.encode())
            raise
        try:
            return self._register(name, group, 0, 0)
        except BaseException:
            self.state.remove_channel(name)
            self.engine.delete_group(name.encode())
            raise

    def generate_key_package(self, *, cipher_suite: int | None = None) -> bytes:
        """A one-time MLS key package to hand to a member, who adds this agent with it.
        A key package fits channels of one cipher suite: ``cipher_suite`` (default: this
        agent's own, 1) must be the channel's, ``PQ_CIPHER_SUITE`` for a post-quantum
        channel."""
        return self.engine.generate_key_package(self._check_suite(cipher_suite))

    def _check_suite(self, cipher_suite: object) -> int | None:
        """``cipher_suite`` if this agent can make channels and key packages of it."""
        if cipher_suite is None:
            return None
        if not isinstance(cipher_suite, int) or isinstance(cipher_suite, bool):
            raise TypeError(
                f"cipher_suite must be an int (1, or PQ_CIPHER_SUITE = 65100), "
                f"not {type(cipher_suite).__name__}"
            )
        usable = self.engine.channel_cipher_suites
        if cipher_suite not in usable:
            hint = (
                " (post-quantum channels need an agent whose data_dir uses suite 1: an "
                "Ed25519 signature key)"
                if cipher_suite == PQ_CIPHER_SUITE
                else ""
            )
            raise MlsError(
                f"cipher suite {cipher_suite} is not one a channel of this agent can use; "
                f"supported: {', '.join(map(str, usable))}{hint}"
            )
        return cipher_suite

    def join_channel(self, name: str, welcome: bytes, *, after_seq: int = 0) -> Channel:
        """Joins ``name`` with the MLS Welcome a member's ``add_member`` returned."""
        check_channel_name(name)
        self._check_open()
        if not isinstance(welcome, bytes | bytearray | memoryview):
            raise TypeError("welcome must be bytes")
        with self._lock:
            if name in self._channels:
                raise MlsError(f"already a member of channel {name!r}")
        group = self.engine.join_group(bytes(welcome))
        if group.group_id != name.encode():
            self.engine.delete_group(group.group_id)
            raise MlsError(
                f"the Welcome is for channel "
                f"{group.group_id.decode(errors='replace')!r}, not {name!r}"
            )
        epoch = group.epoch
        self.state.add_channel(name, after_seq, epoch)
        try:
            return self._register(name, group, after_seq, epoch)
        except BaseException:
            self.state.remove_channel(name)
            self.engine.delete_group(name.encode())
            raise

    # -- beyond the core ---------------------------------------------------------------

    def channel(self, name: str) -> Channel:
        """A channel this agent is in (KeyError if it is not)."""
        with self._lock:
            return self._channels[name]

    def channels(self) -> list[str]:
        """Names of the channels this agent is in."""
        with self._lock:
            return sorted(self._channels)

    def health(self) -> ClientHealth:
        """The relay link and every channel, as of the call: whether the agent is
        connected and stores what it receives. A storage fault (disk full, I/O error)
        stands here until storing works again, while nothing received is lost.

        >>> client.health().storage_errors  # {} while every channel stores what it gets
        {}
        """
        with self._lock:
            channels = [self._channels[name] for name in sorted(self._channels)]
        return ClientHealth(
            connected=self.link.connected,
            relay=self.link.endpoint,
            channels=tuple(channel.health() for channel in channels),
        )

    def invite(self, channel: str, max_uses: int = 1, ttl: int = 3600) -> str:
        """An invite token (``svc_inv_…``) for ``channel``, redeemable ``max_uses`` times
        within ``ttl`` seconds by agents of any account with ``join_with_token``."""
        check_channel_name(channel)
        _check_positive("max_uses", max_uses)
        _check_positive("ttl", ttl)
        return self._api().create_invite(channel, max_uses, ttl)

    def join_with_token(self, channel: str, token: str, timeout: float = 60.0) -> Channel:
        """Joins ``channel`` with an invite token: the key package goes to the API server
        with the token, an online member adds this agent, and the Welcome comes back over
        the relay. InviteError for a bad, expired or used-up token or a timeout (its
        ``reason`` says which)."""
        check_channel_name(channel)
        self._check_open()
        if not isinstance(token, str) or not token.startswith("svc_inv_"):
            raise InviteError("invite token must be a string starting with svc_inv_")
        with self._lock:
            existing = self._channels.get(channel)
        if existing is not None:
            return existing
        deadline = time.monotonic() + timeout
        self._post_join_request(channel, token)
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise InviteError(
                    f"no member of channel {channel!r} added this agent within {timeout:g} s; "
                    "a member must be online (the request stays valid while the invite is)",
                    "timeout",
                )
            try:
                welcome = self.link.welcome(channel, remaining)
            except TimeoutError:
                continue
            try:
                return self.join_channel(channel, welcome.welcome, after_seq=welcome.seq)
            except MlsError:
                continue  # a Welcome for an older key package of ours that is used up

    def _post_join_request(self, channel: str, token: str) -> None:
        """Redeems ``token`` with a key package and posts the join request to the channel.

        The key package is for this agent's own suite first. The relay refuses one for
        another suite than the channel's and names the channel's: the invite is redeemed
        again (by the same agent, which uses no other use of it) with a key package for
        that suite, or MlsError if this agent cannot use it."""
        suite: int | None = None
        while True:
            key_package = self.engine.generate_key_package(suite)
            join_id = self._api().redeem_invite(channel, token, key_package)
            request = JoinRequest(channel=channel, join_id=join_id)
            try:
                self.link.request(request, timeout=self.timeout, retry=True)
                return
            except RelayError as exc:
                wanted = exc.reply.cipher_suite
                if not wanted or suite is not None:
                    raise relay_error(exc, channel) from None
            usable = self.engine.channel_cipher_suites
            if wanted not in usable:
                raise MlsError(
                    f"channel {channel!r} uses cipher suite {wanted}, which this agent "
                    f"cannot use (it can use {', '.join(map(str, usable))}); "
                    + (
                        "post-quantum channels need an agent whose data_dir uses suite 1"
                        if wanted == PQ_CIPHER_SUITE
                        else "ask for a channel of a suite it supports"
                    )
                )
            suite = wanted

    # -- the account's channels, as the account API records them ---------------------

    def account_channels(self) -> list[ChannelSummary]:
        """Every channel this agent's account may use, by name: those with one of its
        agents as a member (``access="member"``, with their roles) and those it holds a
        live invite redemption for (``"invited"``). Unlike ``channels()``, this includes
        channels this agent is not in."""
        return self._api().channels()

    def channel_members(self, name: str) -> list[ChannelMember]:
        """The channel's members and their roles as the relay last recorded them (after
        its newest accepted commit), oldest members first. AccessError if the channel
        does not exist or this account is not admitted to it (the API does not say
        which)."""
        check_channel_name(name)
        return self._api().channel_members(name)

    def channel_events(
        self, name: str, after: int | None = None, limit: int = 100
    ) -> list[ChannelEvent]:
        """The channel's audit trail, oldest first: who created it, added, removed or
        gave a role to whom, who left, policy changes, each with its epoch and time.
        At most ``limit`` (1 to 1,000) events with an ``id`` above ``after``; pass the
        last one's ``id`` to read on. AccessError as for ``channel_members``."""
        check_channel_name(name)
        if after is not None and (
            not isinstance(after, int) or isinstance(after, bool) or after < 0
        ):
            raise ValueError("after must be None or an event id (an integer of 0 or more)")
        _check_positive("limit", limit)
        if limit > MAX_EVENTS_PAGE:
            raise ValueError(f"limit must be at most {MAX_EVENTS_PAGE}")
        return self._api().channel_events(name, after or 0, limit)

    def _api(self) -> ApiClient:
        if self.api is None:
            raise AuthError("invites need the account API: create the client with api_key")
        return self.api

    # -- lifecycle ---------------------------------------------------------------------

    def close(self) -> None:
        """Stops the relay connection and closes every channel. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        with self._lock:
            channels = list(self._channels.values())
        self._send_outboxes(channels)
        for channel in channels:
            # On a full disk the record of what was read stays unwritten (logged): after
            # a restart those messages come again, none is lost. Closing goes on.
            with channel._cond:
                channel._inbox.flush()
            channel._close(ChannelClosedError("the client is closed"))
        # Attributes are missing when the constructor failed part-way.
        if getattr(self, "link", None) is not None:
            self.link.close()
        if self.api is not None:
            self.api.close()
        if getattr(self, "state", None) is not None:
            self.state.close()
        if getattr(self, "engine", None) is not None:
            self.engine.close()  # data_dir is free for the next process

    def __enter__(self) -> SvcClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"SvcClient(identity={self.identity!r}, relay={self.link.endpoint!r})"


def _check_positive(name: str, value: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name} must be a positive integer")
