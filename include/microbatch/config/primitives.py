"""The spec's building blocks: the strict base model, SQL identifiers and durations."""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict

_IDENTIFIER = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")
_DURATION = re.compile(r"^(\d+)\s*(s|m|h|d)$")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _check_identifier(value: str) -> str:
    if not _IDENTIFIER.fullmatch(value):
        raise ValueError(f"'{value}' must be a lower-case SQL identifier (letters, digits, underscore)")
    return value


def _duration_seconds(value: str | int | float) -> float:
    """Seconds of `5s`, `1m`, `2h`, `1d` (or a number of seconds)."""
    if isinstance(value, int | float):
        return float(value)
    match = _DURATION.fullmatch(str(value).strip())
    if not match:
        raise ValueError(f"'{value}' is not a duration; write e.g. 5s, 1m or 2h")
    return float(int(match.group(1)) * {"s": 1, "m": 60, "h": 3600, "d": 86400}[match.group(2)])
