"""Pure planning (ledger positions + broker offsets + policy -> offset ranges; no I/O) by job: the scheduled batches
(`scheduled`), data loss (`data_loss`), the ledger's audit (`audit`) and the sub-ranges of a backfill (`backfill`)."""

from microbatch.planning.audit import find_holes, find_overlaps
from microbatch.planning.backfill import (
    BackfillPlan,
    FillPlan,
    ReplayPlan,
    layers,
    open_overlaps,
    plan_backfill_batches,
    plan_fill,
    plan_replay,
    refuse_open_overlaps,
    subtract,
)
from microbatch.planning.data_loss import data_loss_at_read, lost_ranges
from microbatch.planning.scheduled import (
    RunPlan,
    check_specific_offsets,
    defer_reason,
    disappeared_topics,
    follow_on_plans,
    plan_batch,
    plan_ranges,
    plan_run,
    resolve_starts,
    spark_splits,
    split_budget,
    startup_offset,
)

__all__ = [
    "BackfillPlan", "FillPlan", "ReplayPlan", "RunPlan", "check_specific_offsets", "data_loss_at_read",
    "defer_reason", "disappeared_topics", "find_holes", "find_overlaps", "follow_on_plans", "layers", "lost_ranges",
    "open_overlaps", "plan_backfill_batches", "plan_batch", "plan_fill", "plan_ranges", "plan_replay", "plan_run",
    "refuse_open_overlaps", "resolve_starts", "spark_splits", "split_budget", "startup_offset", "subtract",
]
