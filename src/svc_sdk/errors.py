"""The library's exceptions (docs/client.md, Errors). Every failure is a RuntimeError whose message
starts with a prefix naming the subsystem; the subclasses let callers catch one kind.

One hierarchy under :class:`SvcError`, the MLS engine's errors included: they are defined
here and the Rust extension raises these very classes (as pyca/cryptography does), so
``except SvcError`` catches every failure of the library. This module imports nothing of
the library, so the extension can load it at any point of the package's own import.

>>> try:
...     raise ChannelNameError("acme")
... except RuntimeError as exc:
...     print(str(exc)[:62])
invalid channel name: 'acme'; expected org/namespace/service
"""

from __future__ import annotations

from typing import Literal

__all__ = [
    "AccessError",
    "AuthError",
    "ChannelClosedError",
    "ChannelNameError",
    "InternalError",
    "InviteError",
    "MlsError",
    "PolicyError",
    "SvcError",
    "TransportError",
]


class SvcError(RuntimeError):
    """Base of the library's own errors; ``prefix`` starts every message."""

    prefix = "runtime error: "

    def __init__(self, detail: str) -> None:
        super().__init__(self.prefix + detail)
        self.detail = detail


class AuthError(SvcError):
    """The API key is invalid, revoked or expired, or the relay refused the token."""

    prefix = "auth error: "


class TransportError(SvcError):
    """The relay or API server is unreachable, or the connection failed."""

    prefix = "transport error: "


class ChannelNameError(SvcError):
    """A channel name not in ``org/namespace/service`` form."""

    prefix = "invalid channel name: "

    def __init__(self, name: str) -> None:
        super().__init__(
            f"{name!r}; expected org/namespace/service (three parts of 1 to 64 letters, "
            "digits, '.', '_' or '-')"
        )
        self.name = name


#: Why an invite did not work, in ``InviteError.reason``.
InviteReason = Literal["invalid", "expired", "used-up", "timeout"]


class InviteError(SvcError):
    """An invite token that is invalid, expired or used up, or a join that timed out.

    ``reason`` says which: ``"invalid"`` (malformed, unknown, or for another channel),
    ``"expired"``, ``"used-up"``, or ``"timeout"`` (the token was accepted but no member
    of the channel added this agent in time)."""

    prefix = "runtime error: "

    def __init__(self, detail: str, reason: InviteReason = "invalid") -> None:
        super().__init__(detail)
        self.reason: InviteReason = reason


class AccessError(SvcError):
    """The relay or the account API refused the channel: it belongs to another account,
    this account was not admitted to it (redeem an invite), or it does not exist (the
    account API does not tell an outsider which)."""


class ChannelClosedError(SvcError):
    """The channel was left, this agent was removed from it, or the client closed."""


class MlsError(SvcError):
    """An MLS engine failure: a bad key package or Welcome, a message that does not decrypt
    or validate, a commit that lost its epoch. Raised by the Rust engine as well."""

    prefix = "MLS engine error: "


class PolicyError(MlsError):
    """A commit or proposal that breaks the channel's policy (roles): refused by this
    agent's engine, by the relay and by every member. The message contains ``policy: ``
    and why."""


class InternalError(SvcError):
    """A fault inside the library or an unexpected answer from a server."""


class PayloadTooLargeError(InternalError, ValueError):
    """A payload over ``MAX_PAYLOAD``, refused before it is encrypted. Also a ValueError:
    it is the argument that is wrong."""


def relay_error(exc: BaseException, channel: str | None = None) -> SvcError:
    """The library error for a relay failure, the one mapping of relay codes to errors:
    ``exc`` is a non-OK Reply (``RelayError``), the gRPC status a stream ended with, or
    whatever broke the connection. ``channel`` names the channel a request was about.

    A refused token is an AuthError. Any other failure of the stream itself (no
    ``channel``) is a TransportError: the link reconnects. About a channel: a refused
    channel (another account's, or not admitted) is an AccessError; a relay that cannot
    serve it now (its store unavailable, a cursor it no longer holds, an account over its
    budget of refusals) or a broken stream a TransportError; any other code means the
    request itself was wrong, an InternalError."""
    from svc_sdk.relay_frames import RelayError, StreamError, code_name

    if isinstance(exc, RelayError):
        name, message, replied = code_name(exc.code), exc.reply.message, True
    elif isinstance(exc, StreamError):
        name, message, replied = exc.status.name, exc.details, False
    else:
        return TransportError(f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__)
    if name == "UNAUTHENTICATED":
        return AuthError(f"relay refused the token: {message}")
    if channel is None:  # the stream itself: reconnecting is the answer to the rest
        return TransportError(f"relay {name}: {message}")
    if name in ("PERMISSION_DENIED", "ALREADY_EXISTS"):
        return AccessError(f"channel {channel!r}: {message}")
    if not replied or name in ("UNAVAILABLE", "OUT_OF_RANGE", "RESOURCE_EXHAUSTED"):
        return TransportError(f"channel {channel!r}: {message}")
    return InternalError(f"relay rejected a request for {channel!r} ({name}): {message}")
