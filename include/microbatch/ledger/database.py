"""Engines, sessions and migrations of the ledger database (never Airflow's metadata DB)."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path

from sqlalchemy import Engine, create_engine, make_url
from sqlalchemy.exc import ArgumentError
from sqlalchemy.orm import Session, sessionmaker

from microbatch.errors import ConnectionSettingsError, TransientServiceError

log = logging.getLogger(__name__)
LEDGER_URL_ENV = "MICROBATCH_LEDGER_URL"
MIGRATIONS = Path(__file__).resolve().parent / "migrations"


def ledger_url_from_env() -> str:
    """The ledger URL from `MICROBATCH_LEDGER_URL`, or a clear error saying how to set it."""
    url = os.environ.get(LEDGER_URL_ENV)
    if not url:
        raise ConnectionSettingsError(
            f"The ledger database is not configured: {LEDGER_URL_ENV} is not set.",
            fix="Set it to postgresql+psycopg://USER:PASSWORD@HOST:PORT/DB, "
            "or create the Airflow connection microbatch_ledger.",
        )
    return url


def safe_url(url: str) -> str:
    """The URL with its password masked, for logs and errors."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except ArgumentError:
        return "<unparseable URL>"


def unreachable(url: str, exc: Exception) -> TransientServiceError:
    """One sentence for a failed ledger connection: where, why (first line only), and what to check."""
    reason = str(getattr(exc, "orig", exc)).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return TransientServiceError(
        f"Cannot use the ledger database at {safe_url(url)}: {reason}.",
        fix=f"Check the Airflow connection microbatch_ledger or {LEDGER_URL_ENV} (host, port, user, password).",
    )


@lru_cache(maxsize=8)
def get_engine(url: str) -> Engine:
    """One pooled engine per URL and process."""
    try:
        parsed = make_url(url)
    except ArgumentError:
        raise ConnectionSettingsError(
            "The ledger URL is not a valid database URL.",
            fix="Use postgresql+psycopg://USER:PASSWORD@HOST:PORT/DB.",
        ) from None
    if parsed.drivername == "postgresql":
        parsed = parsed.set(drivername="postgresql+psycopg")
    return create_engine(parsed, pool_pre_ping=True, pool_size=4, max_overflow=4)


@contextmanager
def transaction(url: str) -> Iterator[Session]:
    """One session in one transaction: committed on success, rolled back on any error."""
    factory = sessionmaker(get_engine(url), expire_on_commit=False)
    with factory.begin() as session:
        yield session


def migrate(url: str, revision: str = "head") -> str:
    """Upgrade the ledger schema with Alembic and return the revision it is now at."""
    from alembic import command
    from alembic.config import Config
    from alembic.runtime.migration import MigrationContext

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    config.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    with get_engine(url).begin() as conn:
        config.attributes["connection"] = conn
        command.upgrade(config, revision)
    with get_engine(url).connect() as conn:
        current = MigrationContext.configure(conn).get_current_revision() or "base"
    log.info("ledger schema at revision %s (%s)", current, safe_url(url))
    return current
