"""`microbatch new NAME --from-topic TOPIC` infers a YAML-only pipeline from a live topic it has never seen, and the
pipeline lands the records on the first `microbatch migrate` + `microbatch run NAME`: in a fresh copy of the
repository (its tracked files), two topics, one `new` and one `run` each, on real Kafka, Postgres, Spark Connect
and Airflow. `flat`: flat JSON objects without a key (a sometimes-null field, ints and floats in one field, zoned and
naive times); `nested`: nested objects, an array of objects and a reserved name (epoch seconds, declared a timestamp
with `unit: s`), keyed by a JSON key with a camelCase field. Each table equals the produced records read with
Python's `json` (row by row, at its partition and offset); `verify` passes; the generated unit tests pass and the
copy lints clean. An unknown and an empty topic are refused in one sentence, writing nothing. In the same copy (one
copy, one `migrate`, one lint, one unit run: the suite's budget), `new --topic --format text` writes a Python
pipeline that stores each line, and a second `new` of an existing name is refused without overwriting anything
(`new --format json` with a Python transform is the tutorial's, tests/e2e/test_tutorial_e2e.py)."""

from __future__ import annotations

import json
import re
import uuid
from datetime import UTC, datetime
from pathlib import Path

import pytest
from sqlalchemy import text

from microbatch.dev.kafka import create_topic
from microbatch.ledger.database import transaction
from tests.e2e.test_demo_e2e import _fresh_copy
from tests.e2e.test_scaffold_e2e import _env, _run
from tests.e2e.test_scaffold_e2e import _produce as _produce_values

pytestmark = pytest.mark.e2e


def _produce(bootstrap: str, topic: str, records: list[tuple[int, bytes | None, bytes]]) -> list[tuple[int, int]]:
    """Send (partition, key, value) records; their (partition, offset), in order."""
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all")
    try:
        futures = [producer.send(topic, key=key, value=value, partition=partition)
                   for partition, key, value in records]
        producer.flush()
        return [(meta.partition, meta.offset) for meta in (f.get(timeout=30) for f in futures)]
    finally:
        producer.close()


def _flat(i: int) -> dict:
    return {"id": f"f{i}", "amount": i * 10, "price": i if i % 3 == 0 else i / 4, "ok": i % 2 == 0,
            "at": f"2026-11-25T10:{i % 60:02d}:00Z", "local": f"2026-11-25 08:{i % 60:02d}:30.5",
            "note": None if i % 4 == 0 else f"note {i}"}


def _nested(i: int) -> dict:
    customer = {"name": f"c{i % 5}"} if i % 3 == 0 else {"name": f"c{i % 5}", "address": {"city": f"city{i % 4}"}}
    items = [{"sku": f"s{j}", "qty": j + 1} if j % 2 == 0 else {"sku": f"s{j}"} for j in range(i % 3)]
    return {"orderId": i, "customer": customer, "items": items, "total": i * 1.25,
            "placedAt": f"2026-11-25T10:00:{i % 60:02d}+01:00", "timestamp": 1_764_000_000 + i}


def _time(value: str) -> datetime:
    return datetime.fromisoformat(value)


