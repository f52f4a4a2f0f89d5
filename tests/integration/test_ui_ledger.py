"""The ledger page's app on a real PostgreSQL ledger, in process: Kafka down, auth refused, ledger down.

The browser test (tests/e2e/test_ui_ledger_page.py) covers the page inside Airflow; these cover the
failure paths quickly, with the app's auth dependency replaced by a stand-in that allows or refuses.
"""

from __future__ import annotations

import importlib.util
import socket
import time
from datetime import timedelta
from pathlib import Path

import pytest
from fastapi import HTTPException
from fastapi.testclient import TestClient
from sqlalchemy import make_url, text

from microbatch.config import find_spec
from microbatch.ledger import queries
from microbatch.ledger import repository as repo
from microbatch.ledger.database import transaction
from microbatch.phases.commit import commit_batch
from microbatch.settings import KafkaSettings
from microbatch.types import OffsetRange, Plan
from microbatch.ui import LedgerSources, create_app

pytestmark = pytest.mark.integration
SPEC = find_spec("ip_count")
ROOT_DIR = Path(__file__).resolve().parents[2]


def closed_port() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{sock.getsockname()[1]}"


def closed_kafka(_conn_id: str) -> KafkaSettings:
    return KafkaSettings(closed_port())


def allow() -> None:
    return None


def refuse() -> None:
    raise HTTPException(status_code=401, detail="Not authenticated")


def commit_one_batch(url: str) -> None:
    with transaction(url) as session:
        pipeline = repo.ensure_pipeline(session, SPEC, lock=True)
        batch_id = repo.insert_batch(session, pipeline, Plan(ranges=(OffsetRange("t", 0, 0, 7),
                                                                     OffsetRange("t", 1, 0, 3)))).id
    with transaction(url) as session:
        attempt = repo.begin_attempt(session, batch_id)
    with transaction(url) as session:
        repo.record_staged(session, batch_id, attempt, {"records": 10, "rows_by_sink": {}}, {}, {})
    with transaction(url) as session:
        commit_batch(session, SPEC, batch_id)


def test_page_renders_positions_without_kafka_quickly(ledger_url):
    commit_one_batch(ledger_url)
    app = create_app(LedgerSources(ledger_url=lambda: ledger_url, kafka_settings=closed_kafka,
                                   kafka_timeout_s=1.0), auth=allow)
    client = TestClient(app)
    started = time.monotonic()
    page = client.get("/ledger")
    assert time.monotonic() - started < 10
    assert page.status_code == 200
    assert "data-kafka-note" in page.text and "No Kafka broker answered" in page.text
    assert '<tr data-partition="t[0]"><td>t[0]</td><td class="num" data-field="position">7</td>' in page.text
    assert '<td class="num" data-field="latest">-</td><td class="num" data-field="lag">-</td>' in page.text
    data = client.get("/api/ledger").json()
    [view] = data["pipelines"]
    assert view["total_lag"] is None
    assert [(p["partition"], p["position"], p["lag"]) for p in view["partitions"]] == [(0, 7, None), (1, 3, None)]
    assert [(b["id"], b["state"], b["records"]) for b in view["batches"]] == [(1, "committed", 10)]
    assert view["gaps"] == [] and view["backfills"] == []


def test_refused_requests_get_401_or_the_login_page(ledger_url):
    app = create_app(LedgerSources(ledger_url=lambda: ledger_url, kafka_settings=closed_kafka),
                     auth=refuse, login_url=lambda next_url: f"/auth/login?next={next_url}")
    client = TestClient(app)
    assert client.get("/api/ledger").status_code == 401
    browser = client.get("/ledger", headers={"Accept": "text/html"}, follow_redirects=False)
    assert browser.status_code == 303 and browser.headers["location"] == "/auth/login?next=/ledger"


def test_ledger_down_is_one_sentence_without_the_password(ledger_url):
    wrong = make_url(ledger_url).set(port=int(closed_port().rsplit(":", 1)[1]))
    url = wrong.render_as_string(hide_password=False)
    app = create_app(LedgerSources(ledger_url=lambda: url, kafka_settings=closed_kafka), auth=allow)
    response = TestClient(app).get("/ledger")
    assert response.status_code == 503
    assert "Cannot use the ledger database at postgresql+psycopg://" in response.text
    assert make_url(ledger_url).password not in response.text


