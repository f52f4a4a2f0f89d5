"""The Spark SQL type names a declared field may have, parsed without Spark (a spec loads where no JVM runs).

The subset is what a JSON or Avro value can hold: the atomic types (`binary` for Avro's bytes and fixed only),
`decimal(p,s)`, `array<T>`, `map<string,T>`, `struct<name: T, ...>` and `variant` (the JSON subtree as it is).
`str(SqlType)` is Spark's own spelling of the type, which `try_variant_get` and a DDL schema accept.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

ATOMIC = {
    "string": "string", "boolean": "boolean", "tinyint": "tinyint", "byte": "tinyint", "smallint": "smallint",
    "short": "smallint", "int": "int", "integer": "int", "bigint": "bigint", "long": "bigint", "float": "float",
    "real": "float", "double": "double", "date": "date", "timestamp": "timestamp", "timestamp_ltz": "timestamp",
    "timestamp_ntz": "timestamp_ntz", "variant": "variant", "binary": "binary",
}
"""Spark's names and aliases of the atomic types, each to its canonical name."""
INTEGERS = frozenset({"tinyint", "smallint", "int", "bigint"})
KNOWN_TYPES = ("string, boolean, tinyint, smallint, int, bigint, float, double, decimal(p,s), date, timestamp, "
               "timestamp_ntz, variant, binary, array<T>, map<string,T> or struct<name: T, ...>")
_TOKEN = re.compile(r"\s*([A-Za-z_][A-Za-z0-9_]*|\d+|[<>(),:])")


@dataclass(frozen=True)
class SqlType:
    """A parsed type: `name` is an atomic type's canonical name, `decimal`, `array`, `map` or `struct`."""

    name: str
    precision: int = 0
    scale: int = 0
    element: SqlType | None = None
    """array: the element type; map: the value type (keys are strings)."""
    fields: tuple[tuple[str, SqlType], ...] = ()

    def __str__(self) -> str:
        if self.name == "decimal":
            return f"decimal({self.precision},{self.scale})"
        if self.name == "array":
            return f"array<{self.element}>"
        if self.name == "map":
            return f"map<string,{self.element}>"
        if self.name == "struct":
            return "struct<" + ",".join(f"{name}:{kind}" for name, kind in self.fields) + ">"
        return self.name

    @property
    def article(self) -> str:
        """'a' or 'an', for a reason such as "is not an int"."""
        return "an" if str(self)[0] in "aeiou" else "a"


def parse_type(text: str) -> SqlType:
    """The type that `text` names; ValueError with one sentence if it names none of `KNOWN_TYPES`."""
    tokens = _tokens(text)
    parsed, rest = _parse(tokens)
    if rest:
        raise ValueError(f"'{text}' has '{''.join(rest)}' after a complete type")
    return parsed


def _tokens(text: str) -> list[str]:
    tokens, position = [], 0
    while position < len(text.rstrip()):
        match = _TOKEN.match(text, position)
        if match is None:
            raise ValueError(f"'{text}' is not a Spark SQL type name")
        tokens.append(match.group(1))
        position = match.end()
    return tokens


def _expect(tokens: list[str], token: str) -> list[str]:
    if not tokens or tokens[0] != token:
        raise ValueError(f"expected '{token}' but found '{tokens[0] if tokens else 'the end'}'")
    return tokens[1:]


def _parse(tokens: list[str]) -> tuple[SqlType, list[str]]:
    if not tokens:
        raise ValueError("a type name is missing")
    word, rest = tokens[0].lower(), tokens[1:]
    if word in ATOMIC:
        return SqlType(ATOMIC[word]), rest
    if word in ("decimal", "dec", "numeric"):
        return _decimal(rest)
    if word == "array":
        element, rest = _parse(_expect(rest, "<"))
        return SqlType("array", element=element), _expect(rest, ">")
    if word == "map":
        key, rest = _parse(_expect(rest, "<"))
        if key.name != "string":
            raise ValueError(f"a JSON object's keys are strings, so write map<string, T>, not map<{key}, ...>")
        value, rest = _parse(_expect(rest, ","))
        return SqlType("map", element=value), _expect(rest, ">")
    if word == "struct":
        return _struct(_expect(rest, "<"))
    raise ValueError(f"'{tokens[0]}' is not a Spark SQL type this format reads")


def _decimal(rest: list[str]) -> tuple[SqlType, list[str]]:
    precision, scale = 10, 0
    if rest and rest[0] == "(":
        precision, rest = int(rest[1]) if rest[1:2] and rest[1].isdigit() else -1, rest[2:]
        if rest and rest[0] == ",":
            scale, rest = int(rest[1]) if rest[1:2] and rest[1].isdigit() else -1, rest[2:]
        rest = _expect(rest, ")")
    if not (1 <= precision <= 38 and 0 <= scale <= precision):
        raise ValueError("decimal(p,s) needs 1 <= p <= 38 and 0 <= s <= p")
    return SqlType("decimal", precision=precision, scale=scale), rest


def _struct(rest: list[str]) -> tuple[SqlType, list[str]]:
    fields: list[tuple[str, SqlType]] = []
    while rest and rest[0] != ">":
        if fields:
            rest = _expect(rest, ",")
        name, rest = rest[0] if rest else "", rest[1:]
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
            raise ValueError(f"a struct's field name must be a name, not '{name}'")
        kind, rest = _parse(_expect(rest, ":"))
        fields.append((name, kind))
    if not fields:
        raise ValueError("a struct needs at least one field: struct<name: T, ...>")
    return SqlType("struct", fields=tuple(fields)), _expect(rest, ">")
