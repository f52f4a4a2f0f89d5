"""Finding, reading and passing on specs: the spec files, their loader and its one-sentence errors, and the
command-line token of a spec."""

from __future__ import annotations

import base64
import os
from pathlib import Path

import yaml
from pydantic import ValidationError

from microbatch.config.pipeline import PipelineSpec
from microbatch.config.sinks import SINK_TAGS
from microbatch.errors import SpecError

PIPELINES_DIR = Path(__file__).resolve().parent.parent.parent / "pipelines"
PIPELINES_DIR_ENV = "MICROBATCH_PIPELINES_DIR"


def _describe(error: ValidationError, path: Path) -> str:
    first = error.errors()[0]
    field = ".".join(str(part) for part in first["loc"] if part not in SINK_TAGS) or "(top level)"
    message = first["msg"].removeprefix("Value error, ")
    if first["type"] == "extra_forbidden":
        message = "is not a known setting; remove it or fix its spelling"
    elif first["type"] == "missing":
        message = "is required; add it"
    return f"{path.name}: field '{field}' {message}."


def load_spec(path: Path) -> PipelineSpec:
    """Read and validate one spec file; raise `SpecError` naming the file and the field."""
    try:
        raw = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise SpecError(f"{path}: cannot read the spec ({exc.strerror}).") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark else ""
        raise SpecError(f"{path.name}: the YAML is malformed{where}.", fix="Fix the syntax.") from None
    if not isinstance(raw, dict):
        raise SpecError(f"{path.name}: a spec must be a YAML mapping of settings.")
    try:
        spec = PipelineSpec.model_validate(raw)
    except ValidationError as exc:
        raise SpecError(_describe(exc, path)) from None
    if spec.name != path.stem:
        raise SpecError(f"{path.name}: field 'name' is '{spec.name}' but must equal the file name '{path.stem}'.")
    return spec


def pipelines_dir() -> Path:
    """Where specs live: `MICROBATCH_PIPELINES_DIR`, else `include/pipelines`."""
    return Path(os.environ.get(PIPELINES_DIR_ENV) or PIPELINES_DIR)


def spec_paths(directory: Path | None = None) -> list[Path]:
    """The spec files of a directory, sorted, without reading them."""
    return sorted((directory or pipelines_dir()).glob("*.yaml"))


def encode_spec(spec: PipelineSpec) -> str:
    """The validated spec as one command-line-safe token (base64url of its JSON), for a stage driver that
    may run where the spec files are not: inside the `--py-files` zip, or on another machine. A spec holds
    no secrets (connections are ids), so it may be seen in `ps`."""
    return base64.urlsafe_b64encode(spec.model_dump_json().encode()).decode()


def decode_spec(token: str) -> PipelineSpec:
    """The spec that `encode_spec` packed, validated again."""
    try:
        return PipelineSpec.model_validate_json(base64.urlsafe_b64decode(token.encode()))
    except (ValueError, ValidationError) as exc:
        raise SpecError(f"The --spec argument is not an encoded pipeline spec ({type(exc).__name__}).",
                        fix="Let the stage task pass it, or use --pipeline alone to read the spec file.") from None


def find_spec(name: str, directory: Path | None = None) -> PipelineSpec:
    """Load the spec of the pipeline called `name`."""
    directory = directory or pipelines_dir()
    path = directory / f"{name}.yaml"
    if not path.exists():
        known = ", ".join(p.stem for p in spec_paths(directory)) or "none"
        raise SpecError(f"There is no pipeline '{name}' in {directory}.", fix=f"Known pipelines: {known}.")
    return load_spec(path)
