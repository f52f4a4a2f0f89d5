"""Where the files of a new pipeline go, and the names it may take (`microbatch new NAME`): the pipeline's name,
the paths of its four files under the repository root, and the columns `--columns` declares."""

from __future__ import annotations

import re
from pathlib import Path

from microbatch.column_types import COLUMN_TYPES, TEXT
from microbatch.config import SOURCE_COORDINATES
from microbatch.errors import SpecError

ROOT = Path(__file__).resolve().parents[3]
_NAME = re.compile(r"^[a-z_][a-z0-9_]{0,40}$")


def parse_columns(text: str) -> dict[str, str]:
    """`"id:text,amount:bigint"` -> {"id": "text", "amount": "bigint"}; a bad entry is one sentence."""
    columns: dict[str, str] = {}
    for entry in filter(None, (part.strip() for part in text.split(","))):
        name, _, kind = entry.partition(":")
        name, kind = name.strip(), kind.strip() or TEXT
        if not _NAME.match(name) or name in SOURCE_COORDINATES:
            raise SpecError(f"'{name}' is not a column name a pipeline can declare.",
                            fix="Use lower-case letters, digits and _, and not topic, partition or offset.")
        if kind not in COLUMN_TYPES:
            raise SpecError(f"Column '{name}' has the type '{kind}', which a sink does not support.",
                            fix=f"Use one of: {', '.join(COLUMN_TYPES)}.")
        columns[name] = kind
    if not columns:
        raise SpecError("--columns declares no column.", fix="Give NAME:TYPE pairs, e.g. id:text,amount:bigint.")
    return columns


def paths(name: str, root: Path = ROOT) -> dict[str, Path]:
    """The four files of the pipeline `name` under `root`, by kind: spec, transform, test and dag."""
    return {"spec": root / "include" / "pipelines" / f"{name}.yaml", "transform": root / "spark_jobs" / f"{name}.py",
            "test": root / "tests" / "unit" / f"test_{name}.py", "dag": root / "dags" / f"{name}.py"}


def check_new_name(name: str, root: Path = ROOT, kinds: tuple[str, ...] = ("spec", "transform", "test", "dag"),
                   ) -> dict[str, Path]:
    """The paths a new pipeline `name` gets; SpecError for a bad name or one whose files exist."""
    if not _NAME.match(name):
        raise SpecError(f"'{name}' is not a pipeline name.", fix="Use lower-case letters, digits and _ "
                        "(at most 41 characters), starting with a letter.")
    targets = paths(name, root)
    existing = [p for p in targets.values() if p.exists()]
    if existing:
        raise SpecError(f"A pipeline '{name}' exists already ({existing[0].relative_to(root)}).",
                        fix="Choose another name, or edit the existing files.")
    return {kind: path for kind, path in targets.items() if kind in kinds}
