"""Per-plan lag snapshots: the latest offset each plan saw per partition, and the lag behind it.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-24
"""

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # One row per partition per plan. `lag` is latest - start before the batch; `lag_after` what is left after it.
    op.create_table(
        "lag_snapshots",
        sa.Column("id", sa.BigInteger, primary_key=True),
        sa.Column("pipeline_id", sa.Integer, sa.ForeignKey("pipelines.id"), nullable=False),
        sa.Column("batch_id", sa.BigInteger, sa.ForeignKey("batches.id")),
        sa.Column("topic", sa.Text, nullable=False),
        sa.Column("partition", sa.Integer, nullable=False),
        sa.Column("start_offset", sa.BigInteger, nullable=False),
        sa.Column("latest_offset", sa.BigInteger, nullable=False),
        sa.Column("lag", sa.BigInteger, nullable=False),
        sa.Column("lag_after", sa.BigInteger, nullable=False),
        sa.Column("planned_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.text("now()")),
        sa.CheckConstraint("lag >= 0 AND lag_after >= 0 AND lag_after <= lag", name="lag_sane"),
    )
    op.create_index("ix_lag_snapshots_latest", "lag_snapshots", ["pipeline_id", "topic", "partition", "id"])


def downgrade() -> None:
    op.drop_index("ix_lag_snapshots_latest", table_name="lag_snapshots")
    op.drop_table("lag_snapshots")
