"""A join request belongs to the account that redeemed and its agent identity: the
unique key includes the account, so another account's redemption can never match, and
overwrite, someone else's pending join.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-23
"""

from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("join_requests") as batch:
        batch.drop_constraint("uq_join_invite_identity", type_="unique")
        batch.create_unique_constraint(
            "uq_join_invite_account_identity", ["invite_id", "account_id", "identity"]
        )


def downgrade() -> None:
    with op.batch_alter_table("join_requests") as batch:
        batch.drop_constraint("uq_join_invite_account_identity", type_="unique")
        batch.create_unique_constraint("uq_join_invite_identity", ["invite_id", "identity"])
