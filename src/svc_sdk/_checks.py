"""Argument checks shared by the blocking and the async channel, done before anything
is locked, encrypted or sent."""

from __future__ import annotations

from svc_sdk.errors import PayloadTooLargeError

#: The largest payload ``send`` takes. MLS pads what it encrypts so that only the two
#: most significant bits of its length show (mls-rs's step function): anything over
#: 896 KiB pads to a full 1 MiB and, with its framing, would exceed the relay's 1 MiB
#: message limit. 1 KiB is left for the signature and MLS framing inside the padding.
MAX_PAYLOAD = 896 * 1024 - 1024


def check_wait(timeout: object, accept: object) -> None:
    """A reader's ``timeout`` (seconds ≥ 0, or None to wait until a message or the
    channel's end) and ``accept`` (a callable, or None for every message)."""
    if timeout is not None:
        if isinstance(timeout, bool) or not isinstance(timeout, int | float):
            raise TypeError(f"timeout must be seconds or None, not {type(timeout).__name__}")
        if not timeout >= 0:  # also catches NaN
            raise ValueError(f"timeout must be 0 or more seconds, not {timeout}")
    if accept is not None and not callable(accept):
        raise TypeError(f"accept must be a callable or None, not {type(accept).__name__}")


def check_payload(payload: object) -> bytes:
    """``payload`` as bytes, if it is bytes-like and fits in one relay message."""
    if not isinstance(payload, bytes | bytearray | memoryview):
        raise TypeError(f"payload must be bytes, not {type(payload).__name__}")
    if len(payload) > MAX_PAYLOAD:
        raise PayloadTooLargeError(
            f"payload is {len(payload)} bytes; the limit is {MAX_PAYLOAD} "
            "(the relay's 1 MiB message limit, less MLS padding and framing)"
        )
    return bytes(payload)
