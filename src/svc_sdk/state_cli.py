"""``svc state``: encrypt an agent's data_dir at rest, change its key, or undo it
(svc_sdk.state_key). Each conversion is crash-safe and needs the data_dir unused."""

from __future__ import annotations

import argparse
import os
import sys

from svc_sdk import state_key
from svc_sdk.errors import InternalError

NEW_KEY_ENV = "SVC_NEW_STATE_KEY"
NEW_KEY_FILE_ENV = "SVC_NEW_STATE_KEY_FILE"

_KEY_SOURCES = (
    "The key comes from SVC_STATE_KEY (64 hex characters) or the file named by "
    "SVC_STATE_KEY_FILE (mode 0600); `svc state keygen` makes one."
)


def _key(required_for: str) -> bytes:
    key = state_key.resolve_state_key()
    if key is None:
        raise InternalError(
            f"{required_for} needs a state key: set SVC_STATE_KEY or SVC_STATE_KEY_FILE"
        )
    return key


def _new_key() -> bytes:
    value, file = os.environ.get(NEW_KEY_ENV), os.environ.get(NEW_KEY_FILE_ENV)
    if (value is None) == (file is None):
        raise InternalError(
            f"rekey needs the new key in exactly one of {NEW_KEY_ENV} or {NEW_KEY_FILE_ENV}"
        )
    if value is not None:
        return state_key.parse_key(value, NEW_KEY_ENV)
    assert file is not None
    return state_key.read_key_file(file)


def _encrypt(args: argparse.Namespace) -> int:
    state_key.encrypt(args.data_dir, _key("svc state encrypt"))
    print(f"{args.data_dir}: encrypted; open it with the same key from now on")
    return 0


def _rekey(args: argparse.Namespace) -> int:
    state_key.rekey(args.data_dir, _key("svc state rekey"), _new_key())
    print(f"{args.data_dir}: key changed; the old key no longer opens it")
    return 0


def _decrypt(args: argparse.Namespace) -> int:
    state_key.decrypt(args.data_dir, _key("svc state decrypt"))
    print(f"{args.data_dir}: decrypted; it is plaintext on disk again")
    return 0


def _status(args: argparse.Namespace) -> int:
    print(f"{args.data_dir}: {state_key.encryption(args.data_dir)}")
    return 0


def _keygen(args: argparse.Namespace) -> int:
    key = state_key.generate_key()
    if args.file is None:
        sys.stdout.write(key + "\n")
        return 0
    try:  # 0600 and never over an existing file: a key is not overwritten by accident
        fd = os.open(args.file, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except OSError as exc:
        raise InternalError(f"cannot create {args.file}: {exc.strerror}") from None
    with os.fdopen(fd, "w") as file:
        file.write(key + "\n")
        file.flush()
        os.fsync(file.fileno())
    print(
        f"wrote a new state key to {args.file} (mode 0600); keep a copy: without it the "
        "data_dir cannot be read"
    )
    return 0


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    state = sub.add_parser(
        "state",
        help="encrypt an agent's data_dir at rest, or change its key",
        description="Encryption at rest of an agent's data_dir (SQLCipher, opt-in). "
        + _KEY_SOURCES
        + " Conversions are crash-safe (killed at any point, the data_dir opens under the "
        "old key, or the next run or open completes it) and need the data_dir unused: "
        "stop the agent first.",
    )
    cmds = state.add_subparsers(dest="state_command", required=True, metavar="ACTION")
    for name, helptext, description, func in (
        (
            "encrypt",
            "encrypt a plaintext data_dir in place",
            "Encrypts every database of a plaintext data_dir in place. " + _KEY_SOURCES,
            _encrypt,
        ),
        (
            "rekey",
            "re-encrypt an encrypted data_dir under a new key",
            "Re-encrypts an encrypted data_dir. The current key as for every command "
            f"(SVC_STATE_KEY or SVC_STATE_KEY_FILE); the new one from {NEW_KEY_ENV} or "
            f"{NEW_KEY_FILE_ENV}.",
            _rekey,
        ),
        (
            "decrypt",
            "turn an encrypted data_dir back to plaintext",
            "Decrypts every database of an encrypted data_dir in place. " + _KEY_SOURCES,
            _decrypt,
        ),
        (
            "status",
            "say whether a data_dir is encrypted",
            "Prints encrypted, plaintext or empty, from the files' headers (no key).",
            _status,
        ),
    ):
        command = cmds.add_parser(name, help=helptext, description=description)
        command.add_argument("data_dir", help="the agent's data_dir")
        command.set_defaults(func=func)
    gen = cmds.add_parser(
        "keygen",
        help="make a new random state key",
        description="Prints a new 256-bit key as 64 hex characters, or writes it to a new "
        "file (mode 0600) with --file.",
    )
    gen.add_argument("--file", help="write the key to this new file instead of printing it")
    gen.set_defaults(func=_keygen)
