"""Signing keys get a purpose: relay tokens, or agent credentials.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-23
"""

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("signing_keys") as batch:
        batch.add_column(
            sa.Column("purpose", sa.String(16), nullable=False, server_default="token")
        )


def downgrade() -> None:
    with op.batch_alter_table("signing_keys") as batch:
        batch.drop_column("purpose")
