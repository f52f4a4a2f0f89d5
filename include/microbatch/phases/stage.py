"""The stage phase (Flink's `preCommit`): read exactly a batch's ranges with Spark's Kafka source,
apply the job, and bulk-write the output to staging tables tagged (batch_id, attempt).

Nothing staged is visible in a sink until the commit phase moves it there. A crash anywhere
here leaves the batch open; the retry takes a new attempt number and stages again.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import logging
import os
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from pyspark import StorageLevel
from pyspark.sql import Column, DataFrame, Observation, SparkSession
from pyspark.sql import functions as F
from sqlalchemy import make_url
from sqlalchemy.exc import OperationalError

from microbatch import failpoints
from microbatch.config import PipelineSpec
from microbatch.errors import DataLossError, MicrobatchError, SpecError, StageFailedError
from microbatch.event_time import PLANNED_OPTION, check_event_time_column, check_state_times
from microbatch.formats.base import Format
from microbatch.kafka.offsets import offset_bounds, offsets_client
from microbatch.kafka.security import spark_client_options
from microbatch.ledger import repository as repo
from microbatch.ledger.database import Ledger, stage_lock
from microbatch.ledger.models import BatchState
from microbatch.phases.pins import bound_formats, registry_sides, staged_pins
from microbatch.phases.reporting import log_stage_summary
from microbatch.phases.results import StageResult
from microbatch.phases.stage_records import (
    DECODE_ERROR,
    PARTITION_COUNTER,
    count_records_read,
    decoded_records,
    is_tombstone,
    stage_bad_records,
    stage_undecodable,
    write_staging,
)
from microbatch.planning import data_loss_at_read, lost_ranges
from microbatch.settings import KafkaSettings
from microbatch.sinks.base import Sink, StageContext, write_table
from microbatch.sinks.registry import sinks_of
from microbatch.spark_remote import bound_retries, is_closed_session, is_unavailable, shared_session_id, with_session_id
from microbatch.transform import ERROR_COLUMN, HEADERS_COLUMN, LATE_COLUMN, RECORD_COLUMNS, SparkJob
from microbatch.types import OffsetRange

log = logging.getLogger(__name__)
BEFORE_READ = failpoints.point("stage.before_read")  # a hold point: the Spark job after it reads Kafka
READ = failpoints.point("stage.read")  # a Spark Python worker dies after N records
AFTER_WRITE = failpoints.point("stage.after_write")
AFTER_STAGED = failpoints.point("stage.after_staged")


def load_job(spec: PipelineSpec) -> SparkJob:
    """Import the job object named by `job.transform` ('module:attribute'); a SQL pipeline's is its queries."""
    if spec.job is None:
        from microbatch.sql_job import SqlJob

        return SqlJob(spec)
    module_name, _, attribute = spec.job.transform.partition(":")
    try:
        return getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError) as exc:
        raise SpecError(
            f"{spec.name}.yaml: field 'job.transform' names '{spec.job.transform}', which cannot be imported ({exc}).",
            fix="Point it at an object in a module that spark-submit can import.",
        ) from None


def kafka_read_options(
    ranges: list[OffsetRange], kafka: KafkaSettings, isolation_level: str, min_partitions: int = 0,
    include_headers: bool = False,
) -> dict[str, str]:
    """Options of Spark's Kafka source that read exactly `ranges` and fail on missing offsets (and read the
    records' headers with `include_headers`)."""
    assign: dict[str, list[int]] = {}
    starting: dict[str, dict[str, int]] = {}
    ending: dict[str, dict[str, int]] = {}
    for r in ranges:
        if r.partition in assign.get(r.topic, []):
            raise ValueError(f"{r.tp} appears twice in one batch; ranges must be one per partition")
        assign.setdefault(r.topic, []).append(r.partition)
        starting.setdefault(r.topic, {})[str(r.partition)] = r.start
        ending.setdefault(r.topic, {})[str(r.partition)] = r.end
    options = {
        "kafka.bootstrap.servers": kafka.bootstrap_servers,
        "assign": json.dumps(assign, sort_keys=True),
        "startingOffsets": json.dumps(starting, sort_keys=True),
        "endingOffsets": json.dumps(ending, sort_keys=True),
        "failOnDataLoss": "true",
        "kafka.isolation.level": isolation_level,
        # A range is read up to a known end, often the log end: the broker's default 500 ms long poll for
        # more data then stalls every task once (1,000 records over 8 partitions: 2.3 s -> 0.22 s warm).
        "kafka.fetch.max.wait.ms": "10",
        "includeHeaders": "true" if include_headers else "false",
    }
    if min_partitions:
        options["minPartitions"] = str(min_partitions)
    return options


