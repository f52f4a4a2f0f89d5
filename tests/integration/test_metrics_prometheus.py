"""The ledger's metrics, scraped by a real Prometheus server (Debian's `prometheus`, started here on loopback)
from the exporter of `microbatch metrics`; PromQL must return what the test committed, counted here."""

from __future__ import annotations

import json
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import text

from microbatch.config import find_spec
from microbatch.dev.process import free_port, wait_until
from microbatch.ledger import repository as repo
from microbatch.ledger.database import transaction
from microbatch.phases.commit import commit_batch
from microbatch.settings import MetricsSettings, metrics_settings
from microbatch.telemetry import start
from microbatch.types import OffsetRange, Plan

pytestmark = pytest.mark.integration
PROMETHEUS = "/usr/bin/prometheus"  # `make prometheus` installs Debian's package
SPEC = find_spec("ip_count")
DASHBOARD = Path(__file__).resolve().parents[2] / "docs" / "grafana" / "microbatch-dashboard.json"
HIDDEN_LABELS = {"__name__", "job", "instance", "otel_scope_name", "otel_scope_version"}


def commit(url: str, ranges: tuple[OffsetRange, ...], by_partition: dict[str, int], dead: int,
           timings: dict[str, float]) -> None:
    with transaction(url) as session:
        pipeline = repo.ensure_pipeline(session, SPEC, lock=True)
        batch_id = repo.insert_batch(session, pipeline, Plan(ranges=ranges)).id
    with transaction(url) as session:
        attempt = repo.begin_attempt(session, batch_id)
    with transaction(url) as session:
        counts = {"records": sum(by_partition.values()), "records_by_partition": by_partition, "rows_by_sink": {},
                  "dead_letters": dead, "late_records": 0}
        repo.record_staged(session, batch_id, attempt, counts, {}, timings)
    with transaction(url) as session:
        commit_batch(session, SPEC, batch_id)
        pid = pipeline.id
        for r in ranges:  # what a plan saw: the lag before the batch
            session.execute(text(
                "INSERT INTO lag_snapshots (pipeline_id, batch_id, topic, partition, start_offset, latest_offset, "
                "lag, lag_after) VALUES (:p, :b, :t, :n, :s, :l, :lag, 0)"),
                {"p": pid, "b": batch_id, "t": r.topic, "n": r.partition, "s": r.start, "l": r.end + 5,
                 "lag": r.end - r.start + 5 * r.partition})


