"""Dump every piece of SQL the shipped and tested sinks generate, for a byte comparison across a restructure.

Specs: include/pipelines/*.yaml, and every triple-quoted YAML in tests/ and bench/ and every ```yaml block in docs/
that validates as a pipeline spec. For each sink: its module's `*_sql` builders called with its spec, its tables'
DDL (PostgreSQL dialect), its query rewritten for exactly-once; the ledger's outbox builders; and the pipeline's own
generated queries. Run from a checkout's root: python tests/sql_dump.py > out.sql (the `# N specs` line goes to stderr)
"""
import inspect
import itertools
import re
import sys
from pathlib import Path

import sqlalchemy as sa
import yaml
from sqlalchemy.dialects import postgresql

ROOT = Path.cwd()
sys.path[:0] = [str(ROOT / "include"), str(ROOT)]

from microbatch.config import PipelineSpec  # noqa: E402
from microbatch.sinks import registry  # noqa: E402


def candidates():
    for path in sorted((ROOT / "include/pipelines").glob("*.yaml")):
        yield str(path), path.read_text()
    for folder in ("tests", "bench"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            for i, m in enumerate(re.finditer(r'(?s)(?:"""|\'\'\')(.*?)(?:"""|\'\'\')', path.read_text())):
                if "sinks:" in m.group(1):
                    yield f"{path.relative_to(ROOT)}#{i}", m.group(1)
    for path in sorted((ROOT / "docs").glob("*.md")):
        for i, m in enumerate(re.finditer(r"(?s)```ya?ml\n(.*?)```", path.read_text())):
            yield f"{path.relative_to(ROOT)}#{i}", m.group(1)


def from_test_builders():
    import importlib
    import itertools
    import tempfile
    values = {"topic": ["t_in"], "name": ["p_built"], "spark_mode": ["submit"], "upsert": [False, True],
              "lake": ["delta", "iceberg"], "batch": [250], "include_headers": [False, True],
              "out_topic": ["t_out"], "amount_type": ["double"], "delta_upsert": [False, True],
              "mode": ["submit"], "sql": ["@CAPTURED", "@CHANGED"]}
    for path in sorted((ROOT / "tests").rglob("test_*.py")):
        mod_name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        text = path.read_text()
        if "def write_spec" not in text and "def make_spec" not in text:
            continue
        try:
            mod = importlib.import_module(mod_name)
        except Exception as exc:
            print(f"# cannot import {mod_name}: {exc}", file=sys.stderr)
            continue
        for fname in ("write_spec", "make_spec"):
            fn = getattr(mod, fname, None)
            if fn is None:
                continue
            params = inspect.signature(fn).parameters
            names = [p for p in params if p != "directory" and params[p].default is inspect.Parameter.empty]
            if any(n not in values for n in names):
                print(f"# skip {mod_name}.{fname}{tuple(params)}", file=sys.stderr)
                continue
            for combo in itertools.product(*(values[n] for n in names)):
                kwargs = {k: getattr(mod, v[1:]) if isinstance(v, str) and v.startswith('@') else v
                          for k, v in zip(names, combo, strict=False)}
                where = f"{mod_name}.{fname}{kwargs}"
                try:
                    if "directory" in params:
                        with tempfile.TemporaryDirectory() as tmp:
                            fn(Path(tmp), **kwargs)
                            for y in sorted(Path(tmp).glob("*.yaml")):
                                yield where, y.read_text()
                    else:
                        yield where, fn(**kwargs)
                except Exception as exc:
                    print(f"# {where}: {type(exc).__name__}: {exc}", file=sys.stderr)


def specs():
    seen = set()
    for where, text in itertools.chain(candidates(), from_test_builders()):
        try:
            spec = text if isinstance(text, PipelineSpec) else PipelineSpec.model_validate(yaml.safe_load(text))
        except Exception:
            continue
        key = spec.model_dump_json()
        if key in seen:
            continue
        seen.add(key)
        yield where, spec


def main() -> None:
    n = 0
    for where, spec in specs():
        n += 1
        print(f"==== {where}: {spec.name}")
        try:
            for name, q in sorted(spec.sink_queries().items()):
                print(f"-- query {name}: {q}")
        except Exception as exc:
            print(f"-- queries: {type(exc).__name__}")
        for name, sink in sorted(registry.sinks_of(spec).items()):
            module = sys.modules[type(sink).__module__]
            print(f"--- sink {name} ({type(sink).__module__})")
            metadata = sa.MetaData()
            try:
                for table in sink.tables(metadata):
                    print(str(sa.schema.CreateTable(table).compile(dialect=postgresql.dialect())).strip())
            except Exception as exc:
                print(f"-- tables: {type(exc).__name__}: {exc}")
            for fname, fn in sorted(vars(module).items()):
                if not (fname.endswith("_sql") and inspect.isfunction(fn)):
                    continue
                params = list(inspect.signature(fn).parameters)
                args = [sink.spec, *["target", "source"][:len(params) - 1]]
                try:
                    out = fn(*args)
                except Exception as exc:
                    out = f"{type(exc).__name__}"
                print(f"-- {fname}: {out}")
    from microbatch.ledger import repository as repo
    print(repo.outbox_insert_sql("rel", "o", "k"))
    print(repo.outbox_insert_sql("rel", "o", "k", correction=True, ctes="WITH x AS (SELECT 1)"))
    print(repo.outbox_row_changes_sql("new", "k"))
    print(f"# {n} specs", file=sys.stderr)


main()
