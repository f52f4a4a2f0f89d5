"""The CDC stack's settings, without starting a service (tests/integration/test_cdc_stack.py runs them): the worker on
loopback with Debezium's JSON, the connector's config holding a reference to the password and never the password, and
what counts as a running connector."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest

from microbatch.dev.cdc import (
    KafkaConnectWorker,
    connector_running,
    postgres_connector_config,
    source_postgres,
    topic_name,
    worker_properties,
)


def test_the_worker_listens_on_loopback_with_json_and_schemas_unless_told_otherwise(tmp_path: Path) -> None:
    settings = worker_properties("127.0.0.1:9092", 8083, tmp_path, tmp_path / "plugins", tmp_path / "secrets")
    assert settings["listeners"] == "http://127.0.0.1:8083"
    assert settings["key.converter"] == settings["value.converter"] == "org.apache.kafka.connect.json.JsonConverter"
    assert settings["value.converter.schemas.enable"] == settings["key.converter.schemas.enable"] == "true"
    assert settings["offset.storage.file.filename"] == str(tmp_path / "offsets.dat")
    assert settings["config.providers.file.param.allowed.paths"] == str(tmp_path / "secrets")
    bare = worker_properties("b:1", 1, tmp_path, tmp_path, tmp_path, schemas_enable=False)
    assert bare["value.converter.schemas.enable"] == "false"


def test_the_connector_config_names_the_password_file_not_the_password(tmp_path: Path) -> None:
    source = source_postgres(tmp_path / "pg", port=5999)
    worker = KafkaConnectWorker(tmp_path / "connect", "127.0.0.1:9092", port=8083)
    config = worker.postgres_config(source, name="orders-cdc", tables=["public.orders"], topic_prefix="cdc")
    assert source.password not in json.dumps(config)
    secret = tmp_path / "connect" / "secrets" / "orders-cdc.properties"
    assert config["database.password"] == f"${{file:{secret}:value}}"
    assert secret.read_text() == f"value={source.password}\n"
    assert stat.S_IMODE(secret.stat().st_mode) == 0o600
    assert config["slot.name"] == "orders_cdc" and config["plugin.name"] == "pgoutput"
    assert config["decimal.handling.mode"] == "precise" and config["snapshot.mode"] == "initial"
    assert config["publication.autocreate.mode"] == "filtered" and config["table.include.list"] == "public.orders"
    assert source.settings["wal_level"] == "logical"
    assert topic_name("cdc", "public.orders") == "cdc.public.orders"


def test_a_password_with_a_backslash_or_a_newline_is_escaped_for_the_properties_file(tmp_path: Path) -> None:
    worker = KafkaConnectWorker(tmp_path, "127.0.0.1:9092", port=8083)
    worker.secret_reference("x", "a\\b\nc")
    assert (tmp_path / "secrets" / "x.properties").read_text() == "value=a\\\\b\\nc\n"


def test_options_reach_the_config_and_extra_settings_win() -> None:
    source = source_postgres(Path("/nonexistent"), port=5999)
    config = postgres_connector_config(source, tables=["s.a", "s.b"], topic_prefix="p", slot="s",
                                       password_reference="${file:/x:value}", decimal_handling="string",
                                       partitions=3, extra={"snapshot.mode": "no_data"})
    assert config["table.include.list"] == "s.a,s.b" and config["decimal.handling.mode"] == "string"
    assert config["topic.creation.default.partitions"] == "3" and config["snapshot.mode"] == "no_data"


@pytest.mark.parametrize(("status", "running"), [
    (None, False),
    ({"name": "c", "connector": {"state": "RUNNING"}, "tasks": []}, False),
    ({"name": "c", "connector": {"state": "RUNNING"}, "tasks": [{"id": 0, "state": "UNASSIGNED"}]}, False),
    ({"name": "c", "connector": {"state": "RUNNING"}, "tasks": [{"id": 0, "state": "RUNNING"}]}, True),
])
def test_a_connector_runs_once_it_and_each_of_its_tasks_run(status: dict | None, running: bool) -> None:
    assert connector_running(status) is running


def test_a_failed_task_raises_with_the_first_line_of_its_trace() -> None:
    status = {"name": "c", "connector": {"state": "RUNNING"},
              "tasks": [{"id": 0, "state": "FAILED", "trace": "org.postgresql.util.PSQLException: refused\n\tat x"}]}
    with pytest.raises(RuntimeError, match=r"connector c failed: org.postgresql.util.PSQLException: refused$"):
        connector_running(status)
