"""The few plain lines each task ends with, so an operator knows what a run did without the code."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from microbatch.types import micros_time

if TYPE_CHECKING:
    from microbatch.phases.backfill import BackfillOutcome
    from microbatch.phases.plan import PlanOutcome
    from microbatch.phases.results import CommitResult, PublishResult, StageResult


_LAG_LINES = 64


def log_plan_summary(log: logging.Logger, pipeline: str, outcome: PlanOutcome) -> None:
    """What plan decided: the batch and its ranges, new partitions and how they start, gaps, disappeared
    topics, and the lag per partition and in total."""
    plan = outcome.plan
    if plan is not None:
        for tp in plan.new_partitions:
            log.info("  new partition %s: starts at %s (%s)", tp, plan.starts.get(tp), plan.startup.get(tp, "startup"))
        for gap in plan.gaps:
            log.warning("  gap recorded %s[%s] [%s, %s): %s", gap.topic, gap.partition, gap.start, gap.end, gap.reason)
        for topic in plan.disappeared_topics:
            log.warning("  topic %s has disappeared from the cluster or the pattern; its ledger rows are kept", topic)
    if outcome.batch_id is None:
        if plan is not None and plan.deferred:
            log.info("plan %s: no batch yet: %s (%.2fs); the rest of this run is skipped", pipeline, plan.deferred,
                     outcome.seconds)
        else:
            log.info("plan %s: nothing new to read (%.2fs); the rest of this run is skipped", pipeline,
                     outcome.seconds)
    else:
        verb = "reusing open batch" if outcome.reused else "planned batch"
        ids = outcome.batch_ids
        named = f" {ids[0]}" if len(ids) == 1 else f"es {ids[0]}-{ids[-1]} ({len(ids)} batches, in order)"
        log.info("plan %s: %s%s, %s records in %s range(s) (%.2fs)", pipeline, verb, named,
                 outcome.records, len(outcome.ranges), outcome.seconds)
        for r in outcome.ranges:
            lag = outcome.latest.get(r.tp, r.end) - r.end
            log.info("  %s: %s records, lag after this batch %s", r, r.size, lag)
    if plan is not None and plan.backlog:
        after = plan.lag_after_by_partition()
        shown = list(after.items())
        if len(shown) > _LAG_LINES:  # thousands of partitions: the largest lags, then the total
            shown = sorted(shown, key=lambda item: (-item[1], item[0]))[:_LAG_LINES]
            log.info("  lag of the %s partitions furthest behind (of %s):", _LAG_LINES, len(after))
        for tp, lag in shown:
            log.info("  lag %s: %s behind latest offset %s (%s before this plan)", tp, lag, outcome.latest.get(tp),
                     plan.backlog.get(tp, 0))
        log.info("  lag total: %s offset(s) over %s partition(s) after this plan", sum(after.values()), len(after))


def log_stage_summary(log: logging.Logger, result: StageResult) -> None:
    log.info("stage batch %s attempt %s: read %s records, staged %s, %s dead letter(s), %s late record(s) "
             "(read + transform + staging write %.2fs, dead/late rows %.2fs)", result.batch_id, result.attempt,
             result.records,
             ", ".join(f"{n} rows to {s}" for s, n in result.rows_by_sink.items()), result.dead_letters,
             result.late_records,
             result.timings.get("read_s", 0.0), result.timings.get("stage_write_s", 0.0))
    for partition, count in sorted(result.records_by_partition.items()):
        log.info("  %s: %s records read", partition, count)
    if result.decode:
        formats = result.decode.get("formats", {})
        deleted = result.decode.get("tombstones_deleted") or []
        kept = result.decode.get("tombstones_kept") or []
        rule = "; ".join(filter(None, [f"staged as deletes of their keys in {', '.join(deleted)}" if deleted else "",
                                       f"kept as rows in {', '.join(kept)}" if kept else ""]))
        log.info("  decoded the key as %s and the value as %s in the read: %s record(s) did not decode (dead letters "
                 "with the reason), %s tombstone(s) %s",
                 formats.get("key", {}).get("format", "raw"), formats.get("value", {}).get("format", "raw"),
                 result.decode.get("undecodable", 0), result.decode.get("tombstones", 0),
                 f"{rule}, skipped by every other sink" if rule else "skipped (no sink is keyed by the record key)")
        for side, pins in formats.items():
            if "subject" in pins:
                log.info("  %s: subject '%s', reader schema version %s (id %s), writer schema id(s) met %s", side,
                         pins["subject"], pins["version"], pins["reader_id"], pins.get("writers", []))


def log_commit_summary(log: logging.Logger, pipeline: str, result: CommitResult) -> None:
    if result.already_committed:
        log.info("commit %s: batch %s was already committed; nothing to do (retry no-op)", pipeline, result.batch_id)
        return
    log.info("commit %s: batch %s attempt %s committed in %.3fs: %s, %s dead letter(s)", pipeline, result.batch_id,
             result.attempt, result.seconds,
             ", ".join(f"{n} rows merged into {s}" for s, n in result.rows_by_sink.items()), result.dead_letters)
    for original, replaced in result.replaced:
        log.info("  replaced %s of batch %s (kept for the audit, superseded by batch %s)", replaced, original,
                 result.batch_id)
    for sink, rows in result.retracted_rows.items():
        log.info("  retracted the old contribution from %s rows of %s", rows, sink)
    for move in result.moves:
        before = "new" if move.before is None else move.before
        log.info("  position %s: %s -> %s", move.tp, before, move.after)
    if result.late_records:
        log.warning("  %s late record(s) kept in late_records: their window was already final", result.late_records)
    if result.watermark_after is not None and result.watermark_after == result.watermark_before:
        log.info("  watermark %s (unchanged)", _micros(result.watermark_after))
    elif result.watermark_after is not None:
        log.info("  watermark %s -> %s", _micros(result.watermark_before), _micros(result.watermark_after))
    for sink, (first, last) in result.outbox.items():
        log.info("  %s %s: outbox %s seq %s..%s", last - first + 1, result.outbox_labels.get(sink, "record(s)"),
                 sink, first, last)


def _micros(value: int | None) -> str:
    """A state's time for the task log; one past year 9999 as its number (a log line never fails the task)."""
    if value is None:
        return "none"
    moment = micros_time(value)
    return moment.isoformat() if moment else f"{value} µs since 1970 (past year 9999)"


