"""A pipeline in YAML and SQL only (issue 44), on real Kafka, Postgres, Spark (the suite's Connect server) and
Airflow (`dag.test()`): JSON payments decoded by the platform (`source.value: json`), event time declared once
(`event_time: {column: ts, window: 1m, allowed_lateness: 5s}`), an append sink by a filtering query and a windowed
aggregate by a GROUP BY query with `window_start(ts)`/`window_end(ts)`. Neither query names a source coordinate.
Late payments are routed to `late_records` as the watermark rule, replayed here over the committed batches, says;
the tables equal oracles computed from the produced records with Python's `json`; `verify` passes; then a replay of
one partition's first range leaves every table as it was."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import yaml
from sqlalchemy import text

from microbatch.dev.datagen import produce_lines
from microbatch.ledger.database import transaction
from tests.e2e.helpers import (
    cli,
    committed_batches,
    dead_letter_coordinates,
    late_coordinates,
    pipeline_dag_folder,
    positions,
    recount,
    spark_section,
)

pytestmark = pytest.mark.e2e

PIPELINE = "captures"
T0 = datetime.now(UTC).replace(microsecond=0) - timedelta(hours=1)
CAPTURED_SQL = "SELECT payment_id, merchant, amount_cents, ts FROM records WHERE status = 'captured'"
TOTALS_SQL = ("SELECT window_start(ts) AS window_start, window_end(ts) AS window_end, merchant, "
              "SUM(amount_cents) AS amount_cents, COUNT(*) AS payments FROM records "
              "GROUP BY window_start(ts), window_end(ts), merchant")


@dataclass(frozen=True)
class Payment:
    """A produced record (`value`, `key`, `timestamp` as `produce_lines` sends them) and what it says."""

    value: bytes
    key: bytes | None
    timestamp: datetime | None
    merchant: str | None = None
    amount: int = 0
    status: str | None = None
    event_time: datetime | None = None
    malformed: bool = False

    @property
    def ip(self) -> str | None:  # the grouping key of helpers.recount
        return self.merchant


def payment(i: int, rng: random.Random, when: datetime) -> Payment:
    merchant, amount, status = f"m{rng.randrange(4)}", rng.randrange(100, 9_999), rng.choice(["captured", "failed"])
    body = {"payment_id": f"p{i}", "merchant": merchant, "amount_cents": amount, "status": status,
            "ts": when.isoformat()}
    return Payment(json.dumps(body).encode(), None, None, merchant, amount, status, when)


def generate(seed: int) -> list[Payment]:
    """600 payments over 150 s, some not JSON or missing `ts`, then 30 of the first 40 s: late by then."""
    rng = random.Random(seed)
    out = []
    for i in range(600):
        when = T0 + timedelta(seconds=i / 4)
        roll = rng.random()
        if roll < 0.02:
            out.append(Payment(b"{not json", None, None, malformed=True))
        elif roll < 0.03:
            out.append(Payment(json.dumps({"payment_id": f"p{i}", "amount_cents": 5}).encode(), None, None,
                               malformed=True))
        else:
            out.append(payment(i, rng, when))
    out += [payment(1000 + i, rng, T0 + timedelta(seconds=rng.randrange(40))) for i in range(30)]
    return out


def write_spec(directory: Path, topic: str) -> Path:
    spec = {
        "name": PIPELINE,
        "schedule": None,
        "source": {"topics": [topic], "max_records_per_batch": 320, "commit_group_offsets": False,
                   "value": {"format": "json", "fields": {"payment_id": "string", "merchant": "string",
                                                          "amount_cents": "bigint", "status": "string",
                                                          "ts": "timestamp"},
                             "required": ["payment_id", "amount_cents", "ts"]}},
        "event_time": {"column": "ts", "window": "1m", "allowed_lateness": "5s"},
        "sinks": [
            {"name": "captured", "type": "postgres_append", "table": "captured", "include_late": False,
             "columns": {"payment_id": "text", "merchant": "text", "amount_cents": "bigint", "ts": "timestamptz"},
             "sql": CAPTURED_SQL},
            {"name": "merchant_minute", "type": "postgres_aggregate", "table": "merchant_minute",
             "columns": {"window_start": "timestamptz", "window_end": "timestamptz", "merchant": "text",
                         "amount_cents": "bigint", "payments": "bigint"},
             "keys": ["window_start", "window_end", "merchant"], "sum_columns": ["amount_cents", "payments"],
             "window": {"start": "window_start", "end": "window_end"}, "sql": TOTALS_SQL},
        ],
        "retries": {"count": 2, "delay_seconds": 1},
        "spark": spark_section({"spark.sql.shuffle.partitions": "2"}, "auto"),
    }
    directory.mkdir(parents=True, exist_ok=True)
    (directory / f"{PIPELINE}.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    return directory


def tables(url: str) -> tuple[dict, Counter]:
    with transaction(url) as session:
        captured = {(p, o): (pid, m, a, ts) for pid, m, a, ts, p, o in session.execute(text(
            'SELECT payment_id, merchant, amount_cents, ts, partition, "offset" FROM captured'))}
        totals = Counter({(s, m): (a, n) for s, m, a, n in session.execute(text(
            "SELECT window_start, merchant, amount_cents, payments FROM merchant_minute"))})
    return captured, totals


def test_yaml_and_sql_pipeline_with_declared_event_time(service_env, topic, kafka, ledger_url, tmp_path):
    specs = write_spec(tmp_path / "pipelines", topic)
    env = {**service_env, "MICROBATCH_PIPELINES_DIR": str(specs), **pipeline_dag_folder(tmp_path, PIPELINE)}
    migrated = cli(env, "migrate")
    assert migrated.returncode == 0, migrated.stdout + migrated.stderr
    payments = generate(seed=44)
    coords = produce_lines(kafka.bootstrap_servers, topic, payments)

    def check() -> None:
        batches = committed_batches(ledger_url)
        expected = recount(payments, coords, batches, window=60, lateness=5)
        assert expected.late, "the test must produce late payments"
        assert late_coordinates(ledger_url) == expected.late
        captured, totals = tables(ledger_url)
        assert captured == {co: (json.loads(p.value)["payment_id"], p.merchant, p.amount, p.event_time)
                            for co, p in zip(coords, payments, strict=True)
                            if not p.malformed and p.status == "captured" and co not in expected.late}
        sums: dict = {}
        for co, p in zip(coords, payments, strict=True):
            if not p.malformed and co not in expected.late:
                epoch = int(p.event_time.timestamp())
                key = (datetime.fromtimestamp(epoch - epoch % 60, tz=UTC), p.merchant)
                amount, n = sums.get(key, (0, 0))
                sums[key] = (amount + p.amount, n + 1)
        assert totals == Counter(sums)
        assert dead_letter_coordinates(ledger_url) == sorted(
            co for co, p in zip(coords, payments, strict=True) if p.malformed)
        audit = cli(env, "verify", PIPELINE)
        assert audit.returncode == 0, audit.stdout + audit.stderr

    done = subprocess.run([sys.executable, "-m", "microbatch.cli", "run", PIPELINE, "--max-runs", "6"],
                          env={**os.environ, **env}, capture_output=True, text=True, timeout=900, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    check()
    assert len(committed_batches(ledger_url)) >= 2

    with transaction(ledger_url) as session:
        start, end = session.execute(text(
            "SELECT start_offset, end_offset FROM ranges WHERE committed AND partition = 0 "
            "ORDER BY start_offset LIMIT 1")).one()
    cursor, before, late_before = positions(ledger_url), tables(ledger_url), late_coordinates(ledger_url)
    replayed = cli(env, "backfill", PIPELINE, "--topic", topic, "--mode", "replay", "--partitions", "0",
                   "--start", str(start), "--end", str(end))
    assert replayed.returncode == 0, (replayed.stdout + replayed.stderr)[-4000:]
    # The replay starts from the original batch's state, so what was late stays late and the tables are the same.
    assert tables(ledger_url) == before
    assert late_coordinates(ledger_url) == late_before
    assert dead_letter_coordinates(ledger_url) == sorted(
        co for co, p in zip(coords, payments, strict=True) if p.malformed)
    audit = cli(env, "verify", PIPELINE)
    assert audit.returncode == 0, audit.stdout + audit.stderr
    assert positions(ledger_url) == cursor
