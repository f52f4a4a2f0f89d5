"""The ledger page's charts, drawn by plotly from the series `ledger.queries.chart_data` reads.

Pure: series in, plotly figures (and their HTML fragments) out; no database, no network. The page loads
plotly.js from its own app (`plotly_js()`, the copy that ships in the plotly wheel), never from a CDN.
"""

from __future__ import annotations

from collections import defaultdict
from functools import cache
from html import escape

import plotly.graph_objects as go
import plotly.io as pio
from plotly.offline import get_plotlyjs
from plotly.subplots import make_subplots

from microbatch.ledger.queries import STEP_KEYS, STEP_NAMES, ChartData

RANGE_NAMES = {"1h": "last hour", "1d": "last day", "7d": "last week"}
_LAYOUT = {"height": 300, "margin": {"l": 60, "r": 20, "t": 40, "b": 40}, "template": pio.templates["plotly_white"],
           "legend": {"orientation": "h", "y": -0.2}, "hovermode": "x unified"}
_CONFIG = {"displaylogo": False, "responsive": True}


@cache
def plotly_js() -> str:
    """plotly.js as the installed plotly wheel ships it (read once per process)."""
    return get_plotlyjs()


def lag_figure(data: ChartData) -> go.Figure:
    """Lag over time: one thin line per partition, the pipeline's total thick on top."""
    series: dict[str, tuple[list, list]] = defaultdict(lambda: ([], []))
    for point in data.lag:
        xs, ys = series[point.partition]
        xs.append(point.at)
        ys.append(point.lag)
    # One legend entry for all partitions (a pipeline may have 64): it shows or hides them together, and the
    # hover names each one. The traces skip plotly's per-property validation (`_validate=False`; the layout
    # below is still validated): for 64 partitions x 120 points validation took 0.2 s of a page that must
    # render in 1 s, and every value here is ours.
    traces = [go.Scatter(x=series[name][0], y=series[name][1], name="each partition", mode="lines+markers",
                         line={"width": 1}, marker={"size": 3}, legendgroup="partitions", showlegend=k == 0,
                         opacity=0.6, meta=name, hovertemplate="%{meta}: %{y}<extra></extra>", _validate=False)
              for k, name in enumerate(sorted(n for n in series if n != "total"))]
    if "total" in series:
        xs, ys = series["total"]
        traces.append(go.Scatter(x=xs, y=ys, name="total", mode="lines+markers",
                                 line={"width": 3, "color": "#017cee"}, marker={"size": 5}))
    figure = go.Figure(data=traces, _validate=False)
    figure.update_layout(title="Lag (records behind the latest offset, at the last plan of each interval)", **_LAYOUT)
    figure.update_yaxes(title="records", rangemode="tozero")
    return figure


def records_figure(data: ChartData) -> go.Figure:
    """Records per batch (bars) and records per second of read and stage write (line, right axis)."""
    xs = [p.at for p in data.batches]
    figure = make_subplots(specs=[[{"secondary_y": True}]])
    figure.add_trace(go.Bar(x=xs, y=[round(p.records / p.batches, 1) for p in data.batches],
                            customdata=[p.batches for p in data.batches], name="records per batch",
                            hovertemplate="%{y} records per batch over %{customdata} batch(es)",
                            marker_color="#90cdf4"), secondary_y=False)
    figure.add_trace(go.Scatter(x=xs, y=[None if p.records_per_s is None else round(p.records_per_s, 1)
                                         for p in data.batches],
                                name="records per second", mode="lines+markers", line={"color": "#2f855a"}),
                     secondary_y=True)
    figure.update_layout(title="Batch size and processing rate", **_LAYOUT)
    figure.update_yaxes(title="records per batch", rangemode="tozero", secondary_y=False)
    figure.update_yaxes(title="records / s", rangemode="tozero", secondary_y=True)
    return figure


def steps_figure(data: ChartData) -> go.Figure:
    """Each step's mean seconds per batch, stacked: plan, read, stage write, commit, publish."""
    xs = [p.at for p in data.batches]
    figure = go.Figure()
    for key in STEP_KEYS:
        figure.add_trace(go.Bar(x=xs, y=[round(p.steps[key], 3) for p in data.batches], name=STEP_NAMES[key]))
    figure.update_layout(title="Seconds per batch, by step", barmode="stack", **_LAYOUT)
    figure.update_yaxes(title="seconds", rangemode="tozero")
    return figure


def bad_records_figure(data: ChartData) -> go.Figure:
    """Dead letters and late records per bucket."""
    xs = [p.at for p in data.batches]
    figure = go.Figure()
    figure.add_trace(go.Bar(x=xs, y=[p.dead_letters for p in data.batches], name="dead letters",
                            marker_color="#c53030"))
    figure.add_trace(go.Bar(x=xs, y=[p.late_records for p in data.batches], name="late records",
                            marker_color="#b7791f"))
    figure.update_layout(title="Dead letters and late records", barmode="stack", **_LAYOUT)
    figure.update_yaxes(title="records", rangemode="tozero")
    return figure


def _time_axis(figure: go.Figure, data: ChartData) -> go.Figure:
    """The whole chosen range on the x axis, and bars as wide as a bucket (with a gap between them)."""
    figure.update_xaxes(range=[data.since, data.until], type="date")
    figure.update_traces(width=data.bucket_s * 1000 * 0.8, offset=0, selector={"type": "bar"})
    return figure


CHARTS = {"lag": lag_figure, "records": records_figure, "steps": steps_figure, "bad": bad_records_figure}
"""The page's charts, in order: name -> figure builder."""


def chart_divs(pipeline: str, data: ChartData) -> str:
    """The charts' HTML: one div per chart (id `chart-<name>`, `data-chart=<name>`) with its plotly call."""
    parts = []
    for name, build in CHARTS.items():
        html = pio.to_html(_time_axis(build(data), data), include_plotlyjs=False, full_html=False,
                           div_id=f"chart-{name}", config=_CONFIG, validate=False)
        parts.append(f'<div class="chart" data-chart="{name}" data-pipeline="{escape(pipeline)}">{html}</div>')
    return "".join(parts)