@pytest.fixture
def prometheus(tmp_path: Path) -> Iterator[tuple[str, int]]:
    """Prometheus on a free loopback port, scraping the exporter's port every second."""
    exporter_port, port = free_port(), free_port()
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
        "scrape_configs:\n"
        f"  - job_name: microbatch\n    static_configs: [{{targets: ['127.0.0.1:{exporter_port}']}}]\n")
    log = (tmp_path / "prometheus.log").open("w")
    process = subprocess.Popen([PROMETHEUS, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                                f"--web.listen-address=127.0.0.1:{port}"], stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_until(lambda: _get(f"http://127.0.0.1:{port}/-/ready") is not None, 60, "Prometheus",
                   tmp_path / "prometheus.log")
        yield f"http://127.0.0.1:{port}", exporter_port
    finally:
        process.terminate()
        process.wait(30)


def _get(url: str) -> bytes | None:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.read()
    except OSError:
        return None


def promql(base: str, query: str) -> dict[str, float]:
    """An instant query: {the series' labels, as "k=v,...": value}."""
    body = _get(f"{base}/api/v1/query?query={urllib.parse.quote(query)}")
    assert body is not None
    result = json.loads(body)["data"]["result"]
    return {",".join(f"{k}={v}" for k, v in sorted(r["metric"].items()) if k not in HIDDEN_LABELS):
            float(r["value"][1]) for r in result}


def test_prometheus_scrapes_the_ledgers_metrics(ledger_url, prometheus):
    base, exporter_port = prometheus
    commit(ledger_url, (OffsetRange("src", 0, 0, 40), OffsetRange("src", 1, 0, 25)), {"src[0]": 38, "src[1]": 25},
           dead=2, timings={"read_s": 1.5, "stage_write_s": 0.5})
    commit(ledger_url, (OffsetRange("src", 0, 40, 70), OffsetRange("src", 1, 25, 30)), {"src[0]": 30, "src[1]": 4},
           dead=1, timings={"read_s": 1.0, "stage_write_s": 0.25})
    with transaction(ledger_url) as session:
        # What the commit wrote for the sinks, as a commit with staged rows records it: rows per sink, and
        # three outbox rows of which the publisher has published two.
        session.execute(text("UPDATE batches SET counts = counts || '{\"rows_by_sink\": {\"ip_counts\": 10}}'"))
        session.execute(text("INSERT INTO outbox (pipeline_id, sink, seq, batch_id, key, value) "
                             "SELECT pipeline_id, 'ip_count_sink', s, id, 'k', '{}' FROM batches "
                             "CROSS JOIN generate_series(1, 3) s WHERE id = (SELECT min(id) FROM batches)"))
        session.execute(text("INSERT INTO publish_progress (pipeline_id, sink, last_seq) "
                             "SELECT pipeline_id, 'ip_count_sink', 2 FROM pipelines p JOIN batches b "
                             "ON b.pipeline_id = p.id LIMIT 1"))
    with transaction(ledger_url) as session:  # the oracle: the latest snapshot of each partition, by id
        latest_lag = dict(session.execute(text(
            "SELECT DISTINCT ON (partition) 'partition=' || partition || ',pipeline=ip_count,topic=src', lag "
            "FROM lag_snapshots ORDER BY partition, id DESC")).all())
    settings = MetricsSettings(port=exporter_port)
    provider = start(lambda: ledger_url, settings)
    try:
        def scraped() -> bool:
            return promql(base, "sum(microbatch_records_read_total)") == {"": 97.0}
        wait_until(scraped, 60, "Prometheus to scrape the exporter")
        assert promql(base, 'sum by (partition) (microbatch_records_read_total{pipeline="ip_count"})') == {
            "partition=0": 68.0, "partition=1": 29.0}
        assert promql(base, "microbatch_lag") == {k: float(v) for k, v in latest_lag.items()}
        assert promql(base, "sum(microbatch_dead_letters_total)") == {"": 3.0}
        assert promql(base, 'sum(microbatch_batches_total{state="committed"})') == {"": 2.0}
        assert promql(base, 'microbatch_step_seconds_total{step="read"}') == {
            "batch_kind=scheduled,pipeline=ip_count,step=read": 2.5}
        assert promql(base, "sum by (sink) (microbatch_rows_staged_total)") == {"sink=ip_counts": 20.0}
        assert promql(base, "microbatch_records_published_total") == {"pipeline=ip_count,sink=ip_count_sink": 2.0}
        assert promql(base, "microbatch_outbox_backlog") == {"pipeline=ip_count,sink=ip_count_sink": 1.0}
        check_dashboard(base)
        # No label carries a secret: the ledger URL's password appears nowhere in what Prometheus holds.
        exported = _get(f"http://127.0.0.1:{exporter_port}/metrics") or b""
        password = ledger_url.split("://", 1)[1].split("@", 1)[0].split(":")[-1]
        assert password and password.encode() not in exported
    finally:
        provider.shutdown()


def check_dashboard(base: str) -> None:
    """Every query of the Grafana dashboard in the docs finds its series in this Prometheus (the names and
    labels it uses are the exporter's), for the pipeline picked in its variable."""
    dashboard = json.loads(DASHBOARD.read_text())
    [variable] = dashboard["templating"]["list"]
    assert variable["query"] == "label_values(microbatch_batches_total, pipeline)"
    assert set(promql(base, "count by (pipeline) (microbatch_batches_total)")) == {"pipeline=ip_count"}
    exprs = [t["expr"].replace("$pipeline", "ip_count") for p in dashboard["panels"] for t in p["targets"]]
    assert len(exprs) >= 9
    for expr in exprs:
        deadline = time.monotonic() + 30  # rate() needs two scrapes of a series
        while not (found := promql(base, expr)) and time.monotonic() < deadline:
            time.sleep(1)
        assert found, f"the dashboard's query finds no series: {expr}"


def test_metrics_settings_are_one_sentence():
    assert metrics_settings({}).port == 9464 and metrics_settings({}).host == "127.0.0.1"
    assert metrics_settings({"MICROBATCH_METRICS_EXPORTER": "otlp"}).exporter == "otlp"
    with pytest.raises(Exception, match="MICROBATCH_METRICS_PORT is not valid"):
        metrics_settings({"MICROBATCH_METRICS_PORT": "ninety"})
