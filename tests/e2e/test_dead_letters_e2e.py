"""The dead-letter workflow (issue 45): find, inspect, fix, re-process, verify, on real Kafka, Postgres, Spark (the
suite's Connect server) and Airflow (`dag.test()`); and a pipeline in YAML and SQL only (issue 44): JSON decoded by
the platform, the event time declared once, an append sink by a filtering query and a windowed aggregate by
`window_start(ts)`/`window_end(ts)`, neither naming a source coordinate, late records routed as the watermark rule
replayed here says, and replays of chosen partitions' ranges that end equal to the oracle.

A YAML-only pipeline declares `amount_cents: int`, too small for some payments: those become dead letters ("value
field 'amount_cents' is not an int"), beside records that are not JSON at all. `microbatch dead-letters` lists them
with key and reason; `find` names the reason of one; the spec is fixed (`bigint`); `reprocess --reason amount_cents
--dry-run` shows the ranges and counts and writes nothing; `reprocess` replays exactly those ranges: the payments are
rows now, counted once in the aggregate, the one whose window was final when its batch began is a late record, the
non-JSON records stay dead letters; every table equals the oracle computed here from the produced records, and
`verify` passes. Then a sink that cannot replay (a Delta upsert) makes `reprocess` refuse in one sentence, and
nothing is written.

Real topics' ways (issues 59, 60): `ts` is epoch milliseconds (`{type: timestamp, unit: ms}`); tombstones keyed by
merchant are never dead letters, delete their merchant in a record-keyed upsert, are skipped by the other sinks and
kept as rows by the one that opts in (`keep_tombstones`); a record stamped in the year 2999 is a dead letter that
moves no watermark; the captures are published to a Kafka topic, each once; and a watermark forced past year 9999
is refused by the stage before it writes, then cleared with `reset --watermark`, the run going on exactly once."""

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
from tests.e2e.helpers import cli, committed_batches, late_coordinates, read_output, recount, spark_section
from tests.e2e.test_delta_sink_e2e import dag_folder

pytestmark = pytest.mark.e2e

PIPELINE = "fixme"
T0 = datetime.now(UTC).replace(microsecond=0) - timedelta(hours=1)
BIG = 2**31 + 7


@dataclass(frozen=True)
class Payment:
    value: bytes | None
    ip: str | None  # the record key (produce_lines keys by it), and the merchant
    amount: int = 0
    event_time: datetime | None = None
    json_ok: bool = True
    key: bytes | None = None
    timestamp: datetime | None = None

    @property
    def malformed(self) -> bool:  # after the fix: only what is not JSON (and the tombstones: no data, no event time)
        return not self.json_ok

    @property
    def tombstone(self) -> bool:
        return self.value is None

    @property
    def future(self) -> bool:  # a producer's clock in 2999: a dead letter that moves no watermark (issue 60)
        return self.event_time is not None and self.event_time.year >= 2999


def payment(i: int, merchant: str, amount: int, when: datetime) -> Payment:
    body = {"payment_id": f"p{i}", "merchant": merchant, "amount_cents": amount,
            "ts": int(when.timestamp() * 1000)}  # epoch milliseconds (issue 59)
    return Payment(json.dumps(body).encode(), merchant, amount, when)


def generate() -> list[Payment]:
    """300 payments over 300 s (every 20th one too big for an int, `ts` in epoch milliseconds), 6 records that are
    not JSON, 8 tombstones (keyed by merchant, null value: skipped, never dead letters), one stamped in the year 2999
    (a dead letter that moves no watermark), then one big
    payment of the first seconds: its window is final by the time the second batch begins."""
    rng = random.Random(45)
    out = []
    for i in range(300):
        amount = BIG + i if i % 20 == 0 else rng.randrange(100, 9_999)
        out.append(payment(i, f"m{rng.randrange(3)}", amount, T0 + timedelta(seconds=i)))
        if i % 50 == 0:
            out.append(Payment(b"{not json", f"m{rng.randrange(3)}", json_ok=False))
        if i % 40 == 3:  # a tombstone: never a dead letter, no row, no event time (docs/formats.md#tombstones)
            out.append(Payment(None, f"m{rng.randrange(3)}", json_ok=False))
        if i == 150:  # an event time from a clock set to 2999: later records must not all become late
            future = payment(2999, "m1", 42, datetime(2999, 1, 1, tzinfo=UTC))
            out.append(Payment(future.value, "m1", 42, future.event_time, json_ok=False))
    out.append(payment(999, "m0", BIG, T0 + timedelta(seconds=1)))
    return out


