"""SQLAlchemy models of the account API."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

from sqlalchemy import (
    BigInteger,
    Boolean,
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
    """A relay channel. Who may use it follows its MLS group as the relay tracks it:
    ``channel_members`` mirrors the roster after every accepted commit."""

    __tablename__ = "channels"

    name: Mapped[str] = mapped_column(String(255), primary_key=True)
    # The account that created it (its first owner); roles live in channel_members.
    owner_account_id: Mapped[uuid.UUID] = mapped_column(
        ForeignKey("accounts.id", ondelete="CASCADE")
    )
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    # The group's policy: whether plain members may create invites.
    members_invite: Mapped[bool] = mapped_column(Boolean, default=False, server_default="0")
    epoch: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")


class ChannelMember(Base):
    """One member of a channel's MLS group (an agent: account and identity) and its
    role, as of the channel's newest accepted commit."""

    __tablename__ = "channel_members"

    channel: Mapped[str] = mapped_column(
        ForeignKey("channels.name", ondelete="CASCADE"), primary_key=True
    )
    account_id: Mapped[uuid.UUID] = mapped_column(Uuid, primary_key=True, index=True)
    identity: Mapped[bytes] = mapped_column(LargeBinary, primary_key=True)
    role: Mapped[str] = mapped_column(String(16))
    since_epoch: Mapped[int] = mapped_column(BigInteger, default=0)


class ChannelEvent(Base):
    """The audit trail: one membership change (created, added, removed, left, role,
    policy), who made it and in which epoch. Kept after the accounts it names are gone."""

    __tablename__ = "channel_events"
    __table_args__ = (Index("ix_channel_events_channel_id", "channel", "id"),)

    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True)
    channel: Mapped[str] = mapped_column(ForeignKey("channels.name", ondelete="CASCADE"))
    epoch: Mapped[int] = mapped_column(BigInteger)
    kind: Mapped[str] = mapped_column(String(16))
    actor_account_id: Mapped[uuid.UUID] = mapped_column(Uuid)
    actor_identity: Mapped[bytes] = mapped_column(LargeBinary)
    subject_account_id: Mapped[uuid.UUID | None] = mapped_column(Uuid, default=None)
    subject_identity: Mapped[bytes | None] = mapped_column(LargeBinary, default=None)
    detail: Mapped[str] = mapped_column(String(32), default="")
    at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


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
