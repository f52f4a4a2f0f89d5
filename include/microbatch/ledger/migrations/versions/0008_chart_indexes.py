"""Indexes for the ledger page's charts: lag snapshots and committed batches of one pipeline by time.

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-25
"""

from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_lag_snapshots_time", "lag_snapshots", ["pipeline_id", "planned_at"])
    op.create_index("ix_batches_committed_at", "batches", ["pipeline_id", "committed_at"])


def downgrade() -> None:
    op.drop_index("ix_batches_committed_at", table_name="batches")
    op.drop_index("ix_lag_snapshots_time", table_name="lag_snapshots")
