"""The ledger's running totals, one row per metric value, for the metrics exporter."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import text
from sqlalchemy.orm import Session

from microbatch.ledger.models import BatchState


@dataclass
class MetricRow:
    """One value of one metric with its attributes (pipeline, and topic/partition, kind, step or sink)."""

    metric: str
    value: float
    attributes: dict[str, str | int]


_METRIC_QUERIES = {
    # Records each committed batch read, per partition (the stage's count; transaction markers excluded).
    "records_read": "SELECT p.name, b.kind, split_part(e.key, '[', 1), "
                    "CAST(rtrim(split_part(e.key, '[', 2), ']') AS int), sum(CAST(e.value AS bigint)) "
                    "FROM batches b JOIN pipelines p ON p.id = b.pipeline_id "
                    "CROSS JOIN LATERAL jsonb_each_text(coalesce(b.counts->'records_by_partition', '{}')) e "
                    "WHERE b.state = :committed GROUP BY 1, 2, 3, 4",
    "rows_staged": "SELECT p.name, b.kind, e.key, sum(CAST(e.value AS bigint)) "
                   "FROM batches b JOIN pipelines p ON p.id = b.pipeline_id "
                   "CROSS JOIN LATERAL jsonb_each_text(coalesce(b.counts->'rows_by_sink', '{}')) e "
                   "WHERE b.state = :committed GROUP BY 1, 2, 3",
    "bad_records": "SELECT p.name, b.kind, sum(coalesce(CAST(b.counts->>'dead_letters' AS bigint), 0)), "
                   "sum(coalesce(CAST(b.counts->>'late_records' AS bigint), 0)) "
                   "FROM batches b JOIN pipelines p ON p.id = b.pipeline_id WHERE b.state = :committed "
                   "GROUP BY 1, 2",
    "batches": "SELECT p.name, b.kind, b.state, count(*) FROM batches b JOIN pipelines p ON p.id = b.pipeline_id "
               "GROUP BY 1, 2, 3",
    "step_seconds": "SELECT p.name, b.kind, e.key, sum(CAST(e.value AS float8)) "
                    "FROM batches b JOIN pipelines p ON p.id = b.pipeline_id "
                    "CROSS JOIN LATERAL jsonb_each_text(b.timings) e "
                    "WHERE b.state = :committed AND right(e.key, 2) = '_s' AND e.key <> 'stage_total_s' "
                    "GROUP BY 1, 2, 3",
    # The lag each partition had at its latest plan, before that batch read.
    "lag": "SELECT DISTINCT ON (s.pipeline_id, s.topic, s.partition) p.name, s.topic, s.partition, s.lag "
           "FROM lag_snapshots s JOIN pipelines p ON p.id = s.pipeline_id "
           "ORDER BY s.pipeline_id, s.topic, s.partition, s.id DESC",
    "published": "SELECT p.name, o.sink, coalesce(pp.last_seq, 0), max(o.seq) FROM outbox o "
                 "JOIN pipelines p ON p.id = o.pipeline_id LEFT JOIN publish_progress pp "
                 "ON pp.pipeline_id = o.pipeline_id AND pp.sink = o.sink GROUP BY 1, 2, 3",
}


def metric_rows(session: Session) -> list[MetricRow]:
    """Every metric the exporter serves, from the ledger's committed history: totals only grow (a replay's
    superseded batch stays counted: it was read), so they behave as Prometheus counters."""
    rows: list[MetricRow] = []

    def run(name: str) -> list[Any]:
        return list(session.execute(text(_METRIC_QUERIES[name]), {"committed": BatchState.COMMITTED.value}).all())

    for pipeline, kind, topic, partition, value in run("records_read"):
        rows.append(MetricRow("records_read", value, {"pipeline": pipeline, "batch_kind": kind, "topic": topic,
                                                      "partition": partition}))
    for pipeline, kind, sink, value in run("rows_staged"):
        rows.append(MetricRow("rows_staged", value, {"pipeline": pipeline, "batch_kind": kind, "sink": sink}))
    for pipeline, kind, dead, late in run("bad_records"):
        rows.append(MetricRow("dead_letters", dead, {"pipeline": pipeline, "batch_kind": kind}))
        rows.append(MetricRow("late_records", late, {"pipeline": pipeline, "batch_kind": kind}))
    for pipeline, kind, state, value in run("batches"):
        rows.append(MetricRow("batches", value, {"pipeline": pipeline, "batch_kind": kind, "state": state}))
    for pipeline, kind, key, value in run("step_seconds"):
        rows.append(MetricRow("step_seconds", value, {"pipeline": pipeline, "batch_kind": kind,
                                                      "step": key.removesuffix("_s")}))
    for pipeline, topic, partition, value in run("lag"):
        rows.append(MetricRow("lag", value, {"pipeline": pipeline, "topic": topic, "partition": partition}))
    for pipeline, sink, published, highest in run("published"):
        rows.append(MetricRow("records_published", published, {"pipeline": pipeline, "sink": sink}))
        rows.append(MetricRow("outbox_backlog", max(0, highest - published), {"pipeline": pipeline, "sink": sink}))
    return rows
