"""Signup: an account on the free plan and its first API key."""

from __future__ import annotations

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from ..db.models import Account, ApiKey
from . import api_keys


class EmailTaken(Exception):
    pass


def signup(session: Session, email: str, name: str) -> tuple[Account, ApiKey, str]:
    """Creates the account and its first key; raises EmailTaken for a duplicate email
    (case-insensitively). Returns the account, the key record and the key secret."""
    email = email.strip().lower()
    if session.scalar(select(func.count()).where(Account.email == email)):
        raise EmailTaken(email)
    account = Account(email=email, name=name, plan="free")
    session.add(account)
    session.flush()
    record, secret = api_keys.create(session, account, "default")
    return account, record, secret
