"""The parts of the docs generated from the repository, committed in the pages so they read on GitHub too, and
refreshed by one command: `make docs-generate` (`python docs/hooks.py`). `tests/unit/test_docs.py` regenerates
them and fails, naming that command, when a committed page differs.

Each generated part sits between two markers, and only what lies between them is rewritten:

- `<!-- generated: spec-reference -->` ... `<!-- end generated: spec-reference -->`: the pipeline spec reference,
  one table per model of `PipelineSpec.model_json_schema()` (what `microbatch schema` prints), with field, type,
  default and description. A field without a description in the schema takes its attribute docstring in
  `config/`.
- `<!-- generated: cli-reference -->` ... `<!-- end generated: cli-reference -->`: the CLI reference, every command
  of the Typer app, read from its click command tree (usage, arguments and options with their help, defaults and
  bounds).
- `<!-- include: PATH -->` ... `<!-- end include: PATH -->`: the file PATH of the repository, in a code block.

A start marker without its end (a page just written), and a snippet include of pymdownx (a code block holding only
`--8<-- "PATH"`, which GitHub shows as that line), become marked parts on the next regeneration. As an mkdocs hook,
the same refresh runs on every page on its way to HTML, so the site is current even before a regeneration.
"""

from __future__ import annotations

import ast
import html
import inspect
import itertools
import json
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
for path in (ROOT, ROOT / "include"):  # `mkdocs serve` without PYTHONPATH finds the package too
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

REGENERATE = "make docs-generate"
GENERATED = re.compile(r"<!-- generated: (?P<name>[\w-]+) -->\n(?:(?P<body>.*?)<!-- end generated: (?P=name) -->\n?)?",
                       re.DOTALL)
INCLUDED = re.compile(r"<!-- include: (?P<path>\S+) -->\n(?:(?P<body>.*?)<!-- end include: (?P=path) -->\n?)?",
                      re.DOTALL)
SNIPPET = re.compile(r"^(?P<fence>`{3,})[\w-]*\n--8<-- \"(?P<path>[^\"]+)\"\n(?P=fence)[ \t]*\n?", re.MULTILINE)
LANGUAGES = {".py": "python", ".yaml": "yaml", ".yml": "yaml", ".toml": "toml", ".sql": "sql", ".sh": "bash"}


def on_page_markdown(markdown: str, **_: Any) -> str:
    """mkdocs: the page with its generated parts refreshed."""
    return refresh(markdown)


def generators() -> dict[str, Callable[[], str]]:
    return {"spec-reference": spec_reference, "cli-reference": cli_reference}


def included(path: str) -> str:
    """The file at `path` (from the repository's root) as a code block, fenced longer than any run of backticks
    in it."""
    text = (ROOT / path).read_text()
    fence = "`" * max(3, 1 + max((len(run) for run in re.findall(r"`+", text)), default=0))
    return f"{fence}{LANGUAGES.get(Path(path).suffix, '')}\n{text.rstrip()}\n{fence}"


def refresh(markdown: str) -> str:
    """The page with every generated part and included file rewritten from the repository as it is now."""
    markdown = SNIPPET.sub(lambda m: f"<!-- include: {m['path']} -->\n", markdown)
    makers = generators()

    def generated(match: re.Match[str]) -> str:
        name = match["name"]
        if name not in makers:
            raise ValueError(f"unknown generated part {name!r}; known: {', '.join(makers)}")
        return f"<!-- generated: {name} -->\n\n{makers[name]().strip()}\n\n<!-- end generated: {name} -->\n"

    markdown = GENERATED.sub(generated, markdown)
    return INCLUDED.sub(lambda m: f"<!-- include: {m['path']} -->\n{included(m['path'])}\n"
                                  f"<!-- end include: {m['path']} -->\n", markdown)


def stale_pages(pages: list[Path] | None = None) -> dict[Path, str]:
    """The pages whose generated parts differ from a regeneration, with the regenerated text."""
    found = {}
    for page in pages if pages is not None else sorted(DOCS.glob("*.md")):
        text = page.read_text()
        fresh = refresh(text)
        if fresh != text:
            found[page] = fresh
    return found


def main() -> None:
    """Rewrite the generated parts of every page under docs/ (what `make docs-generate` runs)."""
    stale = stale_pages()
    for page, fresh in stale.items():
        page.write_text(fresh)
        print(f"regenerated {page.relative_to(ROOT)}")
    if not stale:
        print("docs/: every generated part is current")


# --- the spec reference, from the JSON Schema --------------------------------------------------------------


