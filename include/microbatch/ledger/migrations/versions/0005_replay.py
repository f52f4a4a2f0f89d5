"""Backfill mode `replay`: the contribution of each (batch, partition) to each aggregate sink, and
the supersession of committed ranges.

- `stage_ip_counts` gains the source `topic` and `partition`: a job stages one partial aggregate per
  partition, so a replay of one partition retracts exactly that partition's contribution.
- `ip_counts_contributions` keeps every committed (batch, topic, partition) partial aggregate.
- `ranges.superseded_by` names the replay batch that replaced a committed range (kept for the
  audit, no longer `committed`); `batches.replaces` lists the range ids a replay batch replaces.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-23
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("ranges", sa.Column("superseded_by", sa.BigInteger, sa.ForeignKey("batches.id")))
    op.add_column("batches", sa.Column("replaces", JSONB))
    op.drop_constraint("kind", "batches", type_="check")
    op.create_check_constraint("kind", "batches", "kind IN ('scheduled', 'backfill', 'replay')")
    # Rows staged before this migration (an open batch) get a placeholder source; new rows always carry it.
    op.add_column("stage_ip_counts", sa.Column("topic", sa.Text, nullable=False, server_default=""))
    op.add_column("stage_ip_counts", sa.Column("partition", sa.Integer, nullable=False, server_default="-1"))
    op.alter_column("stage_ip_counts", "topic", server_default=None)
    op.alter_column("stage_ip_counts", "partition", server_default=None)
    op.create_table(
        "ip_counts_contributions",
        sa.Column("batch_id", sa.BigInteger, sa.ForeignKey("batches.id"), nullable=False),
        sa.Column("topic", sa.Text, nullable=False),
        sa.Column("partition", sa.Integer, nullable=False),
        sa.Column("window_start", sa.DateTime(timezone=True), nullable=False),
        sa.Column("window_end", sa.DateTime(timezone=True), nullable=False),
        sa.Column("ip", sa.Text, nullable=False),
        sa.Column("count", sa.BigInteger, nullable=False),
        sa.PrimaryKeyConstraint("batch_id", "topic", "partition", "window_start", "window_end", "ip",
                                name="pk_ip_counts_contributions"),
    )


def downgrade() -> None:
    op.drop_table("ip_counts_contributions")
    op.drop_column("stage_ip_counts", "partition")
    op.drop_column("stage_ip_counts", "topic")
    op.drop_constraint("kind", "batches", type_="check")
    op.create_check_constraint("kind", "batches", "kind IN ('scheduled', 'backfill')")
    op.drop_column("batches", "replaces")
    op.drop_column("ranges", "superseded_by")
