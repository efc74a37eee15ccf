"""Alembic environment: runs against the engine the server hands over."""

from __future__ import annotations

from alembic import context
from sqlalchemy.engine import Engine

from svc_server.db.models import Base

engine: Engine = context.config.attributes["engine"]

with engine.connect() as connection:
    context.configure(
        connection=connection,
        target_metadata=Base.metadata,
        render_as_batch=connection.dialect.name == "sqlite",
    )
    with context.begin_transaction():
        context.run_migrations()
    connection.commit()
