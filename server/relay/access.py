"""Channel access checks against the shared database, off the event loop."""

from __future__ import annotations

import asyncio
import uuid

from sqlalchemy.orm import Session, sessionmaker

from ..db.models import utcnow
from ..db.session import transaction
from ..services import channels, invites


class Access:
    def __init__(self, sessions: sessionmaker[Session]) -> None:
        self._sessions = sessions

    async def can_use(self, channel: str, account_id: uuid.UUID) -> bool:
        def check() -> bool:
            with transaction(self._sessions) as session:
                return channels.has_access(session, channel, account_id)

        return await asyncio.to_thread(check)

    async def create(self, channel: str, account_id: uuid.UUID) -> bool:
        def create() -> bool:
            with transaction(self._sessions) as session:
                return channels.create(session, channel, account_id)

        return await asyncio.to_thread(create)

    async def admit(
        self, channel: str, by: uuid.UUID, account_id: uuid.UUID
    ) -> channels.AdmitResult:
        def admit() -> channels.AdmitResult:
            with transaction(self._sessions) as session:
                return channels.admit(session, channel, by, account_id)

        return await asyncio.to_thread(admit)

    async def join_request(
        self, join_id: uuid.UUID, channel: str, account_id: uuid.UUID
    ) -> tuple[bytes, bytes] | None:
        def load() -> tuple[bytes, bytes] | None:
            with transaction(self._sessions) as session:
                return invites.pending_key_package(session, join_id, channel, account_id, utcnow())

        return await asyncio.to_thread(load)
