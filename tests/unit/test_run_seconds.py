"""A run's summary counts each task's seconds over all its tries (Airflow keeps the failed ones in its history)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from microbatch.airflow.runner import task_seconds

T0 = datetime(2026, 11, 27, 12, 0, tzinfo=UTC)


def test_seconds_add_up_over_the_tries_and_count_them():
    tries = [
        ("stage", T0, T0 + timedelta(seconds=63.5)),  # the try that found the server gone
        ("stage", T0 + timedelta(seconds=65), T0 + timedelta(seconds=105)),  # the retry, 1.5 s of wait not counted
        ("plan", T0 - timedelta(seconds=5), T0 - timedelta(seconds=1)),
        ("commit", None, None),  # never started
    ]
    seconds, counts = task_seconds(tries)
    assert seconds == {"stage": 103.5, "plan": 4.0}
    assert counts == {"stage": 2, "plan": 1}


def test_prompt_polls_shortens_only_dag_tests_own_wait_and_restores_sleep():
    """`prompt_polls` targets the one-second wait of `dag.test()`'s loop (still in Airflow's source: else the
    shim is dead code), leaves any other caller's sleep whole, and puts `time.sleep` back."""
    import inspect
    import time

    from airflow.sdk.definitions.dag import DAG

    from microbatch.airflow.runner import prompt_polls

    source = inspect.getsource(DAG.test)
    assert "No tasks to run" in source and "time.sleep(1)" in source
    original = time.sleep
    with prompt_polls():
        assert time.sleep is not original
        started = time.monotonic()
        time.sleep(0.3)  # not from DAG.test: the whole wait
        assert time.monotonic() - started >= 0.3
    assert time.sleep is original
