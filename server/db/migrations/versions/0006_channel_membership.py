"""Access follows membership: the relay mirrors each channel's MLS roster and roles
into ``channel_members`` and records every membership change in ``channel_events``.
The account-level ``channel_access`` list goes; channels created before this revision
have no tracked group and must be created again (docs/operations.md).

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-23
"""

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("channels") as batch:
        batch.add_column(
            sa.Column("members_invite", sa.Boolean(), nullable=False, server_default="0")
        )
        batch.add_column(sa.Column("epoch", sa.BigInteger(), nullable=False, server_default="0"))
    op.create_table(
        "channel_members",
        sa.Column(
            "channel",
            sa.String(255),
            sa.ForeignKey("channels.name", ondelete="CASCADE"),
            primary_key=True,
        ),
        sa.Column("account_id", sa.Uuid(), primary_key=True),
        sa.Column("identity", sa.LargeBinary(), primary_key=True),
        sa.Column("role", sa.String(16), nullable=False),
        sa.Column("since_epoch", sa.BigInteger(), nullable=False),
    )
    op.create_index("ix_channel_members_account_id", "channel_members", ["account_id"])
    op.create_table(
        "channel_events",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), primary_key=True),
        sa.Column(
            "channel",
            sa.String(255),
            sa.ForeignKey("channels.name", ondelete="CASCADE"),
            nullable=False,
        ),
        sa.Column("epoch", sa.BigInteger(), nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("actor_account_id", sa.Uuid(), nullable=False),
        sa.Column("actor_identity", sa.LargeBinary(), nullable=False),
        sa.Column("subject_account_id", sa.Uuid(), nullable=True),
        sa.Column("subject_identity", sa.LargeBinary(), nullable=True),
        sa.Column("detail", sa.String(32), nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_index("ix_channel_events_channel_id", "channel_events", ["channel", "id"])
    op.drop_table("channel_access")


def downgrade() -> None:
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
    op.drop_index("ix_channel_events_channel_id", "channel_events")
    op.drop_table("channel_events")
    op.drop_index("ix_channel_members_account_id", "channel_members")
    op.drop_table("channel_members")
    with op.batch_alter_table("channels") as batch:
        batch.drop_column("epoch")
        batch.drop_column("members_invite")
