"""mkdocs hooks: the pages generated from the code at every build, so they cannot go stale.

- `<!-- generated: spec-reference -->` becomes the pipeline spec reference: one table per model of
  `PipelineSpec.model_json_schema()` (what `microbatch schema` prints), with field, type, default and
  description. A field without a description in the schema takes its attribute docstring in `config.py`.
- `<!-- generated: cli-reference -->` becomes the CLI reference: every command of the Typer app, read from
  its click command tree (usage, arguments and options with their help, defaults and bounds).

Nothing generated is written into docs/: the markers are replaced in memory, on the way to HTML.
"""

from __future__ import annotations

import ast
import html
import inspect
import itertools
import json
import re
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
for path in (ROOT, ROOT / "include"):  # `mkdocs serve` without PYTHONPATH finds the package too
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

SPEC_MARKER = "<!-- generated: spec-reference -->"
CLI_MARKER = "<!-- generated: cli-reference -->"


def on_page_markdown(markdown: str, **_: Any) -> str:
    """Replace each marker of a page by the reference it names."""
    if SPEC_MARKER in markdown:
        markdown = markdown.replace(SPEC_MARKER, spec_reference())
    if CLI_MARKER in markdown:
        markdown = markdown.replace(CLI_MARKER, cli_reference())
    return markdown


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


def _default(field: dict, required: bool, defs: dict) -> str:
    if required:
        return "**required**"
    if "default" in field:
        return _literal(field["default"])
    # pydantic leaves a default_factory out of the schema: say what the factory builds
    if _ref_name(field) is not None and "properties" in defs[_ref_name(field)]:
        return "its own defaults"
    return {"array": "`[]`", "object": "`{}`"}.get(field.get("type", ""), "")


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
    """The pydantic class of a schema model: in `config.py`, or a format's in `formats/`."""
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
        docstrings = attribute_docstrings(cls) if cls is not None else {}
        title = f"`{where}`: {name}" if where else f"{name} (the whole spec)"
        out.append(f"### {title} {{#{_anchor(name)}}}\n")
        if model.get("description"):
            out.append(_text(inspect.cleandoc(model["description"])) + "\n")
        out.append("| field | type | default | description |\n|---|---|---|---|")
        required = set(model.get("required", []))
        for field, sub in model.get("properties", {}).items():
            description = sub.get("description") or docstrings.get(field, "") or _enum_description(sub, defs)
            out.append(f"| `{field}` | {_cell(_type(sub, defs))} | {_default(sub, field in required, defs)} "
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
        out.append(f"## `microbatch {name}` {{#{name}}}\n")
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
