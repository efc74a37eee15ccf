"""Applies the Alembic migrations; the servers call this at start."""

from __future__ import annotations

from alembic import command
from alembic.config import Config
from sqlalchemy.engine import Engine


def alembic_config(engine: Engine) -> Config:
    config = Config()
    config.set_main_option("script_location", "svc_server.db:migrations")
    config.attributes["engine"] = engine
    return config


def upgrade(engine: Engine) -> None:
    """Brings the database to the newest schema; a no-op when it is current."""
    command.upgrade(alembic_config(engine), "head")
