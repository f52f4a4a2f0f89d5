"""The DAG runs of a command (`run`, `backfill`, `maintain`, `reprocess`, `demo`) on the terminal: Airflow's and the
tasks' log lines go to a file; the terminal gets one line per DAG run and a failed run's one-sentence cause (the
last ERROR line microbatch logged in it, in this process or in a spark-submit driver)."""

from __future__ import annotations

import logging
import os
import re
import sys
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import typer
from rich.console import Console
from rich.markup import escape

from microbatch.cli.common import _run_log_path, console
from microbatch.cli.sentences import _sentence
from microbatch.errors import MicrobatchError, error_summary

if TYPE_CHECKING:
    from microbatch.airflow.runner import RunOutcome


@contextmanager
def _output_to(path: Path) -> Iterator[Console]:
    """Send everything this process and its children print (Airflow's log, spark-submit's) to `path`, appended;
    yields a console that still prints where this process's output went before (the terminal)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    with path.open("a") as log_file, os.fdopen(os.dup(saved[0]), "w", buffering=1, errors="replace",
                                               encoding=sys.stdout.encoding or "utf-8") as terminal:
        out = Console(file=terminal, soft_wrap=True, width=console.width)  # measured while fd 1 is the terminal
        os.dup2(log_file.fileno(), 1)
        os.dup2(log_file.fileno(), 2)
        try:
            yield out
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            os.close(saved[0])
            os.close(saved[1])


DRIVER_ERROR = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} ERROR microbatch[\w.]*: (?P<sentence>.+?)"
                          r"(?: \[[\w.]+\] loc=\S+.*)?$")
"""An ERROR line of a "microbatch" logger in a spark-submit driver (spark_jobs/run_batch.py's format), as it is in
the log: alone, or inside the line of Airflow's SparkSubmitHook that copied it (then followed by that logger's name
and location)."""


def _run_line(outcome: RunOutcome) -> str:
    """A DAG run in one line: its id, its state, and each task's state and seconds (over all its tries, and how many
    when it was retried), in the order the tasks ran."""
    def step(task: str, state: str) -> str:
        seconds = outcome.task_seconds.get(task)
        tries = outcome.task_tries.get(task, 1)
        return f"{task} {state}" + ("" if seconds is None else f" {seconds:.1f}s") + (
            f" in {tries} tries" if tries > 1 else "")

    return f"{outcome.run_id}: {outcome.state} ({', '.join(step(t, s) for t, s in outcome.task_states.items())})"


def run_cause(logged: list[tuple[int, str]], chunk: bytes, start: int) -> str | None:
    """The one-sentence cause of a failed DAG run: the last ERROR line of a "microbatch" logger in it (a task's
    `fail()`). Those written in this process are `logged`, each with the log file's size when it was written; those
    of spark-submit drivers are found in `chunk`, the bytes the run added to the log file from offset `start`.
    None when the run logged no such line."""
    lines = list(logged)
    at = start
    for line in chunk.splitlines(keepends=True):
        found = DRIVER_ERROR.search(line.decode(errors="replace").rstrip())
        if found:
            lines.append((at, found["sentence"]))
        at += len(line)
    return sorted(lines, key=lambda line: line[0])[-1][1].strip() if lines else None


def _no_cause(outcome: RunOutcome) -> str:
    """What a failed run says when none of its tasks logged a one-sentence cause: an unexpected error."""
    failed = [task for task, state in outcome.task_states.items() if state == "failed"]
    what = f"The {' and '.join(failed)} task{'s' if len(failed) > 1 else ''}" if failed else "The DAG run"
    return f"{what} failed on an unexpected error, with no one-sentence cause: its traceback is in the full log."


def _masked(text: str) -> str:
    """`text` with the secrets Airflow masks in its task logs shown as ***, as the log file has them (a process in
    which no task ran has not loaded the masker, and it knows no secret)."""
    masker = sys.modules.get("airflow.sdk._shared.secrets_masker")
    return text if masker is None else str(masker.redact(text))


class _ErrorLines(logging.Handler):
    """The ERROR lines of the "microbatch" loggers in this process, each with `where()`: the log file's size when
    the line was written, so that they can be ordered with the drivers' lines in the file."""

    def __init__(self, where: Callable[[], int]) -> None:
        super().__init__(logging.ERROR)
        self.where = where
        self.lines: list[tuple[int, str]] = []

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.lines.append((self.where(), record.getMessage()))
        except Exception:  # a handler never fails the code that logs
            self.handleError(record)


def _log_for(name: str, given: Path | None, doing: str) -> Path:
    """The log file of this command's DAG runs (`given`, else a new one), announced with what is about to run."""
    path = (given or _run_log_path(name)).absolute()
    console.print(f"{doing}; Airflow's task log: {path}", highlight=False, markup=False)
    return path


@contextmanager
def _dag_runs(log_file: Path) -> Iterator[Callable[[RunOutcome], None]]:
    """Airflow's and the tasks' log lines go to `log_file`, never to the terminal. Yields `report`, to be called
    with each DAG run's outcome as the run ends: it prints the run's line and, when the run failed, its cause (the
    last ERROR line microbatch logged in it) and where the full log is. An error that stops the runs leaves its
    traceback in the file and reaches the terminal as one sentence; Ctrl-C exits 130, its traceback in the file."""

    def size() -> int:
        sys.stdout.flush()
        sys.stderr.flush()
        return log_file.stat().st_size

    def log_traceback() -> None:
        size()  # what was written before it, first
        with log_file.open("a") as log:
            log.write(traceback.format_exc())

    with _output_to(log_file) as terminal:
        errors = _ErrorLines(size)
        microbatch_log = logging.getLogger("microbatch")
        microbatch_log.addHandler(errors)
        start = size()

        def report(outcome: RunOutcome) -> None:
            nonlocal start
            end = size()
            terminal.print(_run_line(outcome), highlight=False, markup=False)
            if outcome.state != "success":
                with log_file.open("rb") as log:
                    log.seek(start)
                    cause = run_cause(errors.lines, log.read(max(end - start, 0)), start) or _no_cause(outcome)
                terminal.print(f"[red]error:[/red] {escape(_masked(cause))}", highlight=False)
                terminal.print(f"full log: {log_file}", highlight=False, markup=False)
            errors.lines.clear()
            start = end

        try:
            yield report
        except KeyboardInterrupt:
            log_traceback()
            terminal.print(f"interrupted; full log: {log_file}", highlight=False, markup=False)
            raise typer.Exit(130) from None
        except typer.Exit:
            raise
        except Exception as exc:
            log_traceback()
            if _sentence(exc) is None:  # main() prints the others' sentence
                raise MicrobatchError(f"The DAG runs stopped on an unexpected error: {error_summary(exc)}.",
                                      fix=f"Its traceback is in {log_file}.") from None
            raise
        finally:
            microbatch_log.removeHandler(errors)
