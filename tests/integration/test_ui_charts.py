"""The ledger page's charts on a real PostgreSQL ledger: the bucketed series against a recount done here in
Python from the rows the test wrote, and the page that draws them (plotly.js served by the app itself)."""

from __future__ import annotations

import json
import re
from collections import defaultdict
from datetime import UTC, datetime, timedelta

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import text

from microbatch.ledger import queries
from microbatch.ledger.database import transaction
from microbatch.ui import LedgerSources, create_app
from tests.integration.test_ui_ledger import allow, closed_kafka

pytestmark = pytest.mark.integration
NOW = datetime(2026, 11, 25, 12, 0, 0, tzinfo=UTC)


def fill(url: str) -> tuple[int, list[dict], list[dict]]:
    """A pipeline with 90 committed batches, one every 2 minutes up to NOW (so the last hour holds 30 of
    them), two partitions' lag snapshots per plan, one failed batch (never charted); all values varied."""
    batches, snapshots = [], []
    with transaction(url) as session:
        pid = session.execute(text("INSERT INTO pipelines (name, spec_hash) VALUES ('charted', 'x') "
                                   "RETURNING id")).scalar_one()
        for k in range(90):
            at = NOW - timedelta(minutes=2 * (89 - k))
            row = {"at": at, "records": 1000 + 37 * k, "dead": k % 4, "late": k % 3,
                   "steps": {"plan_s": 0.1 + k % 5 / 10, "read_s": 1 + k % 7 / 10, "stage_write_s": 0.5,
                             "commit_s": 0.05, **({"publish_s": 0.3} if k % 2 else {})}}
            bid = session.execute(text(
                "INSERT INTO batches (pipeline_id, kind, state, attempt, counts, timings, created_at, "
                "committed_at) VALUES (:p, 'scheduled', 'committed', 1, CAST(:c AS jsonb), CAST(:t AS jsonb), "
                ":at, :at) RETURNING id"),
                {"p": pid, "at": at, "t": json.dumps(row["steps"]),
                 "c": json.dumps({"records": row["records"], "dead_letters": row["dead"],
                                  "late_records": row["late"]})}).scalar_one()
            batches.append(row)
            for partition in (0, 1):
                lag = (k * 13 + partition * 50) % 400
                snapshots.append({"at": at - timedelta(seconds=20), "name": f"src[{partition}]", "lag": lag})
                session.execute(text(
                    "INSERT INTO lag_snapshots (pipeline_id, batch_id, topic, partition, start_offset, "
                    "latest_offset, lag, lag_after, planned_at) VALUES (:p, :b, 'src', :n, 0, :l, :l, 0, :at)"),
                    {"p": pid, "b": bid, "n": partition, "l": lag, "at": at - timedelta(seconds=20)})
        session.execute(text("INSERT INTO batches (pipeline_id, kind, state, attempt, counts, timings, created_at) "
                             "VALUES (:p, 'scheduled', 'failed', 1, '{\"records\": 99999}', '{}', :at)"),
                        {"p": pid, "at": NOW})
    return pid, batches, snapshots


def bucket_of(at: datetime, since: datetime, width: int) -> datetime:
    return since + timedelta(seconds=(at - since).total_seconds() // width * width)


def test_chart_series_equal_a_recount(ledger_url):
    pid, batches, snapshots = fill(ledger_url)
    with transaction(ledger_url) as session:
        data = queries.chart_data(session, pid, "1h", now=NOW)
    since, width = NOW - timedelta(hours=1), 30
    assert (data.since, data.bucket_s) == (since, width)

    expected = defaultdict(list)
    for row in batches:
        if row["at"] >= since:
            expected[bucket_of(row["at"], since, width)].append(row)
    assert [p.at for p in data.batches] == sorted(expected)
    for point in data.batches:
        rows = expected[point.at]
        assert point.batches == len(rows) and point.records == sum(r["records"] for r in rows)
        assert point.dead_letters == sum(r["dead"] for r in rows)
        assert point.late_records == sum(r["late"] for r in rows)
        busy = sum(r["steps"]["read_s"] + r["steps"]["stage_write_s"] for r in rows)
        assert point.records_per_s == pytest.approx(point.records / busy)
        for key in queries.STEP_KEYS:
            assert point.steps[key] == pytest.approx(sum(r["steps"].get(key, 0) for r in rows) / len(rows))

    # Lag is what the last plan of each bucket saw, per partition and summed.
    last_plan: dict[datetime, datetime] = {}
    for snap in snapshots:
        if snap["at"] >= since:
            at = bucket_of(snap["at"], since, width)
            last_plan[at] = max(last_plan.get(at, snap["at"]), snap["at"])
    lag = {(at, snap["name"]): snap["lag"] for snap in snapshots for at in [bucket_of(snap["at"], since, width)]
           if snap["at"] >= since and snap["at"] == last_plan[at]}
    totals = defaultdict(int)
    for (at, _), value in lag.items():
        totals[at] += value
    assert {(p.at, p.partition): p.lag for p in data.lag if p.partition != "total"} == lag
    assert {p.at: p.lag for p in data.lag if p.partition == "total"} == dict(totals)

    with transaction(ledger_url) as session:
        week = queries.chart_data(session, pid, "7d", now=NOW)
    assert week.bucket_s == 5040 and sum(p.batches for p in week.batches) == 90  # the failed one is not charted
    assert sum(p.records for p in week.batches) == sum(r["records"] for r in batches)


def test_page_draws_the_charts_with_its_own_plotly(ledger_url):
    fill(ledger_url)
    client = TestClient(create_app(LedgerSources(ledger_url=lambda: ledger_url, kafka_settings=closed_kafka,
                                                 kafka_timeout_s=0.5), auth=allow))
    page = client.get("/ledger", params={"pipeline": "charted", "range": "7d"})
    assert page.status_code == 200
    assert '<script src="static/plotly.min.js"></script>' in page.text
    assert re.search(r"<script[^>]+src=\"(https?:)?//", page.text) is None  # nothing from another host
    assert 'data-charts="charted" data-range="7d"' in page.text
    for name in ("lag", "records", "steps", "bad"):
        assert f'id="chart-{name}"' in page.text
    assert 'href="ledger?pipeline=charted&amp;range=1h"' in page.text
    script = client.get("/static/plotly.min.js")
    assert script.status_code == 200 and script.headers["content-type"].startswith("application/javascript")
    assert len(script.content) > 1_000_000 and b"plotly.js" in script.content[:2000]
    # A range the page does not know, or an unknown pipeline, falls back to what the page opens on: the most
    # recently active pipeline, over the shortest range that holds its last activity (tests/integration/
    # test_ui_ledger.py).
    with transaction(ledger_url) as session:
        opening = queries.range_showing(session, NOW)
    fallback = client.get("/ledger", params={"pipeline": "nope", "range": "1y"})
    assert fallback.status_code == 200 and f'data-charts="charted" data-range="{opening}"' in fallback.text
