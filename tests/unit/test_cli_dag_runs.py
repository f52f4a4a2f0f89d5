"""What `microbatch run`, `backfill`, `maintain` and `demo` print of their DAG runs: one line per run and a failed run's
one-sentence cause on the terminal; Airflow's lines, the tasks' lines and every traceback in the log file."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
import typer

from microbatch import cli
from microbatch.airflow.runner import RunOutcome
from microbatch.errors import MicrobatchError

FAILED = RunOutcome("manual__2", "failed", {"plan": "success", "stage": "failed", "commit": "upstream_failed"},
                    {"plan": 0.42, "stage": 3.25})
# A stage driver's ERROR line as Airflow's SparkSubmitHook copies it into the task log, and as the hook's exception
# repeats it after "Last spark-submit output:".
HOOK_LINE = ("2026-11-27T22:21:08.269712Z [info     ] 2026-11-27 22:21:08,255 ERROR microbatch.stage: stage failed: "
             "The stage failed: Py4JError: boom [x]. [airflow.task.hooks.airflow.providers.apache.spark.hooks."
             "spark_submit.SparkSubmitHook] loc=spark_submit.py:965\n")
RAW_LINE = "2026-11-27 22:21:08,255 ERROR microbatch.stage: stage failed: The stage failed: Py4JError: boom [x].\n"


def test_a_run_line_has_each_task_state_and_its_seconds_in_order_and_the_tries_of_a_retried_one():
    assert cli._run_line(FAILED) == "manual__2: failed (plan success 0.4s, stage failed 3.2s, commit upstream_failed)"
    caught_up = RunOutcome("manual__3", "success", {"plan": "skipped", "stage": "skipped"}, {"plan": 0.05})
    assert cli._run_line(caught_up) == "manual__3: success (plan skipped 0.1s, stage skipped)"
    retried = RunOutcome("manual__4", "success", {"plan": "success", "stage": "success"}, {"plan": 1, "stage": 103.5},
                         {"plan": 1, "stage": 2})
    assert cli._run_line(retried) == "manual__4: success (plan success 1.0s, stage success 103.5s in 2 tries)"


def test_the_cause_is_the_last_error_line_a_task_logged_in_this_process():
    logged = [(100, "Cannot use the ledger database at x: refused. Check it."), (250, "Later sentence. Fix it.")]
    assert cli.run_cause(logged, b"", 0) == "Later sentence. Fix it."
    assert cli.run_cause([], b"2026-11-27T22:21:08Z [info     ] nothing wrong [microbatch] loc=a.py:1\n", 0) is None


def test_a_spark_submit_drivers_error_line_is_found_in_the_log_without_airflows_suffix():
    sentence = "stage failed: The stage failed: Py4JError: boom [x]."
    assert cli.run_cause([], HOOK_LINE.encode(), 0) == sentence
    assert cli.run_cause([], RAW_LINE.encode(), 0) == sentence
    info = HOOK_LINE.replace(" ERROR microbatch", " INFO microbatch")
    assert cli.run_cause([], info.encode(), 0) is None
    other = HOOK_LINE.replace("ERROR microbatch.stage", "ERROR py4j.clientserver")
    assert cli.run_cause([], other.encode(), 0) is None


def test_the_last_line_wins_whether_a_driver_or_this_process_wrote_it():
    """Positions are byte offsets in the log file: the driver's line at `start` + the bytes before it."""
    before = "µ read 10 records [microbatch] loc=stage.py:1\n".encode()  # µ is two bytes: offsets count bytes
    chunk = before + HOOK_LINE.encode()
    start = 1000
    driver_at = start + len(before)
    assert cli.run_cause([(driver_at - 1, "earlier in-process")], chunk, start).startswith("stage failed:")
    assert cli.run_cause([(driver_at + 1, "later in-process")], chunk, start) == "later in-process"


def test_a_failed_run_without_a_sentence_points_at_the_traceback():
    assert cli._no_cause(FAILED) == ("The stage task failed on an unexpected error, with no one-sentence cause: its "
                                     "traceback is in the full log.")
    assert cli._no_cause(RunOutcome("r", "failed", {"a": "failed", "b": "failed"})).startswith("The a and b tasks ")
    assert cli._no_cause(RunOutcome("r", "failed", {"a": "upstream_failed"})).startswith("The DAG run failed ")


def _noise(step: str) -> None:
    """What Airflow and spark-submit write meanwhile: to this process's stdout and stderr, and a child's."""
    os.write(1, f"2026-11-27T22:21:08Z [info     ] {step}: Airflow's noise [airflow.task] loc=x.py:1\n".encode())
    os.write(2, b"Traceback (most recent call last):\n  File \"x.py\", line 1\nRuntimeError: noise\n")
    subprocess.run([sys.executable, "-c", f"print('a child of {step}')"], check=True)


