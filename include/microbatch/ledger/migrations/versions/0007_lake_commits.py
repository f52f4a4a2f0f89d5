"""`lake_commits`: the table version of a lakehouse sink that holds each batch; `pipelines.uid`, the identity
that a lakehouse table's commits carry.

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-25
"""

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("pipelines", sa.Column("uid", sa.Text, server_default=sa.text("gen_random_uuid()::text"),
                                         nullable=False))
    op.create_table(
        "lake_commits",
        sa.Column("batch_id", sa.BigInteger, sa.ForeignKey("batches.id", name="fk_lake_commits_batch_id_batches"),
                  nullable=False),
        sa.Column("sink", sa.Text, nullable=False),
        sa.Column("pipeline_id", sa.Integer,
                  sa.ForeignKey("pipelines.id", name="fk_lake_commits_pipeline_id_pipelines"), nullable=False),
        sa.Column("attempt", sa.Integer, nullable=False),
        sa.Column("location", sa.Text, nullable=False),
        sa.Column("table_version", sa.BigInteger, nullable=False),
        sa.Column("rows", sa.BigInteger, nullable=False),
        sa.Column("written_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
        sa.PrimaryKeyConstraint("batch_id", "sink", name="pk_lake_commits"),
    )
    op.create_index("ix_lake_commits_sink_version", "lake_commits", ["sink", "table_version"])


def downgrade() -> None:
    op.drop_table("lake_commits")
    op.drop_column("pipelines", "uid")
