"""Sink tables from the spec on a real PostgreSQL (and, for the plan, a real Kafka broker): `microbatch migrate`
creates them and applies additive changes, refuses destructive ones with one sentence before changing anything,
and the plan refuses to open a batch while the tables or the transform do not match the spec."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
import yaml
from sqlalchemy import text
from typer.testing import CliRunner

from microbatch.config import PipelineSpec, find_spec
from microbatch.errors import SpecError
from microbatch.ledger.database import Ledger, get_engine
from microbatch.phases.plan import plan_next_batch
from microbatch.settings import KafkaSettings
from microbatch.sinks.schema import apply, apply_changes, check, migrate, migrate_sinks, plan_changes, sink_metadata

pytestmark = pytest.mark.integration
IP_COUNT = find_spec("ip_count")


def probe_views(**sink: Any) -> PipelineSpec:
    """A pipeline with one new aggregate sink, `probe_views` by default (page, minute) -> views."""
    raw = IP_COUNT.model_dump(mode="json")
    raw["name"] = "pages"
    raw["sinks"] = [{
        "name": "probe_views", "type": "postgres_aggregate", "table": "probe_views",
        "columns": {"page": "text", "minute": "timestamptz", "views": "bigint"},
        "keys": ["page", "minute"], "sum_columns": ["views"], **sink,
    }]
    return PipelineSpec.model_validate(raw)


def write_spec(directory: Path, spec: PipelineSpec) -> None:
    directory.mkdir(exist_ok=True)
    (directory / f"{spec.name}.yaml").write_text(yaml.safe_dump(spec.model_dump(mode="json", exclude_none=True)))


def columns_of(url: str, table: str) -> dict[str, str]:
    with get_engine(url).connect() as conn:
        return {c["name"]: str(c["type"]) for c in sa.inspect(conn).get_columns(table)}


def refusal(url: str, spec: PipelineSpec) -> str:
    with pytest.raises(SpecError) as caught, get_engine(url).begin() as conn:
        apply(conn, spec)
    assert not caught.value.retryable
    return caught.value.message


def test_ip_count_tables_are_what_the_spec_declares(ledger_url: str) -> None:
    # The migrations made ip_counts, stage_ip_counts and ip_counts_contributions by hand; the spec says the same.
    with get_engine(ledger_url).connect() as conn:
        assert not plan_changes(conn, sink_metadata(IP_COUNT))
        check(conn, IP_COUNT)
    assert migrate_sinks(ledger_url)["ip_count"] == []


def test_the_migration_to_0010_turns_existing_contributions_tables_into_a_log(
        postgres: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A ledger at 0009 with a sink table `microbatch migrate` had created then: a primary key, rows in it.
    name = f"t_{uuid.uuid4().hex[:10]}"
    postgres.create_database(name)
    url = postgres.url(name)
    migrate(url, "0009")
    with get_engine(url).begin() as conn:
        conn.execute(text(
            "CREATE TABLE probe_views_contributions (batch_id bigint NOT NULL, topic text NOT NULL, "
            "partition integer NOT NULL, page text NOT NULL, minute timestamptz NOT NULL, views bigint NOT NULL, "
            "CONSTRAINT pk_probe_views_contributions PRIMARY KEY (batch_id, topic, partition, page, minute))"))
        conn.execute(text("INSERT INTO probe_views_contributions VALUES (1, 't', 0, '/home', now(), 3)"))
    write_spec(tmp_path / "pipelines", probe_views())
    monkeypatch.setenv("MICROBATCH_PIPELINES_DIR", str(tmp_path / "pipelines"))
    migrate(url)  # the ledger to head, then the sinks of every spec, as `microbatch migrate` does
    with get_engine(url).connect() as conn:
        inspector = sa.inspect(conn)
        for table in ("ip_counts_contributions", "probe_views_contributions"):
            assert inspector.get_pk_constraint(table)["constrained_columns"] == [], table
            assert {i["name"]: i["column_names"] for i in inspector.get_indexes(table)} == {f"ix_{table}": ["batch_id"]}
        assert conn.execute(text("SELECT sum(views) FROM probe_views_contributions")).scalar_one() == 3
        assert not plan_changes(conn, sink_metadata(probe_views()))
        assert not plan_changes(conn, sink_metadata(IP_COUNT))


def test_migrate_creates_the_tables_of_a_new_sink(ledger_url: str, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    spec = probe_views(window={"start": "minute", "end": "minute"})
    write_spec(tmp_path / "pipelines", spec)
    monkeypatch.setenv("MICROBATCH_PIPELINES_DIR", str(tmp_path / "pipelines"))
    migrate(ledger_url)  # the ledger, then the sinks of every spec (`make demo` takes this path)
    with get_engine(ledger_url).connect() as conn:
        inspector = sa.inspect(conn)
        assert inspector.get_pk_constraint("probe_views")["constrained_columns"] == ["page", "minute"]
        assert {i["name"]: i["column_names"] for i in inspector.get_indexes("probe_views")} == {
            "ix_probe_views_minute": ["minute"]}
        assert {i["name"]: i["column_names"] for i in inspector.get_indexes("stage_probe_views")} == {
            "ix_stage_probe_views_batch": ["batch_id", "attempt"]}
        assert inspector.get_pk_constraint("probe_views_contributions")["constrained_columns"] == []
        assert {i["name"]: i["column_names"] for i in inspector.get_indexes("probe_views_contributions")} == {
            "ix_probe_views_contributions": ["batch_id"]}
        # No foreign key: its per-row check dominated the commit (bench/commit_cost.py --explain).
        assert inspector.get_foreign_keys("probe_views_contributions") == []
        assert not any(c["nullable"] for c in inspector.get_columns("stage_probe_views"))
        check(conn, spec)
    assert columns_of(ledger_url, "probe_views")["views"] == "BIGINT"

    result = CliRunner().invoke(_cli(), ["migrate"], env={"MICROBATCH_LEDGER_URL": ledger_url,
                                                          "MICROBATCH_PIPELINES_DIR": str(tmp_path / "pipelines")})
    assert result.exit_code == 0, result.output
    assert "pages: sink tables up to date" in result.output


def _cli() -> Any:
    from microbatch.cli import app

    return app


def test_an_additive_change_is_applied(ledger_url: str) -> None:
    with get_engine(ledger_url).begin() as conn:
        assert sorted(apply(conn, probe_views())) == [
            "create table probe_views", "create table probe_views_contributions", "create table stage_probe_views"]
        conn.execute(text("INSERT INTO probe_views VALUES ('/home', now(), 3)"))
    windowed = probe_views(window={"start": "minute", "end": "minute"})
    with get_engine(ledger_url).connect() as conn, pytest.raises(SpecError, match="run `microbatch migrate`"):
        check(conn, windowed)  # the plan refuses until migrate has added the index
    with get_engine(ledger_url).begin() as conn:
        assert apply(conn, windowed) == ["create index ix_probe_views_minute on probe_views"]
    # A second sink: its tables are created, the first sink's are left as they are.
    raw = windowed.model_dump(mode="json")
    raw["sinks"].append({**raw["sinks"][0], "name": "probe_hits", "table": "probe_hits", "window": None})
    two = PipelineSpec.model_validate(raw)
    with get_engine(ledger_url).begin() as conn:
        assert sorted(apply(conn, two)) == [
            "create table probe_hits", "create table probe_hits_contributions", "create table stage_probe_hits"]
        check(conn, two)
        assert conn.execute(text("SELECT views FROM probe_views")).scalar_one() == 3
    # A new nullable column (a row sink's new column) is added, to a table with rows too.
    metadata = sink_metadata(windowed)
    metadata.tables["probe_views"].append_column(sa.Column("referrer", sa.Text, nullable=True))
    with get_engine(ledger_url).begin() as conn:
        changes = plan_changes(conn, metadata)
        assert (changes.additive, changes.refused) == (["add column referrer to probe_views"], [])
        apply_changes(conn, changes)
    assert columns_of(ledger_url, "probe_views")["referrer"] == "TEXT"


@pytest.mark.parametrize(("change", "expected"), [
    ({"columns": {"page": "text", "minute": "timestamptz", "views": "integer"}},
     "sink table probe_views: column views is bigint in the database but the spec says integer; change the spec "
     "back, or migrate the table yourself and run microbatch migrate again."),
    ({"columns": {"page": "text", "minute": "timestamptz", "views": "bigint", "clicks": "bigint"},
      "sum_columns": ["views", "clicks"]},
     "sink table probe_views: the spec adds column clicks, which is NOT NULL, but the table has rows"),
    ({"keys": ["page"], "sum_columns": ["minute", "views"]},
     "sink table probe_views: its primary key is (page, minute) in the database but (page) in the spec"),
])
def test_a_destructive_change_is_refused_and_the_table_untouched(ledger_url: str, change: dict[str, Any],
                                                                 expected: str) -> None:
    with get_engine(ledger_url).begin() as conn:
        apply(conn, probe_views())
        conn.execute(text("INSERT INTO probe_views VALUES ('/home', '2026-11-25T10:00:00Z', 3)"))
    before = columns_of(ledger_url, "probe_views")
    message = refusal(ledger_url, probe_views(**change))
    assert message.startswith("pages: " + expected.removesuffix(".")), message
    assert columns_of(ledger_url, "probe_views") == before
    with get_engine(ledger_url).connect() as conn:
        assert conn.execute(text("SELECT page, views FROM probe_views")).one() == ("/home", 3)
        assert not sa.inspect(conn).has_table("probe_clicks")


def test_a_dropped_column_is_refused(ledger_url: str) -> None:
    wide = probe_views(columns={"page": "text", "minute": "timestamptz", "views": "bigint", "clicks": "bigint"},
                      sum_columns=["views", "clicks"])
    with get_engine(ledger_url).begin() as conn:
        apply(conn, wide)
    message = refusal(ledger_url, probe_views())
    assert "column clicks is in the database but not in the spec" in message
    assert "clicks" in columns_of(ledger_url, "probe_views")


@pytest.fixture
def no_batches(ledger_url: str):
    """After the test: the plan opened nothing, not even the pipeline's row."""
    yield
    with get_engine(ledger_url).connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM batches")).scalar_one() == 0
        assert conn.execute(text("SELECT count(*) FROM pipelines")).scalar_one() == 0