KAFKA_SOURCE_NAMES = {"timestampType": "timestamp_type"}
"""The Kafka source's columns that a job sees under another name (`transform.RECORD_COLUMNS`)."""


def record_columns(include_headers: bool) -> list[tuple[str, str]]:
    """(the Kafka source's column, the job's name for it) of each column of the records a job is given, in the
    order of `transform.RECORD_COLUMNS`, then the headers when the source reads them."""
    by_job_name = {job: source for source, job in KAFKA_SOURCE_NAMES.items()}
    names = [*RECORD_COLUMNS, *([HEADERS_COLUMN] if include_headers else [])]
    return [(by_job_name.get(name, name), name) for name in names]


def as_records(source: DataFrame, include_headers: bool) -> DataFrame:
    """The Kafka source's DataFrame as the records of the job contract (`record_columns`)."""
    return source.select(*[F.col(column).alias(name) for column, name in record_columns(include_headers)])


def with_pooled_consumers(options: Mapping[str, str]) -> dict[str, str]:
    """`options` plus a group id derived from the Kafka client settings, so a long-lived Spark (Connect)
    reuses its executors' cached consumers across batches instead of opening new ones per query.

    Spark keys its consumer pool by group id and partition and refuses a key whose settings differ, hence
    the hash of every `kafka.*` setting (never call it with credentials among them). Reads assign
    partitions and never commit, so the group id joins no consumer group."""
    client = sorted((k, v) for k, v in options.items() if k.startswith("kafka.") and k != "kafka.group.id")
    digest = hashlib.sha256(json.dumps(client).encode()).hexdigest()[:16]
    return {**options, "kafka.group.id": f"microbatch-stage-{digest}"}


KAFKA_SOURCE_LOGGER = "org.apache.spark.sql.kafka010.KafkaSourceProvider"


def quiet_pooled_group_warning(spark: SparkSession) -> None:
    """Keep the Kafka source's warning about a set `kafka.group.id` out of a spark-submit stage's task log.

    The source warns, in ten lines per batch, that queries sharing a group id interfere as members of one
    consumer group. The stage's reads assign their partitions and never commit (`with_pooled_consumers`), so they
    join no group, and the warning would only alarm an operator. The source's errors still reach the log. A
    Connect client has no JVM of its own: there the server writes the warning to its own log."""
    jvm = spark.sparkContext._jvm
    jvm.org.apache.logging.log4j.core.config.Configurator.setLevel(
        KAFKA_SOURCE_LOGGER, jvm.org.apache.logging.log4j.Level.ERROR)


def jdbc_options(ledger: Ledger) -> dict[str, str]:
    """pgjdbc options for the ledger database; the password travels only as an option."""
    url = make_url(ledger.url)
    return {
        "url": f"jdbc:postgresql://{url.host or '127.0.0.1'}:{url.port or 5432}/{url.database}"
        "?reWriteBatchedInserts=true",
        "user": url.username or "",
        "password": url.password or "",
        "driver": "org.postgresql.Driver",
        "batchsize": "10000",
    }


def _crash_after_records(df: DataFrame, arming: failpoints.Arming, marker_dir: str | None) -> DataFrame:
    """Failpoint `stage.read=N` (`=N:kill`): the Python worker dies after N records, mid-read.

    The closure carries the mode and the marker directory, taken where the plan is built: a worker of a Spark
    Connect server has no failpoint environment, and marks the failpoint fired in the client's directory (the
    server runs on the same machine)."""
    name, limit, mode = READ.name, arming.limit, arming.mode

    def guard(batches):  # noqa: ANN001, ANN202 - Arrow iterator in, out
        seen = 0
        for batch in batches:
            seen += batch.num_rows
            if seen > limit:
                failpoints.crash(name, mode, marker_dir)
            yield batch

    return df.mapInArrow(guard, df.schema)


