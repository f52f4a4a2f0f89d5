"""OpenLineage events of committed batches, sent through Airflow's OpenLineage provider to its file transport,
on a real PostgreSQL ledger: each event's offset-range facet equals the ledger's ranges of its batch, and
its outputs carry the rows the batch committed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from microbatch.airflow.lineage import BATCH_FACET, OFFSET_FACET, emit_committed
from microbatch.config import find_spec
from microbatch.ledger import repository as repo
from microbatch.ledger.database import transaction
from microbatch.phases.commit import commit_batch
from microbatch.types import OffsetRange, Plan

pytestmark = pytest.mark.integration
SPEC = find_spec("ip_count")


@pytest.fixture
def file_transport(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The provider configured as an operator would: a file transport and a namespace, in Airflow's settings
    (the provider reads them at each call under pytest, which it detects)."""
    events = tmp_path / "events.jsonl"
    monkeypatch.setenv("AIRFLOW__OPENLINEAGE__TRANSPORT",
                       json.dumps({"type": "file", "log_file_path": str(events), "append": True}))
    monkeypatch.setenv("AIRFLOW__OPENLINEAGE__NAMESPACE", "microbatch-test")
    return events


def commit(url: str, ranges: tuple[OffsetRange, ...]):
    with transaction(url) as session:
        pipeline = repo.ensure_pipeline(session, SPEC, lock=True)
        batch_id = repo.insert_batch(session, pipeline, Plan(ranges=ranges), airflow_run_id="scheduled__x").id
    with transaction(url) as session:
        attempt = repo.begin_attempt(session, batch_id)
    with transaction(url) as session:
        counts = {"records": sum(r.size for r in ranges), "rows_by_sink": {}}
        repo.record_staged(session, batch_id, attempt, counts, {}, {})
    with transaction(url) as session:
        return commit_batch(session, SPEC, batch_id, "manual__y")


def test_each_committed_batch_sends_its_offset_ranges(ledger_url, file_transport):
    results = [commit(ledger_url, (OffsetRange("src", 0, 0, 40), OffsetRange("src", 1, 0, 25))),
               commit(ledger_url, (OffsetRange("src", 0, 40, 70), OffsetRange("src", 1, 25, 30)))]
    for result in results:
        emit_committed(SPEC, result, ledger_url, lambda: "127.0.0.1:9092,127.0.0.1:9093")
    with transaction(ledger_url) as session:  # a retried commit task finds the batch committed: no new event
        again = commit_batch(session, SPEC, results[0].batch_id, "manual__z")
    assert again.already_committed
    emit_committed(SPEC, again, ledger_url, lambda: "unused")
    events = [json.loads(line) for line in file_transport.read_text().splitlines()]
    assert len(events) == 2
    for event, result in zip(events, results, strict=True):
        with transaction(ledger_url) as session:
            truth = sorted((r.partition, r.start, r.end) for r in repo.batch_ranges(session, result.batch_id))
        [source] = event["inputs"]
        assert (source["namespace"], source["name"]) == ("kafka://127.0.0.1:9092", "src")
        facet = source["inputFacets"][OFFSET_FACET]
        assert [(r["partition"], r["start"], r["end"]) for r in facet["ranges"]] == truth
        run = event["run"]["facets"][BATCH_FACET]
        assert (run["batchId"], run["kind"], run["plannedRunId"], run["committedRunId"]) == (
            result.batch_id, "scheduled", "scheduled__x", "manual__y")
        assert event["eventType"] == "COMPLETE" and event["job"] == {
            "namespace": "microbatch-test", "name": "microbatch.ip_count", "facets": {}} | {
            k: v for k, v in event["job"].items() if k == "facets"}
        names = {(o["namespace"].split("://")[0], o["name"].rsplit(".", 1)[-1]): o for o in event["outputs"]}
        assert set(names) == {("postgres", "ip_counts"), ("kafka", "ip_count_sink")}
        for output in event["outputs"]:
            assert output["outputFacets"]["outputStatistics"]["rowCount"] == 0  # this test staged no rows
        assert "password" not in json.dumps(event) and "@" not in json.dumps(event["outputs"])
    assert events[0]["run"]["runId"] != events[1]["run"]["runId"]


def test_nothing_is_built_without_a_transport(ledger_url, monkeypatch):
    for name in ("AIRFLOW__OPENLINEAGE__TRANSPORT", "OPENLINEAGE_URL", "AIRFLOW__OPENLINEAGE__CONFIG_PATH"):
        monkeypatch.delenv(name, raising=False)
    result = commit(ledger_url, (OffsetRange("src", 0, 0, 5),))
    emit_committed(SPEC, result, ledger_url, lambda: pytest.fail("Kafka was resolved for a disabled provider"))
