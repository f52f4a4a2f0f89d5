"""What the stage keeps of the records it read, besides the sinks' rows: the bad ones, staged with their raw bytes
and tagged (batch_id, attempt) like every staged row, and the exact number read per source partition, which the
ledger records with `staged`.

The stage calls these after the sinks have their rows, in the order of the code: `stage_bad_records`, then
`count_records_read`. `write_staging` is the one way the stage appends to a staging table, through pgjdbc
(`jdbc_options`).
"""

from __future__ import annotations

import logging
import time
import uuid
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from pyspark import StorageLevel
from pyspark.sql import Column, DataFrame, Observation
from pyspark.sql import functions as F
from sqlalchemy import make_url

from microbatch.config import SOURCE_COORDINATES
from microbatch.errors import StageFailedError
from microbatch.formats import jvm
from microbatch.formats.base import Format
from microbatch.formats.record import decode_record, select_decoded
from microbatch.ledger.database import Ledger
from microbatch.transform import ERROR_COLUMN, HEADERS_COLUMN, LATE_COLUMN
from microbatch.types import OffsetRange, TopicPartition

log = logging.getLogger("microbatch.phases.stage.records")  # a line of the stage's own log
PARTITION_COUNTER = "records_{}"
"""The name of the read's counter of the i-th source partition (`read_metrics`, `records_by_partition`)."""


def jdbc_options(ledger: Ledger) -> dict[str, str]:
    """pgjdbc options for the ledger database; the password travels only as an option."""
    url = make_url(ledger.url)
    return {
        "url": f"jdbc:postgresql://{url.host or '127.0.0.1'}:{url.port or 5432}/{url.database}"
        "?reWriteBatchedInserts=true",
        "user": url.username or "",
        "password": url.password or "",
        "driver": "org.postgresql.Driver",
        "batchsize": "10000",
    }


def write_staging(df: DataFrame, table: str, jdbc: Mapping[str, str]) -> None:
    """Append `df` to the ledger's staging table `table` through pgjdbc (`jdbc_options`)."""
    df.write.format("jdbc").options(**jdbc).option("dbtable", table).mode("append").save()


BROADCAST_BAD_RECORDS = 100_000
"""Up to this many bad records (dead letters and late records) in a batch, `_with_record_fields` broadcasts them (no
shuffle of the read)."""


def headers_json(headers: Column) -> Column:
    """The records' headers as the ledger keeps them: a JSON array of {"key": string, "value": base64 of the bytes,
    or null}, in the producer's order (a string column; the commit casts it to jsonb). Spark's JSON writer encodes
    binary as base64 on one line, unlike `base64()`, which breaks lines every 76 characters."""
    return F.to_json(headers, {"ignoreNullFields": "false"})


def _with_record_fields(records: DataFrame, rows: DataFrame, count: int, fields: list[str]) -> DataFrame:
    """`rows` (parsed rows of `count` bad records) with the Kafka record's `fields` beside them.

    A job's parse keeps only the source coordinates and `value` (`SOURCE_COLUMNS`), so the platform takes the
    fields from the read itself: the read's (topic, partition, offset, *fields) joined on the coordinates, which
    name one record. Only the bad-records pass does this, and only when the batch has bad records; each record of
    the read then costs one probe of a hash table of the bad records, broadcast to the executors (no shuffle of
    the read) while they are few. The offsets are immutable, so both sides read the same records."""
    source = records.select(*SOURCE_COORDINATES, *fields)
    return source.join(F.broadcast(rows) if count <= BROADCAST_BAD_RECORDS else rows, list(SOURCE_COORDINATES))