def read_metrics(
    job: SparkJob, options: Mapping[str, Any], partition_keys: list[tuple[str, int]], *, count_partitions: bool
) -> dict[str, Column]:
    """Aggregates observed during the read: the records read, dead letters, late records and the job's state
    metrics, and with `count_partitions` the records of each source partition too (`record_metrics` and
    `job_metrics` in one observation, for a job that is given every record read)."""
    return {**record_metrics(partition_keys, count_partitions=count_partitions), **job_metrics(job, options)}


def record_metrics(
    partition_keys: list[tuple[str, int]], *, count_partitions: bool, decodes: bool = False,
    tombstones_apart: bool = False,
) -> dict[str, Column]:
    """Aggregates over the records read: their number, with `count_partitions` the records of each source
    partition, with `decodes` the records their formats cannot read (`undecodable`), and with `tombstones_apart`
    the tombstones that record-keyed sinks take instead of the job."""
    # These expressions run for every record (bench/throughput.py's executor CPU per record). One counter per
    # partition costs about 0.03 µs per partition and record (bench/stage_profile.py --pairs), so a batch counts
    # per partition only when its ranges are expected to have holes (`records_read`); Spark's histogram_numeric,
    # tried instead, is not exact when split reads merge their partial histograms. The partition (an int) is
    # compared first, and the topic (a string) only when the batch reads several.
    metrics: dict[str, Column] = {"records": F.count(F.lit(1))}
    if count_partitions:
        one_topic = len({t for t, _ in partition_keys}) == 1

        def of(topic: str, partition: int) -> Column:
            same = F.col("partition") == partition
            return same if one_topic else same & (F.col("topic") == topic)

        metrics.update(
            {PARTITION_COUNTER.format(i): F.count(F.when(of(t, p), True)) for i, (t, p) in enumerate(partition_keys)})
    if decodes:
        metrics["undecodable"] = F.count(DECODE_ERROR)
    if tombstones_apart:
        metrics["tombstones"] = F.count(F.when(is_tombstone() & F.col(DECODE_ERROR).isNull() if decodes
                                               else is_tombstone(), True))
    return metrics


def job_metrics(job: SparkJob, options: Mapping[str, Any]) -> dict[str, Column]:
    """Aggregates over the job's parsed rows: dead letters, late records and the job's state metrics."""
    metrics: dict[str, Column] = {}
    metrics["dead_letters"] = F.count(ERROR_COLUMN)
    metrics["late_records"] = F.count(F.when(F.col(LATE_COLUMN), True))
    for name, expr in job.state_metrics(options).items():
        metrics[f"state_{name}"] = expr
    return metrics


def _sink_rows(spec: PipelineSpec, sink: Sink, outputs: Mapping[str, DataFrame]) -> DataFrame:
    """The job's output for `sink`, checked for the columns its staging table needs."""
    assert sink.staging is not None
    if sink.name not in outputs:
        raise SpecError(f"{spec.name}: the job produced no output for sink '{sink.name}'.")
    missing = [c for c in sink.staging.columns if c not in outputs[sink.name].columns]
    if missing:
        raise SpecError(
            f"{spec.name}: the job's output for sink '{sink.name}' lacks the column(s) {', '.join(missing)}.",
            fix=sink.staging.fix,
        )
    return sink.staged_rows(outputs[sink.name])


AQE_EMPTY_RELATION = "org.apache.spark.sql.execution.adaptive.AQEPropagateEmptyRelation"


def keep_observed_metrics(spark: SparkSession) -> None:
    """Keep the read's observed metrics when a batch has no good rows.

    When the aggregation's input is empty (a batch of only dead letters, or of only transaction markers),
    adaptive execution replaces the plan above the empty shuffle with an empty relation, and the read's
    `observe` node goes with it: its Observation then holds no row and `get` fails an assertion, for every
    retry of that batch. Excluding that one rule for the session costs nothing on non-empty batches."""
    key = "spark.sql.adaptive.optimizer.excludedRules"
    rules = [r.strip() for r in (spark.conf.get(key, None) or "").split(",") if r.strip()]
    if AQE_EMPTY_RELATION not in rules:
        spark.conf.set(key, ",".join([*rules, AQE_EMPTY_RELATION]))


