"""Outbox rows of published rows keep their source coordinates, so a replay publishes only what changed.

`outbox` gains nullable `src_topic`, `src_partition` and `src_offset`: for a row (of an append sink, or a kafka
sink's own rows) the coordinates of the record it came from; NULL for a window of an aggregate and for every row
written before this migration. An index on (pipeline_id, sink, src_topic, src_partition, src_offset, seq) lets a
replay find the last published value of each row of the ranges it recomputes without reading the whole outbox.
Adding nullable columns without a default only changes the catalog; the index is built once over the outbox.

Revision ID: 0015
Revises: 0014
Create Date: 2026-11-28
"""

import sqlalchemy as sa
from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None

INDEX = "ix_outbox_source"


def upgrade() -> None:
    op.add_column("outbox", sa.Column("src_topic", sa.Text, nullable=True))
    op.add_column("outbox", sa.Column("src_partition", sa.Integer, nullable=True))
    op.add_column("outbox", sa.Column("src_offset", sa.BigInteger, nullable=True))
    op.create_index(INDEX, "outbox", ["pipeline_id", "sink", "src_topic", "src_partition", "src_offset", "seq"],
                    postgresql_where=sa.text("src_topic IS NOT NULL"))


def downgrade() -> None:
    op.drop_index(INDEX, table_name="outbox")
    for column in ("src_offset", "src_partition", "src_topic"):
        op.drop_column("outbox", column)
