"""`postgres_upsert` applies a change stream on real PostgreSQL (issue 65, item 2): creates, updates and snapshot reads
as upserts, deletes as deletes, in the order of the source's log (`__lsn`) whatever order the batches bring them,
re-sent old events ignored, unchanged-TOAST placeholders keeping the stored text, a primary-key change as the old key
gone and the new one present, a key first seen with a placeholder held until its full image arrives.

The history is a random one; the oracle applies its distinct events in log order with plain Python dicts. The
stage's rows are written into the staging table here (the stage itself is tests/e2e/test_cdc_e2e.py's), then each
batch is committed by the commit phase, as a pipeline run would."""

from __future__ import annotations

import random
from dataclasses import dataclass, replace
from decimal import Decimal
from pathlib import Path

import pytest
import yaml
from sqlalchemy import text

from microbatch.config import find_spec
from microbatch.ledger import repository as repo
from microbatch.ledger.database import transaction
from microbatch.phases.commit import commit_batch
from microbatch.sinks.schema import migrate_sinks
from microbatch.types import OffsetRange, Plan

pytestmark = pytest.mark.integration
PLACEHOLDER = "__debezium_unavailable_value"
TOPIC = "cdc.public.orders"
PARTITIONS = 2
COLUMNS = ("region", "order_id", "amount", "note", "body")


@dataclass(frozen=True)
class Change:
    lsn: int
    op: str  # c, u, d, r
    region: str
    order_id: int
    amount: Decimal | None = None
    note: str | None = None
    body: str | None = None

    @property
    def key(self) -> tuple[str, int]:
        return (self.region, self.order_id)

    @property
    def partition(self) -> int:
        return (self.order_id + len(self.region)) % PARTITIONS


def history(seed: int, changes: int = 400) -> list[Change]:
    """A source table's log: inserts, updates (a third leaving `body` unchanged: the placeholder), deletes and
    primary-key changes (the delete of the old key, then the create of the new one, as Debezium writes them)."""
    rng = random.Random(seed)
    rows: dict[tuple[str, int], Change] = {}
    bodies: dict[tuple[str, int], str | None] = {}  # each live key's full body
    out: list[Change] = []
    lsn = 1000
    next_id = 1
    for _ in range(changes):
        lsn += rng.randrange(1, 50)
        roll = rng.random()
        if roll < 0.3 or not rows:
            key = (rng.choice(["eu", "us"]), next_id)
            next_id += 1
            change = Change(lsn, "c", *key, Decimal(rng.randrange(-10**6, 10**6)) / 100, rng.choice([None, "n"]),
                            f"body-{lsn}")
        else:
            old = rows[rng.choice(sorted(rows))]
            if roll < 0.7:
                body = PLACEHOLDER if rng.random() < 0.35 else f"body-{lsn}"
                change = replace(old, lsn=lsn, op="u", amount=Decimal(rng.randrange(10**5)) / 100, body=body)
            elif roll < 0.85:
                change = Change(lsn, "d", old.region, old.order_id)
            else:  # a primary-key change: one UPDATE, written as two events at its position; the body untouched
                out.append(Change(lsn, "d", old.region, old.order_id))
                rows.pop(old.key)
                change = Change(lsn, "c", old.region, next_id, old.amount, old.note,
                                PLACEHOLDER if rng.random() < 0.7 else bodies[old.key])
                bodies[change.key] = bodies[old.key]
                next_id += 1
        out.append(change)
        if change.op == "d":
            rows.pop(change.key, None)
        else:
            rows[change.key] = change
            if change.body != PLACEHOLDER:
                bodies[change.key] = change.body
    return out


def oracle(changes: list[Change]) -> dict[tuple[str, int], tuple]:
    """Each distinct change once, in log order (a primary-key change's delete before its create); a placeholder keeps
    the stored body, or the old key's in a primary-key change."""
    table: dict[tuple[str, int], dict] = {}
    deleted_at: dict[int, dict] = {}
    distinct = {(c.lsn, c.op, c.key): c for c in changes}.values()
    for change in sorted(distinct, key=lambda c: (c.lsn, c.op != "d")):
        if change.op == "d":
            deleted_at[change.lsn] = table.pop(change.key)
            continue
        body = change.body
        if body == PLACEHOLDER:
            body = (table.get(change.key) or deleted_at[change.lsn])["body"]
        table[change.key] = {"region": change.region, "order_id": change.order_id, "amount": change.amount,
                             "note": change.note, "body": body}
    return {key: tuple(row[c] for c in COLUMNS) for key, row in table.items()}


SPEC = {
    "name": "orders_cdc", "schedule": None,
    "source": {"topics": [TOPIC], "key": {"format": "debezium", "fields": {"region": "string", "order_id": "bigint"}},
               "value": {"format": "debezium", "fields": {"region": "string", "order_id": "bigint",
                                                           "amount": "decimal(12,2)", "note": "string",
                                                           "body": "string"}}},
    "sinks": [{"name": "orders", "type": "postgres_upsert", "table": "orders",
               "columns": {"region": "text", "order_id": "bigint", "amount": "numeric", "note": "text",
                           "body": "text", "__op": "text", "__lsn": "bigint"},
               "keys": ["region", "order_id"], "order_by": "__lsn", "delete_column": "__deleted",
               "unavailable_value": PLACEHOLDER,
               "sql": "SELECT region, order_id, amount, note, body, __op, __lsn, __deleted FROM records"}],
}


