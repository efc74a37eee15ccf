"""Who may use which relay channel. Channel names are global; a channel belongs to the
account that created it (its owner account), and other accounts' agents may use it once
admitted. Only the owner account invites or admits other accounts: an admitted account
cannot let further accounts in."""

from __future__ import annotations

import uuid
from typing import Literal

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from ..db.models import Account, Channel, ChannelAccess, utcnow


def has_access(session: Session, channel: str, account_id: uuid.UUID) -> bool:
    return (
        session.scalar(
            select(ChannelAccess.account_id).where(
                ChannelAccess.channel == channel, ChannelAccess.account_id == account_id
            )
        )
        is not None
    )


def create(session: Session, channel: str, account_id: uuid.UUID) -> bool:
    """Registers ``channel`` for the account. True if it now exists and the account may
    use it (created now, or already its own or admitted); False if another account has it."""
    if has_access(session, channel, account_id):
        return True
    if session.get(Channel, channel) is not None:
        return False
    try:
        with session.begin_nested():
            session.add(Channel(name=channel, owner_account_id=account_id, created_at=utcnow()))
            session.flush()
            session.add(ChannelAccess(channel=channel, account_id=account_id, admitted_at=utcnow()))
            session.flush()
    except IntegrityError:  # another relay process registered it first
        return has_access(session, channel, account_id)
    return True


def is_owner(session: Session, channel: str, account_id: uuid.UUID) -> bool:
    found = session.get(Channel, channel)
    return found is not None and found.owner_account_id == account_id


AdmitResult = Literal["admitted", "not-owner", "no-account"]


def admit(session: Session, channel: str, by: uuid.UUID, account_id: uuid.UUID) -> AdmitResult:
    """Lets ``account_id`` use the channel, if ``by`` is its owner account and the account
    exists."""
    if not is_owner(session, channel, by):
        return "not-owner"
    if session.get(Account, account_id) is None:
        return "no-account"
    if not has_access(session, channel, account_id):
        session.add(ChannelAccess(channel=channel, account_id=account_id, admitted_at=utcnow()))
        session.flush()
    return "admitted"
