"""Channel invites: tokens that let another agent (of any account) join a channel.

A token is ``svc_inv_`` + 43 URL-safe characters (32 random bytes). Only its SHA-256 is
stored and it is looked up by that digest, as API keys are. Redeeming consumes one use in
a single conditional UPDATE, so two redeemers racing for the last use cannot both win,
admits the redeemer's account to the channel, and records the joiner's key package as a
join request, which the joiner then posts to the channel over the relay.
"""

from __future__ import annotations

import hashlib
import re
import secrets
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from svc_sdk.protocol import MlsError, inspect

from ..db.models import Invite, JoinRequest
from . import channels

PREFIX = "svc_inv_"
_SHAPE = re.compile(rf"^{PREFIX}[A-Za-z0-9_-]{{43}}$")
MAX_USES = 10_000
MAX_TTL = 30 * 24 * 3600


class InviteError(Exception):
    """Why an invite cannot be created or redeemed; ``kind`` picks the HTTP status."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind  # "not-found" | "not-admin" | "expired" | "used-up"


@dataclass(frozen=True)
class NewInvite:
    id: uuid.UUID
    token: str
    expires_at: datetime


def digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def is_well_formed(token: str) -> bool:
    return bool(_SHAPE.match(token))


def create(
    session: Session,
    channel: str,
    account_id: uuid.UUID,
    max_uses: int,
    ttl: int,
    now: datetime,
) -> NewInvite:
    """An invite to ``channel``, by an account with an owner or admin in it (or any
    member, when the channel's policy lets members invite)."""
    if not channels.has_access(session, channel, account_id):
        # The same answer whether the channel exists or not.
        raise InviteError("not-found", f"no channel {channel!r} in your account")
    if not channels.can_invite(session, channel, account_id):
        raise InviteError(
            "not-admin",
            f"only accounts with an owner or admin in channel {channel!r} invite to it",
        )
    token = PREFIX + secrets.token_urlsafe(32)
    invite = Invite(
        token_hash=digest(token),
        channel=channel,
        account_id=account_id,
        max_uses=max_uses,
        uses=0,
        created_at=now,
        expires_at=now + timedelta(seconds=ttl),
    )
    session.add(invite)
    session.flush()
    return NewInvite(invite.id, token, invite.expires_at)


def redeem(
    session: Session,
    token: str,
    channel: str,
    account_id: uuid.UUID,
    identity: bytes,
    key_package: bytes,
    now: datetime,
) -> JoinRequest:
    """Consumes one use (none when this agent — this account's ``identity`` — already
    redeemed this invite, so a joiner can retry) and returns the join request to post to
    the channel. An invite is good only while the account that made it may still invite
    to the channel, by the roster the relay mirrors. Nothing is written unless a use is
    left or the agent's own earlier redemption is being retried; another account's join
    request is never touched."""
    invalid = InviteError("not-found", "invite token is not valid for this channel")
    if not is_well_formed(token):
        raise invalid
    invite = session.scalar(select(Invite).where(Invite.token_hash == digest(token)))
    if invite is None or invite.channel != channel:
        raise invalid
    if invite.expires_at <= now:
        raise InviteError("expired", "invite token has expired")
    if not channels.can_invite(session, channel, invite.account_id):
        # The account that made it lost the authority to invite (its agents were removed
        # or left, demoted, or the policy changed). The roster write that took it away
        # also ended the invite (channels.record); this is the same rule, at the use.
        raise InviteError("expired", "invite token is no longer valid")
    existing = session.scalar(
        select(JoinRequest).where(
            JoinRequest.invite_id == invite.id,
            JoinRequest.account_id == account_id,
            JoinRequest.identity == identity,
        )
    )
    if existing is not None:
        existing.key_package = key_package
        existing.created_at = now
        return existing
    used = session.execute(
        update(Invite)
        .where(Invite.id == invite.id, Invite.uses < Invite.max_uses, Invite.expires_at > now)
        .values(uses=Invite.uses + 1)
    )
    if used.rowcount != 1:  # type: ignore[attr-defined]
        raise InviteError("used-up", "invite token has no uses left")
    request = JoinRequest(
        invite_id=invite.id,
        channel=channel,
        account_id=account_id,
        identity=identity,
        key_package=key_package,
        created_at=now,
    )
    session.add(request)
    session.flush()
    return request


def pending_key_package(
    session: Session, join_id: uuid.UUID, channel: str, account_id: uuid.UUID, now: datetime
) -> tuple[bytes, bytes] | None:
    """(identity, key package) of the caller's join request, while its invite is valid
    (an invite ends early when its account loses the authority to invite:
    ``channels.record``)."""
    row = session.execute(
        select(JoinRequest.identity, JoinRequest.key_package)
        .join(Invite, Invite.id == JoinRequest.invite_id)
        .where(
            JoinRequest.id == join_id,
            JoinRequest.channel == channel,
            JoinRequest.account_id == account_id,
            Invite.expires_at > now,
        )
    ).first()
    return None if row is None else (bytes(row[0]), bytes(row[1]))


def dead_admissions(
    session: Session,
    channel: str,
    added: Sequence[tuple[uuid.UUID, bytes, bytes]],
    now: datetime,
) -> list[tuple[uuid.UUID, bytes]]:
    """The agents, of ``added`` (account, identity, KeyPackageRef) that a commit adds,
    whose key package is one they posted with an invite that is no longer valid (expired,
    or ended when its account lost the authority to invite), and with no invite that
    still is. Such a join request stays in the channel's log, where an admin's client may
    still read it: the relay refuses the commit that would add it."""
    dead = []
    for account_id, identity, ref in added:
        rows = session.execute(
            select(JoinRequest.key_package, Invite.expires_at)
            .join(Invite, Invite.id == JoinRequest.invite_id)
            .where(
                JoinRequest.channel == channel,
                JoinRequest.account_id == account_id,
                JoinRequest.identity == identity,
            )
        ).all()
        good = [expires_at > now for kp, expires_at in rows if _ref(bytes(kp)) == ref]
        if good and not any(good):
            dead.append((account_id, identity))
    return dead


def _ref(key_package: bytes) -> bytes | None:
    try:
        return inspect(key_package).key_package_ref
    except MlsError:
        return None
