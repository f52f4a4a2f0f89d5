"""Every spec the docs show loads with the project's loader, as a reader would copy it.

Each ```yaml block of README.md and docs/*.md, and each spec a page writes with `cat > ... <<'SPEC'`, is one of:

- a spec, or part of one with `sinks:` (a missing `name` or `source` is taken from the page's context, below);
- a list of sink entries: the `sinks:` of a pipeline with the page's context as its source (and event time);
- a source, or a `key:`/`value:` of one: a context, loaded with a probe sink (`SELECT timestamp AS kafka_ts`);
- other top-level settings (`event_time:`, `spark:`): loaded in the context's pipeline with the probe sink.

A page's context is its latest block with a `source` and no `sinks` (before it: a topic of JSON values with one
field, `ts`), so a page that shows sink entries says first which records they read. Every block is written to a
file and read by `load_spec`, so a broken example fails with the sentence a user would see; and a sink's `sql:`
removed from any example makes that example fail, since a pipeline without a Python job needs a query per sink.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from microbatch.config import SINK_TAGS, PipelineSpec, SourceSpec, load_spec
from microbatch.errors import SpecError

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
YAML_BLOCK = re.compile(r"^```ya?ml[^\n]*\n(.*?)^```", re.DOTALL | re.MULTILINE)
HEREDOC_SPEC = re.compile(r"<<'SPEC'\n(.*?)^SPEC$", re.DOTALL | re.MULTILINE)
DEFAULT_CONTEXT: dict[str, Any] = {"source": {"topics": ["example"], "value": {"format": "json",
                                                                               "fields": {"ts": "timestamp"}}}}
PROBE = {"name": "probe", "type": "postgres_append", "table": "probe", "columns": {"kafka_ts": "timestamptz"},
         "sql": "SELECT timestamp AS kafka_ts FROM records"}


def _blocks(page: Path) -> list[tuple[int, str]]:
    """(line, text) of each YAML block and heredoc spec of the page, in page order."""
    text = page.read_text()
    found = [m for pattern in (YAML_BLOCK, HEREDOC_SPEC) for m in pattern.finditer(text)]
    return sorted((text.count("\n", 0, m.start()) + 1, m.group(1)) for m in found)


def _is_sink_list(data: Any) -> bool:
    return isinstance(data, list) and bool(data) and all(isinstance(e, dict) and e.get("type") in SINK_TAGS
                                                         for e in data)


def _specs(page: Path, texts: dict[int, str] | None = None) -> list[tuple[int, dict[str, Any]]]:
    """Each example of the page as the whole spec it is loaded as. `texts` replaces blocks' text by line."""
    context = DEFAULT_CONTEXT
    specs = []
    for line, block in _blocks(page):
        data = yaml.safe_load((texts or {}).get(line, block))
        if _is_sink_list(data):
            spec = {**context, "sinks": data}
        elif isinstance(data, dict) and "sinks" in data:
            spec = {**(context if "source" not in data else {}), **data}  # its own source: none of the context
        elif isinstance(data, dict) and data.keys() <= SourceSpec.model_fields.keys() - {"topics"}:
            spec = {**context, "source": {"topics": ["example"], **data}, "sinks": [PROBE]}
        elif isinstance(data, dict) and data.keys() <= PipelineSpec.model_fields.keys():
            spec = {**(context if "source" not in data else {}), **data, "sinks": [PROBE]}
            if "source" in data:
                context = {key: data[key] for key in ("source", "event_time") if key in data}
        else:
            raise AssertionError(f"{page.name}:{line}: a YAML block that is no spec, sink list or fragment of "
                                 f"one:\n{block}")
        specs.append((line, {"name": "docs_example", **spec}))
    return specs


def _load(spec: dict[str, Any], tmp_path: Path) -> PipelineSpec:
    path = tmp_path / f"{spec['name']}.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return load_spec(path)


EXAMPLES = [pytest.param(page, line, spec, id=f"{page.name}:{line}") for page in PAGES
            for line, spec in _specs(page)]


@pytest.mark.parametrize(("page", "line", "spec"), EXAMPLES)
def test_every_spec_example_in_the_docs_loads(page: Path, line: int, spec: dict[str, Any], tmp_path: Path):
    try:
        _load(spec, tmp_path)
    except SpecError as exc:
        pytest.fail(f"the example at {page.name}:{line} does not load: {exc}")


def test_the_docs_show_the_examples_a_reader_needs():
    """Enough examples are found (the extraction works), among them a sink of each type with a query, the
    README's pipeline, and a query that selects the record key's columns."""
    specs = [spec for _, _, spec in (p.values for p in EXAMPLES)]
    assert len(specs) >= 15
    with_sql = {sink["type"] for spec in specs for sink in spec["sinks"] if "sql" in sink}
    assert with_sql == SINK_TAGS, f"sink types without an example with sql: {sorted(SINK_TAGS - with_sql)}"
    assert any(page.name == "README.md" for page, *_ in (p.values for p in EXAMPLES))
    assert any("key_text" in sink.get("sql", "") for spec in specs for sink in spec["sinks"])


def _sql_lines(block: str) -> list[int]:
    """The line numbers (in the block) of each sink's `sql:`."""
    return [i for i, line in enumerate(block.splitlines()) if re.match(r"\s*sql:", line)]


def _without_sql(block: str, at: int) -> str:
    """The block with the `sql:` at line `at` removed, and a block scalar's lines under it."""
    lines = block.splitlines(keepends=True)
    indent = len(lines[at]) - len(lines[at].lstrip())
    end = at + 1
    while end < len(lines) and (not lines[end].strip() or len(lines[end]) - len(lines[end].lstrip()) > indent):
        end += 1
    return "".join(lines[:at] + lines[end:])


WITH_SQL = [pytest.param(page, line, at, id=f"{page.name}:{line + at + 1}") for page in PAGES
            for line, block in _blocks(page) for at in _sql_lines(block)]


@pytest.mark.parametrize(("page", "line", "at"), WITH_SQL)
def test_an_example_without_a_sinks_sql_does_not_load(page: Path, line: int, at: int, tmp_path: Path):
    """What makes the examples' test worth having: any sink's query deleted from the page, its example fails."""
    cut = _without_sql(dict(_blocks(page))[line], at)
    spec = dict(_specs(page, {line: cut}))[line]
    with pytest.raises(SpecError, match="sql"):
        _load(spec, tmp_path)
