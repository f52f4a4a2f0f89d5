"""Alembic environment: the URL comes from the caller (`microbatch migrate`), never from a file."""

from __future__ import annotations

from alembic import context
from sqlalchemy import create_engine, pool

from microbatch.ledger.models import Base

config = context.config
url = config.get_main_option("sqlalchemy.url")
connection = config.attributes.get("connection")


def _run(conn) -> None:
    context.configure(connection=conn, target_metadata=Base.metadata, transaction_per_migration=True)
    with context.begin_transaction():
        context.run_migrations()


if connection is not None:
    _run(connection)
else:
    engine = create_engine(url, poolclass=pool.NullPool)
    with engine.connect() as conn:
        _run(conn)
        conn.commit()
