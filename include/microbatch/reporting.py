"""The few plain lines each task ends with, so an operator knows what a run did without the code."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from microbatch.commit import CommitResult
    from microbatch.planner import PlanOutcome
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
    log.info("stage batch %s attempt %s: read %s records, staged %s, %s dead letter(s) (read %.2fs, write %.2fs)",
             result.batch_id, result.attempt, result.records,
             ", ".join(f"{n} rows to {s}" for s, n in result.rows_by_sink.items()), result.dead_letters,
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