def test_plugin_module_builds_without_touching_the_network(monkeypatch):
    monkeypatch.delenv("MICROBATCH_LEDGER_URL", raising=False)
    monkeypatch.delenv("MICROBATCH_KAFKA_BOOTSTRAP", raising=False)
    spec = importlib.util.spec_from_file_location("microbatch_ledger", ROOT_DIR / "plugins" / "microbatch_ledger.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    plugin = module.MicrobatchLedgerPlugin
    [app] = plugin.fastapi_apps
    assert app["url_prefix"] == "/microbatch"
    assert {r.path for r in app["app"].routes} >= {"/ledger", "/api/ledger"}
    [view] = plugin.external_views
    assert view["href"] == "microbatch/ledger" and view["destination"] == "nav"


def pipeline_active(url: str, name: str, ago: timedelta) -> None:
    """A pipeline whose one committed batch was planned and committed `ago` before the database's clock."""
    with transaction(url) as session:
        session.execute(text(
            "WITH p AS (INSERT INTO pipelines (name, spec_hash) VALUES (:n, 'x') RETURNING id) "
            "INSERT INTO batches (pipeline_id, kind, state, attempt, counts, timings, created_at, committed_at) "
            "SELECT id, 'scheduled', 'committed', 1, '{\"records\": 5}', '{\"read_s\": 1.0}', now() - :ago, "
            "now() - :ago FROM p"), {"n": name, "ago": ago})


@pytest.mark.parametrize(("ago", "opens_on"), [(timedelta(minutes=10), "1h"), (timedelta(hours=5), "1d"),
                                               (timedelta(days=3), "7d"), (timedelta(days=30), "7d")])
def test_page_opens_on_the_most_recently_active_pipeline_over_a_range_that_shows_it(ledger_url, ago, opens_on):
    pipeline_active(ledger_url, "alpha", timedelta(days=60))  # first by name, idle for longer
    pipeline_active(ledger_url, "zulu", ago)
    with transaction(ledger_url) as session:  # never planned: last, and its charts open on the longest range
        session.execute(text("INSERT INTO pipelines (name, spec_hash) VALUES ('idle', 'x')"))
    client = TestClient(create_app(LedgerSources(ledger_url=lambda: ledger_url, kafka_settings=closed_kafka,
                                                 kafka_timeout_s=0.5), auth=allow))
    page = client.get("/ledger")
    assert page.status_code == 200
    assert f'data-charts="zulu" data-range="{opens_on}"' in page.text
    if ago < timedelta(days=7):  # the range chosen holds the batch: the records chart has its point
        with transaction(ledger_url) as session:
            data = queries.chart_data(session, queries.pipeline_id(session, "zulu"), opens_on)
        assert [p.records for p in data.batches] == [5]
    # What the visitor picks stays picked.
    assert 'data-charts="alpha" data-range="1h"' in client.get("/ledger?pipeline=alpha&range=1h").text
    assert 'data-charts="alpha" data-range="7d"' in client.get("/ledger?pipeline=alpha").text
    assert 'data-charts="idle" data-range="7d"' in client.get("/ledger?pipeline=idle").text
    with transaction(ledger_url) as session:
        assert list(queries.last_activity(session)) == ["zulu", "alpha", "idle"]


def test_batch_ranges_are_structured_in_the_json_and_one_line_on_the_page(ledger_url):
    commit_one_batch(ledger_url)
    client = TestClient(create_app(LedgerSources(ledger_url=lambda: ledger_url, kafka_settings=closed_kafka,
                                                 kafka_timeout_s=0.5), auth=allow))
    [view] = client.get("/api/ledger").json()["pipelines"]
    assert view["batches"][0]["ranges"] == [
        {"topic": "t", "partition": 0, "start": 0, "end": 7, "superseded_by": None},
        {"topic": "t", "partition": 1, "start": 0, "end": 3, "superseded_by": None}]
    assert "<td>t[0] [0, 7) t[1] [0, 3)</td>" in client.get("/ledger").text
