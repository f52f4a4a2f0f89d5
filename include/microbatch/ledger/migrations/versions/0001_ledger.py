"""The offset ledger, the dead-letter table, and the ip_count example sink.

Revision ID: 0001
Revises:
Create Date: 2026-11-22
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

_NOW = sa.text("now()")


def upgrade() -> None:
    op.execute("CREATE EXTENSION IF NOT EXISTS btree_gist")
    op.create_table(
        "pipelines",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("name", sa.Text, nullable=False, unique=True),
        sa.Column("spec_hash", sa.Text, nullable=False),
        sa.Column("state", JSONB, nullable=False, server_default="{}"),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False, server_default=_NOW),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False, server_default=_NOW),
    )
    op.create_table(
        "batches",
        sa.Column("id", sa.BigInteger, primary_key=True),
        sa.Column("pipeline_id", sa.Integer, sa.ForeignKey("pipelines.id"), nullable=False, index=True),
        sa.Column("kind", sa.Text, nullable=False),
        sa.Column("state", sa.Text, nullable=False),
        sa.Column("attempt", sa.Integer, nullable=False, server_default="0"),
        sa.Column("staged_attempt", sa.Integer),
        sa.Column("state_before", JSONB, nullable=False, server_default="{}"),
        sa.Column("state_after", JSONB),
        sa.Column("counts", JSONB, nullable=False, server_default="{}"),
        sa.Column("timings", JSONB, nullable=False, server_default="{}"),
        sa.Column("airflow_run_id", sa.Text),
        sa.Column("error", sa.Text),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False, server_default=_NOW),
        sa.Column("staged_at", sa.DateTime(timezone=True)),
        sa.Column("committed_at", sa.DateTime(timezone=True)),
        sa.CheckConstraint("kind IN ('scheduled', 'backfill')", name="kind"),
        sa.CheckConstraint("state IN ('planned', 'staged', 'committed', 'failed', 'abandoned')", name="state"),
    )
    # At most one open scheduled batch per pipeline: a retry reuses it instead of planning anew.
    op.create_index(
        "uq_batches_one_open_scheduled",
        "batches",
        ["pipeline_id"],
        unique=True,
        postgresql_where=sa.text("kind = 'scheduled' AND state IN ('planned', 'staged')"),
    )
    op.create_table(
        "positions",
        sa.Column("pipeline_id", sa.Integer, sa.ForeignKey("pipelines.id"), primary_key=True),
        sa.Column("topic", sa.Text, primary_key=True),
        sa.Column("partition", sa.Integer, primary_key=True),
        sa.Column("next_offset", sa.BigInteger, nullable=False),
        sa.Column("last_batch_id", sa.BigInteger),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False, server_default=_NOW),
        sa.CheckConstraint("next_offset >= 0", name="next_offset_non_negative"),
    )
    op.create_table(
        "ranges",
        sa.Column("id", sa.BigInteger, primary_key=True),
        sa.Column("batch_id", sa.BigInteger, sa.ForeignKey("batches.id"), nullable=False, index=True),
        sa.Column("pipeline_id", sa.Integer, sa.ForeignKey("pipelines.id"), nullable=False),
        sa.Column("topic", sa.Text, nullable=False),
        sa.Column("partition", sa.Integer, nullable=False),
        sa.Column("start_offset", sa.BigInteger, nullable=False),
        sa.Column("end_offset", sa.BigInteger, nullable=False),
        sa.Column("committed", sa.Boolean, nullable=False, server_default=sa.false()),
        sa.CheckConstraint("start_offset >= 0 AND end_offset > start_offset", name="non_empty"),
    )
    # Invariant 3: committed ranges of one partition never share an offset.
    op.execute(
        "ALTER TABLE ranges ADD CONSTRAINT ex_ranges_no_overlap EXCLUDE USING gist ("
        "pipeline_id WITH =, topic WITH =, partition WITH =, "
        "int8range(start_offset, end_offset) WITH &&) WHERE (committed)"
    )
    op.create_table(
        "gaps",
        sa.Column("id", sa.BigInteger, primary_key=True),
        sa.Column("pipeline_id", sa.Integer, sa.ForeignKey("pipelines.id"), nullable=False),
        sa.Column("batch_id", sa.BigInteger, sa.ForeignKey("batches.id")),
        sa.Column("topic", sa.Text, nullable=False),
        sa.Column("partition", sa.Integer, nullable=False),
        sa.Column("start_offset", sa.BigInteger, nullable=False),
        sa.Column("end_offset", sa.BigInteger, nullable=False),
        sa.Column("reason", sa.Text, nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False, server_default=_NOW),
    )
    op.create_table(
        "dead_letters",
        sa.Column("id", sa.BigInteger, primary_key=True),
        sa.Column("pipeline_id", sa.Integer, sa.ForeignKey("pipelines.id"), nullable=False),
        sa.Column("batch_id", sa.BigInteger, sa.ForeignKey("batches.id"), nullable=False),
        sa.Column("topic", sa.Text, nullable=False),
        sa.Column("partition", sa.Integer, nullable=False),
        sa.Column("offset", sa.BigInteger, nullable=False),
        sa.Column("raw", sa.LargeBinary),
        sa.Column("error", sa.Text, nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False, server_default=_NOW),
        sa.UniqueConstraint("pipeline_id", "topic", "partition", "offset", name="uq_dead_letters_source"),
    )
    op.create_table(
        "stage_dead_letters",
        sa.Column("batch_id", sa.BigInteger, nullable=False),
        sa.Column("attempt", sa.Integer, nullable=False),
        sa.Column("topic", sa.Text, nullable=False),
        sa.Column("partition", sa.Integer, nullable=False),
        sa.Column("offset", sa.BigInteger, nullable=False),
        sa.Column("raw", sa.LargeBinary),
        sa.Column("error", sa.Text, nullable=False),
    )
    op.create_index("ix_stage_dead_letters_batch", "stage_dead_letters", ["batch_id", "attempt"])
    # The example pipeline's sink: requests per IP per event-time window.
    op.create_table(
        "ip_counts",
        sa.Column("window_start", sa.DateTime(timezone=True), nullable=False),
        sa.Column("window_end", sa.DateTime(timezone=True), nullable=False),
        sa.Column("ip", sa.Text, nullable=False),
        sa.Column("count", sa.BigInteger, nullable=False),
        sa.PrimaryKeyConstraint("window_start", "window_end", "ip", name="pk_ip_counts"),
    )
    op.create_table(
        "stage_ip_counts",
        sa.Column("batch_id", sa.BigInteger, nullable=False),
        sa.Column("attempt", sa.Integer, nullable=False),
        sa.Column("window_start", sa.DateTime(timezone=True), nullable=False),
        sa.Column("window_end", sa.DateTime(timezone=True), nullable=False),
        sa.Column("ip", sa.Text, nullable=False),
        sa.Column("count", sa.BigInteger, nullable=False),
    )
    op.create_index("ix_stage_ip_counts_batch", "stage_ip_counts", ["batch_id", "attempt"])


def downgrade() -> None:
    for table in (
        "stage_ip_counts",
        "ip_counts",
        "stage_dead_letters",
        "dead_letters",
        "gaps",
        "ranges",
        "positions",
        "batches",
        "pipelines",
    ):
        op.drop_table(table)
