"""`batches.committed_run_id`: the Airflow run whose commit task committed the batch.

A batch is planned by one run and may be committed by another (a retry in a later run, a zombie's
successor), so `microbatch history` names both when they differ.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-25
"""

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("batches", sa.Column("committed_run_id", sa.Text))


def downgrade() -> None:
    op.drop_column("batches", "committed_run_id")
