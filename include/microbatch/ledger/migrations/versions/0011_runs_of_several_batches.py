"""A run may plan several consecutive batches (`source.max_batches_per_run`); still one open plan per pipeline.

0001 allowed at most one open scheduled batch per pipeline (a unique partial index), so that a retry reuses the
open batch instead of planning anew. A run that plans several batches leaves several open, so the index becomes an
exclusion constraint with the same intent: every open scheduled batch of a pipeline belongs to one run's plan.
`run_head` names the first batch of that plan on each later batch (NULL on the first, which is its own head).

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-26
"""

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None

OPEN_SCHEDULED = "kind = 'scheduled' AND state IN ('planned', 'staged')"


def upgrade() -> None:
    op.add_column("batches", sa.Column("run_head", sa.BigInteger, nullable=True))
    op.drop_index("uq_batches_one_open_scheduled", table_name="batches")
    # btree_gist (0001) gives bigint its = and <> for the constraint.
    op.execute("ALTER TABLE batches ADD CONSTRAINT ex_batches_one_open_plan EXCLUDE USING gist "
               f"(pipeline_id WITH =, (coalesce(run_head, id)) WITH <>) WHERE ({OPEN_SCHEDULED})")


def downgrade() -> None:
    op.execute("ALTER TABLE batches DROP CONSTRAINT ex_batches_one_open_plan")
    op.create_index("uq_batches_one_open_scheduled", "batches", ["pipeline_id"], unique=True,
                    postgresql_where=sa.text(OPEN_SCHEDULED))
    op.drop_column("batches", "run_head")
