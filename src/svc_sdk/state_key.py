"""The key that encrypts an agent's ``data_dir`` at rest (SQLCipher), and changing it.

Encryption at rest is opt-in. A key is 256 bits, written as 64 hexadecimal characters
(``svc state keygen`` makes one); it comes, first found wins, from:

- ``state_key=`` on :class:`~svc_sdk.SvcClient` or
  :class:`~svc_sdk.SvcChannelManager` (32 bytes, or the 64-character hex string);
- the environment variable ``SVC_STATE_KEY`` (64 hex characters);
- the file named by ``SVC_STATE_KEY_FILE`` (64 hex characters, surrounding whitespace
  ignored), which must be yours and readable by nobody else (mode 0600 or 0400), as ssh
  demands of a private key.

A raw key rather than a passphrase: SQLCipher would derive a passphrase's key with
256,000 PBKDF2 rounds at every database connection, and a passphrase is the weaker
secret. A data_dir created with a key never opens without it; one created without a key
is encrypted in place with ``svc state encrypt`` (:func:`encrypt`), and the key changed
with ``svc state rekey`` (:func:`rekey`). docs/security.md says what this protects.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from svc_sdk import _native
from svc_sdk.errors import InternalError

__all__ = ["decrypt", "encrypt", "encryption", "generate_key", "rekey", "resolve_state_key"]

KEY_ENV = "SVC_STATE_KEY"
KEY_FILE_ENV = "SVC_STATE_KEY_FILE"
KEY_BYTES = 32


def generate_key() -> str:
    """A new random key, as the 64 hex characters every key source takes."""
    # os.urandom is what ``secrets`` draws from; ``secrets`` itself would load OpenSSL
    # (through hmac) into every agent, ~3 MiB for a name.
    return os.urandom(KEY_BYTES).hex()


def parse_key(value: str | bytes, source: str) -> bytes:
    """The 32-byte key in ``value`` (32 bytes, or 64 hex characters). The error names
    ``source`` and never repeats the value."""
    if isinstance(value, bytes):
        if len(value) == KEY_BYTES:
            return value
        raise InternalError(
            f"{source} must be {KEY_BYTES} bytes or 64 hex characters, got {len(value)} bytes"
        )
    if not isinstance(value, str):
        raise TypeError(f"{source} must be bytes or str")
    text = value.strip()
    if len(text) != 2 * KEY_BYTES or any(c not in "0123456789abcdefABCDEF" for c in text):
        raise InternalError(
            f"{source} must be 64 hexadecimal characters (a 256-bit key; `svc state keygen` "
            f"makes one), got {len(text)} characters"
            + ("" if len(text) != 2 * KEY_BYTES else " that are not all hexadecimal")
        )
    return bytes.fromhex(text)


def read_key_file(path: str | os.PathLike[str]) -> bytes:
    """The key in ``path``, which must be a regular file of yours that nobody else can
    read or write."""
    where = f"{KEY_FILE_ENV} {os.fspath(path)}"
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        raise InternalError(f"cannot read the state key file {where}: {exc.strerror}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise InternalError(f"the state key file {where} is not a regular file")
        if info.st_uid != os.geteuid():
            raise InternalError(
                f"the state key file {where} is owned by uid {info.st_uid}, not by you "
                f"(uid {os.geteuid()}); use a key file of your own"
            )
        if info.st_mode & 0o077:
            raise InternalError(
                f"the state key file {where} is accessible by other users (mode "
                f"{stat.S_IMODE(info.st_mode):o}); run `chmod 600` on it, and make a new key "
                "(`svc state rekey`) if anyone else could have read it"
            )
        data = os.read(fd, 4096)
    finally:
        os.close(fd)
    try:
        text = data.decode("ascii")
    except UnicodeDecodeError:
        raise InternalError(
            f"the state key file {where} must hold 64 hexadecimal characters"
        ) from None
    return parse_key(text, f"the state key file {where}")


def resolve_state_key(state_key: str | bytes | None = None) -> bytes | None:
    """The data_dir key: ``state_key`` if given, else ``SVC_STATE_KEY``, else the file
    ``SVC_STATE_KEY_FILE``; None when none is set (the data_dir is not encrypted).

    A variable that is set but empty is an error, not "no key": a mistyped
    ``SVC_STATE_KEY=$KEY`` must not create a plaintext data_dir."""
    if state_key is not None:
        return parse_key(state_key, "state_key")
    value, file = os.environ.get(KEY_ENV), os.environ.get(KEY_FILE_ENV)
    if value is not None and file is not None:
        raise InternalError(f"both {KEY_ENV} and {KEY_FILE_ENV} are set; set one")
    if value is not None:
        if not value.strip():
            raise InternalError(f"{KEY_ENV} is set but empty")
        return parse_key(value, KEY_ENV)
    if file is not None:
        if not file:
            raise InternalError(f"{KEY_FILE_ENV} is set but empty")
        return read_key_file(file)
    return None


def encryption(data_dir: str | os.PathLike[str]) -> str:
    """``"encrypted"``, ``"plaintext"`` or ``"empty"``: how ``data_dir`` is stored, from
    its files' headers alone (a damaged file also reads as encrypted)."""
    return _native.state_encryption(Path(data_dir))


def encrypt(data_dir: str | os.PathLike[str], key: bytes) -> None:
    """Encrypts a plaintext data_dir in place under ``key``. Crash-safe: killed at any
    point, the data_dir opens as it was, or under ``key`` (the next open or run
    completes it). No process may be using the data_dir."""
    _native.convert_state(Path(data_dir), None, parse_key(key, "the key"))


def rekey(data_dir: str | os.PathLike[str], old: bytes, new: bytes) -> None:
    """Re-encrypts an encrypted data_dir from ``old`` to ``new``, crash-safely."""
    _native.convert_state(
        Path(data_dir), parse_key(old, "the old key"), parse_key(new, "the new key")
    )


def decrypt(data_dir: str | os.PathLike[str], key: bytes) -> None:
    """Turns an encrypted data_dir back to plaintext, crash-safely."""
    _native.convert_state(Path(data_dir), parse_key(key, "the key"), None)
