"""bench/common.py reads Spark event logs for the performance docs: per application, and per job group (the
alternated rounds of `bench/stage_profile.py --pairs`). Pure parsing, checked on a hand-made log."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from common import spark_task_metrics, task_metrics_by_group


def _task(stage: int, cpu_ns: int, records: int = 0) -> dict:
    metrics = {"Executor CPU Time": cpu_ns, "Executor Run Time": cpu_ns // 1_000_000,
               "Input Metrics": {"Records Read": records}}
    return {"Event": "SparkListenerTaskEnd", "Stage ID": stage, "Task Metrics": metrics}


def _log(tmp_path: Path) -> Path:
    events = [
        {"Event": "SparkListenerJobStart", "Job ID": 0, "Stage IDs": [0, 1],
         "Properties": {"spark.jobGroup.id": "0:c"}},
        _task(0, 2_000_000_000, records=500), _task(0, 1_000_000_000, records=500), _task(1, 500_000_000),
        {"Event": "SparkListenerStageCompleted", "Stage Info": {"Stage ID": 0}},
        {"Event": "SparkListenerStageCompleted", "Stage Info": {"Stage ID": 1}},
        {"Event": "SparkListenerJobStart", "Job ID": 1, "Stage IDs": [2], "Properties": {"spark.jobGroup.id": "0:d"}},
        _task(2, 4_000_000_000, records=1000),
        {"Event": "SparkListenerStageCompleted", "Stage Info": {"Stage ID": 2}},
        {"Event": "SparkListenerJobStart", "Job ID": 2, "Stage IDs": [3], "Properties": {}},
        _task(3, 250_000_000),
    ]
    directory = tmp_path / "events"
    directory.mkdir()
    (directory / "app-1").write_text("\n".join(json.dumps(e) for e in events) + "\n")
    return directory


def test_task_metrics_by_job_group(tmp_path):
    groups = task_metrics_by_group(_log(tmp_path))
    assert set(groups) == {"0:c", "0:d", ""}
    c, d, outside = groups["0:c"], groups["0:d"], groups[""]
    assert (c["cpu_s"], c["read_cpu_s"], c["tasks"], c["stages"], c["input_records"]) == (3.5, 3.0, 3, 2, 1000)
    assert (d["cpu_s"], d["read_cpu_s"], d["tasks"], d["stages"]) == (4.0, 4.0, 1, 1)
    assert (outside["cpu_s"], outside["read_cpu_s"], outside["tasks"]) == (0.25, 0.0, 1)


def test_whole_application_sums_every_group(tmp_path):
    total = spark_task_metrics(_log(tmp_path))
    assert (total["cpu_s"], total["read_cpu_s"], total["tasks"], total["stages"]) == (7.75, 7.0, 5, 3)


def test_an_empty_log_directory_gives_zeros(tmp_path):
    (tmp_path / "none").mkdir()
    assert spark_task_metrics(tmp_path / "none")["cpu_s"] == 0.0
