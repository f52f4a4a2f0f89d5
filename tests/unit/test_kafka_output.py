"""A kafka sink of its own rows (issue 46): what its spec accepts and refuses, the tables it needs, the topic it
declares, and the headers of its records. Pure logic: no Kafka, no Postgres."""

from __future__ import annotations

import pytest
import sqlalchemy as sa
from pydantic import TypeAdapter, ValidationError

from microbatch.config import OutputTopic, SinkSpec
from microbatch.sinks.kafka_publish import record_headers
from microbatch.sinks.registry import sink_for

SINKS: TypeAdapter = TypeAdapter(SinkSpec)
OWN = {"name": "captured", "type": "kafka", "topic": "payments_captured", "key": "payment_id",
       "columns": {"payment_id": "text", "amount_cents": "bigint"},
       "headers": {"source-offset": "offset", "merchant": "payment_id"}, "partitions": 3,
       "topic_config": {"cleanup.policy": "compact"}}


def test_own_rows_stage_like_an_append_sink_and_declare_their_topic():
    spec = SINKS.validate_python(OWN)
    assert spec.own_rows and spec.query_kind == "rows" and spec.query_columns == ["payment_id", "amount_cents"]
    assert spec.output_topic == OutputTopic("kafka_default", "payments_captured", 3, None,
                                            {"cleanup.policy": "compact"})
    sink = sink_for(spec)
    assert sink.staging is not None and sink.staging.columns == ("payment_id", "amount_cents", "topic", "partition",
                                                                 "offset")
    assert sink.include_late and sink.table is None
    tables = {t.name: t for t in sink.tables(sa.MetaData())}
    assert list(tables) == ["stage_kafka_captured"]
    assert [c.name for c in tables["stage_kafka_captured"].columns] == [
        "batch_id", "attempt", "payment_id", "amount_cents", "topic", "partition", "offset"]


def test_a_sink_publishing_another_sinks_rows_stages_nothing_itself():
    spec = SINKS.validate_python({"name": "out", "type": "kafka", "topic": "o", "source": "raw", "key": "user"})
    assert not spec.own_rows and spec.staging_table is None and spec.query_kind is None
    assert sink_for(spec).staging is None and sink_for(spec).tables(sa.MetaData()) == []
    assert spec.output_topic == OutputTopic("kafka_default", "o")  # the broker's defaults


@pytest.mark.parametrize(("change", "words"), [
    ({"columns": None}, "has no source: declare the columns it publishes"),
    ({"key": "amount"}, "key 'amount' is not one of its columns (payment_id, amount_cents, topic, partition, offset)"),
    ({"headers": {"trace": "traceparent"}}, "header 'trace' takes 'traceparent', which is not a published column"),
    ({"headers": {"microbatch.seq": "offset"}}, "names starting with microbatch. are the platform's own"),
    ({"columns": {"offset": "bigint"}}, "declares offset, which the platform adds itself"),
    ({"source": "raw"}, "publishes the rows of 'raw'; remove columns"),
    ({"partitions": 0}, "greater than or equal to 1"),
])
def test_bad_kafka_sinks_are_refused_in_one_sentence(change, words):
    with pytest.raises(ValidationError) as refused:
        SINKS.validate_python({**OWN, **change})
    assert words in str(refused.value), str(refused.value)


def test_records_carry_their_sequence_marks_and_the_declared_headers():
    spec = SINKS.validate_python(OWN)
    row = {"payment_id": "p1", "amount_cents": 12, "topic": "t", "partition": 1, "offset": 42}
    assert record_headers(spec, 7, row) == [("microbatch.seq", b"7"), ("source-offset", b"42"),
                                            ("merchant", b"p1")]
    retraction = {"topic": "t", "partition": 1, "offset": 42, "retraction": True, "correction": True}
    assert record_headers(spec, 8, retraction) == [("microbatch.seq", b"8"), ("microbatch.correction", b"1"),
                                                   ("microbatch.retraction", b"1"), ("source-offset", b"42")]