def plan_refusal(spec: PipelineSpec, url: str, bootstrap: str) -> str:
    with pytest.raises(SpecError) as caught:
        plan_next_batch(spec, Ledger(url), KafkaSettings(bootstrap))
    assert not caught.value.retryable  # terminal: the DAG raises AirflowFailException, no retries
    assert "\n" not in caught.value.message
    return caught.value.message


def with_topic(spec: PipelineSpec, topic: str) -> PipelineSpec:
    raw = spec.model_dump(mode="json")
    raw["source"]["topics"] = [topic]
    return PipelineSpec.model_validate(raw)


def test_plan_refuses_a_missing_table(ledger_url: str, kafka, topic: str, no_batches) -> None:
    message = plan_refusal(with_topic(probe_views(), topic), ledger_url, kafka.bootstrap_servers)
    assert message == ("pages: sink table probe_views does not exist; run `microbatch migrate`, which creates the "
                       "sink tables the spec declares.")
    undeclared = probe_views(columns=None)
    with get_engine(ledger_url).begin() as conn:  # migrate cannot create them, and says so
        assert [line.split(" (")[0] for line in apply(conn, undeclared)] == [
            "not created: probe_views", "not created: stage_probe_views", "not created: probe_views_contributions"]
    message = plan_refusal(with_topic(undeclared, topic), ledger_url, kafka.bootstrap_servers)
    assert message.startswith("pages: sink table probe_views does not exist and the spec declares no columns")


