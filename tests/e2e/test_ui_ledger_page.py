"""The ledger page in a real browser: `airflow standalone` with this project's plugin, a ledger filled
through the real plan/commit code, a real login with a generated password, and headless Chromium.

The numbers on the page are checked against the ledger's own rows and Kafka's end offsets, read
here independently of the page's code. A screenshot is saved under the test's tmp dir.
"""

from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote, urlsplit

import pytest
from sqlalchemy import text

from microbatch.config import find_spec
from microbatch.dev.airflow import AirflowStandalone
from microbatch.dev.datagen import generate_lines, produce_lines
from microbatch.ledger import repository as repo
from microbatch.ledger.database import Ledger, transaction
from microbatch.ledger.models import BatchKind
from microbatch.phases.commit import commit_batch
from microbatch.phases.plan import plan_next_batch
from microbatch.settings import KafkaSettings
from microbatch.types import Gap, OffsetRange, Plan
from tests.e2e.helpers import write_test_spec

pytestmark = pytest.mark.e2e
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]
RUN_1 = "scheduled__2026-11-22T12:00:00+00:00"
RUN_2 = "manual__2026-11-22T12:00:30.123456+00:00"
BACKFILL_RUN = "backfill__2026-11-22T13:00:00+00:00"


def stage_and_commit(url: str, spec, batch_id: int) -> None:
    """What the stage task records (no output rows here: the page is about the ledger), then the real commit."""
    with transaction(url) as session:
        attempt = repo.begin_attempt(session, batch_id)
    with transaction(url) as session:
        records = sum(r.size for r in repo.batch_ranges(session, batch_id))
        repo.record_staged(session, batch_id, attempt, {"records": records, "rows_by_sink": {}}, {}, {"stage_s": 1.5})
    with transaction(url) as session:
        commit_batch(session, spec, batch_id)


def fill_ledger(url: str, bootstrap: str, topic: str) -> None:
    """Two committed batches (the second records a gap), an open backfill, then more input so lag > 0."""
    spec = find_spec("ip_count")
    produce_lines(bootstrap, topic, generate_lines(400, seed=11))
    first = plan_next_batch(spec, Ledger(url), KafkaSettings(bootstrap), airflow_run_id=RUN_1)
    assert first.batch_id is not None and first.records == 150, first
    stage_and_commit(url, spec, first.batch_id)

    with transaction(url) as session:
        pipeline = repo.ensure_pipeline(session, spec, lock=True)
        at = repo.read_positions(session, pipeline.id)
        p0, p1 = sorted(at)[:2]
        # As if retention had deleted 5 offsets of p1 under on_data_loss: skip.
        plan = Plan(ranges=(OffsetRange(p0.topic, p0.partition, at[p0], at[p0] + 10),
                            OffsetRange(p1.topic, p1.partition, at[p1] + 5, at[p1] + 12)),
                    gaps=(Gap(p1.topic, p1.partition, at[p1], at[p1] + 5, "deleted by retention (test)"),))
        second = repo.insert_batch(session, pipeline, plan, airflow_run_id=RUN_2).id
        backfill = Plan(ranges=(OffsetRange(p0.topic, p0.partition, 0, 20),))
        repo.insert_batch(session, pipeline, backfill, kind=BatchKind.BACKFILL, airflow_run_id=BACKFILL_RUN)
    stage_and_commit(url, spec, second)
    produce_lines(bootstrap, topic, generate_lines(60, seed=12))


def ledger_truth(url: str, bootstrap: str, topic: str) -> dict:
    """Positions, batches and gaps straight from the tables, and the end offsets straight from Kafka."""
    from kafka import KafkaConsumer
    from kafka import TopicPartition as KTP

    consumer = KafkaConsumer(bootstrap_servers=bootstrap, isolation_level="read_committed")
    try:
        tps = [KTP(topic, p) for p in sorted(consumer.partitions_for_topic(topic))]
        ends = {f"{tp.topic}[{tp.partition}]": off for tp, off in consumer.end_offsets(tps).items()}
    finally:
        consumer.close()
    with transaction(url) as session:
        positions = dict(session.execute(text(
            "SELECT topic || '[' || partition || ']', next_offset FROM positions")).all())
        batches = session.execute(text(
            "SELECT id, kind, state, airflow_run_id, counts->>'records' FROM batches ORDER BY id")).all()
        gaps = session.execute(text("SELECT id, topic, partition, start_offset, end_offset FROM gaps")).all()
    return {"ends": ends, "positions": positions, "batches": batches, "gaps": gaps}


