"""Applies the Alembic migrations; the servers call this at start."""

from __future__ import annotations

from typing import TYPE_CHECKING

from sqlalchemy import inspect, text
from sqlalchemy.engine import Engine

if TYPE_CHECKING:
    from alembic.config import Config

# The newest revision in migrations/versions (a test keeps the two in step). Knowing it
# lets a process whose database is current skip importing Alembic, about 35 MB of RSS
# for every relay process.
HEAD = "0006"


def alembic_config(engine: Engine) -> Config:
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", "svc_server.db:migrations")
    config.attributes["engine"] = engine
    return config


def current_revision(engine: Engine) -> str | None:
    with engine.connect() as conn:
        if not inspect(conn).has_table("alembic_version"):
            return None
        return conn.execute(text("SELECT version_num FROM alembic_version")).scalar()


def upgrade(engine: Engine) -> None:
    """Brings the database to the newest schema; a no-op when it is current."""
    if current_revision(engine) == HEAD:
        return
    from alembic import command

    command.upgrade(alembic_config(engine), "head")
