"""Change data capture end to end (issue 65): a source PostgreSQL with `pgoutput`, Debezium in Kafka Connect, Kafka,
Spark (the suite's Connect server, and one spark-submit run) and the target, run by Airflow (`dag.test()`).

The pipeline is the one docs/your-own-pipeline.md writes (its `orders_cdc` spec, read from the page). A source table
with a composite primary key, a numeric(12,2), a timestamptz, a nullable text and a large TOASTed text goes through
rounds of random inserts, updates (some leaving the large text unchanged, some changing the primary key) and
deletes, with a pipeline run after each round; the oracle is the source itself: after every run the target equals
`SELECT *` of the source, row for row. On the way: the stage and the commit die at their failpoints (`os._exit` and
SIGKILL), the Kafka Connect worker is SIGKILLed mid-round and restarted (Debezium sends events again), bad records
(a key that is not the row's, a malformed envelope, an unknown op) become dead letters with their reasons, a
replay of the whole topic leaves the target as it was, `verify` passes, and a truncate of the source stops its batch
in one sentence that, followed, makes the target the source again."""

from __future__ import annotations

import json
import os
import random
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from sqlalchemy import text

from microbatch.failpoints import EXIT_CODE, FAILPOINT_DIR_ENV, FAILPOINTS_ENV
from microbatch.ledger.database import transaction
from tests.cdc_fixtures import ORDERS_TABLE, Cdc
from tests.e2e.helpers import SHORT_LIVED_DRIVER, cli, pipeline_dag_folder

pytestmark = pytest.mark.e2e
ROOT = Path(__file__).resolve().parents[2]
PIPELINE = "orders_cdc"
TABLE = ORDERS_TABLE
LARGE = "(SELECT string_agg(md5(random()::text || i::text), '') FROM generate_series(1, 300) AS i)"
"""9,600 random characters: stored out of line (TOAST), so an update that leaves it alone sends Debezium's
placeholder instead."""
COLUMNS = "region, order_id, amount, placed_at, note, description"
ARMED = "stage.after_write,stage.after_staged=kill,commit.before_commit=kill,commit.after_commit"
"""The stage and the commit each die once by os._exit and once by SIGKILL (one death a run)."""


def tutorial_spec(topic: str, mode: str) -> dict[str, Any]:
    """The `orders_cdc` spec docs/your-own-pipeline.md writes, reading `topic`, in Spark `mode`."""
    page = (ROOT / "docs" / "your-own-pipeline.md").read_text()
    found = [yaml.safe_load(block) for block in re.findall(r"<<'SPEC'\n(.*?)^SPEC$", page, re.DOTALL | re.MULTILINE)]
    spec = next(s for s in found if s.get("name") == PIPELINE)
    spec["source"]["topics"] = [topic]
    spec["spark"] = {"mode": "submit", "conf": {"spark.ui.enabled": "false", **SHORT_LIVED_DRIVER}} \
        if mode == "submit" else {"mode": mode}
    return spec


