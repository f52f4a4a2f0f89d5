"""The stage's read of one attempt: what it reads (`Attempt`), the pass in which the records are decoded and counted
and the job's records held apart from the tombstones (`ReadPass`), the `stage.read` failpoint, and `read_attempt`,
the step that the stage and a reland both take to read a batch's ranges."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pyspark import StorageLevel
from pyspark.sql import Column, DataFrame, Observation, SparkSession
from pyspark.sql import functions as F

from microbatch import failpoints
from microbatch.config import PipelineSpec
from microbatch.event_time import PLANNED_OPTION
from microbatch.formats.base import Format
from microbatch.phases.kafka_source import kafka_records
from microbatch.phases.stage_metrics import keep_observed_metrics, record_metrics
from microbatch.phases.stage_records import DECODE_ERROR, decoded_records, is_tombstone
from microbatch.settings import KafkaSettings
from microbatch.types import OffsetRange

READ = failpoints.point("stage.read")  # a Spark Python worker dies after N records


@dataclass(frozen=True)
class Attempt:
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


@dataclass(frozen=True)
class ReadPass:
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
    def of(cls, spec: PipelineSpec, source: DataFrame, current: Attempt) -> ReadPass:
        apart = bool(spec.tombstone_sinks)
        decodes = spec.source.decodes or apart  # a record-keyed pipeline refuses a record without a key
        key, value = current.formats or (spec.source.key_format, spec.source.value_format)
        decoded = decoded_records(source, key, value, spec.record_keyed_sinks)
        records = with_read_failpoint(decoded)  # the failpoint's worker dies in the pass that decodes
        if not (decodes or apart):
            return cls(decoded, records, None, None)
        observation = Observation(f"read_{current.batch_id}_{current.attempt}")
        metrics = record_metrics(current.partition_keys, count_partitions=current.count_partitions, decodes=decodes,
                                 tombstones_apart=True,
                                 stops=tuple(dict.fromkeys((*key.stopping_reasons, *value.stopping_reasons))))
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


def read_attempt(
    spark: SparkSession, spec: PipelineSpec, current: Attempt, kafka: KafkaSettings
) -> tuple[DataFrame, ReadPass]:
    """Read exactly the attempt's ranges: the records of Spark's Kafka source (`kafka_records`), and the pass that
    decodes them and holds the tombstones apart (`ReadPass`), in a session that keeps the read's observed metrics."""
    source = kafka_records(spark, spec, current.ranges, kafka)
    read = ReadPass.of(spec, source, current)
    keep_observed_metrics(spark)
    return source, read


def read_ranges(
    spark: SparkSession, spec: PipelineSpec, ranges: list[OffsetRange], kafka: KafkaSettings
) -> DataFrame:
    """The records of exactly `ranges` (with the `stage.read` failpoint when it is set)."""
    return with_read_failpoint(kafka_records(spark, spec, ranges, kafka))


def with_read_failpoint(records: DataFrame) -> DataFrame:
    """`records`, read through the `stage.read` failpoint when it is set."""
    arming = READ.arming()  # decided here, in the driver or the Connect client, when the plan is built
    if arming is not None:
        records = crash_after_records(records, arming, failpoints.env_marker_dir())
    return records


def crash_after_records(df: DataFrame, arming: failpoints.Arming, marker_dir: str | None) -> DataFrame:
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
