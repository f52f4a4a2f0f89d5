"""What the stage observes while it reads: the aggregates over the records read (`record_metrics`) and over the job's
parsed rows (`job_metrics`), and the session setting that keeps them when a batch has no good rows."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pyspark.sql import Column, SparkSession
from pyspark.sql import functions as F

from microbatch.phases.stage_records import DECODE_ERROR, PARTITION_COUNTER, is_tombstone
from microbatch.transform import ERROR_COLUMN, LATE_COLUMN, SparkJob


def read_metrics(
    job: SparkJob, options: Mapping[str, Any], partition_keys: list[tuple[str, int]], *, count_partitions: bool
) -> dict[str, Column]:
    """Aggregates observed during the read: the records read, dead letters, late records and the job's state
    metrics, and with `count_partitions` the records of each source partition too (`record_metrics` and
    `job_metrics` in one observation, for a job that is given every record read)."""
    return {**record_metrics(partition_keys, count_partitions=count_partitions), **job_metrics(job, options)}


STOP_PARTITION = 10**13
"""`stop_at` is the first stopping record's partition times this plus its offset (one number, so one `min`)."""


def record_metrics(
    partition_keys: list[tuple[str, int]], *, count_partitions: bool, decodes: bool = False,
    tombstones_apart: bool = False, stops: tuple[str, ...] = (),
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
    if decodes and stops:  # records whose reason stops the batch (`Format.stopping_reasons`): how many, the first
        stopping = F.col(DECODE_ERROR).startswith(stops[0])
        for opening in stops[1:]:
            stopping = stopping | F.col(DECODE_ERROR).startswith(opening)
        metrics["stopping"] = F.count(F.when(stopping, True))
        at = F.col("partition").cast("bigint") * STOP_PARTITION + F.col("offset")
        metrics["stop_at"] = F.min(F.when(stopping, at))
        metrics["stop_topic"] = F.min(F.when(stopping, F.col("topic")))
        metrics["stop_reason"] = F.min(F.when(stopping, F.col(DECODE_ERROR)))
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