V1_SOURCE_LIST = "spark.sql.sources.useV1SourceList"


def read_kafka_through_v2(spark: SparkSession) -> None:
    """Read Kafka through the source's DataSource V2 scan, the one Structured Streaming uses.

    Spark's default list of V1 sources names `kafka`, so `spark.read.format("kafka")` builds the V1 relation, whose
    scan converts every record to an external Row and back (a `java.sql.Timestamp` per record among it). The V2 scan
    reads the same offsets with the same options and hands Spark internal rows: in one session alternating both, the
    stage's pass over 2M records took 10 % less executor CPU (bench/stage_profile.py, docs/performance.md). A user's
    own list keeps every other source it names."""
    names = [name.strip() for name in (spark.conf.get(V1_SOURCE_LIST) or "").split(",") if name.strip()]
    if "kafka" in (name.lower() for name in names):
        spark.conf.set(V1_SOURCE_LIST, ",".join(name for name in names if name.lower() != "kafka"))


def stage_batch(
    spark: SparkSession, spec: PipelineSpec, batch_id: int, ledger: Ledger, kafka: KafkaSettings
) -> StageResult | None:
    """Stage one batch under a fresh attempt number; None if the batch is already committed, or was
    staged by a concurrent run while this one waited for it.

    Under the batch's stage lock, one ledger call begins the attempt (the ranges, the state it starts from), the
    Spark job stages the rows, and one ledger call records `staged(attempt, counts, state_after)`, which the commit
    checks the staged rows against."""
    with stage_lock(ledger.url, batch_id) as waited:
        started = time.monotonic()
        with ledger.transaction() as session:
            start = repo.begin_stage(session, batch_id, waited=waited)
        if start.attempt is None:
            if start.state == BatchState.COMMITTED.value:
                log.info("batch %s is already committed; nothing to stage (a retry after a commit is a no-op)",
                         batch_id)
            elif waited and start.state == BatchState.STAGED.value:
                log.info("batch %s was staged by attempt %s of a concurrent run while this one waited; nothing to "
                         "stage, the commit takes that attempt", batch_id, start.staged_attempt)
            else:
                log.info("batch %s is %s; nothing to stage", batch_id, start.state)
            return None
        formats = (spec.source.key_format, spec.source.value_format)
        if registry_sides(spec):
            with ledger.transaction() as session:
                formats = bound_formats(session, spec, batch_id, start.pipeline_id, start.formats)
        result = _stage_attempt(spark, spec, _Attempt(batch_id, start.attempt, start.ranges, start.state_before,
                                                      start.holes, start.pipeline_id, start.pipeline_uid, formats,
                                                      start.planned_us),
                                ledger, kafka)
        counts = {
            "records": result.records,
            "records_by_partition": result.records_by_partition,
            "rows_by_sink": result.rows_by_sink,
            "dead_letters": result.dead_letters,
            "late_records": result.late_records,
            **({"decode": result.decode} if result.decode else {}),
        }
        pins = staged_pins(start.formats, result.decode) if registry_sides(spec) else None
        with ledger.transaction() as session:
            repo.record_staged(session, result.batch_id, result.attempt, counts, result.state_after, result.timings,
                               formats=pins)
        result.timings["stage_total_s"] = round(time.monotonic() - started, 3)
        AFTER_STAGED.hit()
        return result


@dataclass(frozen=True)
class _Attempt:
    """One attempt at staging a batch: what it reads, and the state the batch starts from."""

    batch_id: int
    attempt: int
    ranges: list[OffsetRange]
    state_before: dict[str, Any]
    count_partitions: bool = False
    pipeline_id: int = 0
    pipeline_uid: str = ""
    formats: tuple[Format[Any], Format[Any]] | None = None
    """The key's and the value's formats as this batch decodes them (registry formats bound to its schemas); the
    spec's when None."""
    planned_us: int | None = None
    """When the batch was planned: the clock of `event_time.guard_future` for a job without Kafka timestamps."""

    def parse_options(self, spec: PipelineSpec) -> dict[str, Any]:
        """The options the job's `parse` is given: the spec's, and the batch's planned time."""
        return {**spec.job_options, **({PLANNED_OPTION: self.planned_us} if self.planned_us is not None else {})}

    @property
    def partition_keys(self) -> list[tuple[str, int]]:
        return sorted({(r.topic, r.partition) for r in self.ranges})

    def tag(self) -> list[Column]:
        """The (batch_id, attempt) columns every staged row starts with."""
        return [F.lit(self.batch_id).cast("bigint").alias("batch_id"), F.lit(self.attempt).cast("int").alias("attempt")]


