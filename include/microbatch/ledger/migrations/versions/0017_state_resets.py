"""Pipeline state resets: an operator's change of a pipeline's state (its watermark), on the record.

`state_resets` keeps each `microbatch reset --watermark` as a position reset is kept (`position_resets`): the state
before and after, what the operator asked for, who, when. New table: nothing is rewritten.

Revision ID: 0017
Revises: 0016
Create Date: 2026-11-29
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "state_resets",
        sa.Column("id", sa.BigInteger, primary_key=True),
        sa.Column("pipeline_id", sa.Integer, sa.ForeignKey("pipelines.id"), nullable=False),
        sa.Column("old_state", JSONB, nullable=False),
        sa.Column("new_state", JSONB, nullable=False),
        sa.Column("target", sa.Text, nullable=False),
        sa.Column("operator", sa.Text),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("state_resets")