def _cell(text: str) -> str:
    """Text that stays inside one cell of a Markdown table."""
    return " ".join(text.split()).replace("|", "\\|")


def _text(text: str) -> str:
    """Prose whose `<word>` is shown, not taken for an HTML tag (code spans are left as they are)."""
    parts = text.split("`")
    parts[::2] = [html.escape(part, quote=False) for part in parts[::2]]
    return "`".join(parts)


def _anchor(model: str) -> str:
    return f"spec-{model.lower()}"


def _ref_name(schema: dict) -> str | None:
    ref = schema.get("$ref")
    return ref.rsplit("/", 1)[-1] if ref else None


def _literal(value: object) -> str:
    return f"`{json.dumps(value)}`"


def _bounds(schema: dict) -> str:
    parts = []
    for key, sign in (("exclusiveMinimum", ">"), ("minimum", "≥"), ("exclusiveMaximum", "<"), ("maximum", "≤")):
        if key in schema:
            parts.append(f"{sign} {schema[key]}")
    if "minItems" in schema:
        parts.append(f"at least {schema['minItems']} item" + ("s" if schema["minItems"] != 1 else ""))
    return f" ({', '.join(parts)})" if parts else ""


def _type(schema: dict, defs: dict) -> str:
    """A field's type in words: links to the models, literals for enums and constants, bounds in brackets."""
    name = _ref_name(schema)
    if name is not None:
        target = defs[name]
        if "enum" in target:
            return "one of " + ", ".join(_literal(v) for v in target["enum"])
        return f"[{name}](#{_anchor(name)})"
    for union in ("anyOf", "oneOf"):
        if union in schema:
            return " or ".join(_type(option, defs) for option in schema[union])
    return _plain_type(schema, defs)


def _plain_type(schema: dict, defs: dict) -> str:
    if "const" in schema:
        return _literal(schema["const"])
    if "enum" in schema:
        return "one of " + ", ".join(_literal(v) for v in schema["enum"])
    kind = schema.get("type", "any")
    if kind == "array":
        return f"list of {_type(schema.get('items', {}), defs)}" + _bounds(schema)
    if kind == "object":
        values = schema.get("additionalProperties")
        return f"map of string to {_type(values, defs)}" if isinstance(values, dict) and values else "map"
    return kind + _bounds(schema)


def _default(field: dict, required: bool, defs: dict, built: Any = None) -> str:
    """The default column: the schema's default; else what the field's default_factory builds (`built`): a model's
    own defaults, or for a field with a short form, the short form of its default (`startup: earliest`)."""
    if required:
        return "**required**"
    if "default" in field:
        return _literal(field["default"])
    # pydantic leaves a default_factory out of the schema: say what the factory builds
    if _ref_name(field) is not None and "properties" in defs[_ref_name(field)]:
        return "its own defaults"
    if hasattr(built, "model_dump") and type(built).model_fields:  # a field that also takes a short form
        return _literal(built.model_dump(mode="json")[next(iter(type(built).model_fields))])
    return {"array": "`[]`", "object": "`{}`"}.get(field.get("type", ""), "")


def _built_default(cls: type | None, field: str) -> Any:
    """What the default_factory of `cls`'s field builds, or None."""
    info = getattr(cls, "model_fields", {}).get(field)
    return info.default_factory() if info is not None and info.default_factory is not None else None


def _enum_description(field: dict, defs: dict) -> str:
    """The description of the enum a field takes its values from, if it has one."""
    name = _ref_name(field)
    return defs[name].get("description", "") if name is not None and "enum" in defs[name] else ""


def attribute_docstrings(cls: type) -> dict[str, str]:
    """The docstring under each annotated attribute of a class body (what pydantic's
    `use_attribute_docstrings` would put in the schema)."""
    try:
        tree = ast.parse(inspect.getsource(cls))
    except (OSError, TypeError):
        return {}
    body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
    found = {}
    for node, following in itertools.pairwise(body):
        if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
                and isinstance(following, ast.Expr) and isinstance(following.value, ast.Constant)
                and isinstance(following.value.value, str)):
            found[node.target.id] = inspect.cleandoc(following.value.value)
    return found


def _models_in_order(schema: dict) -> list[tuple[str, str]]:
    """(model, where it sits in a spec) for the root and every object model it reaches, breadth first."""
    defs = schema.get("$defs", {})
    order: list[tuple[str, str]] = [(schema["title"], "")]
    seen = {schema["title"]}
    queue: list[tuple[dict, str]] = [(schema, "")]
    while queue:
        model, prefix = queue.pop(0)
        for field, sub in model.get("properties", {}).items():
            for name, suffix in _refs(sub):
                target = defs[name]
                if name in seen or "properties" not in target:
                    continue
                seen.add(name)
                where = f"{prefix}{field}{suffix}"
                order.append((name, where))
                queue.append((target, f"{where}."))
    return order