@pytest.fixture
def specs(topic: str, kafka, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """ip_count reading the test's topic, 150 records per batch, for this process and for Airflow."""
    directory = write_test_spec(tmp_path / "pipelines", topic, 150, bootstrap=kafka.bootstrap_servers)
    monkeypatch.setenv("MICROBATCH_PIPELINES_DIR", str(directory))
    return directory


@pytest.fixture
def airflow_server(service_env: dict[str, str], specs: Path, tmp_path: Path) -> Iterator[AirflowStandalone]:
    """Started, not yet ready: the test fills the ledger while Airflow boots. Always stopped after."""
    home = tmp_path / "airflow_home"
    home.mkdir()
    server = AirflowStandalone({**os.environ, **service_env}, home, tmp_path / "airflow-standalone.log")
    try:
        yield server
    finally:
        server.stop()


def status_of(url: str, headers: dict[str, str] | None = None) -> tuple[int, str]:
    """The status and Location of a request that does not follow redirects."""
    class NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args, **kwargs):
            return None

    opener = urllib.request.build_opener(NoRedirect)
    try:
        with opener.open(urllib.request.Request(url, headers=headers or {}), timeout=10) as response:
            return response.status, response.headers.get("Location", "")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers.get("Location", "")


def test_ledger_page_shows_the_ledger_behind_airflow_login(airflow_server, service_env, kafka, topic, tmp_path):
    from playwright.sync_api import sync_playwright

    url, bootstrap = service_env["MICROBATCH_LEDGER_URL"], kafka.bootstrap_servers
    fill_ledger(url, bootstrap, topic)
    truth = ledger_truth(url, bootstrap, topic)
    login = airflow_server.wait_ready()
    base = airflow_server.base

    # Auth is Airflow's: no session -> 401 (JSON) or a redirect to Airflow's login (browser); a forged token -> 403.
    assert status_of(f"{base}/microbatch/api/ledger")[0] == 401
    code, location = status_of(f"{base}/microbatch/ledger", {"Accept": "text/html"})
    assert code == 303 and location.startswith("/auth/login") and "next=%2Fmicrobatch%2Fledger" in location
    assert status_of(f"{base}/microbatch/api/ledger", {"Cookie": "_token=forged.jwt.value"})[0] == 403
    assert status_of(f"{base}/microbatch/api/ledger", {"Authorization": "Bearer forged.jwt.value"})[0] == 403

    screenshot = tmp_path / "ledger_page.png"
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            requested: list[str] = []
            page.on("request", lambda request: requested.append(request.url))
            page.goto(f"{base}/microbatch/ledger")
            page.wait_for_url("**/auth/login**")
            page.fill("input[name=username]", login["user"])
            page.fill("input[name=password]", login["password"])
            page.click("button[type=submit]")
            page.wait_for_url("**/microbatch/ledger", timeout=20_000)
            section = page.locator("section[data-pipeline=ip_count]")
            section.wait_for()

            shown_lag = 0
            for name, end in truth["ends"].items():
                row = section.locator(f'tr[data-partition="{name}"]')
                position = truth["positions"].get(name)
                assert row.locator("[data-field=position]").inner_text() == str(position)
                assert row.locator("[data-field=latest]").inner_text() == str(end)
                assert row.locator("[data-field=lag]").inner_text() == str(end - position)
                shown_lag += end - position
            assert shown_lag > 0
            assert section.locator("[data-total-lag]").inner_text() == str(shown_lag)

            batch_rows = section.locator("table[data-table=batches] tr[data-batch]")
            assert batch_rows.count() == len(truth["batches"])
            for batch_id, kind, state, run_id, records in truth["batches"]:
                row = section.locator(f'table[data-table=batches] tr[data-batch="{batch_id}"]')
                assert kind in row.inner_text() and state in row.inner_text()
                assert row.locator("[data-field=records]").inner_text() == (records or "-")
                dag_id = "ip_count__backfill" if kind == "backfill" else "ip_count"
                href = row.locator("a").get_attribute("href")
                assert href == f"../dags/{dag_id}/runs/{quote(run_id, safe='')}"
                assert row.locator("a").inner_text() == run_id
            [(_, gtopic, gpart, gstart, gend)] = truth["gaps"]
            gap_row = section.locator("table[data-table=gaps] tr[data-gap]")
            assert gap_row.inner_text().split("\t")[:3] == [f"{gtopic}[{gpart}]", f"[{gstart}, {gend})",
                                                           str(gend - gstart)]
            backfills = section.locator("table[data-table=backfills] tr[data-batch]")
            assert backfills.count() == 1 and BACKFILL_RUN in backfills.inner_text()

            check_charts(page, url, tmp_path)

            # The link resolves to the Airflow UI's DAG run page.
            first_link = section.locator(f'table[data-table=batches] a:text-is("{RUN_1}")')
            assert first_link.evaluate("a => a.href") == f"{base}/dags/ip_count/runs/{quote(RUN_1, safe='')}"

            # The JSON endpoint serves the same numbers to the logged-in browser.
            data = page.request.get(f"{base}/microbatch/api/ledger").json()
            [view] = data["pipelines"]
            assert {f"{p['topic']}[{p['partition']}]": p["lag"] for p in view["partitions"]} == {
                name: end - truth["positions"][name] for name, end in truth["ends"].items()}
            page.screenshot(path=str(screenshot), full_page=True)

            # The nav entry: Airflow lists the external view, and shows the page inside its own UI.
            views = page.request.get(f"{base}/api/v2/plugins").json()["plugins"]
            [plugin] = [p for p in views if p["name"] == "microbatch_ledger"]
            assert [v["name"] for v in plugin["external_views"]] == ["Ledger"]
            page.goto(f"{base}/")
            page.get_by_text("Ledger", exact=True).click()
            page.wait_for_url("**/plugin/microbatch-ledger")
            page.frame_locator("iframe").locator("section[data-pipeline=ip_count]").wait_for(timeout=20_000)
            page.screenshot(path=str(tmp_path / "ledger_in_airflow_ui.png"), full_page=True)
            check_backfill_form(page, airflow_server, tmp_path)
        finally:
            browser.close()
    hosts = {urlsplit(u).hostname for u in requested if urlsplit(u).scheme in ("http", "https", "ws", "wss")}
    assert hosts == {"127.0.0.1"}, hosts  # plotly.js and everything else came from this machine
    print(f"ledger page screenshot: {screenshot}")
    assert screenshot.stat().st_size > 10_000
    backfill_through_the_rest_api(airflow_server, url, topic)


