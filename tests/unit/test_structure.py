"""The house's rooms stay small, and what users import keeps working across a restructure.

Every module of the package is at most 450 lines (the Alembic migrations aside: each is one revision, written
once), `sinks/` included. The imports below are the ones users' own files make:
every DAG file, a pipeline's Spark job, a script that loads a spec; the CLI's commands are pinned by
`docs/cli.md` (generated from the app; `test_docs.py` fails while it is stale) and by the list below.
"""
from __future__ import annotations

import inspect
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "include" / "microbatch"
MAX_LINES = 450

COMMANDS = {
    "migrate", "init-db", "generate", "run", "metrics", "maintain", "backfill", "abandon", "reset", "state",
    "publish", "status", "history", "find", "dead-letters", "reprocess", "verify", "reland", "show", "schema",
    "new", "demo", "airflow",
}


def _modules() -> list[Path]:
    return [path for path in sorted(PACKAGE.rglob("*.py"))
            if "migrations" not in path.relative_to(PACKAGE).parts]


def test_every_module_of_the_package_is_at_most_450_lines() -> None:
    sizes = {str(path.relative_to(PACKAGE)): len(path.read_text().splitlines()) for path in _modules()}
    assert len(sizes) > 40, "the walk found the package's modules"
    over = {name: lines for name, lines in sizes.items() if lines > MAX_LINES}
    assert not over, f"modules over {MAX_LINES} lines (split each by job): {over}"


def test_the_imports_users_make_keep_working() -> None:
    from microbatch.airflow.dags import backfill_dag, maintenance_dag, pipeline_dag
    from microbatch.config import PipelineSpec, find_spec
    from microbatch.transform import ERROR_COLUMN, EVENT_TIME_COLUMN, LATE_COLUMN, SparkJob, batch_constant

    assert all(callable(f) for f in (pipeline_dag, backfill_dag, maintenance_dag, batch_constant))
    assert {"parse", "state_metrics", "next_state", "outputs"} <= set(dir(SparkJob))
    assert (ERROR_COLUMN, LATE_COLUMN, EVENT_TIME_COLUMN) == ("error", "late", "event_time")
    spec = find_spec("clicks")
    assert isinstance(spec, PipelineSpec) and spec.name == "clicks"
    assert list(inspect.signature(find_spec).parameters) == ["name", "directory"]


def test_every_cli_command_stays() -> None:
    from typer.main import get_command

    from microbatch.cli import app, main

    assert callable(main)
    assert set(get_command(app).commands) == COMMANDS
