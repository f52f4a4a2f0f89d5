"""The stage phase (Flink's `preCommit`): read exactly a batch's ranges with Spark's Kafka source,
apply the job, and bulk-write the output to staging tables tagged (batch_id, attempt).

Nothing staged is visible in a sink until the commit phase moves it there. A crash anywhere
here leaves the batch open; the retry takes a new attempt number and stages again.

The read is `stage_read.py` (over `kafka_source.py`, observed by `stage_metrics.py`), the job and each sink's rows
`stage_job.py`, the bad records and the count of the read `stage_records.py`; Spark sessions are built by
`microbatch.spark_session`. Their names stay importable from here.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any

from pyspark import StorageLevel
from pyspark.sql import DataFrame, Observation, SparkSession
from pyspark.sql import functions as F
from sqlalchemy.exc import OperationalError

from microbatch import failpoints
from microbatch.config import PipelineSpec
from microbatch.errors import DataLossError, MicrobatchError, SpecError, StageFailedError
from microbatch.event_time import check_event_time_column, check_state_times
from microbatch.kafka.offsets import offset_bounds, offsets_client
from microbatch.ledger import repository as repo
from microbatch.ledger.database import Ledger, stage_lock
from microbatch.ledger.models import BatchState
from microbatch.phases.kafka_source import (
    KAFKA_SOURCE_LOGGER,
    KAFKA_SOURCE_NAMES,
    V1_SOURCE_LIST,
    as_records,
    kafka_read_options,
    kafka_records,
    quiet_pooled_group_warning,
    read_kafka_through_v2,
    record_columns,
    with_pooled_consumers,
)
from microbatch.phases.pins import bound_formats, registry_sides, staged_pins
from microbatch.phases.reporting import log_stage_summary
from microbatch.phases.results import StageResult
from microbatch.phases.stage_job import job_outputs, load_job, sink_output, sink_rows, takes_late_records
from microbatch.phases.stage_metrics import (
    AQE_EMPTY_RELATION,
    STOP_PARTITION,
    job_metrics,
    keep_observed_metrics,
    read_metrics,
    record_metrics,
)
from microbatch.phases.stage_read import (
    READ,
    Attempt,
    ReadPass,
    crash_after_records,
    read_attempt,
    read_ranges,
    with_read_failpoint,
)
from microbatch.phases.stage_records import (
    count_records_read,
    jdbc_options,
    stage_bad_records,
    stage_undecodable,
    write_staging,
)
from microbatch.planning import data_loss_at_read, lost_ranges
from microbatch.settings import KafkaSettings
from microbatch.sinks.base import StageContext, write_table
from microbatch.sinks.capabilities import LakeTable
from microbatch.sinks.registry import sinks_of
from microbatch.spark_remote import is_unavailable
from microbatch.spark_session import CONNECT_MODE_ENV, connect_client_scope, connect_session, server_session
from microbatch.transform import SparkJob

log = logging.getLogger(__name__)
BEFORE_READ = failpoints.point("stage.before_read")  # a hold point: the Spark job after it reads Kafka
AFTER_WRITE = failpoints.point("stage.after_write")
AFTER_STAGED = failpoints.point("stage.after_staged")

# The names the stage's parts had here before they moved, for code that imports them from this module.
_Attempt, _ReadPass, _kafka_records, _read_ranges = Attempt, ReadPass, kafka_records, read_ranges
_with_read_failpoint, _crash_after_records = with_read_failpoint, crash_after_records
_job_outputs, _sink_rows = job_outputs, sink_rows
__all__ = [  # the stage's names, wherever they live
    "AFTER_STAGED", "AFTER_WRITE", "AQE_EMPTY_RELATION", "BEFORE_READ", "CONNECT_MODE_ENV", "KAFKA_SOURCE_LOGGER",
    "KAFKA_SOURCE_NAMES", "READ", "V1_SOURCE_LIST", "Attempt", "ReadPass", "as_records", "connect_client_scope",
    "connect_session", "crash_after_records", "data_loss_error", "is_data_loss", "jdbc_options", "job_metrics",
    "job_outputs", "kafka_read_options", "kafka_records", "keep_observed_metrics", "load_job",
    "quiet_pooled_group_warning", "read_attempt", "read_kafka_through_v2", "read_metrics", "read_ranges",
    "record_columns", "record_metrics", "server_session", "sink_output", "sink_rows", "stage_batch", "stage_batches",
    "takes_late_records", "with_pooled_consumers", "with_read_failpoint", "write_staging",
]


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
        result = _stage_attempt(spark, spec, Attempt(batch_id, start.attempt, start.ranges, start.state_before,
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


def _stage_attempt(
    spark: SparkSession, spec: PipelineSpec, current: Attempt, ledger: Ledger, kafka: KafkaSettings
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
    source, read = read_attempt(spark, spec, current, kafka)
    parsed = job.parse(read.for_job, current.parse_options(spec), current.state_before)
    check_event_time_column(parsed, spec.name)
    jdbc = jdbc_options(ledger)
    BEFORE_READ.hit()  # the Spark job below reads Kafka
    values, rows_by_sink, read_seconds = _stage_outputs(spec, job, parsed, current, jdbc, ledger, read)
    if values.get("stopping"):
        raise stopped_batch(spec.name, batch_id, values)

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


def _stage_outputs(
    spec: PipelineSpec, job: SparkJob, parsed: DataFrame, current: Attempt, jdbc: Mapping[str, str],
    ledger: Ledger, read: ReadPass | None = None,
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
    lake = any(isinstance(sink, LakeTable) for sink in sinks)
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
    outputs = job_outputs(job, observed, options, current.state_before, sinks)
    rows_by_sink: dict[str, int] = {}
    t_read = time.monotonic()
    if lake:
        observed.count()
    for sink in sinks:
        assert sink.staging is not None
        rows = sink_output(spec, sink, outputs, tombstones)
        if isinstance(sink, LakeTable):
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


def stopped_batch(pipeline: str, batch_id: int, values: Mapping[str, Any]) -> SpecError:
    """The terminal refusal of a batch that reads a record its format stops at (`Format.stopping_reasons`)."""
    partition, offset = divmod(int(values["stop_at"]), STOP_PARTITION)
    where = f"{values['stop_topic']}[{partition}] offset {offset}"
    return SpecError(
        f"batch {batch_id} of {pipeline} stops at {where}: {values['stop_reason']} ({values['stopping']} such "
        "record(s)); nothing was committed.",
        fix=f"Make the sinks match the source as of that record (for a truncate: empty each table and its _versions), "
            f"close the batch with `microbatch abandon {pipeline} {batch_id}`, move past the record with `microbatch "
            f"reset {pipeline} --topic {values['stop_topic']} --partition {partition} --to offset --value {offset + 1}`"
            ", then run the pipeline again (docs/cdc.md).")


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
