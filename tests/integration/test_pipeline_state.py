"""A pipeline's state on the record (issue 60), on a real PostgreSQL ledger, through the console entry point: a
watermark past year 9999 (as an epoch-millisecond event time read as seconds left it) is shown, not a traceback;
`reset --watermark` is refused while a batch is open, shows the change and writes nothing with `--dry-run`, then
clears it once, recorded in `state_resets`, without touching another pipeline; `state` names the batch that last
changed each value and the reset. No Spark, no Kafka: the state is what the ledger holds."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from sqlalchemy import text

from microbatch.config import find_spec
from microbatch.ledger import repository as repo
from microbatch.ledger.database import transaction

pytestmark = pytest.mark.integration
WEDGED = {"watermark_us": 1_764_000_000_000_000_000, "max_event_time_us": 1_764_000_000_005_000_000, "runs": 2}
OTHER = {"watermark_us": 1_795_939_200_000_000, "max_event_time_us": 1_795_939_205_000_000}


def spec(name: str) -> dict:
    return {"name": name, "schedule": None, "source": {"topics": [f"{name}_topic"]},
            "job": {"transform": "spark_jobs.clicks:transform"},
            "sinks": [{"name": "raw", "type": "postgres_append", "table": f"{name}_raw",
                       "columns": {"user": "text"}}]}


@pytest.fixture
def run(ledger_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, console):
    specs = tmp_path / "pipelines"
    specs.mkdir()
    for name in ("wedged", "neighbour"):
        (specs / f"{name}.yaml").write_text(yaml.safe_dump(spec(name)))
    for key, value in {"MICROBATCH_LEDGER_URL": ledger_url, "MICROBATCH_PIPELINES_DIR": str(specs),
                       "COLUMNS": "250"}.items():
        monkeypatch.setenv(key, value)
    with transaction(ledger_url) as session:
        for name, state in (("wedged", WEDGED), ("neighbour", OTHER)):
            pipeline = repo.ensure_pipeline(session, find_spec(name), lock=True)
            pipeline.state = dict(state)
    return console


def state_of(url: str, name: str) -> dict:
    with transaction(url) as session:
        return session.execute(text("SELECT state FROM pipelines WHERE name = :n"), {"n": name}).scalar_one()


def test_a_wedged_watermark_is_shown_then_cleared_on_the_record(run, ledger_url):
    code, output = run("state", "wedged")
    assert code == 0 and "past year 9999" in output and "runs" in output, output

    with transaction(ledger_url) as session:  # a batch planned from the wedged state is still open
        session.execute(text("INSERT INTO batches (pipeline_id, kind, state, attempt, state_before, counts, "
                             "timings) SELECT id, 'scheduled', 'staged', 1, state, '{}', '{}' FROM pipelines "
                             "WHERE name = 'wedged'"))
    code, output = run("reset", "wedged", "--watermark", "clear", "--yes")
    assert code == 2 and "is open, and was planned from the state this reset replaces" in output, output
    assert "microbatch abandon PIPELINE" in output, output
    with transaction(ledger_url) as session:
        session.execute(text("UPDATE batches SET state = 'abandoned' WHERE state = 'staged'"))

    code, output = run("reset", "wedged", "--watermark", "clear", "--dry-run")
    assert code == 0 and "watermark: 1764000000000000000 µs since 1970 (past year 9999" in output, output
    assert "-> none (the next batch starts it again)" in output
    assert state_of(ledger_url, "wedged") == WEDGED, "a dry run writes nothing"

    code, output = run("reset", "wedged", "--watermark", "clear", "--yes")
    assert code == 0 and "the watermark reset is applied and recorded" in output, output
    assert state_of(ledger_url, "wedged") == {"runs": 2}
    assert state_of(ledger_url, "neighbour") == OTHER, "another pipeline's state is untouched"
    with transaction(ledger_url) as session:
        rows = session.execute(text("SELECT old_state, new_state, target FROM state_resets")).all()
    assert rows == [(WEDGED, {"runs": 2}, "watermark clear")]

    code, output = run("reset", "wedged", "--watermark", "2026-11-29T08:00:00Z", "--yes")
    assert code == 0 and state_of(ledger_url, "wedged")["watermark_us"] == 1_795_939_200_000_000
    code, output = run("state", "wedged")
    assert code == 0 and "2026-11-29T08:00:00Z" in output and "reset watermark 2026-11-29T08:00:00Z by" in output
    code, output = run("reset", "wedged", "--watermark", "2026-11-29T08:00:00", "--yes")
    assert code == 2 and "has no time zone" in output, output
    code, output = run("reset", "wedged")
    assert code == 2 and "either --to (positions) or --watermark" in output, output