def test_new_from_topic_infers_pipelines_that_land_the_records(service_env, kafka, ledger_url, tmp_path: Path):
    copy = _fresh_copy(tmp_path / "repo")
    env = _env(copy, tmp_path, service_env)
    suffix = uuid.uuid4().hex[:6]
    flat, nested, empty = f"flat_{suffix}", f"nested_{suffix}", f"empty_{suffix}"
    create_topic(kafka.bootstrap_servers, f"{flat}_src", 3)
    create_topic(kafka.bootstrap_servers, f"{nested}_src", 2)
    create_topic(kafka.bootstrap_servers, f"{empty}_src", 1)

    for topic, says in ((f"nowhere_{suffix}", "does not exist on the Kafka cluster"),
                        (f"{empty}_src", "holds no record")):
        refused = _run(env, copy, "-m", "microbatch.cli", "new", empty, "--from-topic", topic)
        assert refused.returncode == 2 and refused.stdout.strip().startswith("error: "), refused.stdout + refused.stderr
        assert says in refused.stdout and "--topic TOPIC --format json" in refused.stdout
        assert "Traceback" not in refused.stdout + refused.stderr
    assert not list(copy.rglob(f"*{empty}*")), "a refused `new` wrote a file"

    flats = [_flat(i) for i in range(150)]
    flat_coords = _produce(kafka.bootstrap_servers, f"{flat}_src",
                           [(i % 3, None, json.dumps(v).encode()) for i, v in enumerate(flats)])
    orders = [_nested(i) for i in range(80)]
    nested_coords = _produce(kafka.bootstrap_servers, f"{nested}_src",
                             [(i % 2, json.dumps({"orderId": o["orderId"]}).encode(), json.dumps(o).encode())
                              for i, o in enumerate(orders)])

    made = _run(env, copy, "-m", "microbatch.cli", "new", flat, "--from-topic", f"{flat}_src")
    assert made.returncode == 0, made.stdout + made.stderr
    assert f"sampled 100 record(s) of {flat}_src" in made.stdout
    assert "required: id, amount, price, ok, at, local" in made.stdout and "key: none" in made.stdout
    assert "value.price (double)" in made.stdout and "value.local (timestamp_ntz)" in made.stdout
    made = _run(env, copy, "-m", "microbatch.cli", "new", nested, "--from-topic", f"{nested}_src")
    assert made.returncode == 0, made.stdout + made.stderr
    assert f"sampled 80 record(s) of {nested}_src" in made.stdout
    assert re.search(r"value\.customer\.address\.city \(string\) +->  customer_address_city text", made.stdout)
    assert re.search(r"key\.orderId \(bigint\) +->  key_order_id bigint", made.stdout)
    assert ("value.timestamp: epoch seconds (10-digit integers near now), declared {type: timestamp, unit: s, "
            "from: timestamp}") in made.stdout
    assert not (copy / "spark_jobs" / f"{flat}.py").exists() and not (copy / "spark_jobs" / f"{nested}.py").exists()

    # A Python pipeline of text lines, and a refused `new` of a name that exists, in the same copy.
    lines = f"lines_{suffix}"
    create_topic(kafka.bootstrap_servers, f"{lines}_src", 2)
    made = _run(env, copy, "-m", "microbatch.cli", "new", lines, "--topic", f"{lines}_src", "--format", "text")
    assert made.returncode == 0, made.stdout + made.stderr
    written = [copy / "include" / "pipelines" / f"{lines}.yaml", copy / "spark_jobs" / f"{lines}.py",
               copy / "tests" / "unit" / f"test_{lines}.py", copy / "dags" / f"{lines}.py"]
    before = {path: path.read_text() for path in written}
    again = _run(env, copy, "-m", "microbatch.cli", "new", lines, "--topic", "x", "--format", "json")
    assert again.returncode == 2 and again.stdout.strip().startswith("error: ")
    assert "exists already" in again.stdout and "Traceback" not in again.stdout + again.stderr
    assert {path: path.read_text() for path in written} == before, "a refused `new` overwrote a file"
    good_lines = [f"line {i}: GET /page/{i % 3}" for i in range(25)]
    _produce_values(kafka.bootstrap_servers, f"{lines}_src", [line.encode() for line in good_lines] + [b""])

    lint = _run(env, copy, "-m", "ruff", "check", ".")
    assert lint.returncode == 0, lint.stdout + lint.stderr
    unit = _run(env, copy, "-m", "pytest", "-p", "no:cacheprovider", "-q", f"tests/unit/test_{flat}.py",
                f"tests/unit/test_{nested}.py", f"tests/unit/test_{lines}.py")
    assert unit.returncode == 0, unit.stdout[-3000:] + unit.stderr[-3000:]

    migrated = _run(env, copy, "-m", "microbatch.cli", "migrate")
    assert migrated.returncode == 0, migrated.stdout + migrated.stderr
    for name in (flat, nested, lines):
        ran = _run(env, copy, "-m", "microbatch.cli", "run", name, "--max-runs", "3", timeout=900)
        assert ran.returncode == 0, (ran.stdout + ran.stderr)[-4000:]

    with transaction(ledger_url) as session:
        stored = {(p, o): tuple(rest) for p, o, *rest in session.execute(text(
            f'SELECT partition, "offset", id, amount, price, ok, at, local, note FROM {flat}'))}
        assert stored == {co: (v["id"], v["amount"], float(v["price"]), v["ok"], _time(v["at"]), _time(v["local"]),
                               v["note"]) for co, v in zip(flat_coords, flats, strict=True)}
        stored = {(p, o): (*rest[:-2], None if rest[-2] is None else json.loads(rest[-2]), rest[-1])
                  for p, o, *rest in session.execute(text(
                      f'SELECT partition, "offset", key_order_id, customer_name, customer_address_city, total, '
                      f'placed_at, payload_timestamp, items, order_id FROM {nested}'))}
        assert stored == {co: (o["orderId"], o["customer"]["name"], o["customer"].get("address", {}).get("city"),
                               o["total"], _time(o["placedAt"]), datetime.fromtimestamp(o["timestamp"], UTC),
                               o["items"], o["orderId"])
                          for co, o in zip(nested_coords, orders, strict=True)}
        assert sorted(session.execute(text(f"SELECT line FROM {lines}")).scalars().all()) == sorted(good_lines)
        assert dict(session.execute(text("SELECT topic, count(*) FROM dead_letters GROUP BY topic")).all()) == \
            {f"{lines}_src": 1}  # the empty line; the inferred pipelines' records all fit
    for name in (flat, nested, lines):
        audit = _run(env, copy, "-m", "microbatch.cli", "verify", name)
        assert audit.returncode == 0, audit.stdout + audit.stderr
