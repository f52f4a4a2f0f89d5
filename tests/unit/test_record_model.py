"""The record model a job's `parse` is given (issue 43): the Kafka source's columns under the contract's names,
the headers only with `source.include_headers`, and the option that makes Spark read them. The read itself, on a
real broker, is tests/integration/test_kafka_records.py."""

from __future__ import annotations

from microbatch.config import PipelineSpec, SourceSpec, load_spec, spec_paths
from microbatch.phases.stage import kafka_read_options, record_columns
from microbatch.settings import KafkaSettings
from microbatch.transform import HEADERS_COLUMN, RECORD_COLUMNS, SOURCE_COLUMNS
from microbatch.types import OffsetRange

KAFKA_SOURCE_COLUMNS = {"key", "value", "topic", "partition", "offset", "timestamp", "timestampType", "headers"}
RANGES = [OffsetRange("t", 0, 5, 9)]


def test_a_job_is_given_every_column_of_the_kafka_source_with_timestamp_type_renamed():
    plain = record_columns(include_headers=False)
    assert [job for _, job in plain] == list(RECORD_COLUMNS)
    assert ("timestampType", "timestamp_type") in plain
    assert all(source == job for source, job in plain if job != "timestamp_type")
    assert set(SOURCE_COLUMNS) <= set(RECORD_COLUMNS)
    assert record_columns(include_headers=True) == [*plain, (HEADERS_COLUMN, HEADERS_COLUMN)]
    assert {source for source, _ in record_columns(include_headers=True)} == KAFKA_SOURCE_COLUMNS


def test_spark_reads_the_headers_only_when_the_spec_asks():
    kafka = KafkaSettings("127.0.0.1:9092")
    assert kafka_read_options(RANGES, kafka, "read_committed")["includeHeaders"] == "false"
    assert kafka_read_options(RANGES, kafka, "read_committed", include_headers=True)["includeHeaders"] == "true"


def test_include_headers_defaults_to_off_and_the_spec_reference_describes_it():
    from docs.hooks import spec_reference

    assert SourceSpec(topics=["t"]).include_headers is False
    field = PipelineSpec.model_json_schema()["$defs"]["SourceSpec"]["properties"]["include_headers"]
    assert field["type"] == "boolean" and field["default"] is False
    (row,) = [line for line in spec_reference().splitlines() if line.startswith("| `include_headers`")]
    assert "`headers` column" in row and "base64" in row and "timestamp_type" in row


def test_every_shipped_spec_reads_without_headers():
    assert all(not load_spec(path).source.include_headers for path in spec_paths())
