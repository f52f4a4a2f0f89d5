"""`microbatch show`, `find` and `verify` on lakehouse tables that hold nothing, or are gone (issue 58): never a
traceback. An `iceberg` and a `delta` sink made by `microbatch migrate` on a real PostgreSQL ledger (the Iceberg
catalog in it), read while empty, after an empty commit (pyiceberg's empty APPEND snapshot, delta-rs's empty
append: `show` crashed with `ArrowInvalid: Must pass at least one table` on the first), and after the table is
removed. The CLI runs in process through its console entry point `main` (the `console` fixture): a traceback or an
"unexpected error" sentence fails the test. No Spark."""

from __future__ import annotations

import shutil
import uuid
from pathlib import Path

import pyarrow as pa
import pytest
import yaml
from deltalake import DeltaTable, write_deltalake
from pyiceberg.catalog.sql import SqlCatalog
from sqlalchemy import text

from microbatch.config import find_spec
from microbatch.ledger import repository as repo
from microbatch.ledger.database import transaction

pytestmark = pytest.mark.integration
PIPELINE = "lake_views"


@pytest.fixture
def lake(ledger_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, console):
    """The pipeline's spec (an iceberg and a delta sink, relative paths with a suffix of this test's own) in a
    pipelines directory of this test, its tables migrated into a warehouse of this test; a runner of the CLI."""
    suffix = uuid.uuid4().hex[:8]
    specs, warehouse = tmp_path / "pipelines", tmp_path / "warehouse"
    specs.mkdir()
    spec = {
        "name": PIPELINE, "schedule": None,
        "source": {"topics": [f"orders_{suffix}"]},
        "job": {"transform": "spark_jobs.clicks:transform"},
        "sinks": [
            {"name": "orders_ice", "type": "iceberg", "namespace": f"ns_{suffix}", "table": "orders_lake",
             "path": f"orders_ice_{suffix}", "columns": {"user": "text", "page": "text"}},
            {"name": "orders_delta", "type": "delta", "path": f"orders_delta_{suffix}",
             "columns": {"user": "text", "page": "text"}},
        ],
    }
    (specs / f"{PIPELINE}.yaml").write_text(yaml.safe_dump(spec))
    for key, value in {"MICROBATCH_LEDGER_URL": ledger_url, "MICROBATCH_PIPELINES_DIR": str(specs),
                       "MICROBATCH_WAREHOUSE": str(warehouse), "COLUMNS": "250"}.items():
        monkeypatch.setenv(key, value)
    run = console

    code, output = run("migrate")
    assert code == 0, output
    assert f"create iceberg table ns_{suffix}.orders_lake at {warehouse / f'orders_ice_{suffix}'}" in output, output
    assert f"create delta table {warehouse / f'orders_delta_{suffix}'}" in output, output
    assert "not created" not in output, output  # the iceberg sink's `table:` is no Postgres table
    catalog = SqlCatalog("microbatch", uri=ledger_url.replace("postgresql://", "postgresql+psycopg://", 1),
                         warehouse=f"file://{warehouse}")
    return {"run": run, "catalog": catalog, "iceberg": (f"ns_{suffix}", "orders_lake"),
            "delta": str(warehouse / f"orders_delta_{suffix}"), "ledger_url": ledger_url}


def shown(lake: dict, sink: str) -> str:
    code, output = lake["run"]("show", PIPELINE, sink)
    assert code == 0, output
    return output


def refused(lake: dict, *args: str, code: int = 2) -> str:
    """The command fails with one sentence (`error: ...`), nothing else."""
    got, output = lake["run"](*args)
    assert got == code, output
    if code == 2:
        assert output.startswith("error: ") and output.count("error:") == 1, output
    return output


