"""The few plain lines each task ends with, so an operator knows what a run did without the code."""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from microbatch.commit import CommitResult
    from microbatch.planner import PlanOutcome
    from microbatch.publisher import PublishResult
    from microbatch.staging import StageResult


def log_plan_summary(log: logging.Logger, pipeline: str, outcome: PlanOutcome) -> None:
    if outcome.batch_id is None:
        log.info("plan %s: nothing new to read (%.2fs); the rest of this run is skipped", pipeline, outcome.seconds)
        return
    verb = "reusing open batch" if outcome.reused else "planned batch"
    log.info("plan %s: %s %s, %s records in %s range(s) (%.2fs)", pipeline, verb, outcome.batch_id,
             outcome.records, len(outcome.ranges), outcome.seconds)
    for r in outcome.ranges:
        lag = outcome.latest.get(r.tp, r.end) - r.end
        log.info("  %s: %s records, lag after this batch %s", r, r.size, lag)
    if outcome.plan is not None:
        for tp in outcome.plan.new_partitions:
            log.info("  new partition %s: started by source.startup", tp)
        for gap in outcome.plan.gaps:
            log.warning("  gap recorded %s[%s] [%s, %s): %s", gap.topic, gap.partition, gap.start, gap.end, gap.reason)


def log_stage_summary(log: logging.Logger, result: StageResult) -> None:
    log.info("stage batch %s attempt %s: read %s records, staged %s, %s dead letter(s), %s late record(s) "
             "(read %.2fs, write %.2fs)", result.batch_id, result.attempt, result.records,
             ", ".join(f"{n} rows to {s}" for s, n in result.rows_by_sink.items()), result.dead_letters,
             result.late_records,
             result.timings.get("read_s", 0.0), result.timings.get("stage_write_s", 0.0))
    for partition, count in sorted(result.records_by_partition.items()):
        log.info("  %s: %s records read", partition, count)


def log_commit_summary(log: logging.Logger, pipeline: str, result: CommitResult) -> None:
    if result.already_committed:
        log.info("commit %s: batch %s was already committed; nothing to do (retry no-op)", pipeline, result.batch_id)
        return
    log.info("commit %s: batch %s attempt %s committed in %.3fs: %s, %s dead letter(s)", pipeline, result.batch_id,
             result.attempt, result.seconds,
             ", ".join(f"{n} rows merged into {s}" for s, n in result.rows_by_sink.items()), result.dead_letters)
    for move in result.moves:
        before = "new" if move.before is None else move.before
        log.info("  position %s: %s -> %s", move.tp, before, move.after)
    if result.late_records:
        log.warning("  %s late record(s) kept in late_records: their window was already final", result.late_records)
    if result.watermark_after is not None:
        log.info("  watermark %s -> %s", _micros(result.watermark_before), _micros(result.watermark_after))
    for sink, (first, last) in result.outbox.items():
        log.info("  %s window(s) became final: outbox %s seq %s..%s", last - first + 1, sink, first, last)


def _micros(value: int | None) -> str:
    if value is None:
        return "none"
    return datetime.fromtimestamp(value / 1_000_000, tz=UTC).isoformat()


def log_publish_summary(log: logging.Logger, pipeline: str, result: PublishResult) -> None:
    if not result.records:
        log.info("publish %s/%s: nothing to publish; %s holds every sequence up to %s (%.2fs)", pipeline,
                 result.sink, result.topic, result.last_seq, result.seconds)
        return
    log.info("publish %s/%s: sequences %s..%s (%s records) to %s in %s transaction(s) (%.2fs)", pipeline,
             result.sink, result.first_seq, result.last_seq, result.records, result.topic, result.transactions,
             result.seconds)