def _refs(schema: dict) -> list[tuple[str, str]]:
    """The models a field refers to, with `[]` for list items and the sink type for a tagged union member."""
    name = _ref_name(schema)
    if name is not None:
        return [(name, "")]
    found = []
    for union in ("anyOf", "oneOf"):
        for option in schema.get(union, []):
            found.extend(_refs(option))
    if schema.get("type") == "array":
        found.extend((name, f"[]{suffix}") for name, suffix in _refs(schema.get("items", {})))
    values = schema.get("additionalProperties")
    if schema.get("type") == "object" and isinstance(values, dict):
        found.extend((name, f".<name>{suffix}") for name, suffix in _refs(values))
    return found


def _model_class(name: str) -> type | None:
    """The pydantic class of a schema model: in `config/`, or a format's in `formats/`."""
    from microbatch import config
    from microbatch.formats import json as json_format
    from microbatch.formats import registry

    for module in (config, json_format):
        cls = getattr(module, name, None)
        if isinstance(cls, type):
            return cls
    return next((fmt.spec_model for fmt in registry.FORMATS.values() if fmt.spec_model.__name__ == name), None)


def spec_reference() -> str:
    """Markdown tables of every model of the pipeline spec's JSON Schema."""
    from microbatch import config

    schema = config.PipelineSpec.model_json_schema()
    defs = schema.get("$defs", {})
    out = []
    for name, where in _models_in_order(schema):
        model = schema if name == schema["title"] else defs[name]
        cls = _model_class(name)
        # a field declared on a base class (every sink's `sql`) keeps the docstring written there
        docstrings = {k: v for base in reversed(cls.__mro__) for k, v in attribute_docstrings(base).items()} \
            if cls is not None else {}
        title = f"`{where}`: {name}" if where else f"{name} (the whole spec)"
        out.append(f'<a id="{_anchor(name)}"></a>\n\n### {title}\n')  # an anchor GitHub keeps too
        if model.get("description"):
            out.append(_text(inspect.cleandoc(model["description"])) + "\n")
        out.append("| field | type | default | description |\n|---|---|---|---|")
        required = set(model.get("required", []))
        for field, sub in model.get("properties", {}).items():
            description = sub.get("description") or docstrings.get(field, "") or _enum_description(sub, defs)
            default = _default(sub, field in required, defs, _built_default(cls, field))
            out.append(f"| `{field}` | {_cell(_type(sub, defs))} | {default} "
                       f"| {_cell(_text(description))} |")
        out.append("")
    return "\n".join(out)


# --- the CLI reference, from the Typer app ---------------------------------------------------------------


def _usage_piece(piece: str) -> str:
    match = re.fullmatch(r"([{\[])(\w+)([}\]])", piece)
    if match is None or piece == "[OPTIONS]":
        return piece
    name = match.group(2).upper()
    return name if match.group(1) == "{" else f"[{name}]"


def cli_reference() -> str:
    """One section per command of `microbatch`: its help, usage, arguments and options."""
    from typer.main import get_command

    from microbatch.cli import app

    root = get_command(app)  # Typer's own click command tree (Typer ships its click: no `import click`)
    root_ctx = root.context_class(root, info_name="microbatch")
    out = []
    for name in root.list_commands(root_ctx):  # type: ignore[attr-defined]
        command = root.get_command(root_ctx, name)  # type: ignore[attr-defined]
        ctx = command.context_class(command, info_name=name, parent=root_ctx)
        out.append(f'<a id="{name}"></a>\n\n## `microbatch {name}`\n')
        for paragraph in re.split(r"\n\s*\n", command.help or ""):
            out.append(_text(" ".join(paragraph.split())) + "\n")
        usage = " ".join(_usage_piece(piece) for piece in command.collect_usage_pieces(ctx))
        out.append(f"```console\n$ microbatch {name} {usage}\n```\n")
        rows = []
        for param in command.get_params(ctx):
            record = param.get_help_record(ctx)
            if record is None or "--help" in param.opts:
                continue
            names, help_text = record
            kind = "argument" if param.param_type_name == "argument" else "option"
            rows.append(f"| `{names}` | {kind} | {_cell(_text(help_text))} |")
        if rows:
            out.append("| name | kind | help |\n|---|---|---|\n" + "\n".join(rows) + "\n")
    return "\n".join(out)


if __name__ == "__main__":
    main()
