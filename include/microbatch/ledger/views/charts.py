"""The ledger page's chart series, bucketed in the database, and the names of a batch's step seconds."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import text
from sqlalchemy.orm import Session

from microbatch.ledger.models import BatchState

CHART_RANGES = {"1h": 3600, "1d": 86_400, "7d": 604_800}
"""The page's time ranges (last hour, day, week), in seconds."""
CHART_BUCKETS = 120
"""Points per series at most: the database sums each range into this many buckets of equal width."""
STEP_KEYS = ("plan_s", "read_s", "stage_write_s", "commit_s", "publish_s")
"""The step seconds a batch records (`batches.timings`), in the order the chart stacks them."""
STEP_NAMES = {"plan_s": "plan", "read_s": "read+stage", "stage_write_s": "dead+late", "commit_s": "commit",
              "publish_s": "publish"}
"""What each step times, as `history`, the ledger page and its chart name it: `read_s` is the Spark job (the read,
the transform and the staging writes of the sinks), `stage_write_s` only the writes of its dead letters and late
records."""


def step_seconds_text(durations: dict[str, Any]) -> str:
    """A batch's step seconds on one line, in the order of the steps, by the names of `STEP_NAMES`
    (`plan=0.4 read+stage=2.1 ...`; a JSONB object keeps its keys in its own order)."""
    keys = [key for key in STEP_KEYS if key in durations] + sorted(set(durations) - set(STEP_KEYS))
    return " ".join(f"{STEP_NAMES.get(key, key.removesuffix('_s'))}={durations[key]}" for key in keys)


@dataclass
class LagPoint:
    at: datetime
    partition: str  # "topic[p]", or "total" for the sum over the pipeline's partitions
    lag: int  # what the last plan in the bucket saw


@dataclass
class BatchPoint:
    at: datetime  # the bucket's start (by commit time)
    batches: int
    records: int
    dead_letters: int
    late_records: int
    records_per_s: float | None  # records / (read + stage write seconds)
    steps: dict[str, float]  # STEP_KEYS -> mean seconds per batch in the bucket


@dataclass
class ChartData:
    range_key: str
    since: datetime
    until: datetime
    bucket_s: int
    lag: list[LagPoint]
    batches: list[BatchPoint]


def last_activity(session: Session) -> dict[str, datetime | None]:
    """Each pipeline's last activity (its newest batch planned or committed, or plan that saw its lag), the most
    recently active first; a pipeline that never planned comes last."""
    rows = session.execute(text(
        "SELECT p.name, greatest((SELECT max(greatest(b.created_at, b.committed_at)) FROM batches b "
        "WHERE b.pipeline_id = p.id), (SELECT max(s.planned_at) FROM lag_snapshots s WHERE s.pipeline_id = p.id)) "
        "AS at FROM pipelines p ORDER BY at DESC NULLS LAST, p.name")).all()
    return {name: at for name, at in rows}


def range_showing(session: Session, last: datetime | None, now: datetime | None = None) -> str:
    """The shortest chart range that reaches back to `last` (a pipeline's last activity) from `now` (default: the
    database's clock, as `chart_data`'s), so the charts open on its data; the longest when it has none that
    recent."""
    now = now or session.execute(text("SELECT now()")).scalar_one()
    if last is not None:
        for key, seconds in sorted(CHART_RANGES.items(), key=lambda item: item[1]):
            if last >= now - timedelta(seconds=seconds):
                return key
    return max(CHART_RANGES, key=CHART_RANGES.__getitem__)


def bucket_seconds(range_key: str, buckets: int = CHART_BUCKETS) -> int:
    """The width of one bucket for a range: its length over `buckets`, at least one second."""
    if range_key not in CHART_RANGES:
        raise ValueError(f"range must be one of {', '.join(CHART_RANGES)}, not {range_key!r}")
    return max(1, CHART_RANGES[range_key] // buckets)


def chart_data(session: Session, pipeline: int, range_key: str, now: datetime | None = None) -> ChartData:
    """The series of the ledger page's charts for one pipeline over the last hour, day or week: lag per
    partition and in total (from `lag_snapshots`, as the last plan of each bucket saw it), and per committed
    batch its records,
    dead and late records, records per second and step seconds. Everything is bucketed by the database,
    so the page stays the same size however long the history is."""
    bucket = bucket_seconds(range_key)
    now = now or session.execute(text("SELECT now()")).scalar_one()
    since = now - timedelta(seconds=CHART_RANGES[range_key])
    params = {"p": pipeline, "since": since, "bucket": bucket, "committed": BatchState.COMMITTED.value}
    binned = "date_bin(make_interval(secs => :bucket), {column}, CAST(:since AS timestamptz))"
    # Lag is sampled, as Prometheus samples a gauge: each bucket shows what the LAST plan in it saw (every
    # snapshot of one plan shares its transaction's planned_at). That costs one index probe per bucket and
    # reads buckets x partitions rows, however many plans a week of history holds.
    lag_rows = session.execute(text(
        "WITH buckets AS (SELECT CAST(:since AS timestamptz) + make_interval(secs => :bucket * k) AS at "
        "FROM generate_series(0, :buckets) k), "
        "plans AS (SELECT b.at, (SELECT max(s.planned_at) FROM lag_snapshots s WHERE s.pipeline_id = :p "
        "AND s.planned_at >= b.at AND s.planned_at < b.at + make_interval(secs => :bucket)) AS planned_at "
        "FROM buckets b), "
        "seen AS (SELECT plans.at, s.topic, s.partition, s.lag FROM plans JOIN lag_snapshots s "
        "ON s.pipeline_id = :p AND s.planned_at = plans.planned_at) "
        "SELECT at, topic || '[' || partition || ']', lag FROM seen "
        "UNION ALL SELECT at, 'total', sum(lag) FROM seen GROUP BY at ORDER BY 1, 2"),
        {**params, "buckets": CHART_RANGES[range_key] // bucket}).all()
    steps = ", ".join(f"avg(coalesce((timings->>'{key}')::float8, 0))" for key in STEP_KEYS)
    batch_rows = session.execute(text(
        f"SELECT {binned.format(column='committed_at')} AS at, count(*), "
        "sum(coalesce((counts->>'records')::bigint, 0)), sum(coalesce((counts->>'dead_letters')::bigint, 0)), "
        "sum(coalesce((counts->>'late_records')::bigint, 0)), "
        "sum(coalesce((counts->>'records')::bigint, 0)) / nullif(sum(coalesce((timings->>'read_s')::float8, 0) "
        f"+ coalesce((timings->>'stage_write_s')::float8, 0)), 0), {steps} "
        "FROM batches WHERE pipeline_id = :p AND state = :committed AND committed_at >= :since "
        "GROUP BY 1 ORDER BY 1"), params).all()
    return ChartData(
        range_key=range_key, since=since, until=now, bucket_s=bucket,
        lag=[LagPoint(at, name, int(lag)) for at, name, lag in lag_rows],
        batches=[BatchPoint(row[0], int(row[1]), int(row[2]), int(row[3]), int(row[4]),
                            None if row[5] is None else float(row[5]),
                            {key: float(value) for key, value in zip(STEP_KEYS, row[6:], strict=True)})
                 for row in batch_rows],
    )