def commit(url: str, spec, pipeline_ranges: list[OffsetRange], records: list[tuple[int, int, Change]]) -> None:
    """Stage `records` (partition, offset, change) as the stage would for a batch of `pipeline_ranges`, then commit."""
    with transaction(url) as session:
        pipeline = repo.ensure_pipeline(session, spec, lock=True)
        batch_id = repo.insert_batch(session, pipeline, Plan(ranges=tuple(pipeline_ranges))).id
    with transaction(url) as session:
        attempt = repo.begin_attempt(session, batch_id)
        for partition, offset, c in records:
            deleted = c.op == "d"
            session.execute(text(
                "INSERT INTO stage_orders (batch_id, attempt, region, order_id, amount, note, body, __op, __lsn, "
                "__deleted, topic, partition, \"offset\") VALUES (:b, :a, :region, :id, :amount, :note, :body, :op, "
                ":lsn, :deleted, :t, :p, :o)"),
                {"b": batch_id, "a": attempt, "region": c.region, "id": c.order_id, "amount": c.amount,
                 "note": c.note, "body": c.body, "op": c.op, "lsn": c.lsn, "deleted": deleted, "t": TOPIC,
                 "p": partition, "o": offset})
        repo.record_staged(session, batch_id, attempt, {"rows_by_sink": {"orders": len(records)}}, {}, {})
    with transaction(url) as session:
        commit_batch(session, spec, batch_id)


def table(url: str) -> dict[tuple[str, int], tuple]:
    with transaction(url) as session:
        rows = session.execute(text(f"SELECT {', '.join(COLUMNS)} FROM orders")).all()
    return {(r.region, r.order_id): tuple(r) for r in rows}


@pytest.mark.parametrize("seed", [1, 2, 3, 4])
def test_a_change_stream_with_resent_events_lands_as_its_source(ledger_url: str, tmp_path: Path, seed: int) -> None:
    (tmp_path / "orders_cdc.yaml").write_text(yaml.safe_dump(SPEC))
    migrate_sinks(ledger_url, tmp_path)
    spec = find_spec("orders_cdc", tmp_path)
    changes = history(seed)
    rng = random.Random(seed)
    # The topic: each change at the next offset of its key's partition; after some changes the connector restarts
    # and re-sends the last few events (at least once), which land again at later offsets.
    log: list[Change] = []
    for i, change in enumerate(changes):
        log.append(change)
        if i % 97 == 96:
            log += changes[i - rng.randrange(5, 30):i + 1]
    offsets = [0] * PARTITIONS
    placed: list[tuple[int, int, Change]] = []
    for change in log:
        placed.append((change.partition, offsets[change.partition], change))
        offsets[change.partition] += 1
    # Batches of random sizes per partition, committed one after another.
    start = [0] * PARTITIONS
    while start != offsets:
        ranges = []
        for p in range(PARTITIONS):
            end = min(offsets[p], start[p] + rng.randrange(10, 90))
            if end > start[p]:
                ranges.append(OffsetRange(TOPIC, p, start[p], end))
        records = [(p, o, c) for p, o, c in placed if any(r.partition == p and r.start <= o < r.end for r in ranges)]
        commit(ledger_url, spec, ranges, records)
        start = [next((r.end for r in ranges if r.partition == p), start[p]) for p in range(PARTITIONS)]
    expected = oracle(changes)
    assert table(ledger_url) == expected
    assert any(c.body == PLACEHOLDER for c in changes) and len(expected) > 20


def test_a_key_first_seen_with_a_placeholder_is_held_until_its_full_image(ledger_url: str, tmp_path: Path) -> None:
    (tmp_path / "orders_cdc.yaml").write_text(yaml.safe_dump(SPEC))
    migrate_sinks(ledger_url, tmp_path)
    spec = find_spec("orders_cdc", tmp_path)
    partial = Change(10, "u", "eu", 7, Decimal("1.00"), None, PLACEHOLDER)
    commit(ledger_url, spec, [OffsetRange(TOPIC, 0, 0, 1)], [(0, 0, partial)])
    assert table(ledger_url) == {}
    full = replace(partial, lsn=20, amount=Decimal("2.00"), body="whole")
    commit(ledger_url, spec, [OffsetRange(TOPIC, 0, 1, 2)], [(0, 1, full)])
    assert table(ledger_url) == {("eu", 7): ("eu", 7, Decimal("2.00"), None, "whole")}
    older = replace(partial, lsn=15, amount=Decimal("9.99"), body="stale")  # a re-sent older event
    commit(ledger_url, spec, [OffsetRange(TOPIC, 0, 2, 3)], [(0, 2, older)])
    assert table(ledger_url)[("eu", 7)][2:] == (Decimal("2.00"), None, "whole")
