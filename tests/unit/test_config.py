"""Spec validation: the shipped specs load, and each bad case names the file and the field."""

from datetime import timedelta
from pathlib import Path

import pytest
import yaml

from microbatch.config import PIPELINES_DIR, decode_spec, encode_spec, load_spec, spec_paths
from microbatch.errors import SpecError


def write(tmp_path: Path, data: dict, name: str = "demo") -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def base() -> dict:
    return yaml.safe_load((PIPELINES_DIR / "ip_count.yaml").read_text()) | {"name": "demo"}


def test_every_shipped_spec_is_valid():
    paths = spec_paths(PIPELINES_DIR)
    assert paths, "no specs shipped"
    for path in paths:
        assert load_spec(path).name == path.stem


def test_ip_count_spec_values():
    spec = load_spec(PIPELINES_DIR / "ip_count.yaml")
    assert spec.source.topics == ["ip_count_source"]
    assert spec.schedule_value == timedelta(seconds=30)
    assert spec.retries.count == 3 and spec.retries.delay_seconds == 10
    assert spec.sinks[0].staging_table == "stage_ip_counts"
    assert spec.group_id == "microbatch.ip_count"


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: d["source"].update(topicz=["x"]), "field 'source.topicz' is not a known setting"),
        (lambda d: d.update(extra_key=1), "field 'extra_key' is not a known setting"),
        (lambda d: d["source"].pop("topics"), "field 'source.topics' is required"),
        (lambda d: d["source"].update(max_records_per_batch=0), "field 'source.max_records_per_batch'"),
        (lambda d: d["source"].update(startup="sometime"), "field 'source.startup'"),
        (lambda d: d["source"].update(topics=["a", "a"]), "lists a topic twice"),
        (lambda d: d["source"].update(topics=["bad topic!"]), "not a valid Kafka topic name"),
        (lambda d: d["job"].update(transform="no_colon"), "field 'job.transform' must look like"),
        (lambda d: d["sinks"][0].update(table="Drop Table"), "field 'sinks.0.table'"),
        (lambda d: d.update(schedule="every now and then"), "field 'schedule' must be a cron expression"),
        (lambda d: d["retries"].update(count=-1), "field 'retries.count'"),
        (lambda d: d["sinks"][0].update(type="nosuch"), "field 'sinks.0' Input tag 'nosuch' found using 'type'"),
    ],
)
def test_bad_specs_name_file_and_field(tmp_path, mutate, message):
    data = base()
    mutate(data)
    with pytest.raises(SpecError) as error:
        load_spec(write(tmp_path, data))
    assert str(error.value).startswith("demo.yaml: ")
    assert message in str(error.value)
    assert "\n" not in str(error.value)


def test_name_must_match_file(tmp_path):
    with pytest.raises(SpecError, match="must equal the file name 'other'"):
        load_spec(write(tmp_path, base(), name="other"))


def test_malformed_yaml_names_the_line(tmp_path):
    path = tmp_path / "demo.yaml"
    path.write_text("name: demo\nsource: [unclosed\n")
    with pytest.raises(SpecError, match=r"demo.yaml: the YAML is malformed at line \d"):
        load_spec(path)


def test_durations_and_presets():
    data = base()
    cases = [("5m", timedelta(minutes=5)), ("@continuous", "@continuous"), ("*/5 * * * *", "*/5 * * * *")]
    for value, expected in cases:
        data["schedule"] = value
        from microbatch.config import PipelineSpec

        assert PipelineSpec.model_validate(data).schedule_value == expected


def without_spark_mode() -> dict:
    data = base()
    data["spark"].pop("mode")
    return data


def test_spark_mode_defaults_and_connection_of_each_mode(tmp_path):
    assert load_spec(write(tmp_path, without_spark_mode())).spark.mode == "submit"
    assert load_spec(write(tmp_path, without_spark_mode())).spark.connection == "spark_default"
    data = base()
    data["spark"] = {"mode": "connect", "conf": {"spark.sql.shuffle.partitions": "4"}}
    spec = load_spec(write(tmp_path, data))
    assert (spec.spark.mode, spec.spark.connection) == ("connect", "spark_connect_default")
    data["spark"]["connection"] = "my_connect"
    assert load_spec(write(tmp_path, data)).spark.connection == "my_connect"
    data["spark"] = {"connection": "my_master"}
    assert load_spec(write(tmp_path, data)).spark.connection == "my_master"


def test_connect_mode_refuses_settings_a_session_cannot_change(tmp_path):
    data = base()
    data["spark"] = {"mode": "connect", "conf": {"spark.sql.shuffle.partitions": "4", "spark.ui.enabled": "false",
                                                  "spark.executor.memory": "2g"}}
    with pytest.raises(SpecError) as error:
        load_spec(write(tmp_path, data))
    message = str(error.value)
    assert message.startswith("demo.yaml: field 'spark.conf' sets spark.executor.memory, spark.ui.enabled,")
    assert "set it on the Connect server" in message and "\n" not in message
    data["spark"]["mode"] = "submit"  # spark-submit takes any setting
    assert load_spec(write(tmp_path, data)).spark.conf["spark.ui.enabled"] == "false"


