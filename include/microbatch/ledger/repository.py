"""Ledger reads and writes, under their old names: each lives in the module of its aggregate, and this module
re-exports them all (`repository.X` keeps working). Every function takes the caller's session and never commits:
the caller owns the one transaction (plan, stage bookkeeping, or the commit).

- `pipelines`: the pipeline's row; `positions`: its positions (every write to `positions` is there);
- `batches`: a batch's rows and its lifecycle; `attempts`: the stage's attempt; `commit_writes`: the commit's writes;
- `ranges`: reads of committed and open ranges and gaps; `plans`: what a scheduled run's or a backfill's plan reads
  and writes; `lag`: lag snapshots; `registry_schemas`: the schemas kept; `outbox`: the outbox and its publisher."""

from __future__ import annotations

from microbatch.ledger.attempts import (
    _stage_state_before,
    begin_attempt,
    begin_stage,
    last_read_had_holes,
    record_staged,
)
from microbatch.ledger.batches import (
    abandon_batch,
    abandon_followers,
    abandon_open_batch,
    batch_gaps,
    batch_ranges,
    batch_states,
    find_open_batches,
    get_batch,
    insert_batch,
    open_batch_ids,
    open_predecessor,
    record_failure,
)
from microbatch.ledger.commit_writes import (
    clear_staged_bad_records,
    commit_ranges,
    lock_ranges,
    mark_committed,
    move_staged_bad_records,
    partly_superseded_batch,
    supersede_ranges,
)
from microbatch.ledger.lag import LAG_PRUNE_EVERY, LAG_RETENTION_DAYS, latest_lag, prune_lag_snapshots, record_lag
from microbatch.ledger.outbox import (
    _COORDINATES,
    _NEXT_SEQ,
    _RETRACTION,
    OUTBOX_CORRECTION,
    add_publish_seconds,
    append_outbox,
    outbox_insert_sql,
    outbox_row_changes_sql,
    pending_outbox,
    publish_bounds,
    record_publish_progress,
)
from microbatch.ledger.pipelines import ensure_pipeline, get_pipeline, pipeline_state, pipeline_uid
from microbatch.ledger.plans import (
    batches_without_contributions,
    insert_backfill_batches,
    read_backfill_ledger,
    read_planning_ledger,
    record_run,
    seconds_since_last_batch,
)
from microbatch.ledger.positions import (
    advance_position,
    known_positions,
    pin_new_positions,
    read_positions,
    reset_position,
)
from microbatch.ledger.ranges import (
    committed_beyond,
    committed_gaps,
    committed_range_rows,
    committed_ranges,
    open_ranges,
)
from microbatch.ledger.registry_schemas import kept_schemas, record_schemas

__all__ = [
    "LAG_PRUNE_EVERY", "LAG_RETENTION_DAYS", "OUTBOX_CORRECTION", "_COORDINATES", "_NEXT_SEQ", "_RETRACTION",
    "_stage_state_before", "abandon_batch", "abandon_followers", "abandon_open_batch", "add_publish_seconds",
    "advance_position", "append_outbox", "batch_gaps", "batch_ranges", "batch_states", "batches_without_contributions",
    "begin_attempt", "begin_stage", "clear_staged_bad_records", "commit_ranges", "committed_beyond", "committed_gaps",
    "committed_range_rows", "committed_ranges", "ensure_pipeline", "find_open_batches", "get_batch", "get_pipeline",
    "insert_backfill_batches", "insert_batch", "kept_schemas", "known_positions", "last_read_had_holes", "latest_lag",
    "lock_ranges", "mark_committed", "move_staged_bad_records", "open_batch_ids", "open_predecessor", "open_ranges",
    "outbox_insert_sql", "outbox_row_changes_sql", "partly_superseded_batch", "pending_outbox", "pin_new_positions",
    "pipeline_state", "pipeline_uid", "prune_lag_snapshots", "publish_bounds", "read_backfill_ledger",
    "read_planning_ledger", "read_positions", "record_failure", "record_lag", "record_publish_progress", "record_run",
    "record_schemas", "record_staged", "reset_position", "seconds_since_last_batch", "supersede_ranges",
]
