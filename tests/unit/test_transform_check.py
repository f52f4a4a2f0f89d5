"""The plan's transform check reads the module named by `job.transform` (it never imports it, so the plan task
imports no pyspark) and refuses a module that is not there, a name it does not bind, or an object without the
contract's methods; what the source cannot tell is left to the stage."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from microbatch.config import PipelineSpec, find_spec
from microbatch.errors import SpecError
from microbatch.phases.plan import check_transform

METHODS = "    def parse(self): ...\n    def state_metrics(self): ...\n    def next_state(self): ...\n" \
          "    def outputs(self): ...\n"


def spec_for(transform: str) -> PipelineSpec:
    raw = find_spec("ip_count").model_dump(mode="json")
    raw["job"]["transform"] = transform
    return PipelineSpec.model_validate(raw)


@pytest.fixture
def jobs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    package = tmp_path / "mb_check_jobs"
    package.mkdir()
    (package / "__init__.py").write_text("raise RuntimeError('a check that imports would run this')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    return package


@pytest.mark.parametrize("source", [
    f"class Job:\n{METHODS}\njob = Job()\n",
    f"class Base:\n{METHODS}\nclass Job(Base):\n    pass\n\njob = Job()\n",
    f"class job:\n{METHODS}",
    "from elsewhere import job\n",  # taken on trust: the stage imports it
    "job = make_job()\n",
    "try:\n    from fast import job\nexcept ImportError:\n    from slow import job\n",
    "from elsewhere import *\n",
])
def test_a_job_the_source_shows_or_cannot_tell_about_passes(jobs: Path, source: str) -> None:
    (jobs / "mine.py").write_text(source)
    check_transform(spec_for("mb_check_jobs.mine:job"))
    assert "mb_check_jobs" not in sys.modules


@pytest.mark.parametrize(("source", "transform", "expected"), [
    ("", "mb_check_jobs.absent:job", "but module mb_check_jobs.absent is not found"),
    ("", "mb_check_jobs.mine.sub:job", "but module mb_check_jobs.mine.sub is not found"),
    ("other = 1\n", "mb_check_jobs.mine:job", "but module mb_check_jobs.mine defines no 'job'"),
    ("def job(df):\n    return df\n", "mb_check_jobs.mine:job",
     "lacks the method(s) parse, state_metrics, next_state, outputs"),
    ("class Job:\n    def parse(self): ...\n\njob = Job()\n", "mb_check_jobs.mine:job",
     "lacks the method(s) state_metrics, next_state, outputs"),
    ("def broken(:\n", "mb_check_jobs.mine:job", "cannot be read as Python at line 1 (SyntaxError)"),
])
def test_a_job_that_cannot_work_is_refused_in_one_sentence(jobs: Path, source: str, transform: str,
                                                           expected: str) -> None:
    (jobs / "mine.py").write_text(source)
    with pytest.raises(SpecError) as caught:
        check_transform(spec_for(transform))
    assert caught.value.message.startswith(f"ip_count.yaml: field 'job.transform' names '{transform}', but ")
    assert expected in caught.value.message
    assert not caught.value.retryable


def test_a_job_in_folders_without_init_files_passes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`bench/spark_apps/json_hand.py` as `bench.spark_apps.json_hand:transform`: namespace packages, the inner
    one's parent not imported (importlib's namespace path would look it up in sys.modules)."""
    folder = tmp_path / "mb_ns_jobs" / "apps"
    folder.mkdir(parents=True)
    (folder / "mine.py").write_text(f"class Job:\n{METHODS}\njob = Job()\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    check_transform(spec_for("mb_ns_jobs.apps.mine:job"))
    with pytest.raises(SpecError, match="is not found"):
        check_transform(spec_for("mb_ns_jobs.apps.absent:job"))
    assert "mb_ns_jobs" not in sys.modules


def test_the_shipped_transform_passes_without_importing_pyspark() -> None:
    before = set(sys.modules)
    check_transform(find_spec("ip_count"))
    assert not {name for name in set(sys.modules) - before if name.startswith(("pyspark", "spark_jobs"))}
