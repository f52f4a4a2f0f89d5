"""Pure text helpers of the CLI."""

import sqlite3

import pytest
from sqlalchemy.exc import OperationalError

from microbatch.cli import _runs_text, airflow_metadata_error


def test_history_names_both_runs_when_a_later_run_committed_the_batch():
    assert _runs_text("scheduled__a", "scheduled__b") == "planned by scheduled__a, committed by scheduled__b"


def test_history_names_one_run_when_the_same_run_planned_and_committed():
    assert _runs_text("manual__a", "manual__a") == "manual__a"
    assert _runs_text("manual__a", None) == "manual__a"
    assert _runs_text(None, None) == "-"


def test_a_locked_airflow_metadata_file_is_not_reported_as_the_ledger(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("AIRFLOW_HOME", "/srv/airflow")
    locked = OperationalError("UPDATE task_instance ...", {}, sqlite3.OperationalError("database is locked"))
    error = airflow_metadata_error(locked)
    assert error is not None
    assert "Airflow's metadata database in /srv/airflow failed: database is locked" in str(error)
    assert "ledger database" not in str(error) and "AIRFLOW_HOME" in error.fix


def test_a_ledger_failure_is_left_to_the_ledger_sentence():
    import psycopg

    assert airflow_metadata_error(OperationalError("SELECT 1", {}, psycopg.OperationalError("refused"))) is None