def _stage_attempt(
    spark: SparkSession, spec: PipelineSpec, current: _Attempt, ledger: Ledger, kafka: KafkaSettings
) -> StageResult:
    """Read the attempt's ranges, apply the job and write its output to the staging tables (a lakehouse sink: its
    table); the result to record as staged."""
    batch_id = current.batch_id
    log.info("batch %s attempt %s: reading %s range(s)", batch_id, current.attempt, len(current.ranges))
    for r in current.ranges:
        log.info("  read %s: %s records planned", r, r.size)

    check_state_times(current.state_before, spec.name)
    job = load_job(spec)
    if not current.ranges:
        raise ValueError(f"batch {batch_id} has no ranges")
    source = _kafka_records(spark, spec, current.ranges, kafka)
    read = _ReadPass.of(spec, source, current)
    keep_observed_metrics(spark)
    parsed = job.parse(read.for_job, current.parse_options(spec), current.state_before)
    check_event_time_column(parsed, spec.name)
    jdbc = jdbc_options(ledger)
    BEFORE_READ.hit()  # the Spark job below reads Kafka
    values, rows_by_sink, read_seconds = _stage_outputs(spec, job, parsed, current, jdbc, ledger, read)

    t_write = time.monotonic()
    undecodable = int(values.get("undecodable") or 0)
    dead_count = int(values.get("dead_letters") or 0)
    late_count = int(values.get("late_records") or 0)
    stage_undecodable(read.decoded, current.tag(), undecodable, jdbc, include_headers=spec.source.include_headers)
    stage_bad_records(source, parsed, current.tag(), dead_count, late_count, jdbc,
                      include_headers=spec.source.include_headers)
    read.release()
    write_seconds = time.monotonic() - t_write
    AFTER_WRITE.hit()

    by_partition = count_records_read(source, current.ranges, current.partition_keys, values,
                                      counted_in_pass=current.count_partitions)
    state_metrics = {name.removeprefix("state_"): v for name, v in values.items() if name.startswith("state_")}
    return StageResult(
        batch_id=batch_id,
        attempt=current.attempt,
        records_by_partition=by_partition,
        rows_by_sink=rows_by_sink,
        dead_letters=undecodable + dead_count,
        late_records=late_count,
        state_after=job.next_state(current.state_before, state_metrics, spec.job_options),
        timings={"read_s": round(read_seconds, 3), "stage_write_s": round(write_seconds, 3)},
        decode={} if read.observation is None else {
            "formats": {side: fmt.pins(values) for side, fmt in zip(
                ("key", "value"), current.formats or (spec.source.key_format, spec.source.value_format), strict=True)},
            "undecodable": undecodable, "tombstones": int(values.get("tombstones") or 0),
            "tombstones_deleted": spec.record_keyed_sinks,
            "tombstones_kept": [s for s in spec.tombstone_sinks if s not in spec.record_keyed_sinks]},
    )


