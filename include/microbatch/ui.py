"""The ledger page of the Airflow UI: a small FastAPI app rendered on the server (HTML + CSS), with plotly
charts of one pipeline's history (`microbatch.charts`; plotly.js is served by this app, from the wheel).

It reads the ledger through `ledger.queries`, the same code as `microbatch status/history`, and
asks Kafka for the latest offsets with a short deadline, so a broker that is down only blanks the
lag. This module never imports Airflow: `plugins/microbatch_ledger.py` hands in Airflow's auth
dependency and the connection resolvers. Building the app touches neither the network nor a DB.
"""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from datetime import UTC
from html import escape
from typing import Any
from urllib.parse import quote

from fastapi import Depends, FastAPI, HTTPException, Query, Request
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from sqlalchemy.exc import OperationalError

from microbatch.errors import MicrobatchError
from microbatch.ledger import queries
from microbatch.ledger.database import transaction, unreachable
from microbatch.ledger.models import BACKFILL_KINDS, BatchState
from microbatch.settings import KafkaSettings
from microbatch.types import TopicPartition

log = logging.getLogger(__name__)
PAGE_PATH = "/ledger"
JSON_PATH = "/api/ledger"
# The backfill DAG of a pipeline is `<pipeline>__backfill` (see phases.backfill); the scheduled one is `<pipeline>`.
BACKFILL_DAG_SUFFIX = "__backfill"
PLOTLY_JS_PATH = "/static/plotly.min.js"  # the app's own copy of plotly.js: the page needs no internet


@dataclass(frozen=True)
class LedgerSources:
    """Where the page reads from; resolved on each request, never when the app is built."""

    ledger_url: Callable[[], str]
    kafka_settings: Callable[[str], KafkaSettings]  # source.connection -> its servers and security
    kafka_timeout_s: float = 3.0
    batch_limit: int = 20
    gap_limit: int = 50


@dataclass
class PipelineView:
    """Everything the page shows for one pipeline; the JSON endpoint returns the same fields."""

    name: str
    dag_id: str
    partitions: list[queries.PartitionStatus]
    total_lag: int | None
    batches: list[queries.BatchSummary]
    gaps: list[queries.GapSummary]
    backfills: list[queries.BatchSummary]
    kafka_note: str | None = None
    run_links: dict[int, str] = field(default_factory=dict)  # batch id -> DAG run path, relative to Airflow's root

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "dag_id": self.dag_id,
            "total_lag": self.total_lag,
            "kafka_note": self.kafka_note,
            "partitions": [queries.to_dict(p) for p in self.partitions],
            "batches": [{**queries.to_dict(b), "run_link": self.run_links.get(b.id)} for b in self.batches],
            "gaps": [queries.to_dict(g) for g in self.gaps],
            "backfills": [{**queries.to_dict(b), "run_link": self.run_links.get(b.id)} for b in self.backfills],
        }


def dag_id_of(pipeline: str, kind: str) -> str:
    return pipeline + BACKFILL_DAG_SUFFIX if kind in BACKFILL_KINDS else pipeline


def dag_run_path(pipeline: str, batch: queries.BatchSummary) -> str | None:
    """`dags/<dag_id>/runs/<run_id>` of the Airflow 3 UI (no leading slash), or None without a run id."""
    if not batch.airflow_run_id:
        return None
    return f"dags/{quote(dag_id_of(pipeline, batch.kind), safe='')}/runs/{quote(batch.airflow_run_id, safe='')}"


def _any_reachable(bootstrap: str, timeout_s: float) -> bool:
    """A TCP connect to any bootstrap server: kafka-python itself waits 30 s for a broker that is down."""
    for server in bootstrap.split(","):
        host, _, port = server.strip().rpartition(":")
        try:
            with socket.create_connection((host.strip("[]") or "127.0.0.1", int(port)), timeout=timeout_s):
                return True
        except (OSError, ValueError):
            continue
    return False


def latest_offsets(pipeline: str, sources: LedgerSources) -> dict[TopicPartition, int]:
    """The latest (last stable, under read_committed) offsets of the pipeline's topics."""
    from microbatch.config import find_spec
    from microbatch.kafka.offsets import offset_bounds, offsets_client, source_partitions

    spec = find_spec(pipeline)
    kafka = sources.kafka_settings(spec.source.connection)
    if not _any_reachable(kafka.bootstrap_servers, sources.kafka_timeout_s):
        raise MicrobatchError(f"No Kafka broker answered at {kafka.bootstrap_servers}.")
    with offsets_client(kafka, spec.source.isolation_level) as consumer:
        return offset_bounds(consumer, source_partitions(consumer, spec.source))[1]


