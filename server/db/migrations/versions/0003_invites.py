"""Channel invites and the join requests made by redeeming them.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-21
"""

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "invites",
        sa.Column("id", sa.Uuid(), primary_key=True),
        sa.Column("token_hash", sa.String(64), nullable=False, unique=True),
        sa.Column(
            "channel",
            sa.String(255),
            sa.ForeignKey("channels.name", ondelete="CASCADE"),
            nullable=False,
        ),
        sa.Column(
            "account_id",
            sa.Uuid(),
            sa.ForeignKey("accounts.id", ondelete="CASCADE"),
            nullable=False,
        ),
        sa.Column("max_uses", sa.Integer(), nullable=False),
        sa.Column("uses", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_table(
        "join_requests",
        sa.Column("id", sa.Uuid(), primary_key=True),
        sa.Column(
            "invite_id", sa.Uuid(), sa.ForeignKey("invites.id", ondelete="CASCADE"), nullable=False
        ),
        sa.Column(
            "channel",
            sa.String(255),
            sa.ForeignKey("channels.name", ondelete="CASCADE"),
            nullable=False,
        ),
        sa.Column(
            "account_id",
            sa.Uuid(),
            sa.ForeignKey("accounts.id", ondelete="CASCADE"),
            nullable=False,
        ),
        sa.Column("identity", sa.LargeBinary(), nullable=False),
        sa.Column("key_package", sa.LargeBinary(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.UniqueConstraint("invite_id", "identity", name="uq_join_invite_identity"),
    )


def downgrade() -> None:
    op.drop_table("join_requests")
    op.drop_table("invites")
