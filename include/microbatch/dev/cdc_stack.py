"""The local stack's change data capture (`make cdc`, `python -m microbatch.dev.stack cdc`): a source PostgreSQL with
logical decoding and a Kafka Connect worker with Debezium (dev/cdc.py) under `.cache/devstack/cdc`, capturing a sample
table into the stack's Kafka; their ports and the worker's pid are keys of the stack's state file, so that `make down`
stops them (`stop_stack`) and `make clean` removes their data with the stack's folder."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path

from microbatch.dev.cdc import PROCESS_MARKER, KafkaConnectWorker, source_postgres, topic_name, wait_for_topic
from microbatch.dev.postgres import DATABASE, LocalPostgres
from microbatch.dev.process import port_open

log = logging.getLogger(__name__)

STATE_KEYS = ("cdc_source_port", "cdc_worker_port", "cdc_worker_pid")
SAMPLE_TABLE = "public.orders"
SAMPLE_CONNECTOR = "orders-cdc"
SAMPLE_PREFIX = "cdc"
SAMPLE_SQL = """
CREATE TABLE IF NOT EXISTS public.orders (
    region text NOT NULL,
    order_id bigint NOT NULL,
    amount numeric(12, 2) NOT NULL,
    placed_at timestamptz NOT NULL DEFAULT now(),
    note text,
    description text NOT NULL DEFAULT '',
    PRIMARY KEY (region, order_id)
);
INSERT INTO public.orders (region, order_id, amount, placed_at, note, description)
SELECT region, order_id, amount, placed_at, note,
       (SELECT string_agg(md5(order_id::text || i::text), '') FROM generate_series(1, 300) AS i)
FROM (VALUES ('eu', 1, 12.34, timestamptz '2026-01-02 03:04:05.678+00', 'first'),
             ('eu', 2, 0.99, timestamptz '2026-01-02 03:05:00+00', NULL),
             ('us', 1, 1234567890.12, timestamptz '2026-01-03 10:00:00+00', 'large amount'),
             ('us', 2, -5.00, timestamptz '2026-01-03 11:00:00+00', NULL)) AS rows (region, order_id, amount,
                                                                                  placed_at, note)
ON CONFLICT DO NOTHING;
"""
"""The sample table of `make cdc`: a composite primary key, a numeric(12,2), a timestamptz, a nullable column and a
large (TOASTed, 9,600 characters) text, with four rows."""


def stack_root() -> Path:
    from microbatch.runtime import cache_dir

    return cache_dir() / "devstack" / "cdc"


def _worker_alive(state: dict) -> bool:
    from microbatch.dev.stopping import runs

    pid, port = state.get("cdc_worker_pid"), state.get("cdc_worker_port")
    return bool(pid and port) and runs(pid, PROCESS_MARKER) and port_open(port)


def start_stack(state: dict, bootstrap_servers: str, record: Callable[[dict], None]) -> None:
    """`make cdc`, once the stack's Kafka runs: start (or reuse) the source PostgreSQL and the worker under
    `.cache/devstack/cdc`, on their recorded ports while those are free, and `record` their state keys; create the
    sample table, register its connector (a worker that starts creates it from its file, with the source's port of
    now) and wait until it runs and its topic exists; print what runs, never the password."""
    root = stack_root()
    port = state.get("cdc_source_port")
    source = source_postgres(root / "postgres", port)
    if not (port and port_open(port)):  # not running: start it, on its recorded port (free, as it is closed)
        source.start()
    try:
        source.create_database(DATABASE)
        _run_sql(source, SAMPLE_SQL)
        worker_port = state.get("cdc_worker_port")
        alive = _worker_alive(state)
        worker = KafkaConnectWorker(root / "connect", bootstrap_servers,
                                    worker_port if alive or (worker_port and not port_open(worker_port)) else None)
        if not alive:
            worker.save_connector(SAMPLE_CONNECTOR, worker.postgres_config(
                source, name=SAMPLE_CONNECTOR, tables=[SAMPLE_TABLE], topic_prefix=SAMPLE_PREFIX))
            worker.start()
    except BaseException:  # nothing recorded yet, so `down` would not find it: stop it here
        source.stop()
        raise
    recorded = {"cdc_source_port": source.port, "cdc_worker_port": worker.port,
                "cdc_worker_pid": state["cdc_worker_pid"] if alive else worker.pid}
    record(recorded)
    started = time.monotonic()
    if alive and worker.status(SAMPLE_CONNECTOR) is None:  # a worker that runs without it (removed by hand)
        worker.register_postgres(source, name=SAMPLE_CONNECTOR, tables=[SAMPLE_TABLE], topic_prefix=SAMPLE_PREFIX)
    worker.wait_running(SAMPLE_CONNECTOR)
    topic = topic_name(SAMPLE_PREFIX, SAMPLE_TABLE)
    wait_for_topic(bootstrap_servers, topic)
    log.info("connector %s running and its topic there in %.1fs", SAMPLE_CONNECTOR, time.monotonic() - started)
    print(f"CDC up: source PostgreSQL 127.0.0.1:{source.port} (database {DATABASE}, user {source.user}, logical "
          f"decoding; its password is in {root / 'postgres' / 'password'}), table {SAMPLE_TABLE}\n"
          f"Kafka Connect worker {worker.rest_url} (pid {recorded['cdc_worker_pid']}), Debezium connector "
          f"{SAMPLE_CONNECTOR} RUNNING, topic {topic} on {bootstrap_servers}; log: {worker.log_file}")


def stop_stack(state: dict) -> None:
    """`make down`: stop the recorded worker (its process group) and the source PostgreSQL."""
    from microbatch.dev.stopping import stop_group

    stop_group(state.get("cdc_worker_pid"), PROCESS_MARKER, "Kafka Connect worker")
    if state.get("cdc_source_port"):
        source_postgres(stack_root() / "postgres", state["cdc_source_port"]).stop()


def _run_sql(source: LocalPostgres, sql: str) -> None:
    import psycopg

    with psycopg.connect(host="127.0.0.1", port=source.port, user=source.user, password=source.password,
                         dbname=DATABASE, autocommit=True) as conn:
        conn.execute(sql)


def source_sql(statement: str) -> list[tuple]:
    """Run `statement` on the running `make cdc` source database (autocommit): its rows, if it returns any."""
    import json

    import psycopg

    state_file = stack_root().parent / "state.json"
    port = json.loads(state_file.read_text()).get("cdc_source_port") if state_file.exists() else None
    if not (port and port_open(port)):
        raise SystemExit("The CDC source database does not run: start it with `make cdc`, then run this again.")
    password = (stack_root() / "postgres" / "password").read_text().strip()  # the server's own file, owner-only
    with psycopg.connect(host="127.0.0.1", port=port, user=LocalPostgres.user, password=password, dbname=DATABASE,
                         autocommit=True) as conn:
        cursor = conn.execute(statement)
        return cursor.fetchall() if cursor.description else []


if __name__ == "__main__":  # python -m microbatch.dev.cdc_stack "SQL": a statement on the source database
    import sys

    for row in source_sql(" ".join(sys.argv[1:])):
        print(*row, sep="\t")
