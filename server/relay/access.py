"""Channel access checks against the shared database, off the event loop."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Sequence

from sqlalchemy.orm import Session, sessionmaker

from ..db.models import utcnow
from ..db.session import transaction
from ..services import channels, invites


class Access:
    def __init__(self, sessions: sessionmaker[Session]) -> None:
        self._sessions = sessions

    async def has_live_redemption(self, channel: str, account_id: uuid.UUID) -> bool:
        def check() -> bool:
            with transaction(self._sessions) as session:
                return channels.has_live_redemption(session, channel, account_id)

        return await asyncio.to_thread(check)

    async def create(self, channel: str, account_id: uuid.UUID) -> channels.CreateResult:
        def create() -> channels.CreateResult:
            with transaction(self._sessions) as session:
                return channels.create(session, channel, account_id)

        return await asyncio.to_thread(create)

    async def record(
        self,
        channel: str,
        epoch: int,
        members: Sequence[channels.Member],
        members_invite: bool,
        events: Sequence[channels.Event],
    ) -> int:
        """Mirrors the channel's roster after an accepted commit, and its audit events;
        returns how many invites ended with it (accounts that lost the authority to
        invite)."""

        def record() -> int:
            with transaction(self._sessions) as session:
                return channels.record(session, channel, epoch, members, members_invite, events)

        return await asyncio.to_thread(record)

    async def join_request(
        self, join_id: uuid.UUID, channel: str, account_id: uuid.UUID
    ) -> tuple[bytes, bytes] | None:
        def load() -> tuple[bytes, bytes] | None:
            with transaction(self._sessions) as session:
                return invites.pending_key_package(session, join_id, channel, account_id, utcnow())

        return await asyncio.to_thread(load)

    async def dead_admissions(
        self, channel: str, added: Sequence[tuple[uuid.UUID, bytes, bytes]]
    ) -> list[tuple[uuid.UUID, bytes]]:
        """Of the agents a commit adds (account, identity, KeyPackageRef), those whose key
        package came with an invite that is no longer valid."""

        def load() -> list[tuple[uuid.UUID, bytes]]:
            with transaction(self._sessions) as session:
                return invites.dead_admissions(session, channel, added, utcnow())

        return await asyncio.to_thread(load)
