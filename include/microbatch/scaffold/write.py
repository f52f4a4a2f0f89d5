"""Writing a new pipeline's files (`microbatch new`): a Python pipeline's four files, or a pipeline inferred from a
sample of a topic's records (its spec, unit test and DAG file; no transform, the sink's `sql` is the job). Either
refuses a bad or existing name before it writes any file."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from pathlib import Path

from microbatch.errors import SpecError
from microbatch.scaffold.from_topic import Inference, infer_pipeline
from microbatch.scaffold.naming import ROOT, check_new_name
from microbatch.scaffold.templates import (
    DEFAULT_JSON_COLUMNS,
    STARTERS,
    dag_file,
    sampled_test_file,
    spec_file,
    transform_file,
    unit_test_file,
)
from microbatch.scaffold.yaml_spec import spec_yaml

FORMATS = tuple(STARTERS)
"""The formats `microbatch new --format` takes."""
SAMPLED_FILES = ("spec", "test", "dag")
"""What `new --from-topic` writes: no transform, the sink's `sql` is the job."""


def new_pipeline(name: str, topic: str, fmt: str, columns: dict[str, str] | None = None,
                 root: Path = ROOT) -> dict[str, Path]:
    """Write the four files; refuse a bad or existing name before writing any."""
    if fmt not in FORMATS:
        check_new_name(name, root)
        raise SpecError(f"'{fmt}' is not a format.", fix="Use --format json or --format text.")
    targets = check_new_name(name, root)
    columns = dict(STARTERS[fmt].columns or columns or DEFAULT_JSON_COLUMNS)
    texts = {"spec": spec_file(name, topic, fmt, columns), "transform": transform_file(name, topic, fmt, columns),
             "test": unit_test_file(name, fmt, columns), "dag": dag_file(name)}
    _write(targets, texts)
    return targets


def new_pipeline_from_sample(name: str, topic: str, keys: list[bytes | None], values: list[bytes | None],
                             root: Path = ROOT, avro_schema: Callable[[str], str | None] | None = None,
                             now: datetime | None = None) -> tuple[dict[str, Path], Inference]:
    """Write the spec, its unit test and the DAG file of the pipeline inferred from the sampled keys and values;
    refuse a bad or existing name before writing any."""
    targets = check_new_name(name, root, SAMPLED_FILES)
    inference = infer_pipeline(name, topic, keys, values, avro_schema, now)
    texts = {"spec": spec_yaml(inference, topic), "test": sampled_test_file(inference), "dag": dag_file(name)}
    _write(targets, texts)
    return targets, inference


def _write(targets: dict[str, Path], texts: dict[str, str]) -> None:
    for kind, path in targets.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(texts[kind])