def latest_by_key(payments: list[Payment], coords: list[tuple[int, int]]) -> dict[str, tuple[str, int]]:
    """The record-keyed upsert's oracle: per merchant (the record key) its last good payment in Kafka's order, a
    tombstone deleting the merchant; not-JSON records and the one from 2999 are dead letters and take no part."""
    table: dict[str, tuple[str, int]] = {}
    for _, p in sorted(zip(coords, payments, strict=True), key=lambda item: item[0]):
        if p.tombstone:
            table.pop(p.ip, None)
        elif p.json_ok:
            table[p.ip] = (json.loads(p.value)["payment_id"], p.amount)
    return table


def write_spec(directory: Path, topic: str, amount_type: str, delta_upsert: bool = False) -> None:
    sinks = [
        {"name": "payments", "type": "postgres_append", "table": "payments",
         "columns": {"payment_id": "text", "merchant": "text", "amount_cents": "bigint"},
         "sql": "SELECT payment_id, merchant, amount_cents FROM records WHERE amount_cents >= 0"},
        {"name": "per_minute", "type": "postgres_aggregate", "table": "per_minute",
         "columns": {"window_start": "timestamptz", "window_end": "timestamptz", "merchant": "text",
                     "amount_cents": "bigint"},
         "keys": ["window_start", "window_end", "merchant"], "sum_columns": ["amount_cents"],
         "window": {"start": "window_start", "end": "window_end"},
         "sql": "SELECT window_start(ts) AS window_start, window_end(ts) AS window_end, merchant, "
                "SUM(amount_cents) AS amount_cents FROM records GROUP BY 1, 2, merchant"},
        {"name": "marked", "type": "postgres_append", "table": "marked", "keep_tombstones": True,  # the opt-in
         "columns": {"payment_id": "text"}, "sql": "SELECT payment_id FROM records"},
        {"name": "by_merchant", "type": "postgres_upsert", "table": "by_merchant", "keys_from": "record_key",
         "columns": {"key_text": "text", "payment_id": "text", "amount_cents": "bigint"},
         "sql": "SELECT key_text, payment_id, amount_cents FROM records"},  # a tombstone deletes its merchant
        {"name": "captures", "type": "kafka", "topic": f"{topic}_captures", "source": "payments",
         "key": "payment_id"},
    ]
    if delta_upsert:
        sinks.append({"name": "latest", "type": "delta", "mode": "upsert", "keys": ["merchant"],
                      "columns": {"merchant": "text", "amount_cents": "bigint"},
                      "sql": "SELECT merchant, amount_cents FROM records"})
    spec = {
        "name": PIPELINE, "schedule": None,
        "source": {"topics": [topic], "max_records_per_batch": 160, "commit_group_offsets": False, "key": "text",
                   "value": {"format": "json", "required": ["payment_id", "amount_cents", "ts"],
                             "fields": {"payment_id": "string", "merchant": "string", "amount_cents": amount_type,
                                        "ts": {"type": "timestamp", "unit": "ms"}}}},
        "event_time": {"column": "ts", "window": "1m", "allowed_lateness": "5s"},
        "sinks": sinks,
        "retries": {"count": 1, "delay_seconds": 1, "backoff": 1},
        "spark": spark_section({"spark.sql.shuffle.partitions": "2"}, "auto"),
    }
    directory.mkdir(parents=True, exist_ok=True)
    (directory / f"{PIPELINE}.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))


def microbatch(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "microbatch.cli", *args], env={**os.environ, **env},
                          capture_output=True, text=True, timeout=900, check=False)