def log_publish_summary(log: logging.Logger, pipeline: str, result: PublishResult) -> None:
    if not result.records:
        log.info("publish %s/%s: nothing to publish; %s holds every sequence up to %s (%.2fs)", pipeline,
                 result.sink, result.topic, result.last_seq, result.seconds)
        return
    log.info("publish %s/%s: sequences %s..%s (%s records) to %s in %s transaction(s) (%.2fs)", pipeline,
             result.sink, result.first_seq, result.last_seq, result.records, result.topic, result.transactions,
             result.seconds)


def log_backfill_plan(log: logging.Logger, pipeline: str, outcome: BackfillOutcome) -> None:
    params = outcome.params
    log.info("backfill %s: mode %s%s, topic %s, requested %s", pipeline, params.mode,
             " (dry run: nothing is written)" if params.dry_run else "", params.topic,
             ", ".join(str(r) for r in outcome.requests) or "nothing")
    replay = outcome.replay
    if replay is not None:
        for requested, replayed in replay.widened:
            log.info("  widened %s to whole committed batches: %s", requested, replayed)
        if replay.whole_batches:
            log.info("  added %s range(s) of other partitions: a sink keeps one contribution per batch "
                     "(contributions: per_batch), so each batch is replayed whole", len(replay.whole_batches))
        for c in replay.replace:
            log.info("  to replay %s: %s records, replacing the contribution of batch %s", c.range, c.range.size,
                     c.batch_id)
        for sink, (rows, low, high) in outcome.affected_rows.items():
            log.info("  affected %s: %s row contribution(s) retracted and recomputed, windows %s .. %s", sink, rows,
                     low, high)
        if outcome.batch_ids:
            log.info("  %s records in replay batch(es) %s (one per original batch)", replay.records,
                     ", ".join(str(b) for b in outcome.batch_ids))
        return
    for r in outcome.plan.todo:
        log.info("  to fill %s: %s records", r, r.size)
    for r in outcome.plan.already_committed:
        log.info("  already committed, skipped %s", r)
    for r in outcome.plan.ahead_of_position:
        log.info("  at or after the scheduled position, left to the scheduled runs %s", r)
    if outcome.batch_ids:
        log.info("  %s records in backfill batch(es) %s", outcome.plan.records,
                 ", ".join(str(b) for b in outcome.batch_ids))