def test_plan_refuses_a_column_type_drift(ledger_url: str, kafka, topic: str, no_batches) -> None:
    with get_engine(ledger_url).begin() as conn:
        conn.execute(text("ALTER TABLE ip_counts ALTER COLUMN count TYPE integer"))
    message = plan_refusal(with_topic(IP_COUNT, topic), ledger_url, kafka.bootstrap_servers)
    assert message == ("ip_count: sink table ip_counts: column count is integer in the database but the spec says "
                       "bigint; change the spec back, or migrate the table yourself and run microbatch migrate "
                       "again.")


@pytest.mark.parametrize(("transform", "expected"), [
    ("spark_jobs.no_such_job:transform", "but module spark_jobs.no_such_job is not found"),
    ("spark_jobs.ip_count:no_such_object", "but module spark_jobs.ip_count defines no 'no_such_object'"),
    ("spark_jobs.ip_count:window_seconds", "lacks the method(s) parse, state_metrics, next_state, outputs"),
])
def test_plan_refuses_a_transform_that_does_not_import(ledger_url: str, kafka, topic: str, no_batches,
                                                        transform: str, expected: str) -> None:
    raw = with_topic(IP_COUNT, topic).model_dump(mode="json")
    raw["job"]["transform"] = transform
    message = plan_refusal(PipelineSpec.model_validate(raw), ledger_url, kafka.bootstrap_servers)
    assert message.startswith(f"ip_count.yaml: field 'job.transform' names '{transform}'")
    assert expected in message


