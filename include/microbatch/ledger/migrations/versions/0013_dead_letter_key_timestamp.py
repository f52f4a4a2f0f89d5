"""Dead letters keep their record's Kafka key and timestamp.

`dead_letters` and its staging table `stage_dead_letters` gain two nullable columns: `key` (the record's key
bytes, NULL for a record without a key) and `timestamp` (the record's Kafka timestamp, CreateTime or
LogAppendTime as the topic is configured). Rows written before this migration keep NULL in both; nothing that
reads them needs the new columns. Adding a nullable column without a default only changes the catalog, so the
upgrade rewrites no rows.

Revision ID: 0013
Revises: 0012
Create Date: 2026-11-28
"""

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None

TABLES = ("dead_letters", "stage_dead_letters")


def upgrade() -> None:
    for table in TABLES:
        op.add_column(table, sa.Column("key", sa.LargeBinary, nullable=True))
        op.add_column(table, sa.Column("timestamp", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    for table in TABLES:
        op.drop_column(table, "timestamp")
        op.drop_column(table, "key")
