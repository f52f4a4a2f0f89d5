"""Every CLI command, fed bad values on real Kafka and Postgres, answers with one sentence naming what to
change and a non-zero exit; never a traceback. The shipped spec directory is used (no
MICROBATCH_PIPELINES_DIR), as a user runs the CLI, but by the failing DAG runs at the end (a test copy of
ip_count, with short retry delays)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from microbatch.dev.datagen import generate_lines, produce_lines
from microbatch.dev.kafka import create_topic
from microbatch.dev.process import free_port
from microbatch.runtime import cache_dir
from tests.e2e.helpers import write_test_spec

pytestmark = pytest.mark.e2e

# (arguments, what the one sentence must say); the ledger knows ip_count only after the `reset` below.
BEFORE_ANY_RUN = [
    (["history", "ip_count"], "The ledger has no pipeline 'ip_count' yet: it has never run. Run it first"),
    (["status", "ip_count"], "The ledger has no pipeline 'ip_count' yet"),
    (["verify", "ip_count"], "The ledger has no pipeline 'ip_count' yet"),
    (["find", "ip_count", "ip_count_source", "0", "5"], "The ledger has no pipeline 'ip_count' yet"),
]
AFTER_A_RUN = [
    (["history", "nosuch"], "There is no pipeline 'nosuch' in"),
    (["status", "nosuch"], "Known pipelines: clicks, ip_count"),
    (["verify", "nosuch"], "There is no pipeline 'nosuch' in"),
    (["find", "nosuch", "ip_count_source", "0", "5"], "There is no pipeline 'nosuch' in"),
    (["run", "nosuch"], "There is no pipeline 'nosuch' in"),
    (["publish", "nosuch"], "There is no pipeline 'nosuch' in"),
    (["find", "ip_count", "nosuchtopic", "0", "5"],
     "has never read a topic 'nosuchtopic' (it has read ip_count_source)"),
    (["find", "ip_count", "ip_count_source", "9", "5"], "has never read partition 9 of ip_count_source"),
    (["find", "ip_count", "ip_count_source", "x", "5"], "Invalid value for 'partition'"),
    (["backfill", "ip_count", "--topic", "ip_count_source", "--start", "0", "--end", "5", "--partitions", "x"],
     "--partitions 'x' is not \"all\" or a list of partition numbers"),
    (["backfill", "ip_count", "--topic", "elsewhere", "--start", "0", "--end", "5"],
     "Backfill parameter 'topic': 'elsewhere' is not a topic"),
    (["backfill", "ip_count", "--topic", "ip_count_source", "--start", "5", "--end", "2"], "Backfill parameter"),
    (["backfill", "ip_count", "--topic", "ip_count_source", "--start", "0", "--end", "5", "--mode", "redo"],
     "Backfill parameter 'mode'"),
    (["reset", "ip_count", "--to", "offset", "--value", "abc"], "--value 'abc' is not an offset"),
    (["reset", "ip_count", "--to", "offset"], "reset --to offset needs --value"),
    (["reset", "ip_count", "--to", "sideways"], "--to 'sideways' is not a target"),
    (["reset", "ip_count", "--to", "timestamp", "--value", "yesterday"], "'yesterday' is not an ISO-8601 time"),
    (["reset", "ip_count", "--to", "latest", "--partition", "9", "--yes"], "partition 9 does not exist"),
    (["abandon", "ip_count", "999", "--yes"], "Batch 999 of ip_count is not open"),
    (["show", "ip_count", "nosink"], "Pipeline 'ip_count' has no sink 'nosink'. Use one of: ip_counts, ip_count_sink."),
    (["show", "nosuch"], "There is no pipeline 'nosuch' in"),
]
NO_STACK = [["status"], ["history", "ip_count"], ["find", "ip_count", "ip_count_source", "0", "5"],
            ["verify", "ip_count"], ["show", "ip_count"], ["publish", "ip_count"], ["generate", "--count", "5"],
            ["reset", "ip_count", "--to", "latest", "--yes"], ["abandon", "ip_count", "1", "--yes"],
            ["backfill", "ip_count", "--topic", "ip_count_source", "--start", "0", "--end", "5", "--dry-run"]]


def _cli(env: dict[str, str], args: list[str], timeout: float = 180) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if k != "MICROBATCH_PIPELINES_DIR"}
    return subprocess.run([sys.executable, "-m", "microbatch.cli", *args], env={**full, **env},
                          capture_output=True, text=True, timeout=timeout, check=False)


def _assert_one_sentence(result: subprocess.CompletedProcess[str], expected: str) -> None:
    output = result.stdout + result.stderr
    assert result.returncode != 0, output
    assert expected in " ".join(output.split()), output
    assert "Traceback" not in output, output
    errors = [line for line in output.splitlines() if "error" in line.lower()]
    assert len(errors) == 1, output


def test_every_command_refuses_bad_values_with_one_sentence(service_env: dict[str, str], kafka) -> None:
    create_topic(kafka.bootstrap_servers, "ip_count_source", 4)
    for args, expected in BEFORE_ANY_RUN:
        _assert_one_sentence(_cli(service_env, args), expected)
    # Positions for every partition, without a DAG run: the ledger now knows ip_count.
    moved = _cli(service_env, ["reset", "ip_count", "--to", "earliest", "--yes"])
    assert moved.returncode == 0, moved.stdout + moved.stderr
    for args, expected in AFTER_A_RUN:
        _assert_one_sentence(_cli(service_env, args), expected)


def test_unreachable_services_are_one_sentence(service_env: dict[str, str]) -> None:
    closed = free_port()
    ledger = service_env["MICROBATCH_LEDGER_URL"].rsplit("@", 1)[0] + f"@127.0.0.1:{closed}/microbatch"
    _assert_one_sentence(_cli({**service_env, "MICROBATCH_LEDGER_URL": ledger}, ["history", "ip_count"]),
                         "Cannot use the ledger database at")
    _assert_one_sentence(_cli({**service_env, "MICROBATCH_KAFKA_BOOTSTRAP": f"127.0.0.1:{closed}"},
                              ["generate", "--count", "5"]), f"No Kafka broker answered at 127.0.0.1:{closed}")


@pytest.mark.parametrize("args", NO_STACK, ids=lambda args: args[0])
def test_without_a_stack_every_command_says_how_to_start_one(args: list[str], tmp_path: Path) -> None:
    # No connection variable and no running local stack: an empty cache stands for a fresh clone (the
    # user's path without this override, after `make down`, is in test_demo_e2e).
    env = {"MICROBATCH_CACHE_DIR": str(tmp_path), "MICROBATCH_LEDGER_URL": "", "MICROBATCH_KAFKA_BOOTSTRAP": ""}
    result = _cli(env, args)
    _assert_one_sentence(result, "no local stack is running")
    assert "make demo" in result.stdout


def test_a_failed_dag_run_prints_its_cause_and_where_the_log_is(service_env: dict[str, str], topic: str, kafka,
                                                                tmp_path: Path) -> None:
    """`run` and `backfill` of a failing pipeline print their log file's path, one line per DAG run, the failed
    task's one sentence and where the full log is: nothing else. Airflow's lines and tracebacks are in the file:
    the default one under .cache/logs (`run`), or the one `--log-file` names (`backfill`)."""
    specs = write_test_spec(tmp_path / "pipelines", topic, 1000, spark_mode="connect",
                            bootstrap=kafka.bootstrap_servers)
    port = free_port()  # no Spark Connect server there: the stage fails, after plan planned a batch
    env = {**service_env, "MICROBATCH_PIPELINES_DIR": str(specs), "MICROBATCH_SPARK_REMOTE": f"sc://127.0.0.1:{port}"}
    produce_lines(kafka.bootstrap_servers, topic, generate_lines(200, seed=42))
    failing = [  # (arguments, the DAG, the failed task, its sentence, whether --log-file is given)
        (["run", "ip_count", "--max-runs", "1"], "ip_count", "stage failed",
         f"Cannot reach the Spark Connect server at sc://127.0.0.1:{port}: connection refused. Start it", False),
        (["backfill", "ip_count", "--topic", topic, "--mode", "replay", "--start", "0", "--end", "latest"],
         "ip_count__backfill", "plan failed", "was never committed, so there is nothing to replay", True),
    ]
    for args, dag, failed_task, cause, given_log in failing:
        given = tmp_path / f"{args[0]}.log"
        result = _cli(env, [*args, "--log-file", str(given)] if given_log else args, timeout=600)
        shown = result.stdout + result.stderr
        assert result.returncode == 1, shown
        assert "Traceback" not in shown and not re.search(r"\[(info|warning|error) *\]", shown), shown
        lines = result.stdout.splitlines()
        assert len(lines) == 4, shown  # where the log is, the DAG run, its cause, where the log is
        started = re.fullmatch(rf"running the {dag} DAG.*; Airflow's task log: (\S+)", lines[0])
        assert started, shown
        path = Path(started.group(1))
        if given_log:
            assert path == given.absolute()
        else:
            assert path.parent == (cache_dir() / "logs").absolute()
            assert re.fullmatch(rf"{dag}-\d{{8}}T\d{{6}}-\d+\.log", path.name), path
        assert ": failed (" in lines[1] and failed_task in lines[1], shown
        assert lines[2].startswith("error: ") and cause in lines[2], shown
        assert lines[3] == f"full log: {path}", shown
        logged = path.read_text()
        assert cause in logged and "Traceback" in logged, logged[-3000:]  # Airflow's tracebacks: in the file only


EPOCH_JOB = '''"""ip_count with its event time an epoch number: a job bug the stage refuses before writing."""
from pyspark.sql import functions as F

from spark_jobs.ip_count import IpCount


class EpochMillis(IpCount):
    def parse(self, records, options, state):
        return super().parse(records, options, state).withColumn("event_time", F.unix_millis("event_time"))


transform = EpochMillis()
'''


@pytest.mark.parametrize("mode", ["submit", "connect"])
def test_a_terminal_error_fails_the_stage_at_once_in_both_spark_modes(service_env: dict[str, str], topic: str, kafka,
                                                                      tmp_path: Path, mode: str) -> None:
    """A terminal error (here a job whose event time is a number, refused by the stage before it writes) fails the
    stage task in ONE try, under spark-submit (the driver exits 2) as on Spark Connect, where a retry would fail the
    same way; the run prints the stage's one sentence."""
    import yaml

    jobs = tmp_path / "jobs"
    jobs.mkdir()
    (jobs / "epoch_job.py").write_text(EPOCH_JOB)
    specs = write_test_spec(tmp_path / "pipelines", topic, 1000, spark_mode=mode, bootstrap=kafka.bootstrap_servers)
    spec = yaml.safe_load((specs / "ip_count.yaml").read_text())
    spec["job"]["transform"] = "epoch_job:transform"
    (specs / "ip_count.yaml").write_text(yaml.safe_dump(spec))
    produce_lines(kafka.bootstrap_servers, topic, generate_lines(100, seed=7))
    env = {**service_env, "MICROBATCH_PIPELINES_DIR": str(specs),
           "PYTHONPATH": os.pathsep.join([str(jobs), os.environ.get("PYTHONPATH", "")])}
    result = _cli(env, ["run", "ip_count", "--max-runs", "1"], timeout=600)
    shown = result.stdout + result.stderr
    assert result.returncode == 1, shown
    lines = result.stdout.splitlines()
    assert "stage failed" in lines[1] and " tries" not in lines[1], shown  # one try: no "in N tries"
    assert lines[2].startswith("error: ") and "ip_count: the job's event_time column is bigint, not a timestamp; " \
        "nothing was written" in lines[2], shown
