"""`microbatch new`'s files (without Spark: the e2e test runs them) and the demo's click generator."""

from __future__ import annotations

import ast
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from microbatch import scaffold
from microbatch.config import PostgresAppendSink, find_spec, load_spec
from microbatch.dev.datagen import generate_clicks
from microbatch.errors import SpecError
from microbatch.phases.plan import check_transform

T0 = datetime(2026, 11, 25, 10, 0, 0, tzinfo=UTC)


@pytest.mark.parametrize(("fmt", "columns", "expected"), [
    ("json", {"id": "text", "amount": "bigint", "at": "timestamptz"}, {"id": "text", "amount": "bigint",
                                                                       "at": "timestamptz"}),
    ("json", None, scaffold.DEFAULT_JSON_COLUMNS),
    ("text", None, {"line": "text"}),
])
def test_new_writes_a_spec_that_loads_a_transform_with_the_contract_and_a_dag(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fmt: str, columns: dict | None, expected: dict
) -> None:
    written = scaffold.new_pipeline("orders", "orders_src", fmt, columns, root=tmp_path)
    assert sorted(p.relative_to(tmp_path).as_posix() for p in written.values()) == [
        "dags/orders.py", "include/pipelines/orders.yaml", "spark_jobs/orders.py", "tests/unit/test_orders.py"]
    spec = load_spec(written["spec"])
    assert spec.name == "orders" and spec.source.topics == ["orders_src"]
    (sink,) = spec.sinks
    assert isinstance(sink, PostgresAppendSink) and sink.columns == expected
    for path in (written["transform"], written["test"], written["dag"]):
        ast.parse(path.read_text(), filename=str(path))
    # The plan's check (the module is found and the object has the four methods), on a package of its own:
    # `spark_jobs` is this checkout's.
    package = tmp_path / "mb_scaffold_jobs"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "orders.py").write_text(written["transform"].read_text())
    monkeypatch.syspath_prepend(str(tmp_path))
    check_transform(spec.model_copy(update={"job": spec.job.model_copy(
        update={"transform": "mb_scaffold_jobs.orders:transform"})}))
    assert "pipeline_dag('orders')" in written["dag"].read_text()


def test_new_refuses_an_existing_name_and_bad_input_before_writing(tmp_path: Path) -> None:
    scaffold.new_pipeline("orders", "t", "json", root=tmp_path)
    before = {p: p.read_text() for p in tmp_path.rglob("*") if p.is_file()}
    with pytest.raises(SpecError, match="exists already"):
        scaffold.new_pipeline("orders", "other", "text", root=tmp_path)
    assert {p: p.read_text() for p in tmp_path.rglob("*") if p.is_file()} == before
    for name, fmt in (("Bad-Name", "json"), ("ok", "xml")):
        with pytest.raises(SpecError):
            scaffold.new_pipeline(name, "t", fmt, root=tmp_path)
    with pytest.raises(SpecError, match="type 'foo'"):
        scaffold.parse_columns("a:foo")
    with pytest.raises(SpecError, match="not a column name"):
        scaffold.parse_columns("offset:bigint")
    assert scaffold.parse_columns("a:text, b:double precision") == {"a": "text", "b": "double precision"}


def test_a_first_pipeline_may_be_called_payments_the_documented_example_is_payments_example() -> None:
    """Issue 64: `microbatch new payments` was refused while the example job shipped as spark_jobs/payments.py."""
    assert set(scaffold.check_new_name("payments")) == {"spec", "transform", "test", "dag"}
    assert (scaffold.ROOT / "spark_jobs" / "payments_example.py").is_file()


def test_the_shipped_clicks_spec_uses_the_five_sink_types_and_the_transforms_outputs() -> None:
    spec = find_spec("clicks")
    assert sorted(s.type for s in spec.sinks) == ["delta", "kafka", "postgres_aggregate", "postgres_append",
                                                    "postgres_upsert"]
    outputs = "".join(ast.unparse(node) for node in ast.walk(ast.parse(Path("spark_jobs/clicks.py").read_text()))
                      if isinstance(node, ast.Return) and isinstance(node.value, ast.Dict))
    for sink in spec.sinks:
        if sink.type != "kafka":
            assert f"'{sink.name}'" in outputs, f"spark_jobs/clicks.py has no output for {sink.name}"
    check_transform(spec)


def test_generated_clicks_are_seeded_with_malformed_late_and_forget_ones() -> None:
    clicks = generate_clicks(2_000, start=T0, seed=3, forget=0.05)
    assert clicks == generate_clicks(2_000, start=T0, seed=3, forget=0.05)
    assert len(clicks) == 2_000
    malformed = [c for c in clicks if c.malformed]
    assert 10 < len(malformed) < 100 and all(c.user is None for c in malformed)
    late = clicks[-40:]
    assert all(not c.malformed and c.event_time < T0 + timedelta(seconds=10) for c in late)
    assert max(c.event_time for c in clicks if not c.malformed) > T0 + timedelta(seconds=170)
    payloads = [json.loads(c.value) for c in clicks if not c.malformed]
    assert any(p.get("forget") is True and "page" not in p for p in payloads)
    assert all(p["ts"].endswith("Z") and (p.get("forget") or isinstance(p.get("page"), str)) for p in payloads)
