"""What operators read: a failing task ends in one sentence naming the cause and the fix, and no
password appears anywhere in the logs, even when the connection carries one."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from sqlalchemy import make_url

from tests.e2e.helpers import run_log, run_pipeline, write_test_spec

pytestmark = pytest.mark.e2e


def test_bad_ledger_password_fails_with_one_sentence_and_no_secret(service_env, topic, kafka, ledger_url, tmp_path):
    specs = write_test_spec(tmp_path / "pipelines", topic, 1000, bootstrap=kafka.bootstrap_servers)
    wrong = make_url(ledger_url).set(password="not-the-Secret-42")
    env = {**service_env, "MICROBATCH_PIPELINES_DIR": str(specs),
           "MICROBATCH_LEDGER_URL": wrong.render_as_string(hide_password=False)}
    result = run_pipeline(env, max_runs=1)
    assert result.returncode != 0
    shown, log = result.stdout + result.stderr, run_log(result)  # the terminal; it and the run's log file
    assert "Cannot use the ledger database at postgresql+psycopg://microbatch:***@127.0.0.1" in shown
    assert "password authentication failed" in shown
    assert "Check the Airflow connection microbatch_ledger or MICROBATCH_LEDGER_URL" in shown
    for secret in ("not-the-Secret-42", make_url(ledger_url).password):
        assert secret not in log
        for path in Path(os.environ["AIRFLOW_HOME"]).rglob("*.log"):
            assert secret not in path.read_text(errors="replace"), path


def test_bad_spec_is_one_sentence(service_env, topic, tmp_path):
    specs = tmp_path / "pipelines"
    write_test_spec(specs, topic, 1000)
    path = specs / "ip_count.yaml"
    path.write_text(path.read_text().replace("max_records_per_batch: 1000", "max_records_per_batch: -5"))
    result = run_pipeline({**service_env, "MICROBATCH_PIPELINES_DIR": str(specs)}, max_runs=1)
    assert result.returncode == 2
    assert "ip_count.yaml: field 'source.max_records_per_batch' Input should be greater than 0." in result.stdout
    assert "Traceback" not in result.stdout + result.stderr
