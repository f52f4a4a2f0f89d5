"""A sink's table as `microbatch show` prints it, and what a publishing sink has published."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from sqlalchemy import text
from sqlalchemy.orm import Session


@dataclass
class SinkView:
    """A sink table as `microbatch show` prints it: its columns, its first rows, and its totals."""

    columns: list[str]
    rows: list[tuple]
    total_rows: int
    sums: dict[str, Any]
    dead_letters: int
    late_records: int


def sink_view(session: Session, pipeline: int, table: str, order_by: list[str], sum_columns: list[str],
              limit: int) -> SinkView:
    """The first `limit` rows of a sink table in `order_by` order (a column with ` DESC` sorts down), its row
    count and the totals of `sum_columns`, with the pipeline's dead-letter and late-record counts. Names come
    from a validated spec (SQL identifiers)."""
    def quoted(name: str) -> str:
        column, _, direction = name.partition(" ")
        return f'"{column}" {direction}'.strip()

    result = session.execute(text(f'SELECT * FROM "{table}" ORDER BY {", ".join(map(quoted, order_by))} LIMIT :n'),
                             {"n": limit})
    columns, rows = list(result.keys()), [tuple(row) for row in result.all()]
    totals = ", ".join(["count(*)", *(f'coalesce(sum("{c}"), 0)' for c in sum_columns)])
    total_rows, *sums = session.execute(text(f'SELECT {totals} FROM "{table}"')).one()
    dead, late = session.execute(text(
        "SELECT (SELECT count(*) FROM dead_letters WHERE pipeline_id = :p), "
        "(SELECT count(*) FROM late_records WHERE pipeline_id = :p)"), {"p": pipeline}).one()
    return SinkView(columns, rows, total_rows, dict(zip(sum_columns, sums, strict=True)), dead, late)


@dataclass
class PublishedView:
    """What a publishing sink has put in its outbox and what of it its publisher has sent to Kafka."""

    columns: list[str]
    rows: list[tuple[Any, ...]]  # the newest published records, newest first
    written: int  # outbox records the commits wrote
    published: int  # of them, those the publisher has committed to the topic (sequences up to its progress)
    transactions: int  # Kafka transactions the publisher committed


def published_view(session: Session, pipeline: int, sink: str, limit: int) -> PublishedView:
    """The newest `limit` records a publishing sink has published (outbox sequences up to the publisher's
    progress), newest first, and how many the commits wrote and the publisher sent."""
    params = {"p": pipeline, "s": sink, "n": limit}
    last, transactions = session.execute(text(
        "SELECT coalesce(max(last_seq), 0), coalesce(max(transactions), 0) FROM publish_progress "
        "WHERE pipeline_id = :p AND sink = :s"), params).one()
    result = session.execute(text(
        "SELECT seq, batch_id AS batch, key, value, created_at FROM outbox WHERE pipeline_id = :p AND sink = :s "
        "AND seq <= :last ORDER BY seq DESC LIMIT :n"), {**params, "last": last})
    columns = list(result.keys())
    rows = [tuple(json.dumps(v, sort_keys=True) if isinstance(v, dict) else v for v in row) for row in result.all()]
    written = session.execute(text("SELECT count(*) FROM outbox WHERE pipeline_id = :p AND sink = :s"),
                              params).scalar_one()
    return PublishedView(columns, rows, written, min(int(last), written), int(transactions))