def test_dead_letters_find_inspect_fix_reprocess_verify(service_env, topic, kafka, ledger_url, tmp_path):
    specs, warehouse = tmp_path / "pipelines", tmp_path / "warehouse"
    write_spec(specs, topic, "int")
    env = {**service_env, "MICROBATCH_PIPELINES_DIR": str(specs), "MICROBATCH_WAREHOUSE": str(warehouse),
           **dag_folder(tmp_path, PIPELINE)}
    assert cli(env, "migrate").returncode == 0
    payments = generate()
    coords = produce_lines(kafka.bootstrap_servers, topic, payments)
    done = microbatch(env, "run", PIPELINE, "--max-runs", "4")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    scheduled = committed_batches(ledger_url)  # the batches a replay starts from (their ranges, their order)
    assert len(scheduled) >= 2

    # Inspect: every too-big payment and every non-JSON record is listed, with its key and reason.
    listed = microbatch(env, "dead-letters", PIPELINE, "--json")
    assert listed.returncode == 0, listed.stderr
    letters = {(d["partition"], d["offset"]): d for d in json.loads(listed.stdout)}
    too_big = {co for co, p in zip(coords, payments, strict=True) if p.json_ok and p.amount >= 2**31}
    not_json = {co for co, p in zip(coords, payments, strict=True)
                if not p.json_ok and not p.tombstone and not p.future}
    future = {co for co, p in zip(coords, payments, strict=True) if p.future}
    assert set(letters) == too_big | not_json | future
    by_coord = dict(zip(coords, payments, strict=True))
    for co, letter in letters.items():
        assert letter["key"] == by_coord[co].ip
        expected = ("value field 'amount_cents' is not an int" if co in too_big else "value is not JSON"
                    if co in not_json else "the event time is more than 1 day ahead of its Kafka timestamp "
                    "(max_future); it would move the watermark past every later record")
        assert letter["reason"] == expected, letter
    one = sorted(too_big)[0]
    found = microbatch(env, "find", PIPELINE, topic, str(one[0]), str(one[1]))
    assert "dead letter: value field 'amount_cents' is not an int" in " ".join(found.stdout.split()), found.stdout

    # Fix the spec, then a dry run: the ranges and counts, nothing written.
    write_spec(specs, topic, "bigint")
    with transaction(ledger_url) as session:
        batches_before = session.execute(text("SELECT count(*) FROM batches")).scalar_one()
    dry = microbatch(env, "reprocess", PIPELINE, "--reason", "amount_cents", "--dry-run")
    assert dry.returncode == 0, dry.stdout + dry.stderr
    assert f"{len(too_big)} dead letter(s) in" in " ".join(dry.stdout.split()), dry.stdout
    with transaction(ledger_url) as session:
        assert session.execute(text("SELECT count(*) FROM batches")).scalar_one() == batches_before

    redone = microbatch(env, "reprocess", PIPELINE, "--reason", "amount_cents")
    assert redone.returncode == 0, redone.stdout[-3000:] + redone.stderr[-3000:]
    assert "0 remain" in " ".join(redone.stdout.split()), redone.stdout

    # The oracle: every JSON payment once, the late ones (by the watermark over the scheduled batches) aside.
    expected = recount(payments, coords, scheduled, window=60, lateness=5)
    late_big = {co for co in too_big if co in expected.late}
    assert late_big, "the old big payment must be late now"
    assert late_coordinates(ledger_url) == expected.late
    with transaction(ledger_url) as session:
        rows = session.execute(text('SELECT partition, "offset", payment_id, amount_cents FROM payments')).all()
        sums = {(w, m): a for w, m, a in session.execute(text(
            "SELECT window_start, merchant, amount_cents FROM per_minute"))}
        remaining = {(p, o) for p, o in session.execute(text('SELECT partition, "offset" FROM dead_letters'))}
    valid = {co: p for co, p in zip(coords, payments, strict=True) if p.json_ok}
    assert len(rows) == len({(p, o) for p, o, *_ in rows}) == len(valid)  # a landing table takes late ones too
    assert {(p, o): (pid, a) for p, o, pid, a in rows} == {
        co: (json.loads(p.value)["payment_id"], p.amount) for co, p in valid.items()}
    oracle: Counter = Counter()
    for p in (p for co, p in valid.items() if co not in expected.late):  # an aggregate never takes a late one
        epoch = int(p.event_time.timestamp())
        oracle[(datetime.fromtimestamp(epoch - epoch % 60, tz=UTC), p.ip)] += p.amount
    assert sums == dict(oracle)
    assert remaining == not_json | future
    with transaction(ledger_url) as session:
        marked = dict(session.execute(text('SELECT (partition, "offset")::text, payment_id FROM marked')).all())
    tombstones = {co for co, p in zip(coords, payments, strict=True) if p.tombstone}
    assert len(tombstones) == 8 and {co for co, pid in marked.items() if pid is None} == {
        f"({p},{o})" for p, o in tombstones}, "a sink that keeps tombstones holds each as a row of nulls"
    assert len(marked) == len(valid) + len(tombstones)

    # A watermark an older release let run away (issue 60): the stage refuses in one sentence before it writes; the
    # operator abandons that batch and clears the watermark, on the record, and the pipeline goes on exactly once.
    with transaction(ledger_url) as session:
        session.execute(text("UPDATE pipelines SET state = state || CAST(:w AS jsonb) WHERE name = :n"),
                        {"w": json.dumps({"watermark_us": 1_764_000_000_000_000_000}), "n": PIPELINE})
    later = [payment(5000 + i, "m2", 100 + i, datetime.now(UTC).replace(microsecond=0)) for i in range(12)]
    later_coords = produce_lines(kafka.bootstrap_servers, topic, later)
    wedged = microbatch(env, "run", PIPELINE, "--max-runs", "1")
    assert wedged.returncode == 1, wedged.stdout + wedged.stderr
    assert "is past year 9999, which no table can hold; nothing was written" in wedged.stdout, wedged.stdout
    assert "past year 9999" in microbatch(env, "state", PIPELINE).stdout
    with transaction(ledger_url) as session:
        (open_batch,) = session.execute(text("SELECT id FROM batches WHERE state IN ('planned', 'staged')")).scalars()
    assert microbatch(env, "abandon", PIPELINE, str(open_batch), "--yes").returncode == 0
    reset = microbatch(env, "reset", PIPELINE, "--watermark", "clear", "--yes")
    assert reset.returncode == 0 and "applied and recorded" in reset.stdout, reset.stdout + reset.stderr
    resumed = microbatch(env, "run", PIPELINE, "--max-runs", "3")
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    with transaction(ledger_url) as session:
        landed = dict(session.execute(text('SELECT (partition, "offset")::text, payment_id FROM payments')).all())
    assert len(landed) == len(valid) + len(later)
    assert {landed[f"({p},{o})"] for p, o in later_coords} == {f"p{5000 + i}" for i in range(12)}
    assert cli(env, "verify", PIPELINE).returncode == 0
    with transaction(ledger_url) as session:
        by_merchant = {k: (pid, a) for k, pid, a in session.execute(text(
            "SELECT key_text, payment_id, amount_cents FROM by_merchant"))}
    assert by_merchant == latest_by_key([*payments, *later], [*coords, *later_coords])
    published = sorted(value["payment_id"] for _, value in read_output(kafka.bootstrap_servers, f"{topic}_captures"))
    assert published == sorted([*(json.loads(p.value)["payment_id"] for p in valid.values()),
                                *(f"p{5000 + i}" for i in range(12))]), "each capture published once"

    # A sink that cannot replay: the re-process is refused in one sentence, and nothing is written.
    write_spec(specs, topic, "bigint", delta_upsert=True)
    assert cli(env, "migrate").returncode == 0
    with transaction(ledger_url) as session:
        batches_before = session.execute(text("SELECT count(*) FROM batches")).scalar_one()
    refused = microbatch(env, "reprocess", PIPELINE)
    assert refused.returncode != 0
    message = " ".join((refused.stdout + refused.stderr).split())
    assert "sink 'latest' is a delta upsert table" in message, message
    with transaction(ledger_url) as session:
        assert session.execute(text("SELECT count(*) FROM batches")).scalar_one() == batches_before
