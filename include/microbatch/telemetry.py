"""Metrics for the tools platform teams already watch: the ledger's figures through the OpenTelemetry SDK, to
Prometheus (a scrape endpoint) or to an OTLP collector (`settings.MetricsSettings`).

Every figure a task log prints is already a row of the ledger, written in the same transaction as the work it
counts: records read per partition, rows staged per sink, dead and late records, each step's seconds, the
lag each plan saw, the outbox and what was published, batches by state. So one long-lived exporter
(`microbatch metrics`, as kafka-lag-exporter or Burrow for lag) reads them at each collection through
observable instruments, instead of each short-lived task process pushing its own: the totals survive task
crashes and restarts, a retried batch is counted once, and a scrape sees every pipeline, whichever worker
ran it. Attributes are the pipeline, the topic and partition, the batch kind, the sink or the step; never a
record's content or a connection's secret.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterable

from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import MetricReader

from microbatch.ledger import queries
from microbatch.ledger.database import transaction
from microbatch.settings import MetricsSettings

log = logging.getLogger(__name__)

# name -> (kind, unit, description); counters only grow, gauges are the latest value.
INSTRUMENTS: dict[str, tuple[str, str, str]] = {
    "records_read": ("counter", "", "Records read by committed batches, per partition"),
    "rows_staged": ("counter", "", "Rows committed to each sink"),
    "dead_letters": ("counter", "", "Malformed records kept as dead letters"),
    "late_records": ("counter", "", "Records behind the watermark, kept in late_records"),
    "batches": ("counter", "", "Batches by state (committed, failed, abandoned, planned, staged)"),
    "step_seconds": ("counter", "s", "Seconds spent in each step (plan, read, stage_write, commit, publish)"),
    "records_published": ("counter", "", "Outbox records published to each Kafka sink's topic"),
    "lag": ("gauge", "", "Records behind the latest offset at the partition's latest plan"),
    "outbox_backlog": ("gauge", "", "Outbox records not yet published"),
}


class LedgerMetrics:
    """Observable instruments over the ledger: one ledger read per collection, shared by all instruments."""

    def __init__(self, ledger_url: Callable[[], str], provider: MeterProvider, max_age_s: float = 1.0) -> None:
        self._ledger_url = ledger_url
        self._max_age_s = max_age_s
        self._lock = threading.Lock()
        self._read_at = 0.0
        self._rows: dict[str, list[queries.MetricRow]] = {}
        meter = provider.get_meter("microbatch")
        for name, (kind, unit, description) in INSTRUMENTS.items():
            create = meter.create_observable_counter if kind == "counter" else meter.create_observable_gauge
            create(f"microbatch.{name}", callbacks=[self._callback(name)], unit=unit, description=description)

    def _callback(self, name: str) -> Callable[[CallbackOptions], Iterable[Observation]]:
        def observe(_options: CallbackOptions) -> Iterable[Observation]:
            return [Observation(row.value, row.attributes) for row in self.rows().get(name, [])]
        return observe

    def rows(self) -> dict[str, list[queries.MetricRow]]:
        """The ledger's metric rows, read again when older than `max_age_s` (a collection calls every
        instrument's callback in turn: they share one read)."""
        with self._lock:
            if time.monotonic() - self._read_at > self._max_age_s:
                try:
                    with transaction(self._ledger_url()) as session:
                        grouped: dict[str, list[queries.MetricRow]] = defaultdict(list)
                        for row in queries.metric_rows(session):
                            grouped[row.metric].append(row)
                    self._rows = dict(grouped)
                except Exception as exc:  # a scrape must answer even while the ledger is down
                    log.warning("metrics: the ledger could not be read (%s); serving the last values",
                                type(exc).__name__)
                self._read_at = time.monotonic()
            return self._rows


def metric_reader(settings: MetricsSettings) -> MetricReader:
    """The SDK reader of the chosen exporter: Prometheus (a scrape endpoint, started here) or OTLP over HTTP."""
    if settings.exporter == "prometheus":
        from opentelemetry.exporter.prometheus import PrometheusMetricReader
        from prometheus_client import start_http_server

        start_http_server(settings.port, addr=settings.host)
        return PrometheusMetricReader()
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
    from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader

    return PeriodicExportingMetricReader(OTLPMetricExporter(), export_interval_millis=settings.interval_s * 1000)


def start(ledger_url: Callable[[], str], settings: MetricsSettings) -> MeterProvider:
    """Start exporting the ledger's metrics (returns the provider; `shutdown()` stops the OTLP export)."""
    provider = MeterProvider(metric_readers=[metric_reader(settings)])
    LedgerMetrics(ledger_url, provider)
    where = (f"http://{settings.host}:{settings.port}/metrics" if settings.exporter == "prometheus"
             else f"OTLP every {settings.interval_s:.0f}s")
    log.info("metrics: serving the ledger's metrics (%s): %s", settings.exporter, where)
    return provider
