"""Read-only views of the ledger for operators: the CLI and the Airflow UI page both use these.

Every function takes the caller's session and returns plain dataclasses, ready for a Rich
table, JSON or a web page.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import text
from sqlalchemy.orm import Session

from microbatch.ledger.models import BatchState
from microbatch.types import TopicPartition


@dataclass
class PartitionStatus:
    topic: str
    partition: int
    position: int | None
    latest: int | None
    lag: int | None
    last_batch_id: int | None
    last_commit_age_s: float | None


@dataclass
class BatchRange:
    """Offsets [start, end) of one partition that a batch read; `superseded_by` is the replay that replaced them."""

    topic: str
    partition: int
    start: int
    end: int
    superseded_by: int | None = None

    def __str__(self) -> str:
        replaced = f" replaced by {self.superseded_by}" if self.superseded_by is not None else ""
        return f"{self.topic}[{self.partition}] [{self.start}, {self.end}){replaced}"


@dataclass
class BatchSummary:
    id: int
    kind: str
    state: str
    attempt: int
    ranges: list[BatchRange]
    records: int | None
    dead_letters: int | None
    late_records: int | None
    durations: dict[str, Any]
    airflow_run_id: str | None
    created_at: datetime
    committed_at: datetime | None
    error: str | None
    committed_run_id: str | None = None

    @property
    def ranges_text(self) -> str:
        """The ranges on one line, for a table: `topic[p] [start, end)`, and who replaced them."""
        return " ".join(str(r) for r in self.ranges)


@dataclass
class GapSummary:
    """Offsets [start, end) of one partition recorded as lost, and the batch that recorded them."""

    id: int
    batch_id: int | None
    batch_state: str | None
    topic: str
    partition: int
    start: int
    end: int
    size: int
    reason: str
    created_at: datetime


@dataclass
class OffsetOwner:
    """Who accounts for one offset: a committed batch, a recorded gap, or nobody yet; `dead_letter`: the reason,
    when the batch kept the record as a dead letter."""

    kind: str  # "batch", "gap" or "none"
    batch_id: int | None = None
    airflow_run_id: str | None = None
    start: int | None = None
    end: int | None = None
    reason: str | None = None
    dead_letter: str | None = None


def to_dict(item: object) -> dict[str, Any]:
    """A JSON-friendly dict of one of the dataclasses here."""
    data = asdict(item)  # type: ignore[call-overload]
    return {k: v.isoformat() if isinstance(v, datetime) else v for k, v in data.items()}


def pipeline_names(session: Session) -> list[str]:
    return list(session.execute(text("SELECT name FROM pipelines ORDER BY name")).scalars())


def pipeline_id(session: Session, name: str) -> int | None:
    return session.execute(text("SELECT id FROM pipelines WHERE name = :n"), {"n": name}).scalar_one_or_none()


def partition_status(
    session: Session, pipeline: int, latest: dict[TopicPartition, int] | None = None
) -> list[PartitionStatus]:
    """Per partition: the ledger position, the latest offset (when given), the lag and the last commit."""
    rows = session.execute(
        text(
            "SELECT p.topic, p.partition, p.next_offset, p.last_batch_id, b.committed_at "
            "FROM positions p LEFT JOIN batches b ON b.id = p.last_batch_id "
            "WHERE p.pipeline_id = :p ORDER BY p.topic, p.partition"
        ),
        {"p": pipeline},
    ).all()
    now = datetime.now(tz=UTC)
    known = {TopicPartition(r.topic, r.partition): r for r in rows}
    result = []
    for tp in sorted(set(known) | set(latest or {})):
        row = known.get(tp)
        position = row.next_offset if row else None
        end = (latest or {}).get(tp)
        result.append(
            PartitionStatus(
                topic=tp.topic,
                partition=tp.partition,
                position=position,
                latest=end,
                lag=None if end is None or position is None else max(0, end - position),
                last_batch_id=row.last_batch_id if row else None,
                last_commit_age_s=(now - row.committed_at).total_seconds() if row and row.committed_at else None,
            )
        )
    return result


def batch_history(session: Session, pipeline: int, limit: int = 20) -> list[BatchSummary]:
    """The most recent batches, newest first, with their ranges, counts and durations."""
    return _batches(session, pipeline, limit, kind=None)


def backfill_batches(session: Session, pipeline: int, limit: int = 20) -> list[BatchSummary]:
    """The most recent backfills (batches of kind `backfill` or `replay`), newest first: what each one re-read."""
    return _batches(session, pipeline, limit, kind="backfill,replay")


def _batches(session: Session, pipeline: int, limit: int, kind: str | None) -> list[BatchSummary]:
    rows = session.execute(
        text(
            "SELECT b.*, (SELECT json_agg(json_build_array(r.topic, r.partition, r.start_offset, r.end_offset, "
            "r.superseded_by) ORDER BY r.topic, r.partition, r.start_offset) FROM ranges r WHERE r.batch_id = b.id) "
            "AS range_rows FROM batches b WHERE b.pipeline_id = :p "
            "AND (CAST(:k AS text) IS NULL OR b.kind = ANY(string_to_array(:k, ','))) "
            "ORDER BY b.id DESC LIMIT :n"
        ),
        {"p": pipeline, "n": limit, "k": kind},
    ).mappings()
    return [
        BatchSummary(
            id=row["id"],
            kind=row["kind"],
            state=row["state"],
            attempt=row["attempt"],
            ranges=[BatchRange(*r) for r in row["range_rows"] or []],
            records=(row["counts"] or {}).get("records"),
            dead_letters=(row["counts"] or {}).get("dead_letters"),
            late_records=(row["counts"] or {}).get("late_records"),
            durations=dict(row["timings"] or {}),
            airflow_run_id=row["airflow_run_id"],
            committed_run_id=row["committed_run_id"],
            created_at=row["created_at"],
            committed_at=row["committed_at"],
            error=row["error"],
        )
        for row in rows
    ]


def recorded_gaps(session: Session, pipeline: int, limit: int = 50) -> list[GapSummary]:
    """Offsets the ledger records as lost, newest first, with the batch that recorded each and its state.

    Only gaps of committed batches count as lost; those of open or failed batches are shown for context.
    """
    rows = session.execute(
        text(
            "SELECT g.id, g.batch_id, b.state AS batch_state, g.topic, g.partition, g.start_offset, g.end_offset, "
            "g.reason, g.created_at FROM gaps g LEFT JOIN batches b ON b.id = g.batch_id "
            "WHERE g.pipeline_id = :p ORDER BY g.id DESC LIMIT :n"
        ),
        {"p": pipeline, "n": limit},
    ).all()
    return [
        GapSummary(
            id=r.id,
            batch_id=r.batch_id,
            batch_state=r.batch_state,
            topic=r.topic,
            partition=r.partition,
            start=r.start_offset,
            end=r.end_offset,
            size=r.end_offset - r.start_offset,
            reason=r.reason,
            created_at=r.created_at,
        )
        for r in rows
    ]


def find_offset(session: Session, pipeline: int, topic: str, partition: int, offset: int) -> OffsetOwner:
    """The committed batch (and its Airflow run) that processed an offset, or the gap that lost it."""
    params = {"p": pipeline, "t": topic, "n": partition, "o": offset, "committed": BatchState.COMMITTED.value}
    row = session.execute(
        text(
            "SELECT b.id, b.airflow_run_id, r.start_offset, r.end_offset FROM ranges r "
            "JOIN batches b ON b.id = r.batch_id WHERE r.pipeline_id = :p AND r.topic = :t AND r.partition = :n "
            "AND r.committed AND int8range(r.start_offset, r.end_offset) @> CAST(:o AS bigint)"
        ),
        params,
    ).one_or_none()
    if row:
        dead = session.execute(text(
            "SELECT error FROM dead_letters WHERE pipeline_id = :p AND topic = :t AND partition = :n "
            'AND "offset" = :o'), params).scalar()
        return OffsetOwner("batch", row.id, row.airflow_run_id, row.start_offset, row.end_offset, dead_letter=dead)
    gap = session.execute(
        text(
            "SELECT g.batch_id, g.start_offset, g.end_offset, g.reason FROM gaps g "
            "LEFT JOIN batches b ON b.id = g.batch_id WHERE g.pipeline_id = :p AND g.topic = :t "
            "AND g.partition = :n AND (b.state = :committed OR g.batch_id IS NULL) "
            "AND int8range(g.start_offset, g.end_offset) @> CAST(:o AS bigint)"
        ),
        params,
    ).one_or_none()
    if gap:
        return OffsetOwner("gap", gap.batch_id, None, gap.start_offset, gap.end_offset, gap.reason)
    return OffsetOwner("none")


@dataclass
class SinkView:
    """A sink table as `microbatch show` prints it: its columns, its first rows, and its totals."""

    columns: list[str]
    rows: list[tuple]
    total_rows: int
    sums: dict[str, Any]
    dead_letters: int
    late_records: int


def sink_view(session: Session, pipeline: int, table: str, order_by: list[str], sum_columns: list[str],
              limit: int) -> SinkView:
    """The first `limit` rows of a sink table in `order_by` order (a column with ` DESC` sorts down), its row
    count and the totals of `sum_columns`, with the pipeline's dead-letter and late-record counts. Names come
    from a validated spec (SQL identifiers)."""
    def quoted(name: str) -> str:
        column, _, direction = name.partition(" ")
        return f'"{column}" {direction}'.strip()

    result = session.execute(text(f'SELECT * FROM "{table}" ORDER BY {", ".join(map(quoted, order_by))} LIMIT :n'),
                             {"n": limit})
    columns, rows = list(result.keys()), [tuple(row) for row in result.all()]
    totals = ", ".join(["count(*)", *(f'coalesce(sum("{c}"), 0)' for c in sum_columns)])
    total_rows, *sums = session.execute(text(f'SELECT {totals} FROM "{table}"')).one()
    dead, late = session.execute(text(
        "SELECT (SELECT count(*) FROM dead_letters WHERE pipeline_id = :p), "
        "(SELECT count(*) FROM late_records WHERE pipeline_id = :p)"), {"p": pipeline}).one()
    return SinkView(columns, rows, total_rows, dict(zip(sum_columns, sums, strict=True)), dead, late)


@dataclass
class PublishedView:
    """What a publishing sink has put in its outbox and what of it its publisher has sent to Kafka."""

    columns: list[str]
    rows: list[tuple[Any, ...]]  # the newest published records, newest first
    written: int  # outbox records the commits wrote
    published: int  # of them, those the publisher has committed to the topic (sequences up to its progress)
    transactions: int  # Kafka transactions the publisher committed


def published_view(session: Session, pipeline: int, sink: str, limit: int) -> PublishedView:
    """The newest `limit` records a publishing sink has published (outbox sequences up to the publisher's
    progress), newest first, and how many the commits wrote and the publisher sent."""
    params = {"p": pipeline, "s": sink, "n": limit}
    last, transactions = session.execute(text(
        "SELECT coalesce(max(last_seq), 0), coalesce(max(transactions), 0) FROM publish_progress "
        "WHERE pipeline_id = :p AND sink = :s"), params).one()
    result = session.execute(text(
        "SELECT seq, batch_id AS batch, key, value, created_at FROM outbox WHERE pipeline_id = :p AND sink = :s "
        "AND seq <= :last ORDER BY seq DESC LIMIT :n"), {**params, "last": last})
    columns = list(result.keys())
    rows = [tuple(json.dumps(v, sort_keys=True) if isinstance(v, dict) else v for v in row) for row in result.all()]
    written = session.execute(text("SELECT count(*) FROM outbox WHERE pipeline_id = :p AND sink = :s"),
                              params).scalar_one()
    return PublishedView(columns, rows, written, min(int(last), written), int(transactions))


# ---- charts: the ledger page's series, bucketed in the database --------------------------------------

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


# ---- metrics: the ledger's running totals, for the metrics exporter ---------------------------------


@dataclass
class MetricRow:
    """One value of one metric with its attributes (pipeline, and topic/partition, kind, step or sink)."""

    metric: str
    value: float
    attributes: dict[str, str | int]


_METRIC_QUERIES = {
    # Records each committed batch read, per partition (the stage's count; transaction markers excluded).
    "records_read": "SELECT p.name, b.kind, split_part(e.key, '[', 1), "
                    "CAST(rtrim(split_part(e.key, '[', 2), ']') AS int), sum(CAST(e.value AS bigint)) "
                    "FROM batches b JOIN pipelines p ON p.id = b.pipeline_id "
                    "CROSS JOIN LATERAL jsonb_each_text(coalesce(b.counts->'records_by_partition', '{}')) e "
                    "WHERE b.state = :committed GROUP BY 1, 2, 3, 4",
    "rows_staged": "SELECT p.name, b.kind, e.key, sum(CAST(e.value AS bigint)) "
                   "FROM batches b JOIN pipelines p ON p.id = b.pipeline_id "
                   "CROSS JOIN LATERAL jsonb_each_text(coalesce(b.counts->'rows_by_sink', '{}')) e "
                   "WHERE b.state = :committed GROUP BY 1, 2, 3",
    "bad_records": "SELECT p.name, b.kind, sum(coalesce(CAST(b.counts->>'dead_letters' AS bigint), 0)), "
                   "sum(coalesce(CAST(b.counts->>'late_records' AS bigint), 0)) "
                   "FROM batches b JOIN pipelines p ON p.id = b.pipeline_id WHERE b.state = :committed "
                   "GROUP BY 1, 2",
    "batches": "SELECT p.name, b.kind, b.state, count(*) FROM batches b JOIN pipelines p ON p.id = b.pipeline_id "
               "GROUP BY 1, 2, 3",
    "step_seconds": "SELECT p.name, b.kind, e.key, sum(CAST(e.value AS float8)) "
                    "FROM batches b JOIN pipelines p ON p.id = b.pipeline_id "
                    "CROSS JOIN LATERAL jsonb_each_text(b.timings) e "
                    "WHERE b.state = :committed AND right(e.key, 2) = '_s' AND e.key <> 'stage_total_s' "
                    "GROUP BY 1, 2, 3",
    # The lag each partition had at its latest plan, before that batch read.
    "lag": "SELECT DISTINCT ON (s.pipeline_id, s.topic, s.partition) p.name, s.topic, s.partition, s.lag "
           "FROM lag_snapshots s JOIN pipelines p ON p.id = s.pipeline_id "
           "ORDER BY s.pipeline_id, s.topic, s.partition, s.id DESC",
    "published": "SELECT p.name, o.sink, coalesce(pp.last_seq, 0), max(o.seq) FROM outbox o "
                 "JOIN pipelines p ON p.id = o.pipeline_id LEFT JOIN publish_progress pp "
                 "ON pp.pipeline_id = o.pipeline_id AND pp.sink = o.sink GROUP BY 1, 2, 3",
}


def metric_rows(session: Session) -> list[MetricRow]:
    """Every metric the exporter serves, from the ledger's committed history: totals only grow (a replay's
    superseded batch stays counted: it was read), so they behave as Prometheus counters."""
    rows: list[MetricRow] = []

    def run(name: str) -> list[Any]:
        return list(session.execute(text(_METRIC_QUERIES[name]), {"committed": BatchState.COMMITTED.value}).all())

    for pipeline, kind, topic, partition, value in run("records_read"):
        rows.append(MetricRow("records_read", value, {"pipeline": pipeline, "batch_kind": kind, "topic": topic,
                                                      "partition": partition}))
    for pipeline, kind, sink, value in run("rows_staged"):
        rows.append(MetricRow("rows_staged", value, {"pipeline": pipeline, "batch_kind": kind, "sink": sink}))
    for pipeline, kind, dead, late in run("bad_records"):
        rows.append(MetricRow("dead_letters", dead, {"pipeline": pipeline, "batch_kind": kind}))
        rows.append(MetricRow("late_records", late, {"pipeline": pipeline, "batch_kind": kind}))
    for pipeline, kind, state, value in run("batches"):
        rows.append(MetricRow("batches", value, {"pipeline": pipeline, "batch_kind": kind, "state": state}))
    for pipeline, kind, key, value in run("step_seconds"):
        rows.append(MetricRow("step_seconds", value, {"pipeline": pipeline, "batch_kind": kind,
                                                      "step": key.removesuffix("_s")}))
    for pipeline, topic, partition, value in run("lag"):
        rows.append(MetricRow("lag", value, {"pipeline": pipeline, "topic": topic, "partition": partition}))
    for pipeline, sink, published, highest in run("published"):
        rows.append(MetricRow("records_published", published, {"pipeline": pipeline, "sink": sink}))
        rows.append(MetricRow("outbox_backlog", max(0, highest - published), {"pipeline": pipeline, "sink": sink}))
    return rows


@dataclass
class DeadLetterView:
    """One dead letter as `microbatch dead-letters` lists it, with the committed range of its batch that holds it
    (what a re-process replays)."""

    batch_id: int
    topic: str
    partition: int
    offset: int
    key: bytes | None
    timestamp: datetime | None
    error: str
    value: bytes | None
    """The first 200 bytes of the record's value."""
    range_start: int
    range_end: int


