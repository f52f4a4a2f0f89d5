"""error_summary and StageFailedError: one line for an unexpected error, never the whole trace."""

from __future__ import annotations

import logging

import pytest

from microbatch.errors import StageFailedError, error_summary
from microbatch.ledger.database import Ledger
from microbatch.settings import KafkaSettings


class Py4JJavaError(Exception):
    """Stands in for py4j's error class: only its name and message text matter here."""


def test_a_py4j_error_is_summarised_by_its_java_exception():
    text = ("An error occurred while calling z:org.apache.spark.sql.api.python.PythonSQLUtils.toPyRow.\n"
            ": java.lang.AssertionError: assertion failed\n\tat scala.Predef$.assert(Predef.scala:264)\n")
    assert error_summary(Py4JJavaError(text)) == "Py4JJavaError: java.lang.AssertionError: assertion failed"


def test_other_errors_keep_their_first_line_and_are_bounded():
    assert error_summary(ValueError("bad value\nmore detail")) == "ValueError: bad value"
    assert error_summary(RuntimeError()) == "RuntimeError: no message"
    assert len(error_summary(RuntimeError("x" * 5000))) == 500


def test_an_unexpected_stage_failure_is_one_retryable_sentence():
    error = StageFailedError.from_exception(Py4JJavaError("An error occurred while calling o1.save.\n: "
                                                          "java.lang.AssertionError: assertion failed\n\tat x"))
    assert error.retryable
    assert str(error).startswith("The stage failed: Py4JJavaError: java.lang.AssertionError: assertion failed. "
                                 "Nothing was committed")
    assert "\tat" not in str(error)


def test_stage_batches_turns_only_unnamed_failures_into_stage_failed(monkeypatch, caplog):
    """The control flow alone (stage_batch replaced): a Spark error becomes StageFailedError with its trace
    logged; platform errors and a lost Connect server pass through unchanged."""
    from microbatch.errors import SpecError
    from microbatch.phases import stage as staging

    raised: list[BaseException] = []

    def failing(*_args):
        raise raised[-1]

    monkeypatch.setattr(staging, "stage_batch", failing)
    caplog.set_level(logging.INFO, logger=staging.log.name)
    for original, expected in ((Py4JJavaError(": java.lang.IllegalStateException: boom"), StageFailedError),
                               (SpecError("bad spec"), SpecError),
                               (RuntimeError("status = StatusCode.UNAVAILABLE"), RuntimeError)):
        raised.append(original)
        with pytest.raises(expected) as info:
            staging.stage_batches(None, None, [7], Ledger(""), KafkaSettings(""))
        assert (info.value is original) == (expected is not StageFailedError)
    assert "trace of the failure of batch 7" in caplog.text
