"""Relay channel registry and access list.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-21
"""

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "channels",
        sa.Column("name", sa.String(255), primary_key=True),
        sa.Column(
            "owner_account_id",
            sa.Uuid(),
            sa.ForeignKey("accounts.id", ondelete="CASCADE"),
            nullable=False,
        ),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_table(
        "channel_access",
        sa.Column(
            "channel",
            sa.String(255),
            sa.ForeignKey("channels.name", ondelete="CASCADE"),
            primary_key=True,
        ),
        sa.Column(
            "account_id",
            sa.Uuid(),
            sa.ForeignKey("accounts.id", ondelete="CASCADE"),
            primary_key=True,
        ),
        sa.Column("admitted_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_index("ix_channel_access_account", "channel_access", ["account_id"])


def downgrade() -> None:
    op.drop_index("ix_channel_access_account", table_name="channel_access")
    op.drop_table("channel_access")
    op.drop_table("channels")
