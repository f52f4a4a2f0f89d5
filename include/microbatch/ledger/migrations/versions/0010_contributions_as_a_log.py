"""Contributions tables as an append-only log: no primary key, an index on batch_id.

The commit copied a batch's staged rows into `<table>_contributions` grouped by (topic, partition, keys), and
the primary key made every row a B-tree insert: together 0.35 s of a 0.8 s commit of 80,000 rows
(bench/commit_cost.py --explain 80000). Every reader of the contributions (a replay's retraction, a backfill's
count) sums or counts them per key, so neither the grouping nor the key is needed; an index on batch_id finds
one batch's rows. Measured at 80,000 rows: the statement took 0.35 s, 0.11 s without the grouping and the key,
0.05 s without any index (a BRIN index costs as little, but leaves the rows appended since the last vacuum
unsummarized, and a replay of a recent batch would read them all).

This drops the primary key `pk_<table>` of every `*_contributions` table (the example's, from 0005, and sink
tables `microbatch migrate` created before) and adds the index `ix_<table>`, the name the sink declares for
new tables.

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-26
"""

from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(r"""
        DO $$
        DECLARE t record;
        BEGIN
            FOR t IN SELECT c.oid::regclass AS owner, c.relname FROM pg_class c
                     JOIN pg_constraint k ON k.conrelid = c.oid AND k.contype = 'p' AND k.conname = 'pk_' || c.relname
                     WHERE c.relkind = 'r' AND c.relname LIKE '%\_contributions' ESCAPE '\'
                       AND c.relnamespace = current_schema()::regnamespace
            LOOP
                EXECUTE format('ALTER TABLE %s DROP CONSTRAINT %I', t.owner, 'pk_' || t.relname);
                EXECUTE format('CREATE INDEX IF NOT EXISTS %I ON %s (batch_id)', 'ix_' || t.relname,
                               t.owner);
            END LOOP;
        END $$
    """)


def downgrade() -> None:
    op.drop_index("ix_ip_counts_contributions", table_name="ip_counts_contributions")
    op.create_primary_key("pk_ip_counts_contributions", "ip_counts_contributions",
                          ["batch_id", "topic", "partition", "window_start", "window_end", "ip"])