Latest = dict[TopicPartition, int]


def _wait_latest(future: Future[Latest], deadline: float) -> tuple[Latest, str | None]:
    try:
        return future.result(timeout=max(0.0, deadline - time.monotonic())), None
    except FutureTimeout:
        return {}, "Kafka did not answer in time: latest offsets and lag are not shown."
    except MicrobatchError as exc:
        return {}, f"Latest offsets unavailable: {exc}"
    except Exception as exc:  # the page must render without Kafka, whatever went wrong there
        log.warning("latest offsets failed: %s", exc)
        return {}, f"Latest offsets unavailable ({type(exc).__name__})."


def ledger_report(sources: LedgerSources) -> list[PipelineView]:
    """One view per pipeline in the ledger; the ledger is read in one transaction, Kafka in parallel."""
    url = sources.ledger_url()
    pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="microbatch-ui-kafka")
    try:
        with transaction(url) as session:
            names = queries.pipeline_names(session)
            lookups = {name: pool.submit(latest_offsets, name, sources) for name in names}
            deadline = time.monotonic() + sources.kafka_timeout_s + 2.0
            views = []
            for name in names:
                pid = queries.pipeline_id(session, name)
                assert pid is not None  # listed by pipeline_names in this same transaction
                batches = queries.batch_history(session, pid, sources.batch_limit)
                backfills = queries.backfill_batches(session, pid, sources.batch_limit)
                gaps = queries.recorded_gaps(session, pid, sources.gap_limit)
                latest, note = _wait_latest(lookups[name], deadline)
                partitions = queries.partition_status(session, pid, latest)
                lags = [p.lag for p in partitions]
                links = {b.id: link for b in batches + backfills if (link := dag_run_path(name, b))}
                views.append(PipelineView(
                    name=name, dag_id=name, partitions=partitions,
                    total_lag=None if not lags or None in lags else sum(lags),  # type: ignore[arg-type]
                    batches=batches, gaps=gaps, backfills=backfills, kafka_note=note, run_links=links,
                ))
            return views
    except OperationalError as exc:
        raise unreachable(url, exc) from None
    finally:
        pool.shutdown(wait=False, cancel_futures=True)


# ---- HTML ----------------------------------------------------------------------------------------

CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:1.5rem;color:#1a202c;background:#fff}
h1{font-size:1.4rem;margin:0 0 .25rem} h2{font-size:1.15rem;margin:1.75rem 0 .5rem;border-bottom:2px solid #017cee}
h3{font-size:.95rem;margin:1rem 0 .35rem;color:#4a5568}
table{border-collapse:collapse;font-size:.85rem;margin-bottom:.5rem}
th,td{border:1px solid #e2e8f0;padding:.25rem .55rem;text-align:left;vertical-align:top}
th{background:#f7fafc} td.num{text-align:right;font-variant-numeric:tabular-nums}
.muted{color:#718096} .note{background:#fffbea;border:1px solid #f6e05e;padding:.35rem .6rem;font-size:.85rem}
.state-committed{color:#2f855a} .state-failed,.state-abandoned{color:#c53030}
.state-planned,.state-staged{color:#b7791f}
.lag-0{color:#2f855a} .lag-pos{color:#c05621;font-weight:600} a{color:#017cee}
.pickers a{margin-right:.4rem} .pickers a.current{font-weight:700;color:#1a202c;text-decoration:none}
.charts{display:grid;grid-template-columns:repeat(auto-fill,minmax(560px,1fr));gap:.5rem 1rem}
"""


def _cell(value: object, cls: str = "num", name: str | None = None) -> str:
    attr = f' data-field="{name}"' if name else ""
    return f'<td class="{cls}"{attr}>{"-" if value is None else escape(str(value))}</td>'


def _batch_rows(view: PipelineView, batches: list[queries.BatchSummary], airflow_root: str) -> str:
    rows = []
    for b in batches:
        link = view.run_links.get(b.id)
        run = (f'<a target="_top" href="{escape(airflow_root + link)}">{escape(b.airflow_run_id or "")}</a>'
               if link else '<span class="muted">-</span>')
        seconds = queries.step_seconds_text(b.durations)
        error = f'<div class="muted">{escape(b.error)}</div>' if b.error and b.state != BatchState.COMMITTED else ""
        committed = f"{b.committed_at.astimezone(UTC):%Y-%m-%d %H:%M:%S} UTC" if b.committed_at else "-"
        rows.append(
            f'<tr data-batch="{b.id}">{_cell(b.id)}<td>{escape(b.kind)}</td>'
            f'<td class="state-{escape(b.state)}">{escape(b.state)}{error}</td>{_cell(b.attempt)}'
            f"<td>{escape(b.ranges_text) or '-'}</td>{_cell(b.records, name='records')}{_cell(b.dead_letters or 0)}"
            f"{_cell(b.late_records or 0)}<td>{escape(seconds) or '-'}</td>"
            f"<td>{committed}</td><td>{run}</td></tr>"
        )
    return "".join(rows)


BATCH_HEAD = ("<tr><th>batch</th><th>kind</th><th>state</th><th>try</th><th>ranges</th><th>records</th>"
              "<th>dead</th><th>late</th><th>seconds</th><th>committed</th><th>Airflow run</th></tr>")


def _pipeline_html(view: PipelineView, airflow_root: str) -> str:
    name = escape(view.name)
    parts = [f'<section id="pipeline-{name}" data-pipeline="{name}">',
             f'<h2>{name} <span class="muted">total lag <span data-total-lag>'
             f'{"-" if view.total_lag is None else view.total_lag}</span></span></h2>']
    if view.kafka_note:
        parts.append(f'<p class="note" data-kafka-note>{escape(view.kafka_note)}</p>')
    parts.append("<h3>Partitions</h3><table><tr><th>partition</th><th>position</th><th>latest</th><th>lag</th>"
                 "<th>last batch</th><th>committed ago</th></tr>")
    for p in view.partitions:
        lag_cls = "num" if p.lag is None else ("num lag-0" if p.lag == 0 else "num lag-pos")
        age = None if p.last_commit_age_s is None else f"{p.last_commit_age_s:.0f}s"
        parts.append(
            f'<tr data-partition="{escape(p.topic)}[{p.partition}]"><td>{escape(p.topic)}[{p.partition}]</td>'
            f"{_cell(p.position, name='position')}{_cell(p.latest, name='latest')}"
            f"{_cell(p.lag, lag_cls, name='lag')}"
            f"{_cell(p.last_batch_id)}{_cell(age)}</tr>"
        )
    parts.append("</table>")
    parts.append(f'<h3>Recent batches</h3><table data-table="batches">{BATCH_HEAD}'
                 f"{_batch_rows(view, view.batches, airflow_root)}</table>")
    parts.append("<h3>Gaps (offsets recorded as lost)</h3>")
    if view.gaps:
        parts.append('<table data-table="gaps"><tr><th>partition</th><th>range</th><th>offsets</th><th>batch</th>'
                     "<th>batch state</th><th>reason</th></tr>")
        for g in view.gaps:
            parts.append(
                f'<tr data-gap="{g.id}"><td>{escape(g.topic)}[{g.partition}]</td><td>[{g.start}, {g.end})</td>'
                f"{_cell(g.size)}{_cell(g.batch_id)}<td>{escape(g.batch_state or '-')}</td>"
                f"<td>{escape(g.reason)}</td></tr>"
            )
        parts.append("</table>")
    else:
        parts.append('<p class="muted" data-empty="gaps">No gaps: no offset has been lost.</p>')
    parts.append("<h3>Backfills</h3>")
    if view.backfills:
        parts.append(f'<table data-table="backfills">{BATCH_HEAD}'
                     f"{_batch_rows(view, view.backfills, airflow_root)}</table>")
    else:
        parts.append('<p class="muted" data-empty="backfills">No backfills.</p>')
    parts.append("</section>")
    return "".join(parts)


def _charts_html(names: list[str], pipeline: str, range_key: str, charts: str) -> str:
    """The charts of one pipeline, with links that pick the pipeline and the time range."""
    from microbatch.charts import RANGE_NAMES

    def link(label: str, to_pipeline: str, to_range: str, current: bool) -> str:
        href = escape(f"ledger?pipeline={quote(to_pipeline, safe='')}&range={to_range}")
        return f'<a href="{href}" class="{"current" if current else ""}">{escape(label)}</a>'

    pipelines = " ".join(link(n, n, range_key, n == pipeline) for n in names)
    ranges = " ".join(link(label, pipeline, key, key == range_key) for key, label in RANGE_NAMES.items())
    return (f'<section id="charts" data-charts="{escape(pipeline)}" data-range="{range_key}">'
            f'<h2>Charts: {escape(pipeline)}</h2><p class="pickers">pipeline: {pipelines}'
            f' &nbsp;·&nbsp; time range: {ranges}</p><div class="charts">{charts}</div></section>')


def render_page(views: list[PipelineView], airflow_root: str = "../", charts: str = "") -> str:
    """The whole page. `airflow_root` prefixes DAG run links (relative, so it works behind a proxy path);
    `charts` is the charts section (`_charts_html`), if any."""
    body = "".join(_pipeline_html(v, airflow_root) for v in views) or (
        '<p class="muted">The ledger has no pipeline yet: run one first.</p>')
    script = f'<script src="{PLOTLY_JS_PATH.lstrip("/")}"></script>' if charts else ""
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8"><title>microbatch ledger</title>'
        f'<meta name="viewport" content="width=device-width, initial-scale=1"><style>{CSS}</style>{script}</head>'
        '<body><h1>microbatch offset ledger</h1><p class="muted">Positions, lag, batches, gaps and backfills, read '
        'from the ledger database (the same queries as <code>microbatch status</code>). '
        f'<a href="api/ledger">JSON</a></p>{charts}{body}</body></html>'
    )


def charts_section(sources: LedgerSources, names: list[str], pipeline: str | None, range_key: str | None) -> str:
    """The charts section for `pipeline` over `range_key`. Without them (or with a name or a range the page does
    not know), the most recently active pipeline, over the shortest range that holds its last activity."""
    from microbatch.charts import chart_divs

    if not names:
        return ""
    with transaction(sources.ledger_url()) as session:
        active = queries.last_activity(session)
        if pipeline not in names:
            pipeline = next((name for name in active if name in names), names[0])
        if range_key not in queries.CHART_RANGES:
            range_key = queries.range_showing(session, active.get(pipeline))
        pid = queries.pipeline_id(session, pipeline)
        assert pid is not None
        data = queries.chart_data(session, pid, range_key)
    return _charts_html(names, pipeline, range_key, chart_divs(pipeline, data))


def _error_page(message: str) -> str:
    return (f'<!doctype html><html><head><meta charset="utf-8"><title>microbatch ledger</title><style>{CSS}</style>'
            f'</head><body><h1>microbatch offset ledger</h1><p class="note">{escape(message)}</p></body></html>')


def create_app(
    sources: LedgerSources,
    auth: Callable[..., Any],
    login_url: Callable[[str], str] | None = None,
) -> FastAPI:
    """The app the plugin mounts. `auth` is a FastAPI dependency that raises 401/403 for a refused request;
    `login_url(next)` is where a browser without a session is sent instead of a bare 401."""
    app = FastAPI(title="microbatch ledger", docs_url=None, redoc_url=None, openapi_url=None)

    @app.exception_handler(HTTPException)
    async def _refused(request: Request, exc: HTTPException) -> Response:
        wants_html = request.url.path.endswith(PAGE_PATH) and "text/html" in request.headers.get("accept", "")
        if exc.status_code == 401 and wants_html and login_url is not None:
            next_url = request.url.path + (f"?{request.url.query}" if request.url.query else "")
            return RedirectResponse(login_url(next_url), status_code=303)
        return JSONResponse({"detail": exc.detail}, status_code=exc.status_code, headers=exc.headers)

    @app.get(PAGE_PATH, response_class=HTMLResponse, dependencies=[Depends(auth)])
    def ledger_page(pipeline: str | None = None,
                    range_key: str | None = Query(None, alias="range")) -> HTMLResponse:
        try:
            views = ledger_report(sources)
            charts = charts_section(sources, [v.name for v in views], pipeline, range_key)
        except MicrobatchError as exc:
            return HTMLResponse(_error_page(str(exc)), status_code=503)
        return HTMLResponse(render_page(views, charts=charts))

    @app.get(PLOTLY_JS_PATH, dependencies=[Depends(auth)], include_in_schema=False)
    def plotly_script() -> Response:
        from microbatch.charts import plotly_js

        return Response(plotly_js(), media_type="application/javascript",
                        headers={"Cache-Control": "private, max-age=86400"})

    @app.get(JSON_PATH, dependencies=[Depends(auth)])
    def ledger_json() -> JSONResponse:
        try:
            views = ledger_report(sources)
        except MicrobatchError as exc:
            return JSONResponse({"error": str(exc)}, status_code=503)
        return JSONResponse({"pipelines": [v.to_dict() for v in views]})

    @app.get("/", include_in_schema=False)
    def index() -> RedirectResponse:
        return RedirectResponse("ledger", status_code=307)

    return app
