"""API key format, generation and lookup.

A key is ``sk_live_`` + 43 base62 characters (32 random bytes) + a 6-character base62
CRC-32 of everything before it. The checksum lets a typo be rejected without a database
lookup; it is no security measure (the 256 random bits are). Only the SHA-256 of a key is
stored, and keys are looked up by that digest, so lookup time does not depend on how
much of a guessed key is right.

>>> key = generate()
>>> key.secret.startswith("sk_live_") and is_well_formed(key.secret)
True
>>> is_well_formed(key.secret[:-1] + ("a" if key.secret[-1] != "a" else "b"))
False
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import uuid
import zlib
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import Connection, bindparam, select, update
from sqlalchemy.orm import Session

from ..db.models import Account, ApiKey

PREFIX = "sk_live_"
ALPHABET = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
BODY_CHARS = 43  # 62**43 > 2**256
CHECKSUM_CHARS = 6  # 62**6 > 2**32
VISIBLE_CHARS = 8  # of the body, shown in key_prefix: tells keys apart, 47 of 256 bits
_SHAPE = re.compile(rf"^{PREFIX}[0-9A-Za-z]{{{BODY_CHARS + CHECKSUM_CHARS}}}$")


def _base62(value: int, width: int) -> str:
    chars = []
    for _ in range(width):
        value, digit = divmod(value, 62)
        chars.append(ALPHABET[digit])
    if value:
        raise ValueError("value does not fit")
    return "".join(reversed(chars))


def _checksum(text: str) -> str:
    return _base62(zlib.crc32(text.encode()), CHECKSUM_CHARS)


@dataclass(frozen=True)
class NewKey:
    secret: str
    prefix: str
    digest: str


def digest(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def generate() -> NewKey:
    body = _base62(secrets.randbits(256), BODY_CHARS)
    secret = PREFIX + body + _checksum(PREFIX + body)
    return NewKey(secret=secret, prefix=PREFIX + body[:VISIBLE_CHARS], digest=digest(secret))


def is_well_formed(secret: str) -> bool:
    """Shape and checksum; no database involved."""
    if len(secret) != len(PREFIX) + BODY_CHARS + CHECKSUM_CHARS or not _SHAPE.match(secret):
        return False
    return hmac.compare_digest(secret[-CHECKSUM_CHARS:], _checksum(secret[:-CHECKSUM_CHARS]))


def create(session: Session, account: Account, name: str) -> tuple[ApiKey, str]:
    """Creates a key for ``account``; returns the record and the secret (shown once)."""
    new = generate()
    record = ApiKey(account=account, name=name, key_prefix=new.prefix, key_hash=new.digest)
    session.add(record)
    session.flush()
    return record, new.secret


@dataclass(frozen=True)
class AccountRecord:
    id: uuid.UUID
    email: str
    name: str
    plan: str
    created_at: datetime


@dataclass(frozen=True)
class ActiveKey:
    id: uuid.UUID
    account: AccountRecord


_FIND_ACTIVE = (
    select(
        ApiKey.id,
        ApiKey.key_hash,
        Account.id,
        Account.email,
        Account.name,
        Account.plan,
        Account.created_at,
    )
    .join(Account, ApiKey.account_id == Account.id)
    .where(ApiKey.key_hash == bindparam("digest"), ApiKey.revoked_at.is_(None))
)


def find_active(conn: Connection, secret: str) -> ActiveKey | None:
    """The active key with this secret and its account, or None. One indexed query on
    the digest; runs on every authenticated request, so it stays at the Core level."""
    wanted = digest(secret)
    row = conn.execute(_FIND_ACTIVE, {"digest": wanted}).first()
    if row is None or not hmac.compare_digest(row[1], wanted):
        return None
    return ActiveKey(id=row[0], account=AccountRecord(*row[2:]))


def touch(conn: Connection, key_id: uuid.UUID, now: datetime) -> None:
    conn.execute(update(ApiKey).where(ApiKey.id == key_id).values(last_used_at=now))


def list_active(session: Session, account_id: uuid.UUID) -> list[ApiKey]:
    return list(
        session.scalars(
            select(ApiKey)
            .where(ApiKey.account_id == account_id, ApiKey.revoked_at.is_(None))
            .order_by(ApiKey.created_at.desc(), ApiKey.id.desc())
        )
    )


def revoke(session: Session, account_id: uuid.UUID, key_id: uuid.UUID, now: datetime) -> bool:
    """Revokes one of the account's active keys; False if there is no such key."""
    record = session.scalars(
        select(ApiKey)
        .where(ApiKey.id == key_id, ApiKey.account_id == account_id, ApiKey.revoked_at.is_(None))
        .with_for_update()
    ).first()
    if record is None:
        return False
    record.revoked_at = now
    return True