def stage_bad_records(
    records: DataFrame, parsed: DataFrame, tag: list[Column], dead_count: int, late_count: int,
    jdbc: Mapping[str, str], *, include_headers: bool,
) -> None:
    """Dead letters and late records keep their raw bytes, dead letters their record's Kafka key and timestamp,
    and both their headers with `include_headers`; only when the pass above saw some does a second, filtered read
    of the same ranges (immutable offsets, so the same records) stage them. The fields from the read are joined to
    the bad rows once, for both tables, and only when some table needs them."""
    if not (dead_count or late_count):
        return
    headers = [headers_json(F.col(HEADERS_COLUMN)).alias(HEADERS_COLUMN)] if include_headers else []
    bad = parsed.where(F.col(ERROR_COLUMN).isNotNull() | F.col(LATE_COLUMN)).select(
        *SOURCE_COORDINATES, "value", ERROR_COLUMN, LATE_COLUMN, *(["event_time"] if late_count else []))
    if dead_count or include_headers:
        fields = [*(["key", "timestamp"] if dead_count else []), *([HEADERS_COLUMN] if include_headers else [])]
        bad = _with_record_fields(records, bad, dead_count + late_count, fields)
    bad = bad.persist(StorageLevel.MEMORY_AND_DISK)
    if dead_count:
        write_staging(bad.where(F.col(ERROR_COLUMN).isNotNull()).select(
            *tag, *SOURCE_COORDINATES, F.col("value").alias("raw"), F.col(ERROR_COLUMN).alias("error"),
            "key", "timestamp", *headers,
        ), "stage_dead_letters", jdbc)
    if late_count:
        write_staging(bad.where(F.col(LATE_COLUMN)).select(
            *tag, *SOURCE_COORDINATES, "event_time", F.col("value").alias("raw"), *headers,
        ), "stage_late_records", jdbc)
    bad.unpersist()


DECODE_ERROR = "_decode_error"
"""The read's column of why a record's key or value does not decode (null: it does), while the stage holds it."""


def decoded_records(records: DataFrame, key: Format[Any], value: Format[Any],
                    keyed_sinks: Sequence[str] = ()) -> DataFrame:
    """`records` (the Kafka records of the job contract) with the columns the key's and value's formats (the
    spec's, registry formats bound to the batch's schemas) decode (`formats/record.py`) after them and
    `DECODE_ERROR`, which with `keyed_sinks` (upsert sinks keyed by the record key) also refuses a record without a
    key; `records` as they are when both formats are `raw` and no sink is keyed by the record key. Projections of
    the read: the decode runs in the read's pass, on the JVM (`Format.on_jvm`) where the Spark has the formats jar."""
    if not (key.columns() or value.columns() or keyed_sinks):
        return records
    sides = [side for side, fmt in (("key", key), ("value", value)) if fmt.on_jvm() is not fmt]
    if sides and jvm.available(records.sparkSession):
        key, value = key.on_jvm(), value.on_jvm()
        log.info("decode: the %s in one pass by the formats jar's Java function", " and the ".join(sides))
    decoded = decode_record(key, value, F.col("key"), F.col("value"))
    reason = decoded.reason
    if keyed_sinks:
        keyless = (f"the record has no key, and the sink{'s' if len(keyed_sinks) > 1 else ''} "
                   f"{', '.join(keyed_sinks)} {'are' if len(keyed_sinks) > 1 else 'is'} keyed by the record key")
        reason = F.when(F.col("key").isNull(), F.lit(keyless)).otherwise(reason)
    return select_decoded(records, decoded, reason, DECODE_ERROR)


def is_tombstone() -> Column:
    """A Kafka tombstone: a record with a key and a null value, the delete of its key (as log compaction keeps it)."""
    return F.col("value").isNull() & F.col("key").isNotNull()


