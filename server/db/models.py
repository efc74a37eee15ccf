"""SQLAlchemy models of the account API."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

from sqlalchemy import (
    DateTime,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    String,
    Text,
    TypeDecorator,
    UniqueConstraint,
    Uuid,
)
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

PLANS = ("free", "dev", "team", "enterprise")


class UTCDateTime(TypeDecorator[datetime]):
    """Timezone-aware UTC datetimes on every backend (SQLite stores them naive)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime given to a UTC column")
        return value.astimezone(UTC)

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def utcnow() -> datetime:
    return datetime.now(UTC)


class Base(DeclarativeBase):
    pass


class Account(Base):
    __tablename__ = "accounts"

    id: Mapped[uuid.UUID] = mapped_column(Uuid, primary_key=True, default=uuid.uuid4)
    email: Mapped[str] = mapped_column(String(254), unique=True)
    name: Mapped[str] = mapped_column(String(200), default="")
    plan: Mapped[str] = mapped_column(String(20), default="free")
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)

    api_keys: Mapped[list[ApiKey]] = relationship(back_populates="account")


class ApiKey(Base):
    """An API key. Only the SHA-256 of the key is stored; revocation is a soft delete."""

    __tablename__ = "api_keys"
    __table_args__ = (Index("ix_api_keys_account_active", "account_id", "revoked_at"),)

    id: Mapped[uuid.UUID] = mapped_column(Uuid, primary_key=True, default=uuid.uuid4)
    account_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("accounts.id", ondelete="CASCADE"))
    name: Mapped[str] = mapped_column(String(100), default="default")
    key_prefix: Mapped[str] = mapped_column(String(32))
    key_hash: Mapped[str] = mapped_column(String(64), unique=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    last_used_at: Mapped[datetime | None] = mapped_column(UTCDateTime, default=None)
    revoked_at: Mapped[datetime | None] = mapped_column(UTCDateTime, default=None)

    account: Mapped[Account] = relationship(back_populates="api_keys")


class SigningKey(Base):
    """A signing key pair of the API, for one ``purpose``: ``token`` (relay JWTs) or
    ``credential`` (agent credentials). Per purpose the newest unretired key signs; a
    token key verifies until ``verify_until`` (its retirement plus the longest token
    lifetime), a credential key for as long as it is published (docs/security.md)."""

    __tablename__ = "signing_keys"

    kid: Mapped[str] = mapped_column(String(64), primary_key=True)
    purpose: Mapped[str] = mapped_column(String(16), default="token", server_default="token")
    algorithm: Mapped[str] = mapped_column(String(16), default="EdDSA")
    private_pem: Mapped[str] = mapped_column(Text)
    public_jwk: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    retired_at: Mapped[datetime | None] = mapped_column(UTCDateTime, default=None)
    verify_until: Mapped[datetime | None] = mapped_column(UTCDateTime, default=None)


class Channel(Base):
    """A relay channel, registered by the account that created it."""

    __tablename__ = "channels"

    name: Mapped[str] = mapped_column(String(255), primary_key=True)
    owner_account_id: Mapped[uuid.UUID] = mapped_column(
        ForeignKey("accounts.id", ondelete="CASCADE")
    )
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class ChannelAccess(Base):
    """An account whose agents may use a channel (the owner, and admitted accounts)."""

    __tablename__ = "channel_access"

    channel: Mapped[str] = mapped_column(
        ForeignKey("channels.name", ondelete="CASCADE"), primary_key=True
    )
    account_id: Mapped[uuid.UUID] = mapped_column(
        ForeignKey("accounts.id", ondelete="CASCADE"), primary_key=True
    )
    admitted_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class Invite(Base):
    """An invite to a channel. Only the SHA-256 of the token is stored; ``uses`` is
    incremented atomically and never passes ``max_uses``."""

    __tablename__ = "invites"

    id: Mapped[uuid.UUID] = mapped_column(Uuid, primary_key=True, default=uuid.uuid4)
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    channel: Mapped[str] = mapped_column(ForeignKey("channels.name", ondelete="CASCADE"))
    account_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("accounts.id", ondelete="CASCADE"))
    max_uses: Mapped[int] = mapped_column(Integer)
    uses: Mapped[int] = mapped_column(Integer, default=0)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    expires_at: Mapped[datetime] = mapped_column(UTCDateTime)


class JoinRequest(Base):
    """A redeemed invite: the joiner's key package, waiting to be posted to the channel
    (relay JoinRequest frame) where an online member adds it."""

    __tablename__ = "join_requests"
    # The redeeming account is part of the key: another account's redemption of the same
    # invite never matches (and so never overwrites) this one.
    __table_args__ = (
        UniqueConstraint(
            "invite_id", "account_id", "identity", name="uq_join_invite_account_identity"
        ),
    )

    id: Mapped[uuid.UUID] = mapped_column(Uuid, primary_key=True, default=uuid.uuid4)
    invite_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("invites.id", ondelete="CASCADE"))
    channel: Mapped[str] = mapped_column(ForeignKey("channels.name", ondelete="CASCADE"))
    account_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("accounts.id", ondelete="CASCADE"))
    identity: Mapped[bytes] = mapped_column(LargeBinary)
    key_package: Mapped[bytes] = mapped_column(LargeBinary)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