@dataclass(frozen=True)
class _ReadPass:
    """The records of one attempt as the stage's pass reads them: `decoded`, the Kafka records with the key's and
    value's decoded columns (and `DECODE_ERROR` when the spec decodes); `for_job`, what the job's `parse` is given:
    the records that decode, except the tombstones that record-keyed sinks take (`tombstones`, else None).

    When records are held back from the job, the records read (per partition too), the undecodable ones and the
    tombstones are counted by `observation` over every record, in the same pass; else (the default `raw` formats and
    no record-keyed sink: the job is given every record) the job's observation counts them, as it always did."""

    decoded: DataFrame
    for_job: DataFrame
    tombstones: DataFrame | None
    observation: Observation | None
    cached: DataFrame | None = None

    @classmethod
    def of(cls, spec: PipelineSpec, source: DataFrame, current: _Attempt) -> _ReadPass:
        apart = bool(spec.tombstone_sinks)
        decodes = spec.source.decodes or apart  # a record-keyed pipeline refuses a record without a key
        key, value = current.formats or (spec.source.key_format, spec.source.value_format)
        decoded = decoded_records(source, key, value, spec.record_keyed_sinks)
        records = _with_read_failpoint(decoded)  # the failpoint's worker dies in the pass that decodes
        if not (decodes or apart):
            return cls(decoded, records, None, None)
        observation = Observation(f"read_{current.batch_id}_{current.attempt}")
        metrics = record_metrics(current.partition_keys, count_partitions=current.count_partitions, decodes=decodes,
                                 tombstones_apart=True)
        metrics.update({**key.metrics(F.col("key"), "key"), **value.metrics(F.col("value"), "value")})
        records = records.observe(observation, *[expr.alias(name) for name, expr in metrics.items()])
        if apart:  # the job's rows and the tombstones are two branches of one read
            records = records.persist(StorageLevel.MEMORY_AND_DISK)
        readable = F.col(DECODE_ERROR).isNull() if decodes else F.lit(True)
        # The tombstone rule (docs/formats.md#tombstones): a tombstone never reaches the job (it has no event time
        # and is never a dead letter); record-keyed sinks take it as the delete of its key, every other sink skips it.
        for_job = records.where(readable & ~is_tombstone())
        tombstones = records.where(readable & is_tombstone()) if apart else None
        return cls(decoded, for_job.drop(DECODE_ERROR) if decodes else for_job, tombstones, observation,
                   records if apart else None)

    def release(self) -> None:
        if self.cached is not None:
            self.cached.unpersist()


def _kafka_records(
    spark: SparkSession, spec: PipelineSpec, ranges: list[OffsetRange], kafka: KafkaSettings
) -> DataFrame:
    """The records of exactly `ranges` (`as_records`), read by Spark's Kafka source."""
    read_options = kafka_read_options(
        ranges, kafka, spec.source.isolation_level, spec.source.min_spark_partitions, spec.source.include_headers)
    security = spark_client_options(kafka.security)
    read_kafka_through_v2(spark)  # before load(): the reader picks the V1 or V2 source there
    # The pooled group id hashes the client settings; with credentials among them it would leak a hash
    # of a secret into the broker's logs, so a secured cluster keeps Spark's fresh group id per query.
    source = spark.read.format("kafka").options(
        **(with_pooled_consumers(read_options) if not security else {**read_options, **security})).load()
    return as_records(source, spec.source.include_headers)


def _read_ranges(
    spark: SparkSession, spec: PipelineSpec, ranges: list[OffsetRange], kafka: KafkaSettings
) -> DataFrame:
    """The records of exactly `ranges` (with the `stage.read` failpoint when it is set)."""
    return _with_read_failpoint(_kafka_records(spark, spec, ranges, kafka))


def _with_read_failpoint(records: DataFrame) -> DataFrame:
    """`records`, read through the `stage.read` failpoint when it is set."""
    arming = READ.arming()  # decided here, in the driver or the Connect client, when the plan is built
    if arming is not None:
        records = _crash_after_records(records, arming, failpoints.env_marker_dir())
    return records


