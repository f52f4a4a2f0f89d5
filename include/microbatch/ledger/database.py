"""Engines, sessions and migrations of the ledger database (never Airflow's metadata DB)."""

from __future__ import annotations

import logging
import time
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

from sqlalchemy import Engine, create_engine, make_url, text
from sqlalchemy.exc import ArgumentError, SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from microbatch.errors import ConnectionSettingsError, MicrobatchError, TransientServiceError
from microbatch.settings import LEDGER_CONN_ID, LEDGER_URL_ENV, ledger_url

log = logging.getLogger(__name__)
MIGRATIONS = Path(__file__).resolve().parent / "migrations"
MIGRATE_LOCK_NAMESPACE = 0x6D6D  # 'mm': the advisory lock of `sinks.schema.migrate_sinks`


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
        fix=f"Check the Airflow connection {LEDGER_CONN_ID} or {LEDGER_URL_ENV} (host, port, user, password).",
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


@dataclass(frozen=True)
class Ledger:
    """The ledger database, as the phases take it: its URL (the password never shows in `repr` or logs), the
    process's pooled engine and a transaction. Resolved once per task by `microbatch.airflow.hooks.LedgerHook`,
    from the environment by the CLI and the Spark driver (`Ledger.from_settings`)."""

    url: str = field(repr=False)

    def __repr__(self) -> str:
        return f"Ledger({safe_url(self.url)})"

    @classmethod
    def from_settings(cls) -> Ledger:
        """The ledger of `MICROBATCH_LEDGER_URL` (no Airflow lookup)."""
        return cls(ledger_url())

    @property
    def safe_url(self) -> str:
        """The URL with its password masked."""
        return safe_url(self.url)

    @property
    def engine(self) -> Engine:
        """The one pooled engine of this URL in this process."""
        return get_engine(self.url)

    @contextmanager
    def transaction(self) -> Iterator[Session]:
        """One session in one transaction: committed on success, rolled back on any error."""
        with transaction(self.url) as session:
            yield session

    def unreachable(self, exc: Exception) -> TransientServiceError:
        """One sentence for a failed connection to this ledger (its URL masked)."""
        return unreachable(self.url, exc)


def upgrade_ledger(url: str, revision: str = "head") -> str:
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


STAGE_LOCK_NAMESPACE = 0x6D62  # 'mb': the first key of microbatch's advisory locks on batches
PUBLISH_LOCK_NAMESPACE = 0x6D70  # 'mp': on the publisher of one sink


@contextmanager
def _advisory_lock(url: str, namespace: int, key: int, busy: str, timeout_fix: str, wait_s: float,
                   poll_s: float) -> Iterator[bool]:
    """Hold Postgres's session advisory lock (namespace, key) while the body runs; yield whether it had
    to wait for another holder. Postgres drops the lock when the holder's connection closes, so a killed
    holder never blocks the next one."""
    params = {"ns": namespace, "key": key % 2**31}
    deadline = time.monotonic() + wait_s
    waited = False
    with get_engine(url).connect() as conn:
        while not conn.execute(text("SELECT pg_try_advisory_lock(:ns, :key)"), params).scalar_one():
            conn.commit()
            if not waited:
                log.warning("%s by another live run; waiting for it to finish (up to %.0fs)", busy, wait_s)
                waited = True
            if time.monotonic() > deadline:
                raise MicrobatchError(f"{busy} by another run after {wait_s:.0f}s.", fix=timeout_fix)
            time.sleep(poll_s)
        conn.commit()  # the lock is session-level: it outlives this transaction
        try:
            yield waited
        finally:
            try:
                conn.execute(text("SELECT pg_advisory_unlock(:ns, :key)"), params)
                conn.commit()
            except SQLAlchemyError:
                conn.invalidate()  # the connection is gone, and the lock with it


@contextmanager
def stage_lock(url: str, batch_id: int, wait_s: float = 3600.0, poll_s: float = 1.0) -> Iterator[bool]:
    """Hold the batch's advisory lock while this process stages it; yields whether it had to wait.

    Attempt numbers keep a superseded stage from ever being committed (safety); this lock keeps
    concurrent live stages from superseding each other in turn forever (liveness): the second one
    waits instead of superseding. If the connection is lost while the holder still runs (a Postgres
    restart), a newer attempt may start and the attempt check fences the older one.
    """
    with _advisory_lock(url, STAGE_LOCK_NAMESPACE, batch_id, f"Batch {batch_id} is still being staged",
                        "If that run is hung, stop its spark-submit (the lock goes with its process), then retry.",
                        wait_s, poll_s) as waited:
        yield waited


@contextmanager
def publish_lock(url: str, pipeline_id: int, sink: str, wait_s: float = 600.0, poll_s: float = 0.5) -> Iterator[bool]:
    """Hold the advisory lock of one sink's publisher; yields whether it had to wait.

    Two live publishers of a sink share its transactional id, so each would fence the other: the
    fenced one then blocks until its batches expire (two minutes by default) and fails. With this
    lock the second publisher waits a moment, then finds the outbox already published. Fencing still
    guards the case the lock cannot see (a holder cut off from Postgres that still reaches Kafka).
    """
    key = zlib.crc32(f"{pipeline_id}/{sink}".encode())
    with _advisory_lock(url, PUBLISH_LOCK_NAMESPACE, key, f"Sink {sink} is still being published",
                        "If that run is hung, stop its publish task (the lock goes with its process), then retry.",
                        wait_s, poll_s) as waited:
        yield waited