def stage_undecodable(
    decoded: DataFrame, tag: list[Column], count: int, jdbc: Mapping[str, str], *, include_headers: bool
) -> None:
    """Stage the `count` records whose key or value their format cannot read as dead letters, their reason as the
    error, with the record's bytes, key, timestamp (and headers); only when the pass counted some does a second,
    filtered read of the same ranges stage them."""
    if not count:
        return
    headers = [headers_json(F.col(HEADERS_COLUMN)).alias(HEADERS_COLUMN)] if include_headers else []
    # Spark's optimizer pushes a filter below the projections under it, each column replaced by its expression:
    # below the decode's layers of helpers, the reason's expression copied once per reference (a Debezium value: a
    # 1 MB predicate, 38 s for 30 records). An observation is a node no filter is pushed through: the reason is
    # computed once a record, as in the first pass (3 s).
    barrier = decoded.observe(Observation(f"undecodable_{uuid.uuid4().hex}"), F.count(F.lit(1)).alias("records"))
    write_staging(barrier.where(F.col(DECODE_ERROR).isNotNull()).select(
        *tag, *SOURCE_COORDINATES, F.col("value").alias("raw"), F.col(DECODE_ERROR).alias("error"), "key",
        "timestamp", *headers,
    ), "stage_dead_letters", jdbc)


def records_by_partition(values: Mapping[str, Any], partition_keys: list[tuple[str, int]]) -> dict[str, int]:
    """Records read per source partition, `topic[p]` -> count, from the per-partition counters of `read_metrics`."""
    return {str(TopicPartition(t, p)): int(values.get(PARTITION_COUNTER.format(i)) or 0)
            for i, (t, p) in enumerate(partition_keys)}


def planned_by_partition(ranges: list[OffsetRange]) -> dict[str, int]:
    """Offsets the ranges hold per source partition, `topic[p]` -> count: the most records a read of them returns."""
    planned: Counter[str] = Counter()
    for r in ranges:
        planned[str(r.tp)] += r.size
    return dict(planned)


def records_read(
    observed: int, planned: Mapping[str, int], counted: Mapping[str, int] | None
) -> dict[str, int] | None:
    """The exact records read per source partition, or None when only a count per partition can tell.

    A read returns each offset of its ranges at most once, so no partition yields more records than its ranges
    hold; when the total read equals the total planned, every partition therefore yielded exactly its ranges,
    and no per-partition counter is needed. Fewer records mean holes (transaction markers, aborted or compacted
    records): then `counted` (per-partition counts of the same pass, or of a second read of the same ranges,
    where records can only have been removed since) must add up to the total observed, which makes each of them
    exact too. Anything else is a read the ledger cannot vouch for (StageFailedError, retried)."""
    total = sum(planned.values())
    if counted is None:
        if observed == total:
            return dict(planned)
        if observed < total:
            return None
    elif sum(counted.values()) == observed and all(n <= planned.get(key, 0) for key, n in counted.items()):
        return {key: int(counted.get(key, 0)) for key in planned}
    raise StageFailedError(
        f"The read returned {observed} records for {total} planned offsets"
        + (f", and {sum(counted.values())} when counted per partition" if counted is not None else "")
        + ": the counts do not add up, so the ledger cannot vouch for them.",
        fix="Nothing was committed; the retry reads the same ranges again. If it recurs, compaction or retention "
            "is removing records while the batch reads them: read further behind the log end.")


def count_records_read(
    source: DataFrame, ranges: list[OffsetRange], partition_keys: list[tuple[str, int]], values: Mapping[str, Any],
    *, counted_in_pass: bool,
) -> dict[str, int]:
    """The exact records read per source partition (`records_read`), from the pass's metrics (`values`), counted
    in a second read of `source` (the same ranges) when the pass had holes and no per-partition counters."""
    observed = int(values.get("records") or 0)
    planned = planned_by_partition(ranges)
    counted = records_by_partition(values, partition_keys) if counted_in_pass else None
    exact = records_read(observed, planned, counted)
    if exact is not None:
        return exact
    started = time.monotonic()
    rows = source.groupBy("topic", "partition").count()
    again = {str(TopicPartition(row["topic"], row["partition"])): int(row["count"]) for row in rows.collect()}
    exact = records_read(observed, planned, again)
    assert exact is not None
    log.info("  %s of %s planned offsets were records (the rest: transaction markers, aborted or compacted "
             "records); counted per partition in a second read (%.1fs)", observed, sum(planned.values()),
             time.monotonic() - started)
    return exact