def test_plan_opens_a_batch_when_all_matches(ledger_url: str, kafka, topic: str) -> None:
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=kafka.bootstrap_servers, acks="all")
    for _ in range(3):
        producer.send(topic, b"x", partition=0)
    producer.flush()
    producer.close()
    outcome = plan_next_batch(with_topic(IP_COUNT, topic), Ledger(ledger_url), KafkaSettings(kafka.bootstrap_servers))
    assert outcome.batch_id is not None and outcome.records == 3


def test_every_column_type_round_trips(ledger_url: str) -> None:
    # A table made from the spec compares equal to the spec, for every type a spec may name (no false drift).
    from typing import get_args

    from microbatch.config import ColumnType

    typed = {f"c_{name.replace(' ', '_')}": name for name in get_args(ColumnType)}
    spec = probe_views(columns={"page": "text", **typed}, keys=["page"], sum_columns=list(typed))
    with get_engine(ledger_url).begin() as conn:
        apply(conn, spec)
    with get_engine(ledger_url).connect() as conn:
        changes = plan_changes(conn, sink_metadata(spec))
        assert not changes, changes
    drifted = probe_views(columns={"page": "text", **typed, "c_timestamptz": "timestamp"}, keys=["page"],
                         sum_columns=list(typed))
    assert "column c_timestamptz is timestamptz in the database but the spec says timestamp" in refusal(
        ledger_url, drifted)


def test_the_cli_refuses_a_type_change_with_one_sentence(ledger_url: str, tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    with get_engine(ledger_url).begin() as conn:
        apply(conn, probe_views())
    write_spec(tmp_path / "pipelines", probe_views(columns={"page": "text", "minute": "timestamptz",
                                                             "views": "integer"}))
    env = {**os.environ, "MICROBATCH_LEDGER_URL": ledger_url, "MICROBATCH_PIPELINES_DIR": str(tmp_path / "pipelines")}
    result = subprocess.run([sys.executable, "-m", "microbatch.cli", "migrate"], env=env, capture_output=True,
                            text=True, timeout=180, check=False)
    output = " ".join((result.stdout + result.stderr).split())
    assert result.returncode == 2, output
    assert ("error: pages: sink table probe_views: column views is bigint in the database but the spec says "
            "integer; change the spec back") in output
    assert "Traceback" not in output
    assert columns_of(ledger_url, "probe_views")["views"] == "BIGINT"
