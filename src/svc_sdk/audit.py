"""What the account API tells an account about its channels: which it may use, who is in
each and with what role, and the audit trail of membership changes the relay recorded
(``SvcClient.account_channels``, ``channel_members``, ``channel_events``; docs/client.md).

Unlike ``Channel.members()``, which reads this agent's own copy of the group, these come
from the server and need no membership of this agent: any agent of an account admitted to
the channel may ask.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal, cast

from svc_sdk.agent_id import AgentId
from svc_sdk.errors import InternalError

Role = Literal["owner", "admin", "member"]
#: created, added, removed, left (the member removed itself), role (``detail`` is the new
#: role), policy (``detail`` is ``members-invite`` or ``admins-invite``).
EventKind = Literal["created", "added", "removed", "left", "role", "policy"]


@dataclass(frozen=True, slots=True)
class ChannelMember:
    """A member agent and its role; ``since_epoch`` is the epoch of the commit that added
    it."""

    agent: AgentId
    role: Role
    since_epoch: int


@dataclass(frozen=True, slots=True)
class ChannelSummary:
    """A channel the account may use. ``access`` is ``"member"`` when one of its agents is
    a member, ``"invited"`` when it holds a live invite redemption only (then ``role`` is
    None and ``agents`` empty). ``role`` is the highest of the account's agents' roles."""

    name: str
    epoch: int
    member_count: int
    access: Literal["member", "invited"]
    role: Role | None
    agents: tuple[ChannelMember, ...]


@dataclass(frozen=True, slots=True)
class ChannelEvent:
    """One membership change: ``actor``'s commit moved the channel to ``epoch``;
    ``subject`` is who was added, removed, left or given a role (None for policy)."""

    id: int
    channel: str
    epoch: int
    kind: EventKind
    actor: AgentId
    subject: AgentId | None
    detail: str
    at: datetime


def _agent(data: Any) -> AgentId:
    return AgentId(str(uuid.UUID(str(data["account_id"]))), bytes.fromhex(str(data["identity"])))


def _member(data: Any) -> ChannelMember:
    return ChannelMember(_agent(data), cast(Role, str(data["role"])), int(data["since_epoch"]))


_MALFORMED = (KeyError, TypeError, ValueError)


def _malformed(what: str, exc: Exception) -> InternalError:
    return InternalError(f"unexpected {what} from the account API: {exc!r}")


def channels_from(data: Any) -> list[ChannelSummary]:
    """``GET /v1/channels``'s answer."""
    try:
        return [
            ChannelSummary(
                name=str(c["name"]),
                epoch=int(c["epoch"]),
                member_count=int(c["member_count"]),
                access="invited" if c["access"] == "invited" else "member",
                role=None if c["role"] is None else cast(Role, str(c["role"])),
                agents=tuple(_member(m) for m in c["agents"]),
            )
            for c in data["channels"]
        ]
    except _MALFORMED as exc:
        raise _malformed("channel list", exc) from None


def members_from(data: Any) -> list[ChannelMember]:
    """``GET /v1/channels/{name}/members``'s answer."""
    try:
        return [_member(m) for m in data["members"]]
    except _MALFORMED as exc:
        raise _malformed("member list", exc) from None


def events_from(data: Any) -> list[ChannelEvent]:
    """``GET /v1/channels/{name}/events``'s answer."""
    try:
        return [
            ChannelEvent(
                id=int(e["id"]),
                channel=str(data["channel"]),
                epoch=int(e["epoch"]),
                kind=cast(EventKind, str(e["kind"])),
                actor=_agent(e["actor"]),
                subject=None if e["subject"] is None else _agent(e["subject"]),
                detail=str(e["detail"]),
                at=datetime.fromisoformat(str(e["at"])),
            )
            for e in data["events"]
        ]
    except _MALFORMED as exc:
        raise _malformed("event list", exc) from None