class Source:
    """The source table and the random changes of a round, made as an application would, statement by statement."""

    def __init__(self, cdc: Cdc, seed: int) -> None:
        import psycopg

        self.rng, self.next_id = random.Random(seed), 1
        server = cdc.source
        self.connection = psycopg.connect(host="127.0.0.1", port=server.port, user=server.user,
                                          password=server.password, dbname="microbatch", autocommit=True)

    def sql(self, statement: str, params: tuple | None = None) -> list[tuple]:
        cursor = self.connection.execute(statement, params)
        return cursor.fetchall() if cursor.description else []

    def keys(self) -> list[tuple[str, int]]:
        return [tuple(row) for row in self.sql("SELECT region, order_id FROM public.orders ORDER BY 1, 2")]

    def insert(self, count: int) -> None:
        for _ in range(count):
            region, self.next_id = self.rng.choice(["eu", "us", "ap"]), self.next_id + 1
            self.sql(f"INSERT INTO public.orders VALUES (%s, %s, %s, now() - %s * interval '1 minute', %s, "
                         f"{LARGE})", (region, self.next_id, self.amount(), self.rng.randrange(10_000),
                                       self.rng.choice([None, "gift", "rush"])))

    def amount(self) -> str:
        return f"{self.rng.randrange(-10**9, 10**11) / 100:.2f}"

    def round(self, changes: int) -> None:
        """`changes` random changes of existing rows, and a few inserts."""
        self.insert(max(2, changes // 5))
        for _ in range(changes):
            keys = self.keys()
            region, order_id = self.rng.choice(keys)
            roll = self.rng.random()
            where = "WHERE region = %s AND order_id = %s"
            if roll < 0.4:  # the large text untouched: Debezium's placeholder
                self.sql(f"UPDATE public.orders SET amount = %s, note = %s {where}",
                             (self.amount(), self.rng.choice([None, "late", "paid"]), region, order_id))
            elif roll < 0.6:
                self.sql(f"UPDATE public.orders SET description = {LARGE}, placed_at = now() {where}",
                             (region, order_id))
            elif roll < 0.75:  # a primary-key change: a delete of the old key and a create of the new one
                self.next_id += 1
                self.sql(f"UPDATE public.orders SET order_id = %s {where}", (self.next_id, region, order_id))
            elif roll < 0.9:
                self.sql(f"DELETE FROM public.orders {where}", (region, order_id))
            else:  # several changes of one key in one transaction
                self.sql(f"BEGIN; UPDATE public.orders SET amount = 1 WHERE region = '{region}' AND order_id = "
                             f"{order_id}; UPDATE public.orders SET note = 'twice', amount = 2 WHERE region = "
                             f"'{region}' AND order_id = {order_id}; COMMIT")
        self.insert(1)  # the round's last change, which `caught_up` waits for

    def rows(self) -> set[tuple]:
        return {tuple(row) for row in self.sql(f"SELECT {COLUMNS} FROM public.orders")}


def target(url: str) -> set[tuple]:
    with transaction(url) as session:
        return {tuple(row) for row in session.execute(text(f"SELECT {COLUMNS} FROM orders_replica")).all()}


def caught_up(cdc: Cdc, topic: str, source: Source, timeout: float = 60) -> None:
    """Wait until Debezium has written the round's changes: the event of its last insert (the topic has one
    partition, in the order of the source's log)."""
    def reached(changes: list) -> bool:
        return any(c.payload and (c.payload.get("after") or {}).get("order_id") == source.next_id
                   for c in changes)

    cdc.changes(topic, 1, timeout=timeout, until=reached)


def run(env: dict[str, str], extra: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """One DAG run: one batch reads all that Debezium wrote (the spec's default `max_records_per_batch`)."""
    return subprocess.run([sys.executable, "-m", "microbatch.cli", "run", PIPELINE, "--max-runs", "1"],
                          env={**os.environ, **env, **(extra or {})}, capture_output=True, text=True, timeout=600,
                          check=False)


def test_a_debezium_topic_lands_as_its_source_through_faults(cdc: Cdc, service_env: dict[str, str], kafka,
                                                             ledger_url: str, tmp_path: Path) -> None:
    source = Source(cdc, seed=65)
    source.sql(TABLE)
    source.insert(12)
    topic = cdc.register("public.orders", extra={"skipped.operations": "none"})  # truncates sent too
    specs = tmp_path / "pipelines"
    specs.mkdir()

    def write_spec(mode: str) -> None:
        (specs / f"{PIPELINE}.yaml").write_text(yaml.safe_dump(tutorial_spec(topic, mode), sort_keys=False))

    write_spec("auto")
    env = {**service_env, "MICROBATCH_PIPELINES_DIR": str(specs), **pipeline_dag_folder(tmp_path, PIPELINE)}
    migrated = cli(env, "migrate")
    assert migrated.returncode == 0, migrated.stdout + migrated.stderr

    def land(extra: dict[str, str] | None = None, deaths: int = 0) -> None:
        for attempt in range(deaths + 1):
            result = run(env, extra)
            (tmp_path / f"run-{len(list(tmp_path.glob('run-*')))}.log").write_text(result.stdout + result.stderr)
            if result.returncode == 0:
                assert attempt == deaths, f"{deaths} deaths expected, {attempt} seen"
                break
            assert result.returncode in (EXIT_CODE, -9), result.stdout[-3000:] + result.stderr[-3000:]
        else:
            pytest.fail(f"the pipeline never caught up; logs in {tmp_path}")
        assert target(ledger_url) == source.rows()

    # Round 1: the snapshot and a first round of changes, in Connect mode.
    source.round(20)
    caught_up(cdc, topic, source)
    land()
    assert len(source.rows()) > 10

    # Round 2: the worker SIGKILLed mid-round and started again (Debezium sends events again); the stage and the
    # commit die at their failpoints, os._exit and SIGKILL.
    source.round(10)
    cdc.worker.kill()
    source.round(10)
    cdc.worker.start()
    caught_up(cdc, topic, source)
    land({FAILPOINTS_ENV: ARMED, FAILPOINT_DIR_ENV: str(tmp_path / "fired")}, deaths=4)
    assert {p.name for p in (tmp_path / "fired").iterdir()} == {item.split("=")[0] for item in ARMED.split(",")}

    # Round 3: bad records among Debezium's, then a spark-submit run.
    from kafka import KafkaProducer

    good_key = json.dumps({"region": "eu", "order_id": 10**9}).encode()
    envelope = {"before": None, "after": {"region": "eu", "order_id": 10**9 + 1, "amount": "AQ==",
                                          "placed_at": "2026-01-01T00:00:00Z", "note": None, "description": "x"},
                "op": "c", "source": {"lsn": 1, "ts_ms": 0}}
    producer = KafkaProducer(bootstrap_servers=kafka.bootstrap_servers)
    for value in (envelope, {"unexpected": True}, {**envelope, "op": "x"}):
        producer.send(topic, key=good_key, value=json.dumps(value).encode())
    producer.flush()
    producer.close()
    source.round(15)
    caught_up(cdc, topic, source)
    write_spec("submit")
    land()
    with transaction(ledger_url) as session:
        reasons = sorted(session.execute(text("SELECT error FROM dead_letters")).scalars())
    assert reasons == sorted([
        "key field(s) order_id differ from the change's row: the record key is not the table's primary key",
        "value is not a Debezium change event: it has no op",
        "value op 'x' is not one of c, r, u, d"]), reasons

    # A replay of the whole topic: the same target.
    write_spec("auto")
    replayed = cli(env, "backfill", PIPELINE, "--topic", topic, "--mode", "replay", "--start", "0", "--end", "latest")
    assert replayed.returncode == 0, replayed.stdout[-3000:] + replayed.stderr[-3000:]
    assert target(ledger_url) == source.rows()
    verified = cli(env, "verify", PIPELINE)
    assert verified.returncode == 0, verified.stdout + verified.stderr

    # A truncate of the source stops its batch in one sentence, nothing committed; following the sentence (empty the
    # target, abandon the batch, move past the truncate) lands the changes after it: the target is the source again.
    before = target(ledger_url)
    source.sql("TRUNCATE public.orders")
    source.insert(3)
    caught_up(cdc, topic, source)
    stopped = run(env)
    said = stopped.stdout + stopped.stderr
    found = re.search(rf"batch (\d+) of {PIPELINE} stops at \S+\[(\d+)\] offset (\d+): value is a truncate", said)
    assert stopped.returncode != 0 and found, said[-3000:]
    assert target(ledger_url) == before
    batch, partition, offset = found.groups()
    with transaction(ledger_url) as session:
        session.execute(text("TRUNCATE orders_replica, orders_replica_versions"))
    past = str(int(offset) + 1)
    for args in (("abandon", PIPELINE, batch, "--yes"),
                 ("reset", PIPELINE, "--topic", topic, "--partition", partition, "--to", "offset", "--value", past,
                  "--yes")):
        done = cli(env, *args)
        assert done.returncode == 0, done.stdout + done.stderr
    land()
    assert len(source.rows()) == 3
    source.connection.close()
