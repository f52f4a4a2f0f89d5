"""Contributions tables without a foreign key to batches.

The key was checked once per inserted row, and a commit inserts one contribution per key, window and source
partition: at 80,000 rows the checks took most of the commit (bench/commit_cost.py --explain). Only the commit
writes these rows, for the batch it holds locked in the same transaction. This drops the key of every
`*_contributions` table that has one (the example's, from 0005, and sink tables `microbatch migrate` created
before); new sink tables are created without it.

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-25
"""

from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(r"""
        DO $$
        DECLARE fk record;
        BEGIN
            FOR fk IN SELECT conrelid::regclass AS owner, conname FROM pg_constraint
                      WHERE contype = 'f' AND confrelid = 'batches'::regclass
                        AND conrelid::regclass::text LIKE '%\_contributions' ESCAPE '\'
            LOOP
                EXECUTE format('ALTER TABLE %s DROP CONSTRAINT %I', fk.owner, fk.conname);
            END LOOP;
        END $$
    """)


def downgrade() -> None:
    op.create_foreign_key("ip_counts_contributions_batch_id_fkey", "ip_counts_contributions", "batches",
                          ["batch_id"], ["id"])