def _stage_outputs(
    spec: PipelineSpec, job: SparkJob, parsed: DataFrame, current: _Attempt, jdbc: Mapping[str, str],
    ledger: Ledger, read: _ReadPass | None = None,
) -> tuple[dict[str, Any], dict[str, int], float]:
    """Write the job's output for every sink that stages rows (with the tombstones of `read` for the sinks that
    take them), observing the read's metrics on the way: (observed metrics, rows staged per sink, seconds)."""
    options = spec.job_options
    observation = Observation(f"batch_{current.batch_id}_{current.attempt}")
    split = read is not None and read.observation is not None
    metrics = job_metrics(job, options) if split else read_metrics(
        job, options, current.partition_keys, count_partitions=current.count_partitions)
    observed = parsed.observe(observation, *[expr.alias(name) for name, expr in metrics.items()])
    sinks = [sink for sink in sinks_of(spec).values() if sink.staging is not None]
    lake = any(sink.writes_in_stage for sink in sinks)
    tombstones = read.tombstones if read is not None else None
    # One sink: one Spark job reads Kafka, parses, aggregates and writes the staged rows, with the counts and
    # state metrics observed on the way; nothing is cached, so the driver and executor heap stay flat in the
    # batch size. Several sinks share one read through a cache instead, and so does a lakehouse sink, whose
    # table write (a Delta MERGE) is not a plain action that reports the observed metrics, and a sink that takes
    # the tombstones (a second branch of the read).
    shared = len(sinks) != 1 or lake or tombstones is not None
    if shared:
        observed = observed.persist(StorageLevel.MEMORY_AND_DISK)
    tag = current.tag()
    outputs = _job_outputs(job, observed, options, current.state_before, sinks)
    rows_by_sink: dict[str, int] = {}
    t_read = time.monotonic()
    if lake:
        observed.count()
    for sink in sinks:
        assert sink.staging is not None
        rows = _sink_rows(spec, sink, outputs[sink.name]).select(*sink.staging.columns)
        if tombstones is not None and sink.takes_tombstones:
            rows = rows.unionByName(sink.tombstone_rows(tombstones, rows))
        if sink.writes_in_stage:
            written = write_table(sink, rows, ledger, StageContext(spec.name, current.pipeline_id, current.pipeline_uid,
                                                                   current.batch_id, current.attempt, current.ranges))
            rows_by_sink[sink.name] = written.rows
            continue
        out = rows.select(*tag, *sink.staging.columns)
        counted = Observation(f"batch_{current.batch_id}_{current.attempt}_{sink.name}")
        write_staging(out.observe(counted, F.count(F.lit(1)).alias("rows")), sink.staging.table, jdbc)
        rows_by_sink[sink.name] = int(counted.get["rows"])
    if not sinks:
        observed.count()
    values = {**(read.observation.get if split else {}), **observation.get}
    read_seconds = time.monotonic() - t_read
    if shared:
        observed.unpersist()
    return values, rows_by_sink, read_seconds


def takes_late_records(sink: Sink) -> bool:
    """Whether a sink takes the late records as well (a row sink with `include_late`, e.g. a raw landing
    table); an aggregate never does, so its windows that may be published stay final."""
    return sink.include_late


def _job_outputs(
    job: SparkJob, observed: DataFrame, options: Mapping[str, Any], state: Mapping[str, Any], sinks: list[Sink]
) -> dict[str, Mapping[str, DataFrame]]:
    """The job's outputs that each sink stages from, by sink name.

    Late records (valid, but for a window already final when the batch began) still go to `late_records`,
    as before. A sink that takes late records too gets its output from a second call of `job.outputs` over
    every valid row (the `late` column tells them apart); every other sink from the call over the good,
    on-time rows. So the job contract stays as it was: `outputs` returns each sink's rows from the rows it
    is given, and a job needs no change to feed a raw landing table. Both calls build plans over the same
    read (cached when several sinks share it), so Kafka is still read once."""
    valid = observed.where(F.col(ERROR_COLUMN).isNull())
    on_time = job.outputs(valid.where(~F.col(LATE_COLUMN)), options, state)
    with_late = job.outputs(valid, options, state) if any(takes_late_records(s) for s in sinks) else on_time
    return {sink.name: with_late if takes_late_records(sink) else on_time for sink in sinks}


def is_data_loss(exc: BaseException) -> bool:
    """Whether a Spark failure is the Kafka source's `failOnDataLoss` refusal."""
    text = str(exc)
    return "KAFKA_DATA_LOSS" in text or "failOnDataLoss" in text or "data may have been lost" in text


def data_loss_error(spec: PipelineSpec, batch_id: int, ledger: Ledger, kafka: KafkaSettings) -> DataLossError:
    """Spark refused to read offsets that retention deleted after plan: name the lost ranges in one sentence,
    and keep the error on the batch row for `microbatch history`."""
    with ledger.transaction() as session:
        ranges = repo.batch_ranges(session, batch_id)
    with offsets_client(kafka, spec.source.isolation_level) as consumer:
        earliest, _ = offset_bounds(consumer, sorted({r.tp for r in ranges}))
    error = data_loss_at_read(batch_id, lost_ranges(ranges, earliest) or ranges, spec.source.on_data_loss)
    with ledger.transaction() as session:
        repo.record_failure(session, batch_id, str(error))
    return error