def check_backfill_form(page, server: AirflowStandalone, tmp_path: Path) -> None:
    """The backfill DAG's trigger form (issue 45): the offsets are number fields, the partitions one line of text;
    no field is a JSON text area. Its screenshot is docs/img/backfill-form.png."""
    dag = "ip_count__backfill"
    deadline = time.monotonic() + 180
    while server.api("GET", f"/api/v2/dags/{dag}")[0] != 200:  # the dag-processor parses dags/ first
        assert time.monotonic() < deadline, "the backfill DAG was never parsed"
        time.sleep(2)
    page.goto(f"{server.base}/dags/{dag}")
    page.locator("button", has_text="Trigger").first.click()
    dialog = page.get_by_role("dialog")
    numbers = dialog.get_by_role("spinbutton")
    try:
        numbers.first.wait_for(timeout=20_000)
        fields = page.evaluate("""() => [...document.querySelectorAll('[role=dialog] input, [role=dialog] textarea')]
            .map(e => ({tag: e.tagName, role: e.getAttribute('role'), value: e.value}))""")
        assert [f["value"] for f in fields if f["role"] == "spinbutton"] == ["0", ""], fields  # start, end
        assert [f["tag"] for f in fields if f["value"] == "all"] == ["INPUT"], fields  # partitions: one line
        # No field is a JSON text area (the one empty text area is the run's note).
        assert not [f for f in fields if f["tag"] == "TEXTAREA" and f["value"]], fields
    finally:
        page.screenshot(path=str(tmp_path / "backfill_form.png"))
    print(f"backfill form screenshot: {tmp_path / 'backfill_form.png'}")


