"""Database engine and sessions: SQLite (WAL) by default, PostgreSQL in production."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import create_engine, event
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.exc import ArgumentError, NoSuchModuleError, OperationalError
from sqlalchemy.orm import Session, sessionmaker

from ..config import Settings
from ..errors import StartupError


def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    # WAL lets the relay read while the API writes; NORMAL is durable across process
    # crashes; foreign keys are off by default in SQLite.
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.execute("PRAGMA busy_timeout=10000")
    cursor.close()


def make_engine(settings: Settings) -> Engine:
    url = settings.database_url
    if settings.is_sqlite:
        settings.data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        path = url.removeprefix("sqlite:///")
        if path and path != ":memory:" and not os.path.exists(path):
            # Account data and signing keys: readable by the server's user only.
            os.close(os.open(path, os.O_CREAT | os.O_WRONLY, 0o600))
        engine = create_engine(url, connect_args={"check_same_thread": False})
        event.listen(engine, "connect", _sqlite_pragmas)
        return engine
    if url.startswith("postgresql://"):
        url = "postgresql+psycopg://" + url.removeprefix("postgresql://")
    return create_engine(url, pool_pre_ping=False, pool_size=10, max_overflow=20)


def _shown(url: str) -> str:
    try:
        return make_url(url).render_as_string(hide_password=True)
    except ArgumentError:
        return "the given URL"


def open_database(settings: Settings) -> Engine:
    """The engine, with the schema migrated to the newest revision; StartupError with a
    plain reason for an unusable URL or an unreachable database."""
    from . import migrate

    try:
        engine = make_engine(settings)
    except (ArgumentError, NoSuchModuleError) as exc:
        raise StartupError(
            f"invalid database URL {_shown(settings.database_url)}: {exc}; "
            "expected sqlite:///PATH or postgresql://USER@HOST/DB"
        ) from None
    try:
        migrate.upgrade(engine)
    except OperationalError as exc:
        engine.dispose()
        reason = str(exc.orig).strip().splitlines()[0] if exc.orig else str(exc)
        raise StartupError(
            f"cannot use the database at {_shown(settings.database_url)}: {reason}"
        ) from None
    return engine


def make_sessionmaker(engine: Engine) -> sessionmaker[Session]:
    return sessionmaker(engine, expire_on_commit=False)


@contextmanager
def transaction(factory: sessionmaker[Session]) -> Iterator[Session]:
    """A session whose work is committed on success and rolled back on any error."""
    with factory() as session, session.begin():
        yield session