def stage_batches(
    spark: SparkSession, spec: PipelineSpec, batch_ids: list[int], ledger: Ledger, kafka: KafkaSettings,
    log: logging.Logger = log,
) -> list[StageResult]:
    """Stage each batch in turn on one Spark session (spark-submit or Spark Connect) and log its summary.
    A Kafka data-loss refusal becomes a DataLossError naming the lost ranges; any other Spark failure a
    retryable StageFailedError of one sentence, its trace logged first for a bug report. Platform errors,
    an unreachable ledger and a lost Connect server pass through to their own handling."""
    results = []
    for batch_id in batch_ids:
        try:
            result = stage_batch(spark, spec, batch_id, ledger, kafka)
        except Exception as exc:
            if is_data_loss(exc):
                raise data_loss_error(spec, batch_id, ledger, kafka) from None
            if isinstance(exc, MicrobatchError | OperationalError) or is_unavailable(exc):
                raise
            log.info("trace of the failure of batch %s:", batch_id, exc_info=True)
            raise StageFailedError.from_exception(exc) from None
        if result is not None:
            log_stage_summary(log, result)
            results.append(result)
    return results


CONNECT_MODE_ENV = "SPARK_CONNECT_MODE_ENABLED"


@contextmanager
def connect_client_scope() -> Iterator[None]:
    """Unmark this process as a Spark Connect client when the block ends. Building a Connect session sets
    SPARK_CONNECT_MODE_ENABLED=1 in the process environment (pyspark.sql.functions reads it) and nothing unsets
    it; a spark-submit started later by the same process (another DAG's stage in one `microbatch run`, or a
    test) would inherit it, and its driver would take itself for a Connect client."""
    before = os.environ.get(CONNECT_MODE_ENV)
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(CONNECT_MODE_ENV, None)
        else:
            os.environ[CONNECT_MODE_ENV] = before


def connect_session(remote: str, conf: Mapping[str, str], share_key: str | None = None) -> SparkSession:
    """A Spark Connect session on `remote` (sc://host:port) with the pipeline's SQL settings and a UTC
    session time zone; the server's JVM is already warm, so nothing starts per batch.

    With `share_key` (the DAG id), the session is the server-side session that the DAG's stage tasks share
    (`spark_remote.shared_session_id`), and `stop()` then leaves it open on the server for the next batch. If the
    server has closed that session, this task opens a session of its own, released by `stop()` as before."""
    settings = {**conf, "spark.sql.session.timeZone": "UTC"}
    if share_key is not None and "session_id=" not in remote:
        shared = with_session_id(remote, shared_session_id(share_key, settings, time.time()))
        try:
            return _open_session(shared, settings, release=False)
        except Exception as exc:
            if not is_closed_session(exc):
                raise
            log.info("the server closed the stage's shared Spark Connect session; this stage opens one of its own")
    return _open_session(remote, settings, release=True)


def _open_session(remote: str, settings: Mapping[str, str], *, release: bool) -> SparkSession:
    spark = SparkSession.builder.remote(remote).create()
    bound_retries(spark)  # before the first call: create() sends none
    spark.release_session_on_close = release  # type: ignore[attr-defined]  # Connect's SparkSession
    try:
        for key, value in settings.items():
            if key.startswith("spark.sql."):  # the only settings a Connect session may change at run time
                spark.conf.set(key, value)
    except Exception:
        spark.release_session_on_close = False  # type: ignore[attr-defined]  # nothing to release
        spark.stop()
        raise
    return spark


def server_session(spark: SparkSession) -> str:
    """The first 8 characters of the server's id of a Connect session, for the task log: the same id in two
    stage tasks means the second reused the first's warm session."""
    client = getattr(spark, "client", None)
    server_id = getattr(client, "_server_session_id", None) or getattr(spark, "session_id", "")
    return str(server_id)[:8]