def test_show_reads_empty_lake_tables_and_names_missing_ones(lake: dict) -> None:
    # As `migrate` made them: no snapshot, version 0 without files.
    assert "orders_ice (iceberg, read by pyiceberg): 0 rows in version 0 of" in shown(lake, "orders_ice")
    assert "orders_delta (delta, read by delta-rs): 0 rows in version 0 of" in shown(lake, "orders_delta")
    code, both = lake["run"]("show", PIPELINE)
    assert code == 0 and both.count(": 0 rows in version") == 2, both

    # Empty commits: pyiceberg's APPEND of no row, and an `add_files` of no file (the snapshot the bug made, with no
    # manifest at all); delta-rs's append of no row.
    table = lake["catalog"].load_table(lake["iceberg"])
    table.append(pa.Table.from_pylist([], schema=table.schema().as_arrow()))
    table.add_files([])
    empty = lake["catalog"].load_table(lake["iceberg"]).current_snapshot()
    assert empty is not None
    assert f": 0 rows in version {empty.snapshot_id} of" in shown(lake, "orders_ice")
    write_deltalake(lake["delta"], pa.schema(DeltaTable(lake["delta"]).schema().to_arrow()).empty_table(),
                    mode="append")
    assert DeltaTable(lake["delta"]).version() == 1
    assert "orders_delta (delta, read by delta-rs): 0 rows in version 1 of" in shown(lake, "orders_delta")
    # A row, then an empty snapshot on top of it: the row is still the table's, in one file.
    table = lake["catalog"].load_table(lake["iceberg"])
    table.append(pa.Table.from_pylist([{"user": "u1", "page": "/a", "topic": "t", "partition": 0, "offset": 7}],
                                      schema=table.schema().as_arrow()))
    table.add_files([])
    one = shown(lake, "orders_ice")
    assert ": 1 rows in version" in one and ", 1 files; newest rows" in one and "│ t │ 0 │ 7 │ /a │ u1 │" in one, one
    code, counted = lake["run"]("show", PIPELINE, "orders_ice", "--count-by", "page")
    assert code == 0 and "│ /a │ 1 │" in counted, counted

    # Missing: the Delta folder deleted; the Iceberg table's folder deleted (its catalog row left pointing at a
    # metadata file that is gone), then its catalog row dropped.
    shutil.rmtree(lake["delta"])
    assert "Delta table" in refused(lake, "show", PIPELINE, "orders_delta")
    assert "does not exist. Run `microbatch migrate`" in refused(lake, "show", PIPELINE, "orders_delta")
    shutil.rmtree(table.location().removeprefix("file://"))
    gone = refused(lake, "show", PIPELINE, "orders_ice")
    assert "is in the catalog, but its metadata file under" in gone and "is gone" in gone, gone
    with transaction(lake["ledger_url"]) as session:
        session.execute(text("DELETE FROM iceberg_tables WHERE table_namespace = :ns AND table_name = :name"),
                        {"ns": lake["iceberg"][0], "name": lake["iceberg"][1]})
    missing = refused(lake, "show", PIPELINE, "orders_ice")
    assert f"Iceberg table {'.'.join(lake['iceberg'])} of sink 'orders_ice' does not exist." in missing, missing


def test_find_and_verify_answer_in_one_sentence_without_batches_or_tables(lake: dict) -> None:
    never = refused(lake, "find", PIPELINE, "orders", "0", "5")
    assert f"The ledger has no pipeline '{PIPELINE}' yet: it has never run." in never, never
    with transaction(lake["ledger_url"]) as session:  # known to the ledger, no batch yet
        repo.ensure_pipeline(session, find_spec(PIPELINE), lock=True)
    topic = find_spec(PIPELINE).source.topics[0]
    unread = refused(lake, "find", PIPELINE, topic, "0", "5")
    assert f"has never read a topic '{topic}' (it has read nothing yet)" in unread, unread

    code, output = lake["run"]("verify", PIPELINE)
    assert code == 0 and "ok: iceberg orders_ice: 0 committed batches" in output, output
    shutil.rmtree(lake["delta"])
    with transaction(lake["ledger_url"]) as session:
        session.execute(text("DELETE FROM iceberg_tables WHERE table_namespace = :ns AND table_name = :name"),
                        {"ns": lake["iceberg"][0], "name": lake["iceberg"][1]})
    problems = refused(lake, "verify", PIPELINE, code=1)
    assert f"violation iceberg orders_ice: no table {'.'.join(lake['iceberg'])} in the catalog" in problems, problems
    assert f"violation delta orders_delta: no table at {lake['delta']}" in problems, problems


def test_verify_answers_on_a_table_of_empty_snapshots(lake: dict) -> None:
    with transaction(lake["ledger_url"]) as session:
        repo.ensure_pipeline(session, find_spec(PIPELINE), lock=True)
    lake["catalog"].load_table(lake["iceberg"]).add_files([])  # the snapshot the bug made: no manifest
    code, output = lake["run"]("verify", PIPELINE)
    assert code == 0 and "ok: iceberg orders_ice: 0 committed batches" in output, output
