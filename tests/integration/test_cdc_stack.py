"""The CDC stack on the real thing: a PostgreSQL with logical decoding, a Kafka Connect worker running Debezium's
PostgreSQL connector (pgoutput) into the session's broker, read back with kafka-python. A snapshot, then inserts,
updates and a delete arrive as Debezium's events (op r/c/u/d, a tombstone after the delete, `source.lsn` growing, a
numeric(12,2) as the base64 bytes of its unscaled value); after a SIGKILL of the worker and its restart, the changes
made since arrive too (some may come twice: Debezium delivers at least once). `new --from-topic`'s inference on the
topic gives the tutorial's spec (docs/your-own-pipeline.md section 6)."""

from __future__ import annotations

import base64
import time
from decimal import Decimal

import pytest

from microbatch.dev.process import listening_sockets
from microbatch.kafka.sampling import sample_topic
from microbatch.scaffold import infer_pipeline
from microbatch.settings import KafkaSettings
from tests.cdc_fixtures import ORDERS_TABLE, Cdc, Change

pytestmark = pytest.mark.integration

TABLE = ORDERS_TABLE
LARGE = "(SELECT string_agg(md5(i::text), '') FROM generate_series(1, 300) AS i)"
"""9,600 characters that do not compress below PostgreSQL's 2 kB: stored out of line (TOAST)."""
UNAVAILABLE = "__debezium_unavailable_value"
"""What Debezium puts for a TOASTed column that an update left alone (pgoutput does not send it; REPLICA IDENTITY
DEFAULT)."""


def decimal(change: Change, field: str) -> Decimal:
    """A `decimal.handling.mode=precise` value: the base64 of its unscaled value's big-endian two's complement bytes,
    its scale a parameter of the field's schema."""
    after = next(f for f in change.value["schema"]["fields"] if f["field"] == "after")
    schema = next(f for f in after["fields"] if f["field"] == field)
    assert schema["name"] == "org.apache.kafka.connect.data.Decimal" and schema["type"] == "bytes"
    unscaled = int.from_bytes(base64.b64decode(change.payload["after"][field]), "big", signed=True)
    return Decimal(unscaled).scaleb(-int(schema["parameters"]["scale"]))


def key(change: Change) -> tuple:
    payload = change.key["payload"]
    return payload["region"], payload["order_id"]


def test_snapshot_changes_and_a_killed_worker(cdc: Cdc) -> None:
    cdc.sql(TABLE)
    cdc.sql(f"INSERT INTO public.orders VALUES ('eu', 1, 12.34, '2026-01-02 03:04:05.678+00', NULL, {LARGE}), "
            f"('us', 7, -1234567890.12, '2026-01-03 10:00:00+00', 'big', {LARGE})")
    started = time.monotonic()
    topic = cdc.register("public.orders")
    running = time.monotonic() - started
    snapshot = cdc.changes(topic, 2)
    print(f"connector RUNNING and topic there {running:.1f}s after the PUT, the snapshot read "
          f"{time.monotonic() - started:.1f}s after it")
    assert [c.op for c in snapshot] == ["r", "r"]
    assert [decimal(c, "amount") for c in snapshot] == [Decimal("12.34"), Decimal("-1234567890.12")]
    assert snapshot[0].payload["after"]["placed_at"] == "2026-01-02T03:04:05.678000Z"  # io.debezium.time.ZonedTimestamp
    assert snapshot[0].payload["after"]["note"] is None and len(snapshot[1].payload["after"]["description"]) == 9600

    changed = time.monotonic()
    cdc.sql("INSERT INTO public.orders VALUES ('eu', 2, 0.10, now(), 'new', 'short')")
    cdc.sql("UPDATE public.orders SET amount = 99.99, note = 'paid' WHERE region = 'eu' AND order_id = 1")
    cdc.sql("DELETE FROM public.orders WHERE region = 'eu' AND order_id = 2")
    events = cdc.changes(topic, 6)[2:]
    print(f"three changes on the topic {time.monotonic() - changed:.1f}s after the first")
    assert [c.op for c in events] == ["c", "u", "d", None]
    insert, update, delete, tombstone = events
    assert key(insert) == ("eu", 2) and insert.payload["before"] is None and decimal(insert, "amount") == Decimal("0.1")
    assert decimal(update, "amount") == Decimal("99.99") and update.payload["after"]["note"] == "paid"
    assert update.payload["after"]["description"] == UNAVAILABLE  # a TOASTed column the update did not touch
    assert delete.payload["after"] is None and delete.payload["before"]["order_id"] == 2
    assert tombstone.value is None and tombstone.key == delete.key
    lsns = [c.payload["source"]["lsn"] for c in (insert, update, delete)]
    assert lsns == sorted(set(lsns)), lsns
    inferring = time.monotonic()  # `microbatch new --from-topic` on the real topic: the tutorial's spec
    sampled = sample_topic(KafkaSettings(cdc.bootstrap_servers), topic)
    inference = infer_pipeline("orders_cdc", topic, [r.key for r in sampled], [r.value for r in sampled])
    print(f"sampled and inferred {len(sampled)} records in {time.monotonic() - inferring:.2f}s")
    assert inference.spec["source"]["key"] == {"format": "debezium", "fields": {"region": "string",
                                                                                 "order_id": "bigint"}}
    assert inference.spec["source"]["value"] == {"format": "debezium", "fields": {
        "region": "string", "order_id": "bigint", "amount": "decimal(12,2)", "placed_at": "timestamp",
        "note": "string", "description": "string"}}
    (sink,) = inference.spec["sinks"]
    assert (sink["type"], sink["keys"], sink["order_by"], sink["delete_column"], sink["unavailable_value"]) == (
        "postgres_upsert", ["region", "order_id"], "__lsn", "__deleted", UNAVAILABLE)
    sockets = listening_sockets([cdc.worker.pid])  # the REST API, on loopback only
    assert [s.port for s in sockets] == [cdc.worker.port] and all(s.loopback_only for s in sockets), sockets

    # SIGKILL once the worker flushed the offset of these events (every second): a kill before that flush sends them
    # again, and one before the first flush after the snapshot snapshots the table again (op r).
    cdc.worker.wait_lsn_flushed(max(lsns))
    cdc.worker.kill()
    cdc.sql("INSERT INTO public.orders VALUES ('us', 8, 5.00, now(), NULL, 'while the worker was down')")
    restarted = time.monotonic()
    cdc.worker.start()  # the connector comes back from its file
    cdc.sql("UPDATE public.orders SET amount = 6.00 WHERE region = 'us' AND order_id = 8")
    after = cdc.changes(topic, 8, until=lambda found: any(c.op == "u" and key(c) == ("us", 8) for c in found))
    print(f"worker restarted and the changes since its kill on the topic {time.monotonic() - restarted:.1f}s later")
    resumed = [c for c in after[6:] if c.value is not None]
    assert [(c.op, key(c)) for c in resumed][-2:] == [("c", ("us", 8)), ("u", ("us", 8))]
    assert all(c.op in ("c", "u", "d") for c in resumed)  # no new snapshot: the offsets survived the kill
    assert decimal(resumed[-1], "amount") == Decimal("6.00")
    assert resumed[-1].payload["source"]["lsn"] > max(lsns)
