"""The JSON type lattice of `microbatch new --from-topic`: the one Spark SQL type of a field's sampled JSON values
(`observe` one value, `merge` two types), and whether a field's values are epoch times near now (`epoch_unit`)."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from microbatch.formats.inference import IDENTIFIER

_DATE = r"\d{4}-\d{2}-\d{2}"
_TIME = _DATE + r"[T ]\d{2}:\d{2}:\d{2}(?:\.\d{1,6})?"
_ZONED = re.compile(_TIME + r"(?:Z|[+-]\d{2}:\d{2})")
_NAIVE = re.compile(_TIME)
_DAY = re.compile(_DATE)
_BIGINT = (-(2**63), 2**63 - 1)
_TEMPORAL = ("date", "timestamp_ntz", "timestamp")
_NUMERIC = ("bigint", "decimal(38,0)", "double")
EPOCH_SINCE = datetime(2000, 1, 1, tzinfo=UTC)
EPOCH_AHEAD = timedelta(days=366)
"""The times an epoch number is taken for: from EPOCH_SINCE to a year after now (in any of the units)."""
_EPOCH_SCALES = {"s": 1, "ms": 1_000, "us": 1_000_000}
_EPOCH_NAMES = {"s": "seconds", "ms": "milliseconds", "us": "microseconds"}
_DIGITS = re.compile(r"[1-9][0-9]{0,18}")


@dataclass(frozen=True)
class JsonType:
    """What the sampled values of one JSON field were: `kind` is null (only nulls seen), boolean, bigint,
    decimal(38,0), double, string, date, timestamp_ntz, timestamp, array (`element`), struct (`fields`, in order of
    first sight), map (`element`: an object whose names are not identifiers) or variant (kinds that do not mix)."""

    kind: str
    element: JsonType | None = None
    fields: tuple[tuple[str, JsonType], ...] = ()

    @property
    def spark(self) -> str:
        """The Spark SQL type the json format declares for it (a field only ever null is declared a string)."""
        if self.kind == "null":
            return "string"
        if self.kind in ("array", "map"):
            assert self.element is not None
            return f"array<{self.element.spark}>" if self.kind == "array" else f"map<string,{self.element.spark}>"
        if self.kind == "struct":
            return "struct<" + ", ".join(f"{name}: {kind.spark}" for name, kind in self.fields) + ">"
        return self.kind


NULL = JsonType("null")


def observe(value: object) -> JsonType:
    """The type of one parsed JSON value."""
    if isinstance(value, list):
        return JsonType("array", element=merged(observe(item) for item in value))
    if isinstance(value, dict):
        fields = tuple((name, observe(item)) for name, item in value.items())
        if _struct_names([name for name, _ in fields]):
            return JsonType("struct", fields=fields)
        return JsonType("map", element=merged(kind for _, kind in fields))
    return JsonType(_scalar_kind(value))


def _scalar_kind(value: object) -> str:
    if value is None:
        kind = "null"
    elif isinstance(value, bool):
        kind = "boolean"
    elif isinstance(value, int):
        kind = "bigint" if _BIGINT[0] <= value <= _BIGINT[1] else "decimal(38,0)" if len(str(abs(value))) <= 38 \
            else "double"
    elif isinstance(value, float):
        kind = "double"
    else:
        kind = _string_kind(str(value))
    return kind


def merged(kinds: Iterable[JsonType]) -> JsonType:
    """The one type of all `kinds` (null for none)."""
    result = NULL
    for kind in kinds:
        result = merge(result, kind)
    return result


def _string_kind(text: str) -> str:
    """An ISO-8601 time that Python and Spark both read: timestamp with an offset or Z, timestamp_ntz without one,
    date for a day alone; any other string is a string."""
    for pattern, kind in ((_ZONED, "timestamp"), (_NAIVE, "timestamp_ntz"), (_DAY, "date")):
        if pattern.fullmatch(text):
            try:
                datetime.fromisoformat(text)
            except ValueError:
                return "string"
            return kind
    return "string"


def _struct_names(names: list[str]) -> bool:
    """Whether an object's names can be a struct's fields: identifiers, not two of one spelling but for case."""
    return (bool(names) and all(IDENTIFIER.fullmatch(n) for n in names)
            and len({n.lower() for n in names}) == len(names))


def merge(a: JsonType, b: JsonType) -> JsonType:
    """The one type that holds the values of both: null gives way, numbers widen (bigint, decimal, double), times
    widen (date, timestamp_ntz, timestamp) and fall back to string, arrays and maps merge their elements, structs
    their fields (a struct and a map, or the names a map must have, make a map); anything else is a variant."""
    if a.kind == "null" or a == b:
        return b
    if b.kind == "null":
        return a
    kinds = {a.kind, b.kind}
    if kinds <= set(_NUMERIC):
        return JsonType(max(kinds, key=_NUMERIC.index))
    if kinds <= {"string", *_TEMPORAL}:
        return JsonType("string" if "string" in kinds else max(kinds, key=_TEMPORAL.index))
    return _merge_containers(a, b)


def _merge_containers(a: JsonType, b: JsonType) -> JsonType:
    kinds = {a.kind, b.kind}
    if kinds == {"array"}:
        assert a.element is not None and b.element is not None
        return JsonType("array", element=merge(a.element, b.element))
    if kinds == {"struct"}:
        fields = dict(a.fields)
        for name, kind in b.fields:
            fields[name] = merge(fields.get(name, NULL), kind)
        if _struct_names(list(fields)):
            return JsonType("struct", fields=tuple(fields.items()))
    if kinds <= {"struct", "map"}:
        return JsonType("map", element=merge(_values(a), _values(b)))
    return JsonType("variant")


def _values(kind: JsonType) -> JsonType:
    """The merged type of the values of an object (a map's element, or every field of a struct)."""
    if kind.kind == "map":
        assert kind.element is not None
        return kind.element
    return merged(field for _, field in kind.fields)


@dataclass(frozen=True)
class Epoch:
    """A field read as epoch times: its `unit` (s, ms or us) and what the sample held, for the summary."""

    unit: str
    seen: str

    @property
    def described(self) -> str:
        """`epoch milliseconds (13-digit integers near now)`."""
        return f"epoch {_EPOCH_NAMES[self.unit]} ({self.seen} near now)"


def epoch_unit(values: Iterable[object], now: datetime) -> Epoch | None:
    """The unit of epoch time every one of `values` (a field's non-null sampled values) is, read in it, a time from
    EPOCH_SINCE to a year after `now`: s (10 digits today), ms (13) or us (16); None when there is no value, or one
    is no integer or string of digits (without a leading zero), or they fall near now in no one unit."""
    numbers: list[int] = []
    kinds: set[str] = set()
    for value in values:
        if isinstance(value, int) and not isinstance(value, bool):
            numbers.append(value)
            kinds.add("integers")
        elif isinstance(value, str) and _DIGITS.fullmatch(value):
            numbers.append(int(value))
            kinds.add("strings of digits")
        else:
            return None
    if not numbers:
        return None
    moment = now if now.tzinfo is not None else now.replace(tzinfo=UTC)
    since, until = int(EPOCH_SINCE.timestamp()), int((moment + EPOCH_AHEAD).timestamp())
    for unit, scale in _EPOCH_SCALES.items():
        if all(since * scale <= n <= until * scale for n in numbers):
            digits = sorted({len(str(n)) for n in numbers})
            width = "- or ".join(str(d) for d in digits)  # 13, or 9- or 10 (seconds before 2001-09-09)
            return Epoch(unit, f"{width}-digit {' and '.join(sorted(kinds))}")
    return None
