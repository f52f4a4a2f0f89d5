"""error_summary: one line for an unexpected error, never the whole trace."""

from __future__ import annotations

from microbatch.errors import error_summary


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
