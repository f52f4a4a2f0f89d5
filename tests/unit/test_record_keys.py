"""The spec's record model (issue 43): `source.key` and `source.value` formats, and upsert sinks keyed by the record
key (`keys_from: record_key`), refused at load in one sentence that names the field and says what to do."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from microbatch.config import PipelineSpec, decode_spec, encode_spec, load_spec
from microbatch.errors import SpecError

BASE = {
    "name": "payments",
    "source": {"topics": ["payments"], "key": "text",
               "value": {"format": "json", "fields": {"payment_id": "string", "amount_cents": "bigint",
                                                      "ts": "timestamp"}, "required": ["payment_id"]}},
    "job": {"transform": "spark_jobs.payments_example:transform"},
    "sinks": [{"name": "latest", "type": "postgres_upsert", "table": "latest", "keys_from": "record_key",
               "columns": {"key_text": "text", "amount_cents": "bigint", "ts": "timestamptz"}}],
}


def load(tmp_path: Path, spec: dict) -> PipelineSpec:
    path = tmp_path / "payments.yaml"
    path.write_text(yaml.safe_dump(spec))
    return load_spec(path)


def changed(change) -> dict:
    spec = copy.deepcopy(BASE)
    change(spec)
    return spec


def test_record_keyed_upsert_takes_the_decoded_keys_and_survives_a_round_trip(tmp_path):
    spec = load(tmp_path, BASE)
    assert spec.sinks[0].keys == ["key_text"]
    assert spec.record_keyed_sinks == ["latest"]
    assert spec.source.decodes
    assert decode_spec(encode_spec(spec)) == spec  # the token spark-submit's driver reads
    raw_key = load(tmp_path, changed(lambda s: (s["source"].pop("key"), s["sinks"][0]["columns"].pop("key_text"),
                                                s["sinks"][0]["columns"].update(key="bytea"))))
    assert raw_key.sinks[0].keys == ["key"]
    json_key = load(tmp_path, changed(lambda s: (
        s["source"].update(key={"format": "json", "fields": {"id": "string", "region": "string"}}),
        s["sinks"][0]["columns"].pop("key_text"), s["sinks"][0]["columns"].update(key_id="text", key_region="text"))))
    assert json_key.sinks[0].keys == ["key_id", "key_region"]
    ordered = load(tmp_path, changed(lambda s: s["sinks"][0].update(order_by="ts")))
    assert ordered.sinks[0].order_by == "ts"
    plain = load(tmp_path, changed(lambda s: (s.update(source={"topics": ["payments"]}), s["sinks"][0].update(
        keys_from="columns", keys=["amount_cents"]))))
    assert not plain.source.decodes and plain.source.key_format.name == plain.source.value_format.name == "raw"


@pytest.mark.parametrize(("change", "words"), [
    (lambda s: s["sinks"][0]["columns"].pop("key_text"), "keyed by the record key's column(s) key_text (the key "
     "decoded as UTF-8 by `source.key: text`); declare them in its columns, e.g. `key_text: text`, and keep them in "
     "its rows"),
    # issue 64: a sink that declares key_text without a key format is told which setting decodes the key into it
    (lambda s: s["source"].pop("key"), "column(s) key (the key's bytes, as no source.key format is set; "
     "`source.key: text` decodes it into key_text); declare"),
    (lambda s: s["sinks"][0].update(keys=["amount_cents"]), "takes its keys from the record key (key_text); remove"),
    (lambda s: s["sinks"][0].update(order_by="amount_cents"), "order_by 'amount_cents' must be a timestamptz"),
    (lambda s: s["sinks"][0].update(keys_from="columns"), "keys: list the key columns, or set keys_from"),
    (lambda s: s["source"]["value"]["fields"].update(error="string"), "'error' is a column the job adds itself"),
    (lambda s: s["source"]["value"]["fields"].update(offset="bigint"), "'offset' is the name of a record column"),
    (lambda s: s["source"]["value"]["fields"].update(amount="money"), "'money' is not a Spark SQL type"),
    (lambda s: s["source"]["value"].update(format="protobuf"),
     "'protobuf' is not a format; use one of raw, text, json, avro"),
    (lambda s: s["source"].update(key={"format": "json", "fields": {"ts": "string"}},
                                  value={"format": "json", "fields": {"key_ts": "string"}}), "'key_ts'"),
])
def test_bad_record_specs_are_refused_in_one_sentence(tmp_path, change, words):
    with pytest.raises(SpecError) as refused:
        load(tmp_path, changed(change))
    message = str(refused.value)
    assert words in message, message
    assert message.startswith("payments.yaml: field '") and "\n" not in message


def test_delta_upserts_take_record_keys_and_appends_refuse_them(tmp_path):
    delta = {"name": "lake", "type": "delta", "mode": "upsert", "keys_from": "record_key",
             "columns": {"key_text": "text", "amount_cents": "bigint"}}
    spec = load(tmp_path, changed(lambda s: s.update(sinks=[delta])))
    assert spec.sinks[0].keys == ["key_text"] and spec.record_keyed_sinks == ["lake"]
    with pytest.raises(SpecError, match="only an upsert table has keys, keys_from"):
        load(tmp_path, changed(lambda s: s.update(sinks=[{**delta, "mode": "append"}])))
