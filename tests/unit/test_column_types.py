"""The spec's column types live in one model (`microbatch.column_types`, with their Spark spellings) and one module
of sink-target mappers (`microbatch.sinks.column_mappers`): no other module spells them out, and every type has a
mapping in every mapper."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from microbatch import column_types
from microbatch.column_types import CALENDAR_TYPES, COLUMN_TYPES, TIME_TYPES
from microbatch.sinks import column_mappers

PACKAGE = Path(column_types.__file__).resolve().parent
MODEL_MODULES = {Path(column_types.__file__).resolve(), Path(column_mappers.__file__).resolve()}
# The spec's type names that mean nothing else in the package (the others are also Spark SQL types, column names
# or words of the CLI): a table of the spec's types, or a check against one, names at least one of them.
ONLY_COLUMN_TYPES = {"double precision", "timestamptz", "jsonb", "bytea"}


def _docstrings(tree: ast.AST) -> set[int]:
    """The ids of the docstring constants of a module, its classes and functions."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                found.add(id(first.value))
    return found


def _spelled_out(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    skipped = _docstrings(tree)
    return [f"{path.relative_to(PACKAGE.parent)}:{node.lineno}: {node.value!r}" for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and id(node) not in skipped and node.value in ONLY_COLUMN_TYPES]


def test_only_the_model_and_its_mappers_spell_out_the_column_types() -> None:
    assert set(COLUMN_TYPES) >= ONLY_COLUMN_TYPES
    found = [hit for path in sorted(PACKAGE.rglob("*.py")) if path.resolve() not in MODEL_MODULES
             for hit in _spelled_out(path)]
    assert not found, "spell the column types only in microbatch/column_types.py and sinks/column_mappers.py:\n" + \
        "\n".join(found)


@pytest.mark.parametrize("table", [column_mappers.DELTA_TYPES, column_mappers.ICEBERG_SPARK_TYPES,
                                   column_mappers.ICEBERG_TYPES, column_types.SCAFFOLD_SPARK_TYPES,
                                   column_types.SAMPLE_VALUES])
def test_every_column_type_has_a_mapping_in_every_table(table: dict[str, object]) -> None:
    assert set(table) == set(COLUMN_TYPES)


def test_every_column_type_has_a_postgres_and_an_iceberg_type() -> None:
    assert set(column_mappers.postgres_types()) == set(COLUMN_TYPES)
    for name in COLUMN_TYPES:
        column_mappers.postgres_types()[name]()
        assert column_mappers.iceberg_type(name) is not None


def test_spark_types_infer_column_types_and_the_facts_name_column_types() -> None:
    assert set(column_types.POSTGRES_FOR_SPARK.values()) <= set(COLUMN_TYPES)
    assert column_types.spec_type_for_spark("decimal(10,2)") in COLUMN_TYPES
    assert set(TIME_TYPES) <= set(CALENDAR_TYPES) <= set(COLUMN_TYPES)
