"""Persistence: SQLAlchemy models, engine set-up and Alembic migrations."""
