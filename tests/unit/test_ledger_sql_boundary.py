"""The ledger's SQL lives in include/microbatch/ledger/ only (issue 42): no module of the package outside it names a
ledger table in SQL text, nor selects, inserts, updates or deletes through the ledger's model classes or tables.

Which tables are the ledger's comes from its Alembic metadata (`Base.metadata` of ledger/models.py), not from a
list kept here: a table added to the models is guarded from then on. A sink's own tables (staging, contributions,
versions, its output) are not in it, so sinks write their SQL themselves; the parts of it that touch the ledger
come from `ledger/fragments.py`."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from sqlalchemy import Table

from microbatch.ledger import models
from microbatch.ledger.models import Base

PACKAGE = Path(models.__file__).resolve().parents[1]
LEDGER = PACKAGE / "ledger"
LEDGER_TABLES = sorted(Base.metadata.tables)
MODELS_MODULE = "microbatch.ledger.models"
MODEL_NAMES = {
    name for name, value in vars(models).items()
    if (isinstance(value, type) and issubclass(value, Base) and value is not Base) or isinstance(value, Table)
}
SQL_ON_LEDGER = re.compile(
    r"\b(FROM|JOIN|INTO|UPDATE|TABLE|USING)\s+(" + "|".join(map(re.escape, LEDGER_TABLES)) + r")\b", re.IGNORECASE)
STATEMENTS = {"select", "insert", "update", "delete", "get", "query", "merge", "exists"}
"""Calls that read or write through a model or table named in their arguments (`select(Batch)`,
`session.get(Pipeline, id)`, `update(Range)`...), or, as methods of a table, write it (`TABLE.delete()`)."""
ALLOWED: dict[str, str] = {}
"""`path:line` -> why SQL on a ledger table may stand there. None: dev/, ui.py and the CLI read through
ledger/queries.py and ledger/repository.py like everyone else."""


def _modules() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if LEDGER not in p.parents)


def _text_of(node: ast.AST) -> str | None:
    """A string constant, or an f-string's constant parts with `{}` for each value (so a formatted table name
    never matches, a literal one does)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(v.value if isinstance(v, ast.Constant) else "{}" for v in node.values)
    return None


def _skipped(tree: ast.AST) -> set[int]:
    """Docstrings (prose, not SQL), and the constant parts of f-strings (read with their f-string)."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            found |= {id(v) for v in node.values}
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                found.add(id(first.value))
    return found


def _model_aliases(tree: ast.AST) -> tuple[set[str], set[str]]:
    """(local names of the ledger's models and tables, local names of the models module) in one file."""
    names: set[str] = set()
    modules: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == MODELS_MODULE:
            names |= {a.asname or a.name for a in node.names if a.name in MODEL_NAMES}
        elif isinstance(node, ast.ImportFrom) and node.module == "microbatch.ledger":
            modules |= {a.asname or a.name for a in node.names if a.name == "models"}
        elif isinstance(node, ast.Import):
            modules |= {a.asname for a in node.names if a.name == MODELS_MODULE and a.asname}
    return names, modules


def _names_model(node: ast.AST, names: set[str], modules: set[str]) -> bool:
    for sub in ast.walk(node):
        if isinstance(sub, ast.Name) and sub.id in names:
            return True
        if (isinstance(sub, ast.Attribute) and sub.attr in MODEL_NAMES and isinstance(sub.value, ast.Name)
                and sub.value.id in modules):
            return True
    return False


def ledger_sql_sites(files: list[Path]) -> list[str]:
    """`path:line: what` for every SQL on a ledger table, or statement through a ledger model, in `files`."""
    sites: list[tuple[str, int, str]] = []
    for path in files:
        tree = ast.parse(path.read_text(), filename=str(path))
        skipped = _skipped(tree)
        names, modules = _model_aliases(tree)
        where = str(path.relative_to(PACKAGE.parent)) if PACKAGE in path.parents else path.name
        for node in ast.walk(tree):
            text = None if id(node) in skipped else _text_of(node)
            if text is not None:
                for match in SQL_ON_LEDGER.finditer(text):
                    sites.append((where, node.lineno, f"SQL names the ledger table: {match.group(0)!r}"))
            if isinstance(node, ast.Call):
                func = node.func
                called = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
                if called in STATEMENTS and any(_names_model(a, names, modules)
                                                for a in [*node.args, *(k.value for k in node.keywords)]):
                    sites.append((where, node.lineno, f"{called}() through a ledger model"))
                elif (called in {"insert", "update", "delete", "select"} and isinstance(func, ast.Attribute)
                      and _names_model(func.value, names, modules)):
                    sites.append((where, node.lineno, f"{called}() of a ledger table"))
    return [f"{where}:{line}: {what}" for where, line, what in sorted(sites)]


def test_the_ledger_tables_come_from_the_alembic_metadata():
    assert {"batches", "ranges", "positions", "lake_commits", "dead_letters", "outbox",
            "publish_progress"} <= set(LEDGER_TABLES)
    assert {"Batch", "Range", "LakeCommit"} <= MODEL_NAMES


def test_no_sql_on_a_ledger_table_outside_ledger():
    found = [site for site in ledger_sql_sites(_modules()) if site.split(": ", 1)[0] not in ALLOWED]
    assert not found, "the ledger's SQL belongs in include/microbatch/ledger/ (repository.py, queries.py, " \
                      "fragments.py):\n" + "\n".join(found)


def test_the_scan_finds_sql_on_a_ledger_table(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text(
        "from sqlalchemy import select, text\n"
        "from microbatch.ledger.models import Range as R\n"
        "def f(session, t):\n"
        "    session.execute(text(f'UPDATE ranges SET committed = true WHERE batch_id = {t}'))\n"
        "    session.execute(text(f'SELECT 1 FROM {t} JOIN Lake_Commits l ON true'))\n"
        "    session.execute(text('SELECT * FROM ' 'batches'))\n"
        "    session.execute(text(f'SELECT * FROM {t} WHERE stage_ranges = 1'))\n"
        "    return session.scalars(select(R.id).where(R.batch_id == 1))\n"
    )
    sites = ledger_sql_sites([probe])
    assert [s.split(": ", 1)[1] for s in sites] == [
        "SQL names the ledger table: 'UPDATE ranges'",
        "SQL names the ledger table: 'JOIN Lake_Commits'",
        "SQL names the ledger table: 'FROM batches'",
        "select() through a ledger model",
    ]
