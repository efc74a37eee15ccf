"""Who may use which relay channel. Channel names are global. Access follows the
channel's MLS group as the relay tracks it: an account may use a channel while one of its
agents is a member, or while it holds a live invite redemption for it (to post its join
request and receive its Welcome). The relay writes the roster, roles and audit events
after every accepted commit (``record``)."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Literal

from sqlalchemy import delete, exists, func, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from ..db.models import Channel, ChannelEvent, ChannelMember, Invite, JoinRequest, utcnow

ADMIN_ROLES = ("owner", "admin")


@dataclass(frozen=True, slots=True)
class Member:
    account_id: uuid.UUID
    identity: bytes
    role: str


@dataclass(frozen=True, slots=True)
class Event:
    kind: str  # created, added, removed, left, role, policy
    actor: tuple[uuid.UUID, bytes]
    subject: tuple[uuid.UUID, bytes] | None = None
    detail: str = ""


def is_member(session: Session, channel: str, account_id: uuid.UUID) -> bool:
    return bool(
        session.scalar(
            select(
                exists().where(
                    ChannelMember.channel == channel, ChannelMember.account_id == account_id
                )
            )
        )
    )


def has_live_redemption(
    session: Session, channel: str, account_id: uuid.UUID, now: datetime | None = None
) -> bool:
    """Whether the account redeemed an invite to ``channel`` that is still valid."""
    redeemed = (
        select(JoinRequest.id)
        .join(Invite, Invite.id == JoinRequest.invite_id)
        .where(
            JoinRequest.channel == channel,
            JoinRequest.account_id == account_id,
            Invite.expires_at > (now or utcnow()),
        )
    )
    return bool(session.scalar(select(exists(redeemed))))


def has_access(
    session: Session, channel: str, account_id: uuid.UUID, now: datetime | None = None
) -> bool:
    return is_member(session, channel, account_id) or has_live_redemption(
        session, channel, account_id, now
    )


CreateResult = Literal["created", "exists", "denied"]


def create(session: Session, channel: str, account_id: uuid.UUID) -> CreateResult:
    """Registers ``channel`` for the account: "created" (go on and store its group),
    "exists" (and the account may use it) or "denied" (another account's).

    A channel is created once its roster is recorded (``record``). The account that
    registered a name whose roster never was (a step after this one failed) gets
    "created" again: it finishes the creation, and the name is not left taken by
    nobody. The log store decides between two such attempts: one group is stored."""
    found = session.get(Channel, channel)
    if found is None:
        try:
            with session.begin_nested():
                session.add(Channel(name=channel, owner_account_id=account_id, created_at=utcnow()))
                session.flush()
            return "created"
        except IntegrityError:  # another relay process registered it first
            found = session.get(Channel, channel)
            if found is None:
                raise
    if has_access(session, channel, account_id):
        return "exists"
    unfinished = not session.scalar(select(exists().where(ChannelMember.channel == channel)))
    return "created" if unfinished and found.owner_account_id == account_id else "denied"


def record(
    session: Session,
    channel: str,
    epoch: int,
    members: Sequence[Member],
    members_invite: bool,
    events: Sequence[Event],
) -> int:
    """The roster after the commit that moved ``channel`` to ``epoch``, and what it
    changed. Rosters of older epochs never overwrite newer ones (relay processes may
    record out of order). Invites of accounts that can no longer invite end here
    (``end_invites_without_authority``); returns how many, as their redemptions no
    longer admit anyone."""
    moved = session.execute(
        update(Channel)
        .where(Channel.name == channel, Channel.epoch <= epoch)
        .values(epoch=epoch, members_invite=members_invite)
    )
    if moved.rowcount == 1:  # type: ignore[attr-defined]
        current = {
            (m.account_id, bytes(m.identity)): m
            for m in session.scalars(select(ChannelMember).where(ChannelMember.channel == channel))
        }
        wanted = {(m.account_id, m.identity): m for m in members}
        for key in current.keys() - wanted.keys():
            session.delete(current[key])
        for key, m in wanted.items():
            row = current.get(key)
            if row is None:
                session.add(
                    ChannelMember(
                        channel=channel,
                        account_id=m.account_id,
                        identity=m.identity,
                        role=m.role,
                        since_epoch=epoch,
                    )
                )
            elif row.role != m.role:
                row.role = m.role
    for e in events:
        if e.kind in ("added", "removed", "left") and e.subject is not None:
            # A redemption is spent once its agent is in: it must not keep the account
            # admitted after that agent is removed or leaves. The removal drops it too,
            # so a removed agent never keeps its account admitted through a redemption
            # whose "added" record is missing.
            session.execute(
                delete(JoinRequest).where(
                    JoinRequest.channel == channel,
                    JoinRequest.account_id == e.subject[0],
                    JoinRequest.identity == e.subject[1],
                )
            )
    now = utcnow()
    ended = end_invites_without_authority(session, channel, now)
    for e in events:
        session.add(
            ChannelEvent(
                channel=channel,
                epoch=epoch,
                kind=e.kind,
                actor_account_id=e.actor[0],
                actor_identity=e.actor[1],
                subject_account_id=e.subject[0] if e.subject else None,
                subject_identity=e.subject[1] if e.subject else None,
                detail=e.detail,
                at=now,
            )
        )
    session.flush()
    return ended


def end_invites_without_authority(session: Session, channel: str, now: datetime) -> int:
    """Ends, for good, the live invites to ``channel`` of every account that may no longer
    invite to it (``can_invite`` on the roster just written): its agents were removed or
    left, or demoted, or the owner stopped letting members invite. An invite is good only
    while its account could still make it; it does not come back if the account regains
    the authority later. Ending it (its lifetime set to now) also ends the redemptions
    made with it: they no longer admit their accounts to the channel, their join requests
    can no longer be posted, and the relay refuses a commit adding their key packages
    (``invites.dead_admissions``). Returns how many invites ended."""
    issuers = set(
        session.scalars(
            select(Invite.account_id)
            .where(Invite.channel == channel, Invite.expires_at > now)
            .distinct()
        )
    )
    lost = [a for a in issuers if not can_invite(session, channel, a)]
    if not lost:
        return 0
    ended = session.execute(
        update(Invite)
        .where(Invite.channel == channel, Invite.account_id.in_(lost), Invite.expires_at > now)
        .values(expires_at=now)
    )
    return int(ended.rowcount)  # type: ignore[attr-defined]


def can_invite(session: Session, channel: str, account_id: uuid.UUID) -> bool:
    """Whether the account has an admin in the channel, or any member when the channel's
    policy lets members invite."""
    roles = set(
        session.scalars(
            select(ChannelMember.role).where(
                ChannelMember.channel == channel, ChannelMember.account_id == account_id
            )
        )
    )
    if roles & set(ADMIN_ROLES):
        return True
    found = session.get(Channel, channel)
    return bool(roles) and found is not None and found.members_invite


def members(session: Session, channel: str) -> list[ChannelMember]:
    return list(
        session.scalars(
            select(ChannelMember)
            .where(ChannelMember.channel == channel)
            .order_by(ChannelMember.since_epoch, ChannelMember.account_id, ChannelMember.identity)
        )
    )


def events(session: Session, channel: str, after_id: int, limit: int) -> list[ChannelEvent]:
    return list(
        session.scalars(
            select(ChannelEvent)
            .where(ChannelEvent.channel == channel, ChannelEvent.id > after_id)
            .order_by(ChannelEvent.id)
            .limit(limit)
        )
    )


@dataclass(frozen=True, slots=True)
class Listed:
    """A channel as an account sees it in its list."""

    name: str
    epoch: int
    #: Member agents of every account.
    member_count: int
    #: The account's own member agents, as ``members`` orders them; empty when the
    #: account is admitted only by a live invite redemption.
    mine: list[ChannelMember]


def for_account(
    session: Session, account_id: uuid.UUID, now: datetime | None = None
) -> list[Listed]:
    """The channels the account may use (``has_access``): those with one of its agents
    as a member, and those it holds a live invite redemption for, by name."""
    mine: dict[str, list[ChannelMember]] = {}
    for row in session.scalars(
        select(ChannelMember)
        .where(ChannelMember.account_id == account_id)
        .order_by(ChannelMember.since_epoch, ChannelMember.identity)
    ):
        mine.setdefault(row.channel, []).append(row)
    redeemed = (
        select(JoinRequest.channel)
        .join(Invite, Invite.id == JoinRequest.invite_id)
        .where(JoinRequest.account_id == account_id, Invite.expires_at > (now or utcnow()))
    )
    names = mine.keys() | set(session.scalars(redeemed))
    if not names:
        return []
    counts: dict[str, int] = {
        name: count
        for name, count in session.execute(
            select(ChannelMember.channel, func.count())
            .where(ChannelMember.channel.in_(names))
            .group_by(ChannelMember.channel)
        )
    }
    return [
        Listed(name, epoch, counts.get(name, 0), mine.get(name, []))
        for name, epoch in session.execute(
            select(Channel.name, Channel.epoch)
            .where(Channel.name.in_(names))
            .order_by(Channel.name)
        )
    ]
