"""How a sink counts the rows it holds per committed batch, for `microbatch verify` (`Sink.live_rows`).

An append sink's row carries its record's source coordinates (topic, partition, offset), so the rows a batch put
there are the rows whose coordinates fall in the batch's ranges: that count survives compaction (Delta's OPTIMIZE,
Iceberg's rewrites) and any later reorganisation, and it drops when rows are lost. A Postgres table counts them in
SQL; a lakehouse table reads only its three coordinate columns into Arrow and counts them here."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from sqlalchemy import text
from sqlalchemy.orm import Session

from microbatch.types import OffsetRange

if TYPE_CHECKING:
    import pyarrow as pa


def no_coordinates() -> pa.Table:
    """The coordinates of a table that has no rows (or no table): what `count_in_ranges` counts nothing in."""
    import pyarrow as pa

    return pa.table({"topic": pa.array([], pa.string()), "partition": pa.array([], pa.int32()),
                     "offset": pa.array([], pa.int64())})


def count_in_ranges(coordinates: pa.Table, ranges: Mapping[int, Sequence[OffsetRange]]) -> dict[int, int]:
    """The rows of `coordinates` (columns topic, partition, offset) in each batch's ranges: {batch: rows}."""
    import numpy as np
    import pyarrow.compute as pc

    offsets: dict[tuple[str, int], Any] = {}
    for topic, partition in {(r.topic, r.partition) for spans in ranges.values() for r in spans}:
        mask = pc.and_(pc.equal(coordinates["topic"], topic), pc.equal(coordinates["partition"], partition))
        held = pc.filter(coordinates["offset"], mask)
        offsets[(topic, partition)] = np.sort(held.to_numpy()) if len(held) else np.empty(0, dtype=np.int64)
    counts: dict[int, int] = {}
    for batch_id, spans in ranges.items():
        total = 0
        for r in spans:
            held = offsets.get((r.topic, r.partition))
            if held is not None:
                total += int(np.searchsorted(held, r.end, "left") - np.searchsorted(held, r.start, "left"))
        counts[batch_id] = total
    return counts


def count_rows_sql(table: str) -> str:
    """SQL: the rows of `table` (quoted by the caller, with the source coordinates) in each of the ranges bound as
    arrays (:b batch, :t topic, :p partition, :lo start, :hi end), summed per batch."""
    return (
        "SELECT r.b, count(s.\"offset\") FROM unnest(CAST(:b AS bigint[]), CAST(:t AS text[]), CAST(:p AS int[]), "
        "CAST(:lo AS bigint[]), CAST(:hi AS bigint[])) AS r(b, t, p, lo, hi) "
        f"LEFT JOIN {table} s ON s.topic = r.t AND s.\"partition\" = r.p AND s.\"offset\" >= r.lo "
        "AND s.\"offset\" < r.hi GROUP BY r.b"
    )


def ranges_params(ranges: Mapping[int, Sequence[OffsetRange]]) -> dict[str, list[Any]]:
    """The ranges as the arrays `count_rows_sql` and `delete_rows_sql` bind."""
    flat = [(b, r) for b, spans in ranges.items() for r in spans]
    return {"b": [b for b, _ in flat], "t": [r.topic for _, r in flat], "p": [r.partition for _, r in flat],
            "lo": [r.start for _, r in flat], "hi": [r.end for _, r in flat]}


def delete_rows_sql(table: str) -> str:
    """SQL: delete the rows of `table` (quoted by the caller) in the ranges bound as `ranges_params` arrays."""
    return (
        f"DELETE FROM {table} s USING unnest(CAST(:b AS bigint[]), CAST(:t AS text[]), CAST(:p AS int[]), "
        "CAST(:lo AS bigint[]), CAST(:hi AS bigint[])) AS r(b, t, p, lo, hi) "
        "WHERE s.topic = r.t AND s.\"partition\" = r.p AND s.\"offset\" >= r.lo AND s.\"offset\" < r.hi"
    )


def count_rows(session: Session, table: str, ranges: Mapping[int, Sequence[OffsetRange]]) -> dict[int, int]:
    """The rows of the Postgres table `table` (quoted) per batch of `ranges`, by their source coordinates."""
    found = dict(session.execute(text(count_rows_sql(table)), ranges_params(ranges)).tuples().all())
    return {b: int(found.get(b, 0)) for b in ranges}


def count_kept(session: Session, table: str, batches: Sequence[int]) -> dict[int, int]:
    """The rows of the side table `table` (quoted; a `batch_id` column) per batch of `batches`."""
    found = dict(session.execute(text(f"SELECT batch_id, count(*) FROM {table} WHERE batch_id = ANY(:ids) "
                                      "GROUP BY batch_id"), {"ids": list(batches)}).tuples().all())
    return {b: int(found.get(b, 0)) for b in batches}
