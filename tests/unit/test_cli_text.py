"""Pure text helpers of the CLI."""

from microbatch.cli import _runs_text


def test_history_names_both_runs_when_a_later_run_committed_the_batch():
    assert _runs_text("scheduled__a", "scheduled__b") == "planned by scheduled__a, committed by scheduled__b"


def test_history_names_one_run_when_the_same_run_planned_and_committed():
    assert _runs_text("manual__a", "manual__a") == "manual__a"
    assert _runs_text("manual__a", None) == "manual__a"
    assert _runs_text(None, None) == "-"
