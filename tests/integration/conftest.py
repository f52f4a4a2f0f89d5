"""One local Spark for the integration tests that run Spark in the test process, and a ledger at an old migration.

A JVM started by pyspark keeps the classpath of its first session: a second session with `spark.jars`
in the same process does not get Spark's Kafka source. So every in-process test shares this session,
started once with the connector jars.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from sqlalchemy import Connection, text

from microbatch.ledger.database import get_engine
from microbatch.sinks.schema import migrate


@pytest.fixture(scope="session")
def spark() -> Iterator[object]:
    from pyspark.sql import SparkSession

    from microbatch.runtime import spark_jars

    session = (SparkSession.builder.master("local[2]").appName("microbatch-integration")
               .config("spark.jars", ",".join(str(p) for p in spark_jars()))
               .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", "2").getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()



@contextmanager
def ledger_at_revision(postgres: Any, revision: str, state: str) -> Iterator[tuple[str, Connection, int, int]]:
    """A new ledger database migrated to `revision` only, with one pipeline and one batch in `state` written as an
    older release wrote them: (its URL, the open transaction for the rows the test adds, pipeline id, batch id),
    committed when the block ends."""
    name = f"t_{uuid.uuid4().hex[:10]}"
    postgres.create_database(name)
    url = postgres.url(name)
    migrate(url, revision)
    with get_engine(url).begin() as conn:
        pipeline = conn.execute(text(
            "INSERT INTO pipelines (name, spec_hash) VALUES ('old', 'h') RETURNING id")).scalar_one()
        batch = conn.execute(text(
            "INSERT INTO batches (pipeline_id, kind, state, attempt) VALUES (:p, 'scheduled', :s, 1) RETURNING id"),
            {"p": pipeline, "s": state}).scalar_one()
        yield url, conn, pipeline, batch


@pytest.fixture
def console(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> Callable[..., tuple[int, str]]:
    """`microbatch ARGS` as the console runs it, in process (its entry point `main`, which turns every failure into
    one sentence): (exit code, what it printed, as words). A traceback, an unexpected error or an exception let out
    of `main` fails the test. Never a running local stack's connections: the test's own environment."""
    import sys
    import traceback

    from microbatch import cli

    monkeypatch.setattr(cli.localenv, "use_running_stack", dict)

    def invoke(*args: str) -> tuple[int, str]:
        monkeypatch.setattr(sys, "argv", ["microbatch", *args])
        try:
            cli.main()
            code = 0
        except SystemExit as done:
            code = done.code if isinstance(done.code, int) else 1
        except Exception as exc:
            pytest.fail(f"microbatch {' '.join(args)} let out:\n{''.join(traceback.format_exception(exc))}")
        out = capsys.readouterr()
        output = out.out + out.err
        assert "Traceback" not in output and "unexpected error" not in output, output
        return code, " ".join(output.split())

    return invoke