def dead_letters(
    session: Session, pipeline: int, *, batch_id: int | None = None, topic: str | None = None,
    partition: int | None = None, since: datetime | None = None, until: datetime | None = None,
    reason: str | None = None, limit: int | None = None,
) -> list[DeadLetterView]:
    """The pipeline's dead letters (those of its committed batches), by topic, partition and offset; filtered by
    batch, topic, partition, the record's Kafka timestamp (`since` inclusive, `until` exclusive) and a piece of the
    reason (case-insensitive)."""
    where = ["d.pipeline_id = :p"]
    params: dict[str, Any] = {"p": pipeline, "limit": limit}
    for column, name, value in (("d.batch_id", "b", batch_id), ("d.topic", "t", topic),
                                ("d.partition", "n", partition)):
        if value is not None:
            where.append(f"{column} = :{name}")
            params[name] = value
    if since is not None:
        where.append('d."timestamp" >= :since')
        params["since"] = since
    if until is not None:
        where.append('d."timestamp" < :until')
        params["until"] = until
    if reason:
        where.append("strpos(lower(d.error), lower(:reason)) > 0")
        params["reason"] = reason
    rows = session.execute(text(
        'SELECT d.batch_id, d.topic, d.partition, d."offset", d."key", d."timestamp", d.error, '
        "substring(d.raw FROM 1 FOR 200) AS value, r.start_offset, r.end_offset FROM dead_letters d "
        "JOIN ranges r ON r.batch_id = d.batch_id AND r.topic = d.topic AND r.partition = d.partition "
        "AND r.committed AND int8range(r.start_offset, r.end_offset) @> d.\"offset\" "
        f"WHERE {' AND '.join(where)} ORDER BY d.topic, d.partition, d.\"offset\" LIMIT :limit"), params).all()
    return [DeadLetterView(r.batch_id, r.topic, r.partition, r.offset, r.key, r.timestamp, r.error,
                           bytes(r.value) if r.value is not None else None, r.start_offset, r.end_offset)
            for r in rows]