def test_unknown_spark_mode_names_the_field(tmp_path):
    data = base()
    data["spark"]["mode"] = "kubernetes"
    with pytest.raises(SpecError, match=r"demo.yaml: field 'spark.mode' Input should be 'submit', 'connect' or 'auto'"):
        load_spec(write(tmp_path, data))


def test_auto_mode_resolves_by_the_connect_server_and_takes_that_modes_connection(tmp_path):
    data = base()
    data["spark"] = {"mode": "auto", "conf": {"spark.sql.shuffle.partitions": "4"}}
    spark = load_spec(write(tmp_path, data)).spark
    assert (spark.mode, spark.connection) == ("auto", None)
    assert (spark.resolved(True).mode, spark.resolved(True).connection) == ("connect", "spark_connect_default")
    assert (spark.resolved(False).mode, spark.resolved(False).connection) == ("submit", "spark_default")
    assert spark.resolved(True).conf == spark.conf
    explicit = load_spec(write(tmp_path, without_spark_mode())).spark
    assert explicit.resolved(True) == explicit  # only auto follows the server


def test_the_maintenance_spark_submit_takes_the_default_spark_connection_in_every_mode(tmp_path):
    data = base()
    for mode, connection in (("auto", None), ("connect", "my_connect"), ("submit", "my_cluster")):
        data["spark"] = {"mode": mode, "conf": {"spark.sql.shuffle.partitions": "4"},
                         **({"connection": connection} if connection else {})}
        spark = load_spec(write(tmp_path, data)).spark.for_submit()
        assert (spark.mode, spark.connection) == ("submit", connection if mode == "submit" else "spark_default")
        assert spark.conf == {"spark.sql.shuffle.partitions": "4"}


def test_auto_mode_refuses_a_connection_and_server_side_settings(tmp_path):
    data = base()
    data["spark"] = {"mode": "auto", "connection": "spark_default"}
    with pytest.raises(SpecError, match=r"demo.yaml: field 'spark.connection' is not used in mode 'auto'"):
        load_spec(write(tmp_path, data))
    data["spark"] = {"mode": "auto", "conf": {"spark.ui.enabled": "false"}}
    with pytest.raises(SpecError) as error:
        load_spec(write(tmp_path, data))
    assert str(error.value).startswith("demo.yaml: field 'spark.conf' sets spark.ui.enabled, which a Spark Connect")
    assert "mode 'auto' runs as a Connect client where MICROBATCH_SPARK_REMOTE is set" in str(error.value)


def test_shipped_pipelines_run_in_auto_mode():
    from microbatch.config import PIPELINES_DIR

    for name in ("ip_count", "clicks"):
        assert load_spec(PIPELINES_DIR / f"{name}.yaml").spark.mode == "auto"


@pytest.mark.parametrize("path", spec_paths(PIPELINES_DIR), ids=lambda p: p.stem)
def test_every_shipped_spec_travels_to_the_stage_driver_unchanged(path):
    # The stage driver gets its spec from --spec, not from a spec file it may not have (issue 16).
    spec = load_spec(path)
    token = encode_spec(spec)
    assert token.isascii() and not set(token) & set(" \t\n'\"$;&|")
    assert decode_spec(token) == spec


def test_a_stage_given_a_broken_spec_token_says_so_in_one_sentence():
    with pytest.raises(SpecError, match="--spec argument is not an encoded pipeline spec"):
        decode_spec("bm90IGEgc3BlYw==")


def test_a_key_column_missing_from_the_columns_is_refused_by_name(tmp_path):
    data = yaml.safe_load((PIPELINES_DIR / "clicks.yaml").read_text()) | {"name": "demo"}
    index, sink = next((i, s) for i, s in enumerate(data["sinks"]) if s["type"] == "postgres_upsert")
    sink["keys"] = ["nosuch"]
    with pytest.raises(SpecError) as error:
        load_spec(write(tmp_path, data))
    assert f"field 'sinks.{index}' keys: nosuch is not among the columns; declare it in columns" in str(error.value)
    assert "\n" not in str(error.value)


def test_retries_back_off_exponentially_up_to_a_bound_and_reach_airflow(tmp_path):
    from microbatch.airflow.dags import _default_args
    from microbatch.config import RetrySpec

    assert RetrySpec().delay_bounds() == [(10, 19), (20, 39), (40, 79)]
    assert RetrySpec(count=5, delay_seconds=30).delay_bounds() == [(30, 59), (60, 119), (120, 120), (120, 120),
                                                                    (120, 120)]
    assert RetrySpec(count=2, delay_seconds=7, backoff=1).delay_bounds() == [(7, 7), (7, 7)]
    assert RetrySpec(count=3, delay_seconds=0).delay_bounds() == [(1, 1)] * 3  # Airflow waits 1 s at least
    with pytest.raises(ValueError, match="backoff"):
        RetrySpec(backoff=0.5)

    data = base()
    data.pop("retries", None)
    args = _default_args(load_spec(write(tmp_path, data)))
    assert (args["retries"], args["retry_delay"].total_seconds(), args["retry_exponential_backoff"],
            args["max_retry_delay"].total_seconds()) == (3, 10, 2.0, 120)
