"""The commit's log lines say what they count (issue 45): a kafka sink's outbox rows are the windows that became
final only for an aggregate's scheduled batch; a row sink publishes rows, a backfill or a replay corrections; and a
batch that leaves the watermark where it was says so instead of `watermark X -> X`."""

import logging

import pytest

from microbatch.config import PIPELINES_DIR, load_spec
from microbatch.phases.reporting import log_commit_summary
from microbatch.phases.results import CommitResult
from microbatch.sinks.base import CommitContext
from microbatch.sinks.registry import sinks_of

IP_COUNT = load_spec(PIPELINES_DIR / "ip_count.yaml")
CLICKS = load_spec(PIPELINES_DIR / "clicks.yaml")
KAFKA_SINK = {"ip_count": "ip_count_sink", "clicks": "clicks_out"}


def context(spec, *, backfill: bool = False, replay: bool = False) -> CommitContext:
    return CommitContext(pipeline_id=1, batch_id=7, attempt=1, backfill=backfill or replay, replay=replay,
                         watermark_before=1, watermark_after=1 if backfill or replay else 2, sinks=sinks_of(spec))


@pytest.mark.parametrize(("spec", "kind", "label"), [
    (IP_COUNT, "scheduled", "row(s) of the window(s) that became final"),
    (IP_COUNT, "backfill", "correction(s) of published windows"),
    (IP_COUNT, "replay", "correction(s) of published windows"),
    (CLICKS, "scheduled", "row(s)"),
    (CLICKS, "backfill", "row(s)"),
    (CLICKS, "replay", "correction(s) and retraction(s) of published rows"),
])
def test_a_kafka_sinks_outbox_rows_are_named_by_what_its_source_publishes(spec, kind, label):
    ctx = context(spec, backfill=kind == "backfill", replay=kind == "replay")
    assert ctx.sinks[KAFKA_SINK[spec.name]].outbox_label(ctx) == label


def summary(caplog, result: CommitResult) -> list[str]:
    log = logging.getLogger("test.commit")
    with caplog.at_level(logging.INFO, logger="test.commit"):
        log_commit_summary(log, "clicks", result)
    return [r.getMessage() for r in caplog.records]


def test_the_commit_summary_uses_the_sinks_label_and_says_when_the_watermark_stood_still(caplog):
    moved = summary(caplog, CommitResult(batch_id=7, attempt=1, outbox={"clicks_out": (11, 15)},
                                         outbox_labels={"clicks_out": "row(s)"}, watermark_before=1_000_000,
                                         watermark_after=2_000_000))
    assert "  5 row(s): outbox clicks_out seq 11..15" in moved
    assert "  watermark 1970-01-01T00:00:01+00:00 -> 1970-01-01T00:00:02+00:00" in moved
    assert not any("became final" in line for line in moved)
    caplog.clear()
    replay = summary(caplog, CommitResult(batch_id=8, attempt=1, watermark_before=2_000_000,
                                          watermark_after=2_000_000))
    assert "  watermark 1970-01-01T00:00:02+00:00 (unchanged)" in replay
    assert not any("->" in line and "watermark" in line for line in replay)