def check_charts(page, url: str, tmp_path: Path) -> None:
    """The charts drew (plotly made their SVG) with the ledger's numbers: the records chart's bars times
    their batch counts add up to the committed batches' records, and the lag chart's highest total is the
    highest sum of one plan's snapshots, each read here with SQL."""
    charts = page.locator("section#charts")
    assert charts.get_attribute("data-charts") == "ip_count"
    for name in ("lag", "records", "steps", "bad"):
        page.locator(f"#chart-{name} .main-svg").first.wait_for(timeout=20_000)
    bars = page.evaluate("() => document.getElementById('chart-records').data[0]")
    plotted = round(sum(y * n for y, n in zip(bars["y"], bars["customdata"], strict=True)))
    totals = page.evaluate("() => document.getElementById('chart-lag').data.find(t => t.name === 'total').y")
    with transaction(url) as session:
        records = session.execute(text("SELECT sum((counts->>'records')::int) FROM batches "
                                       "WHERE state = 'committed'")).scalar_one()
        highest = session.execute(text("SELECT max(total) FROM (SELECT sum(lag) AS total FROM lag_snapshots "
                                       "GROUP BY planned_at) plans")).scalar_one()
    assert plotted == records and records > 0
    assert max(totals) == highest
    charts.screenshot(path=str(tmp_path / "ledger_charts.png"))
    assert (tmp_path / "ledger_charts.png").stat().st_size > 10_000
    # The time range is a link: the week's view draws the same batches.
    page.locator("section#charts a", has_text="last week").click()
    page.wait_for_url("**range=7d**")
    page.locator("#chart-records .main-svg").first.wait_for(timeout=20_000)
    week = page.evaluate("() => document.getElementById('chart-records').data[0]")
    assert round(sum(y * n for y, n in zip(week["y"], week["customdata"], strict=True))) == records
    page.goto(page.url.split("?")[0])


def backfill_through_the_rest_api(server: AirflowStandalone, url: str, topic: str) -> None:
    """The backfill DAG triggered through Airflow's REST API: bad params are refused by Airflow's own
    Param validation before any run exists; a dry run is planned by the real scheduler and writes nothing."""
    dag = "ip_count__backfill"
    deadline = time.monotonic() + 180
    while server.api("GET", f"/api/v2/dags/{dag}")[0] != 200:  # the dag-processor parses dags/ first
        assert time.monotonic() < deadline, "the backfill DAG was never parsed"
        time.sleep(2)
    assert server.api("PATCH", f"/api/v2/dags/{dag}", {"is_paused": False})[0] == 200
    with transaction(url) as session:
        batches_before = session.execute(text("SELECT count(*) FROM batches")).scalar_one()

    code, body = server.api("POST", f"/api/v2/dags/{dag}/dagRuns", {
        "logical_date": None, "conf": {"topic": topic, "start": 0, "mode": "redo"}})
    assert code == 400 and "mode" in json.dumps(body), (code, body)
    assert server.api("GET", f"/api/v2/dags/{dag}/dagRuns")[1]["total_entries"] == 0

    code, run = server.api("POST", f"/api/v2/dags/{dag}/dagRuns", {
        "logical_date": None, "conf": {"topic": topic, "start": 0, "end": None, "dry_run": True}})
    assert code == 200, (code, run)
    path = f"/api/v2/dags/{dag}/dagRuns/{quote(run['dag_run_id'], safe='')}"
    while (state := server.api("GET", path)[1]["state"]) not in ("success", "failed"):
        assert time.monotonic() < deadline + 120, f"the backfill run is still {state}"
        time.sleep(2)
    tasks = {t["task_id"]: t["state"] for t in server.api("GET", f"{path}/taskInstances")[1]["task_instances"]}
    assert state == "success" and tasks["plan"] == "skipped", (state, tasks)  # a dry run skips the rest
    with transaction(url) as session:
        assert session.execute(text("SELECT count(*) FROM batches")).scalar_one() == batches_before
