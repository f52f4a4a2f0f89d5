"""Registry formats: the schemas a batch decodes with are pinned in the batch and kept in the ledger.

`batches.formats` (JSONB, nullable): for a pipeline whose key or value is read through a schema registry (`avro`),
each such side's pins: the subject, the reader schema's version and id (fixed when the batch is planned; a replay
copies them from the batch it replays) and the writer schema ids the stage met. `registry_schemas` keeps each
schema's text once per pipeline by its registry id, so that a replay decodes with exactly the schemas of the first
run, even after the subject moved on or while the registry is down. Both are new: nothing is rewritten.

Revision ID: 0016
Revises: 0015
Create Date: 2026-11-28
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("batches", sa.Column("formats", JSONB, nullable=True))
    op.create_table(
        "registry_schemas",
        sa.Column("pipeline_id", sa.Integer, sa.ForeignKey("pipelines.id"), primary_key=True),
        sa.Column("schema_id", sa.BigInteger, primary_key=True),
        sa.Column("schema", sa.Text, nullable=False),
        sa.Column("recorded_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("registry_schemas")
    op.drop_column("batches", "formats")
