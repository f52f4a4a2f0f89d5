"""The job of a SQL pipeline (no `job` in the spec): each sink's query over the view `records`, as a `SparkJob`.

`parse` adds the declared event time and the `late` flag (the watermark of `microbatch/event_time.py`, in the
pipeline state); a record whose event time column is null is a dead letter. `outputs` runs each sink's checked and
rewritten query (`microbatch/sql.py`) over the rows it is given, built from the query's parts with the DataFrame
API: neither a named view (on a Spark Connect server a view is resolved when the plan runs, so the two calls of
`outputs` a batch may make, on-time rows and every valid row for sinks with `include_late`, would both read the
last view registered) nor `spark.sql` with a DataFrame argument (whose plan hides the read's observations from the
Connect client).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from microbatch.config import PipelineSpec
from microbatch.event_time import watermark_after, watermark_metrics, with_late
from microbatch.sql import SinkQuery
from microbatch.transform import ERROR_COLUMN, EVENT_TIME_COLUMN, LATE_COLUMN


class SqlJob:
    """Implements `microbatch.transform.SparkJob` for a spec whose sinks give SQL."""

    def __init__(self, spec: PipelineSpec) -> None:
        self.spec = spec
        self.queries = spec.sink_queries()

    def parse(self, records: DataFrame, options: Mapping[str, Any], state: Mapping[str, Any]) -> DataFrame:
        kept = [c for c in records.columns if c not in (EVENT_TIME_COLUMN, ERROR_COLUMN, LATE_COLUMN)]
        declared = self.spec.event_time
        if declared is None:
            return records.select(*kept, F.lit(None).cast("timestamp").alias(EVENT_TIME_COLUMN),
                                  F.lit(None).cast("string").alias(ERROR_COLUMN), F.lit(False).alias(LATE_COLUMN))
        event_time = F.col(declared.column).cast("timestamp")
        error = F.when(event_time.isNull(), F.lit(f"the event time column '{declared.column}' is null"))
        checked = records.select(*kept, event_time.alias(EVENT_TIME_COLUMN), error.alias(ERROR_COLUMN))
        return with_late(checked, declared.window_seconds, state, options)

    def state_metrics(self, options: Mapping[str, Any]) -> dict[str, Column]:
        return watermark_metrics() if self.spec.event_time is not None else {}

    def next_state(
        self, state: Mapping[str, Any], metrics: Mapping[str, Any], options: Mapping[str, Any]
    ) -> dict[str, Any]:
        if self.spec.event_time is None:
            return dict(state)
        return watermark_after(state, metrics.get("max_event_time"), options)

    def outputs(
        self, parsed: DataFrame, options: Mapping[str, Any], state: Mapping[str, Any]
    ) -> dict[str, DataFrame]:
        return {name: query_rows(parsed, query) for name, query in self.queries.items()}


def query_rows(rows: DataFrame, query: SinkQuery) -> DataFrame:
    """`query` over `rows`, built with the DataFrame API from its checked parts (`F.expr` of each), so that the
    plan stays the stage's own: a plan that `spark.sql` builds over a DataFrame argument hides, on Spark Connect,
    the observations of the read it reads from."""
    if query.where is not None:
        rows = rows.where(F.expr(query.where))
    select = [F.expr(expression).alias(name) for expression, name in query.select]
    if not query.group_by:
        return rows.select(*select)
    grouped = rows.groupBy(*[F.expr(g).alias(f"_group_{i}") for i, g in enumerate(query.group_by)])
    return grouped.agg(*select).select(*[name for _, name in query.select])
