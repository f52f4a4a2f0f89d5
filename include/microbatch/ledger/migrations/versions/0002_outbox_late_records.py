"""Transactional outbox, publish progress, and the late-records side table.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-23
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

_NOW = sa.text("now()")


def upgrade() -> None:
    # One row per record to publish; `seq` is gap-free per (pipeline, sink) and travels in a header.
    op.create_table(
        "outbox",
        sa.Column("pipeline_id", sa.Integer, sa.ForeignKey("pipelines.id"), nullable=False),
        sa.Column("sink", sa.Text, nullable=False),
        sa.Column("seq", sa.BigInteger, nullable=False),
        sa.Column("batch_id", sa.BigInteger, sa.ForeignKey("batches.id"), nullable=False),
        sa.Column("key", sa.Text),
        sa.Column("value", JSONB, nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False, server_default=_NOW),
        sa.PrimaryKeyConstraint("pipeline_id", "sink", "seq", name="pk_outbox"),
        sa.CheckConstraint("seq > 0", name="seq_positive"),
    )
    # What the publisher last committed to Kafka. Informational: the topic's committed tail is the truth.
    op.create_table(
        "publish_progress",
        sa.Column("pipeline_id", sa.Integer, sa.ForeignKey("pipelines.id"), nullable=False),
        sa.Column("sink", sa.Text, nullable=False),
        sa.Column("last_seq", sa.BigInteger, nullable=False),
        sa.Column("transactions", sa.BigInteger, nullable=False, server_default="0"),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False, server_default=_NOW),
        sa.PrimaryKeyConstraint("pipeline_id", "sink", name="pk_publish_progress"),
    )
    # Records for event-time windows that were already final when their batch began (Flink's late side output).
    op.create_table(
        "late_records",
        sa.Column("id", sa.BigInteger, primary_key=True),
        sa.Column("pipeline_id", sa.Integer, sa.ForeignKey("pipelines.id"), nullable=False),
        sa.Column("batch_id", sa.BigInteger, sa.ForeignKey("batches.id"), nullable=False),
        sa.Column("topic", sa.Text, nullable=False),
        sa.Column("partition", sa.Integer, nullable=False),
        sa.Column("offset", sa.BigInteger, nullable=False),
        sa.Column("event_time", sa.DateTime(timezone=True)),
        sa.Column("raw", sa.LargeBinary),
        sa.Column("watermark", sa.DateTime(timezone=True)),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False, server_default=_NOW),
        sa.UniqueConstraint("pipeline_id", "topic", "partition", "offset", name="uq_late_records_source"),
    )
    op.create_table(
        "stage_late_records",
        sa.Column("batch_id", sa.BigInteger, nullable=False),
        sa.Column("attempt", sa.Integer, nullable=False),
        sa.Column("topic", sa.Text, nullable=False),
        sa.Column("partition", sa.Integer, nullable=False),
        sa.Column("offset", sa.BigInteger, nullable=False),
        sa.Column("event_time", sa.DateTime(timezone=True)),
        sa.Column("raw", sa.LargeBinary),
    )
    op.create_index("ix_stage_late_records_batch", "stage_late_records", ["batch_id", "attempt"])
    op.create_index("ix_ip_counts_window_end", "ip_counts", ["window_end"])


def downgrade() -> None:
    op.drop_index("ix_ip_counts_window_end", "ip_counts")
    for table in ("stage_late_records", "late_records", "publish_progress", "outbox"):
        op.drop_table(table)
