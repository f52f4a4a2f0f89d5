"""An index of each pipeline's batches in order, for the stage's look at the pipeline's latest read.

Before staging, the stage asks whether the pipeline's latest staged batch read fewer records than its ranges hold
(`repository.last_read_had_holes`). Without this index Postgres walked the primary key backwards over every
pipeline's batches: 13-19 ms at 1M committed ranges (102,000 batches), growing with the ledger. With it, the walk
stays within the one pipeline.

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-27
"""

from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_batches_pipeline_batch", "batches", ["pipeline_id", "id"])


def downgrade() -> None:
    op.drop_index("ix_batches_pipeline_batch", table_name="batches")
