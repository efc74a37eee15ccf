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
    ) -> None:
        """Mirrors the channel's roster after an accepted commit, and its audit events."""

        def record() -> None:
            with transaction(self._sessions) as session:
                channels.record(session, channel, epoch, members, members_invite, events)

        await asyncio.to_thread(record)

    async def join_request(
        self, join_id: uuid.UUID, channel: str, account_id: uuid.UUID
    ) -> tuple[bytes, bytes] | None:
        def load() -> tuple[bytes, bytes] | None:
            with transaction(self._sessions) as session:
                return invites.pending_key_package(session, join_id, channel, account_id, utcnow())

        return await asyncio.to_thread(load)
