"""Read-only views of the ledger for operators, under their old names: each lives in a module of `ledger/views/`
by what it serves (status, history, sinks, charts, metrics, dead letters), and this module re-exports them all
(`queries.X` keeps working)."""

from __future__ import annotations

from microbatch.ledger.views.charts import (
    CHART_BUCKETS,
    CHART_RANGES,
    STEP_KEYS,
    STEP_NAMES,
    BatchPoint,
    ChartData,
    LagPoint,
    bucket_seconds,
    chart_data,
    last_activity,
    range_showing,
    step_seconds_text,
)
from microbatch.ledger.views.dead_letters import DeadLetterView, dead_letters
from microbatch.ledger.views.history import (
    BatchRange,
    BatchSummary,
    GapSummary,
    OffsetOwner,
    _batches,
    backfill_batches,
    batch_history,
    find_offset,
    recorded_gaps,
    to_dict,
)
from microbatch.ledger.views.metrics import _METRIC_QUERIES, MetricRow, metric_rows
from microbatch.ledger.views.sinks import PublishedView, SinkView, published_view, sink_view
from microbatch.ledger.views.status import PartitionStatus, partition_status, pipeline_id, pipeline_names

__all__ = [
    "CHART_BUCKETS", "CHART_RANGES", "STEP_KEYS", "STEP_NAMES", "_METRIC_QUERIES", "BatchPoint", "BatchRange",
    "BatchSummary", "ChartData", "DeadLetterView", "GapSummary", "LagPoint", "MetricRow", "OffsetOwner",
    "PartitionStatus", "PublishedView", "SinkView", "_batches", "backfill_batches", "batch_history", "bucket_seconds",
    "chart_data", "dead_letters", "find_offset", "last_activity", "metric_rows", "partition_status", "pipeline_id",
    "pipeline_names", "published_view", "range_showing", "recorded_gaps", "sink_view", "step_seconds_text", "to_dict",
]
