"""Channels, their members and their audit trail, as the relay records them after every
accepted commit (docs/api.md, Channels). Only accounts admitted to a channel see it;
to anyone else it does not exist."""

from __future__ import annotations

import uuid
from typing import Annotated, cast

from fastapi import APIRouter, Query

from svc_sdk.protocol import AgentId, is_valid_channel_name

from ...db.models import Channel, ChannelMember
from ...db.session import transaction
from ...services import channels
from ..deps import CallerDep, ServicesDep
from ..problems import ProblemError, responses
from ..schemas import (
    AgentOut,
    ChannelEventKind,
    ChannelEventOut,
    ChannelEvents,
    ChannelList,
    ChannelMemberOut,
    ChannelMembers,
    ChannelOut,
    ChannelRole,
)

router = APIRouter(prefix="/v1/channels", tags=["channels"])

MAX_EVENTS = 1000
# Event ids are 64-bit signed in both databases; a larger cursor matches nothing anyway.
MAX_EVENT_ID = 2**63 - 1
_RANK: dict[str, int] = {"owner": 0, "admin": 1, "member": 2}


def _agent(account_id: uuid.UUID, identity: bytes) -> AgentOut:
    identity = bytes(identity)
    return AgentOut(
        agent=AgentId(str(account_id), identity).name,
        identity=identity.hex(),
        account_id=account_id,
    )


def _member(row: ChannelMember) -> ChannelMemberOut:
    return ChannelMemberOut(
        **_agent(row.account_id, row.identity).model_dump(),
        role=cast(ChannelRole, row.role),
        since_epoch=row.since_epoch,
    )


def _not_found(name: str) -> ProblemError:
    # The same answer for a channel that does not exist, one this account is not admitted
    # to, and a name no channel can have: nobody learns which channels exist.
    return ProblemError(404, f"no channel {name!r} in your account", slug="channel-not-found")


@router.get(
    "",
    response_model=ChannelList,
    responses=responses(401, 429),
    summary="The channels your account may use: a member agent or a live invite redemption",
)
def list_channels(caller: CallerDep, services: ServicesDep) -> ChannelList:
    with transaction(services.sessions) as session:
        found = channels.for_account(session, caller.account.id)
        return ChannelList(
            channels=[
                ChannelOut(
                    name=c.name,
                    epoch=c.epoch,
                    member_count=c.member_count,
                    access="member" if c.mine else "invited",
                    role=cast(
                        ChannelRole,
                        min((m.role for m in c.mine), key=_RANK.__getitem__, default=None),
                    ),
                    agents=[_member(m) for m in c.mine],
                )
                for c in found
            ]
        )


# ``{name:path}``: channel names are org/namespace/service, slashes included (also sent
# as %2F). The fixed suffix after it is what tells the two routes apart.
@router.get(
    "/{name:path}/members",
    response_model=ChannelMembers,
    responses=responses(401, 404, 429),
    summary="A channel's members and their roles (accounts admitted to it only)",
)
def channel_members(name: str, caller: CallerDep, services: ServicesDep) -> ChannelMembers:
    if not is_valid_channel_name(name):
        raise _not_found(name)
    with transaction(services.sessions) as session:
        if not channels.has_access(session, name, caller.account.id):
            raise _not_found(name)
        found = session.get(Channel, name)
        epoch = found.epoch if found is not None else 0
        return ChannelMembers(
            channel=name,
            epoch=epoch,
            members=[_member(m) for m in channels.members(session, name)],
        )


@router.get(
    "/{name:path}/events",
    response_model=ChannelEvents,
    responses=responses(401, 404, 422, 429),
    summary="A channel's audit trail: membership, role and policy changes, oldest first",
)
def channel_events(
    name: str,
    caller: CallerDep,
    services: ServicesDep,
    after: Annotated[
        int, Query(ge=0, le=MAX_EVENT_ID, description="Events with a larger id than this")
    ] = 0,
    limit: Annotated[int, Query(ge=1, le=MAX_EVENTS, description="At most this many")] = 100,
) -> ChannelEvents:
    if not is_valid_channel_name(name):
        raise _not_found(name)
    with transaction(services.sessions) as session:
        if not channels.has_access(session, name, caller.account.id):
            raise _not_found(name)
        rows = channels.events(session, name, after, limit)
        return ChannelEvents(
            channel=name,
            events=[
                ChannelEventOut(
                    id=e.id,
                    epoch=e.epoch,
                    kind=cast(ChannelEventKind, e.kind),
                    actor=_agent(e.actor_account_id, e.actor_identity),
                    subject=None
                    if e.subject_account_id is None or e.subject_identity is None
                    else _agent(e.subject_account_id, e.subject_identity),
                    detail=e.detail,
                    at=e.at,
                )
                for e in rows
            ],
            next_after=rows[-1].id if len(rows) == limit else None,
        )
