"""Spark's Kafka source as the stage reads it: the options that read exactly a batch's ranges, the records of the job
contract it yields (`as_records`), the pooled consumers and the V2 scan a long-lived Spark reuses, and the records of
exactly some ranges (`kafka_records`)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from microbatch.config import PipelineSpec
from microbatch.kafka.security import spark_client_options
from microbatch.settings import KafkaSettings
from microbatch.transform import HEADERS_COLUMN, RECORD_COLUMNS
from microbatch.types import OffsetRange


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


def kafka_records(
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
