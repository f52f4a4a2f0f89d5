"""The ledger page's chart builders (pure: series in, plotly figures and HTML out)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from microbatch import charts
from microbatch.ledger.queries import STEP_KEYS, BatchPoint, ChartData, LagPoint

NOW = datetime(2026, 11, 25, 12, 0, tzinfo=UTC)


def sample(partitions: int = 3) -> ChartData:
    since = NOW - timedelta(hours=1)
    lag = [LagPoint(since + timedelta(minutes=m), f"src[{p}]", 10 * m + p) for m in (5, 10) for p in range(partitions)]
    lag += [LagPoint(since + timedelta(minutes=m), "total", sum(10 * m + p for p in range(partitions)))
            for m in (5, 10)]
    batches = [BatchPoint(since + timedelta(minutes=5), 2, 300, 4, 1, 150.0, dict.fromkeys(STEP_KEYS, 0.5)),
               BatchPoint(since + timedelta(minutes=10), 1, 90, 0, 0, None, dict.fromkeys(STEP_KEYS, 0.25))]
    return ChartData("1h", since, NOW, 30, lag, batches)


def test_lag_has_one_legend_entry_for_all_partitions_and_the_total_on_top():
    figure = charts.lag_figure(sample(partitions=64))
    partitions = [t for t in figure.data if t.legendgroup == "partitions"]
    assert len(partitions) == 64 and [t.showlegend for t in partitions].count(True) == 1
    assert sorted(t.meta for t in partitions)[:2] == ["src[0]", "src[10]"]  # the hover names each partition
    total = figure.data[-1]
    assert total.name == "total" and list(total.y) == [sum(50 + p for p in range(64)), sum(100 + p for p in range(64))]


def test_records_bars_carry_their_batch_counts_and_the_rate_skips_unknowns():
    bars, rate = charts.records_figure(sample()).data
    assert list(bars.y) == [150.0, 90.0] and list(bars.customdata) == [2, 1]
    assert list(rate.y) == [150.0, None]


def test_steps_stack_every_step_and_bad_records_stack_dead_and_late():
    steps = charts.steps_figure(sample())
    assert [t.name for t in steps.data] == ["plan", "read+stage", "dead+late", "commit", "publish"]
    assert steps.layout.barmode == "stack"
    dead, late = charts.bad_records_figure(sample()).data
    assert (list(dead.y), list(late.y)) == ([4, 0], [1, 0])


def test_chart_divs_span_the_whole_range_and_load_nothing_from_elsewhere():
    html = charts.chart_divs("ip_count", sample())
    for name in charts.CHARTS:
        assert f'id="chart-{name}"' in html and f'data-chart="{name}"' in html
    assert "cdn" not in html.lower() and "<script src" not in html
    figure = charts._time_axis(charts.steps_figure(sample()), sample())
    assert [str(x) for x in figure.layout.xaxis.range] == [str(NOW - timedelta(hours=1)), str(NOW)]
    assert {t.width for t in figure.data} == {30 * 1000 * 0.8}  # a bucket wide, with a gap
