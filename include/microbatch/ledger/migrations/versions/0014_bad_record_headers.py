"""Dead letters and late records keep their record's Kafka headers.

`dead_letters` and `late_records` gain a nullable `headers` column (jsonb): the record's headers when the spec
sets `source.include_headers`, a JSON array of {"key": string, "value": base64 of the bytes, or null} in the
producer's order, and NULL otherwise. Their staging tables `stage_dead_letters` and `stage_late_records` gain it as
text, which Spark's JDBC writer fills and the commit casts to jsonb. Rows written before this migration keep
NULL; adding a nullable column without a default only changes the catalog, so the upgrade rewrites no rows.

Revision ID: 0014
Revises: 0013
Create Date: 2026-11-28
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None

TABLES = {"dead_letters": JSONB, "late_records": JSONB, "stage_dead_letters": sa.Text, "stage_late_records": sa.Text}


def upgrade() -> None:
    for table, kind in TABLES.items():
        op.add_column(table, sa.Column("headers", kind, nullable=True))


def downgrade() -> None:
    for table in TABLES:
        op.drop_column(table, "headers")
