"""Event-time completeness and exactly-once Kafka output, end to end on real services.

Phase 1 sets the watermark; phase 2 sends lines beyond the lateness (late by construction),
lines within it (merged), and newer lines that move the watermark so more windows become final.
A read_committed consumer of the output topic must see every final window once, with the count
recomputed here from the produced lines.
"""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import text

from microbatch.dev.datagen import LogLine, format_line, generate_lines, produce_lines
from microbatch.ledger.database import transaction
from tests.e2e.helpers import assert_exactly_once, run_log, run_pipeline, write_test_spec

pytestmark = pytest.mark.e2e
T0 = datetime(2026, 11, 22, 12, 0, 0, tzinfo=UTC)


def lines_at(seconds: list[int], rng: random.Random) -> list[LogLine]:
    out = []
    for second in seconds:
        ip = f"10.1.0.{rng.randint(1, 12)}"
        when = T0 + timedelta(seconds=second)
        out.append(LogLine(format_line(ip, when), ip, when))
    return out


def test_watermark_late_records_and_final_windows_published_once(service_env, topic, kafka, ledger_url, tmp_path):
    specs = write_test_spec(tmp_path / "pipelines", topic, max_records=100_000, bootstrap=kafka.bootstrap_servers)
    env = {**service_env, "MICROBATCH_PIPELINES_DIR": str(specs)}
    rng = random.Random(5)

    # Phase 1: 60 s of in-order traffic; the watermark ends at 12:00:54 (max event 12:00:59 - 5 s).
    phase1 = generate_lines(3_000, ips=12, span_seconds=60, out_of_order=0.0, malformed=0.02, seed=21, start=T0)
    coords1 = produce_lines(kafka.bootstrap_servers, topic, phase1)
    first = run_pipeline(env)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    with transaction(ledger_url) as session:
        watermark = session.execute(text("SELECT state->>'watermark_us' FROM pipelines")).scalar_one()
    assert datetime.fromtimestamp(int(watermark) / 1e6, tz=UTC) == T0 + timedelta(seconds=54)

    # Phase 2: beyond the lateness (windows ended by 12:00:45), within it (12:00:52-59), and newer traffic.
    beyond = lines_at([rng.randint(10, 44) for _ in range(150)], rng)
    within = lines_at([rng.randint(52, 59) for _ in range(150)], rng)
    newer = lines_at([rng.randint(60, 90) for _ in range(400)], rng)
    phase2 = beyond + within + newer
    rng.shuffle(phase2)
    coords2 = produce_lines(kafka.bootstrap_servers, topic, phase2)
    second = run_pipeline(env)
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]

    late_by_construction = {c for c, line in zip(coords2, phase2, strict=True) if line in beyond}
    expected = assert_exactly_once(ledger_url, env, phase1 + phase2, coords1 + coords2, f"{topic}_out")
    assert expected.late == late_by_construction
    assert len(late_by_construction) == 150

    log = run_log(second)
    assert "150 late record(s) kept in late_records" in log
    assert "row(s) of the window(s) that became final: outbox ip_count_sink seq" in log
    assert "publish ip_count/ip_count_sink: sequences" in log
