"""Audit rows of operator position resets (`microbatch reset`).

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
    op.create_table(
        "position_resets",
        sa.Column("id", sa.BigInteger, primary_key=True),
        sa.Column("pipeline_id", sa.Integer, sa.ForeignKey("pipelines.id"), nullable=False),
        sa.Column("topic", sa.Text, nullable=False),
        sa.Column("partition", sa.Integer, nullable=False),
        sa.Column("old_offset", sa.BigInteger),
        sa.Column("new_offset", sa.BigInteger, nullable=False),
        sa.Column("target", sa.Text, nullable=False),
        sa.Column("operator", sa.Text),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.text("now()")),
    )


def downgrade() -> None:
    op.drop_table("position_resets")