def test_dag_runs_print_one_line_per_run_and_a_failed_runs_cause_and_the_rest_goes_to_the_file(
        tmp_path: Path, capfd: pytest.CaptureFixture[str]):
    log_file = tmp_path / "logs" / "run.log"
    with cli._dag_runs(log_file) as report:
        _noise("run 1")
        logging.getLogger("microbatch").error("%s", "An error of a run that then succeeded. Ignore it.")
        report(RunOutcome("manual__1", "success", {"plan": "success"}, {"plan": 1.0}))
        _noise("run 2")
        logging.getLogger("microbatch.phases").error("The stage found [topic][0] unreachable. Start it.")
        os.write(1, HOOK_LINE.encode())  # an earlier attempt's driver line: the in-process line after it wins
        logging.getLogger("microbatch").error("%s", "Cannot reach the server at sc://h:1 [x]. Start it.")
        logging.getLogger("elsewhere").error("not a task's sentence")
        report(FAILED)
    terminal = capfd.readouterr()
    assert terminal.out.splitlines() == [
        "manual__1: success (plan success 1.0s)",
        "manual__2: failed (plan success 0.4s, stage failed 3.2s, commit upstream_failed)",
        "error: Cannot reach the server at sc://h:1 [x]. Start it.",
        f"full log: {log_file}",
    ]
    assert terminal.err == ""
    logged = log_file.read_text()
    assert logged.count("Traceback") == 2 and "a child of run 2" in logged and "Airflow's noise" in logged
    assert not any(isinstance(h, cli._ErrorLines) for h in logging.getLogger("microbatch").handlers)

    with cli._dag_runs(log_file) as report:  # appended to; a new run's cause is only its own lines'
        report(RunOutcome("manual__3", "failed", {"plan": "failed", "stage": "upstream_failed"}))
    assert capfd.readouterr().out.splitlines()[1] == ("error: The plan task failed on an unexpected error, with no "
                                                      "one-sentence cause: its traceback is in the full log.")
    assert log_file.read_text().startswith(logged)


def test_an_error_that_stops_the_runs_is_one_sentence_its_traceback_in_the_file(tmp_path: Path,
                                                                                 capfd: pytest.CaptureFixture[str]):
    log_file = tmp_path / "run.log"
    with pytest.raises(MicrobatchError) as stopped, cli._dag_runs(log_file):
        raise KeyError("dag_id")
    assert str(stopped.value) == (f"The DAG runs stopped on an unexpected error: KeyError: 'dag_id'. Its traceback "
                                  f"is in {log_file}.")
    with pytest.raises(MicrobatchError, match="The ledger is gone"), cli._dag_runs(log_file):
        raise MicrobatchError("The ledger is gone.")  # main() prints it as it is
    with pytest.raises(typer.Exit) as interrupted, cli._dag_runs(log_file):
        raise KeyboardInterrupt
    assert interrupted.value.exit_code == 130
    terminal = capfd.readouterr()
    assert terminal.out == f"interrupted; full log: {log_file}\n" and terminal.err == ""
    logged = log_file.read_text()
    assert "KeyError: 'dag_id'" in logged and "The ledger is gone." in logged and "KeyboardInterrupt" in logged


def test_run_announces_its_log_file_and_exits_1_when_the_last_run_failed(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch,
                                                                         capfd: pytest.CaptureFixture[str]):
    import microbatch.airflow.runner
    import microbatch.config

    def runs(pipeline: str, max_runs: int, on_outcome) -> list[RunOutcome]:
        assert (pipeline, max_runs) == ("ip_count", 5)
        _noise("run 1")
        logging.getLogger("microbatch").error("%s", "Cannot reach the Spark Connect server. Start it.")
        on_outcome(FAILED)
        return [FAILED]

    monkeypatch.setattr(microbatch.config, "find_spec", lambda name: None)
    monkeypatch.setattr(microbatch.airflow.runner, "run_until_caught_up", runs)
    monkeypatch.setenv("MICROBATCH_CACHE_DIR", str(tmp_path))
    with pytest.raises(typer.Exit) as failed:
        cli.run("ip_count", 5, None)
    assert failed.value.exit_code == 1
    lines = capfd.readouterr().out.splitlines()
    (log_file,) = (tmp_path / "logs").iterdir()
    assert lines == [f"running the ip_count DAG until it has caught up; Airflow's task log: {log_file}",
                     cli._run_line(FAILED), "error: Cannot reach the Spark Connect server. Start it.",
                     f"full log: {log_file}"]
    assert log_file.name.startswith("ip_count-") and log_file.name.endswith(f"-{os.getpid()}.log")
    assert "Traceback" in log_file.read_text()

    given = tmp_path / "given.log"
    with pytest.raises(typer.Exit):
        cli.run("ip_count", 5, given)
    assert capfd.readouterr().out.splitlines()[0].endswith(f"Airflow's task log: {given}")
    assert "a child of run 1" in given.read_text()
