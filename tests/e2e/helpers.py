"""End-to-end helpers: a test copy of the ip_count spec, real DAG runs in a subprocess, and the
independent checks (recount of the input, dead letters, ledger audit)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import yaml
from sqlalchemy import text

from microbatch.datagen import LogLine, expected_counts
from microbatch.ledger.database import transaction

ROOT = Path(__file__).resolve().parents[2]


def write_test_spec(directory: Path, topic: str, max_records: int, retry_delay: float = 1.0) -> Path:
    """A copy of ip_count.yaml that reads `topic`, in small batches, with short retry delays."""
    spec = yaml.safe_load((ROOT / "include/pipelines/ip_count.yaml").read_text())
    spec["source"].update(topics=[topic], max_records_per_batch=max_records, commit_group_offsets=False)
    spec["retries"] = {"count": 3, "delay_seconds": retry_delay}
    spec["spark"]["conf"] = {**spec["spark"]["conf"], "spark.ui.enabled": "false"}
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "ip_count.yaml"
    path.write_text(yaml.safe_dump(spec))
    return directory


def run_pipeline(env: dict[str, str], *, max_runs: int = 10, extra_env: dict[str, str] | None = None,
                 timeout: float = 900) -> subprocess.CompletedProcess[str]:
    """`microbatch run ip_count` in its own process: a crash failpoint kills only that process."""
    full_env = {**os.environ, **env, **(extra_env or {})}
    return subprocess.run(
        [sys.executable, "-m", "microbatch.cli", "run", "ip_count", "--max-runs", str(max_runs)],
        env=full_env, capture_output=True, text=True, timeout=timeout, check=False,
    )


def sink_counts(url: str) -> Counter:
    with transaction(url) as session:
        rows = session.execute(text("SELECT window_start, ip, count FROM ip_counts")).all()
    return Counter({(start, ip): count for start, ip, count in rows})


def dead_letter_coordinates(url: str) -> list[tuple[int, int]]:
    with transaction(url) as session:
        rows = session.execute(text('SELECT partition, "offset" FROM dead_letters ORDER BY 1, 2')).all()
    return [tuple(row) for row in rows]


def positions(url: str) -> dict[int, int]:
    with transaction(url) as session:
        return dict(session.execute(text("SELECT partition, next_offset FROM positions")).all())


def verify_ledger(env: dict[str, str]) -> dict:
    result = subprocess.run(
        [sys.executable, "-m", "microbatch.cli", "verify", "ip_count", "--json"],
        env={**os.environ, **env}, capture_output=True, text=True, timeout=120, check=False,
    )
    return json.loads(result.stdout)


def assert_exactly_once(url: str, env: dict[str, str], lines: list[LogLine], coords: list[tuple[int, int]]) -> None:
    """The sink equals an independent recount, dead letters equal the malformed lines, the ledger is whole."""
    expected = expected_counts(lines)
    actual = sink_counts(url)
    assert sum(actual.values()) == sum(expected.values())
    assert actual == expected
    malformed = sorted(coord for coord, line in zip(coords, lines, strict=True) if line.malformed)
    assert dead_letter_coordinates(url) == malformed
    ends: dict[int, int] = {}
    for partition, offset in coords:
        ends[partition] = max(ends.get(partition, 0), offset + 1)
    assert positions(url) == ends
    audit = verify_ledger(env)
    assert audit["ok"], audit["problems"]
