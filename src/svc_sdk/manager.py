"""``SvcChannelManager``: channels for synchronous callers, with a background
listener thread per channel that processes deliveries as they arrive (decrypting,
applying commits, adding agents that redeemed invites), so ``receive`` only reads.

>>> with SvcChannelManager("alice") as alice:                  # doctest: +SKIP
...     alice.create("acme/support/triage")
...     token = alice.invite("acme/support/triage")
...     alice.send("acme/support/triage", "hello")
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
import time

from svc_sdk import credentials
from svc_sdk.agent_id import AgentId
from svc_sdk.api_client import ApiClient
from svc_sdk.channel import Accept, Channel, Message
from svc_sdk.client import NO_API_KEY, SvcClient, parse_endpoints
from svc_sdk.envelope import Envelope, Protocol
from svc_sdk.errors import AuthError, ChannelClosedError, InternalError
from svc_sdk.health import ClientHealth
from svc_sdk.names import check_channel_name

log = logging.getLogger("svc_sdk.manager")

STOP_POLL = 0.2  # how often listeners look at the stop flag: close() takes at most this
# After a local write failed (disk full): how soon a listener tries again.
STORAGE_RETRY = 1.0


def default_data_dir(identity: bytes, relay: str, account: str) -> str:
    """The spec's default, ``/tmp/svc-<hex>``, where ``<hex>`` stands for this OS user,
    the relay address, the account and the identity together: state from another server,
    account or user is never picked up, and two users on one host never share a folder.

    The engine creates it 0700 and refuses one that another user owns or can read, or
    that another process is using (docs/client.md).
    """
    parts = (str(os.geteuid()).encode(), relay.encode(), account.encode(), identity)
    digest = hashlib.sha256(b"\0".join(parts)).hexdigest()[:32]
    return f"/tmp/svc-{digest}"  # noqa: S108


class SvcChannelManager:
    """Channels by name, for code that wants plain calls rather than iterators.

    Every argument but ``identity`` has a default from the environment:
    ``endpoint`` from ``SVC_RELAY`` (else ``http://127.0.0.1:50051``), ``data_dir``
    from ``SVC_DATA_DIR`` (else ``/tmp/svc-<hex>``, see :func:`default_data_dir`),
    ``api_key`` from ``SVC_API_KEY`` (else the file ``svc signup`` wrote), ``api_url``
    from ``SVC_API_URL`` (else ``http://127.0.0.1:8000``) — the addresses ``svc up``
    listens on. ``state_key`` encrypts the data_dir at rest, as for
    :class:`~svc_sdk.SvcClient` (else ``SVC_STATE_KEY`` or ``SVC_STATE_KEY_FILE``).
    """

    def __init__(
        self,
        identity: bytes | str,
        endpoint: str | None = None,
        data_dir: str | os.PathLike[str] | None = None,
        api_key: str | None = None,
        api_url: str | None = None,
        *,
        timeout: float = 30.0,
        state_key: str | bytes | None = None,
    ) -> None:
        ident = identity.encode() if isinstance(identity, str) else identity
        if not isinstance(ident, bytes):
            raise TypeError("identity must be bytes or str")
        self.identity = ident
        relay = endpoint or os.environ.get("SVC_RELAY") or credentials.DEFAULT_RELAY_URL
        key = api_key or credentials.load_api_key()
        url = api_url or credentials.api_url()
        directory = data_dir or os.environ.get("SVC_DATA_DIR")
        api = None
        if not directory:
            # The default folder names the account, known once the key is exchanged; the
            # client reuses that exchange.
            if not key:
                raise AuthError(NO_API_KEY)
            api = ApiClient(url, key)
            try:
                directory = default_data_dir(
                    ident, ",".join(parse_endpoints(relay)), api.account_id()
                )
            except BaseException:
                api.close()
                raise
        try:
            self.client = SvcClient(
                relay, directory, ident, key, url, timeout=timeout, state_key=state_key, _api=api
            )
        except BaseException:
            if api is not None:
                api.close()  # idempotent: the client may have closed it already
            raise
        self._stop = threading.Event()
        self._listeners: dict[str, threading.Thread] = {}
        self._lock = threading.Lock()
        for name in self.client.channels():
            self._listen(name)

    @property
    def agent_id(self) -> AgentId:
        """This agent as channel members see it: its account and identity."""
        return self.client.agent_id

    # -- listeners ---------------------------------------------------------------------

    def _listen(self, name: str) -> None:
        channel = self.client.channel(name)
        thread = threading.Thread(
            target=self._run_listener, args=(channel,), name=f"svc-listen-{name}", daemon=True
        )
        with self._lock:
            self._listeners[name] = thread
        thread.start()

    def _run_listener(self, channel: Channel) -> None:
        fault = ""
        while not self._stop.is_set() and not channel.closed:
            try:
                channel._deliveries.wait(STOP_POLL)
                channel._deliveries.process_pending()
                channel._flush_if_due()  # what readers took, recorded while idle
                if fault:
                    log.warning("channel %s: storing works again", channel.name)
                    fault = ""
            except ChannelClosedError:
                break
            except InternalError as exc:  # storage: nothing is lost, retried until it works
                if str(exc) != fault:
                    log.warning("%s", exc)
                    fault = str(exc)
                self._stop.wait(STORAGE_RETRY)
            except Exception:  # keep listening: one bad moment must not end the channel
                log.exception("listener of %s", channel.name)
                self._stop.wait(0.1)

    def _channel(self, name: str) -> Channel:
        check_channel_name(name)  # a malformed name says so, not "not in channel"
        try:
            return self.client.channel(name)
        except KeyError:
            raise ChannelClosedError(
                f"not in channel {name!r}; create it, join it or join_with_token first"
            ) from None

    # -- the core API ------------------------------------------------------------------

    def create(self, channel_name: str, *, cipher_suite: int | None = None) -> None:
        """Creates the channel and starts listening on it; ``cipher_suite`` as in
        :meth:`SvcClient.create_channel`."""
        self.client.create_channel(channel_name, cipher_suite=cipher_suite)
        self._ensure_listening(channel_name)

    def join(self, channel_name: str, welcome: bytes) -> None:
        """Joins with an MLS Welcome and starts listening."""
        self.client.join_channel(channel_name, welcome)
        self._ensure_listening(channel_name)

    def generate_key_package(self, *, cipher_suite: int | None = None) -> bytes:
        """A single-use MLS key package of this agent, to hand to a member who calls
        ``add_member`` (``join_with_token`` does this exchange for you); for a
        post-quantum channel, ``cipher_suite=PQ_CIPHER_SUITE``."""
        return self.client.generate_key_package(cipher_suite=cipher_suite)

    def add_member(self, channel_name: str, key_package: bytes) -> bytes:
        """Adds an agent by key package; returns its MLS Welcome."""
        return self._channel(channel_name).add_member(key_package)

    def send(self, channel_name: str, message: str | bytes) -> None:
        """Sends an encrypted message (str is UTF-8 encoded)."""
        data = message.encode() if isinstance(message, str) else message
        self._channel(channel_name).send(data)

    def receive(self, channel_name: str, timeout: float = 5.0) -> list[str]:
        """Every buffered message, oldest first; waits up to ``timeout`` only when none
        is buffered. Payloads that are not UTF-8 are decoded with replacement characters."""
        return [m.data.decode(errors="replace") for m in self._drain(channel_name, timeout)]

    def receive_latest(self, channel_name: str, timeout: float = 5.0) -> str | None:
        """The newest buffered message, discarding older ones; None if none came."""
        messages = self._drain(channel_name, timeout)
        return messages[-1].data.decode(errors="replace") if messages else None

    def list_channels(self) -> list[str]:
        """Names of all channels this agent is in."""
        return self.client.channels()

    def invite(self, channel_name: str, max_uses: int = 1, ttl: int = 3600) -> str:
        """An invite token (``svc_inv_…``) for agents to pass to ``join_with_token``."""
        return self.client.invite(channel_name, max_uses, ttl)

    def join_with_token(self, channel_name: str, token: str, timeout: float = 60.0) -> None:
        """Joins with an invite token; no key package changes hands manually."""
        self.client.join_with_token(channel_name, token, timeout)
        self._ensure_listening(channel_name)

    def send_envelope(self, channel_name: str, envelope: Envelope) -> None:
        """Sends an :class:`Envelope` (a payload tagged with its protocol), encrypted;
        readers get it back from ``receive_envelopes``."""
        if not isinstance(envelope, Envelope):
            raise TypeError("send_envelope takes an Envelope")
        self._channel(channel_name).send(envelope.serialize())

    def receive_envelopes(self, channel_name: str, timeout: float = 5.0) -> list[Envelope]:
        """Buffered messages as Envelopes; anything that is not one is wrapped as RAW."""
        return [to_envelope(m) for m in self._drain(channel_name, timeout)]

    # -- beyond the core ---------------------------------------------------------------

    def receive_messages(
        self, channel_name: str, timeout: float = 5.0, *, accept: Accept | None = None
    ) -> list[Message]:
        """Like ``receive``, with each message's (authenticated) sender and sequence
        number. With ``accept``, only the messages it returns true for; the rest stay
        buffered, in order, for other readers of the channel (the adapters use this to
        share one channel between protocols)."""
        return self._drain(channel_name, timeout, accept)

    def health(self) -> ClientHealth:
        """The client's :meth:`SvcClient.health`: the relay link, and each channel's
        standing storage fault (which its listener retries until storing works again)
        and backlog. Poll it to learn of a full disk without reading a log."""
        return self.client.health()

    def members(self, channel_name: str) -> list[AgentId]:
        """The channel's members (account and identity, from their verified
        credentials), as this agent's MLS state has them."""
        return self._channel(channel_name).members()

    def remove_member(self, channel_name: str, member: AgentId | bytes | str) -> None:
        """Removes a member (an :class:`AgentId`, or an identity only one member has): a
        commit the relay must accept, after which it can read nothing sent later."""
        self._channel(channel_name).remove_member(member)

    def leave(self, channel_name: str) -> None:
        """Leaves the channel (an owner or admin commits the removal) and forgets it here."""
        self._channel(channel_name).leave()

    def close(self) -> None:
        """Stops every listener thread (within a second) and the client. Idempotent."""
        self._stop.set()
        self.client.close()
        with self._lock:
            threads = list(self._listeners.values())
        deadline = time.monotonic() + 1.0
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))

    def __enter__(self) -> SvcChannelManager:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- internals ---------------------------------------------------------------------

    def _ensure_listening(self, name: str) -> None:
        with self._lock:
            running = self._listeners.get(name)
        if running is None or not running.is_alive():
            self._listen(name)

    def _drain(self, name: str, timeout: float, accept: Accept | None = None) -> list[Message]:
        channel = self._channel(name)
        taken = channel.next_messages(timeout, accept)
        if not taken and channel.closed and name not in self.client.channels():
            raise ChannelClosedError(f"no longer in channel {name!r}")
        return taken


def to_envelope(message: Message) -> Envelope:
    try:
        return Envelope.deserialize(message.data)
    except ValueError:
        return Envelope(Protocol.RAW, "application/octet-stream", message.data)


__all__ = ["SvcChannelManager", "to_envelope"]
