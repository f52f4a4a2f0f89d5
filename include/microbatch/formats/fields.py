"""The names a format's declared fields may take as a job's columns, checked the same way for every format that
declares its fields (`json`, `avro`): a column name Spark and Postgres both take, no record column's name, no two
names that differ only in case.
"""

from __future__ import annotations

import re

from microbatch.transform import HEADERS_COLUMN, RECORD_COLUMNS

RESERVED_NAMES = (*RECORD_COLUMNS, HEADERS_COLUMN)
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")


def check_field_names(types: dict[str, str], kind: str) -> None:
    """Refuse (ValueError, one sentence) a declared column name that is not a name, is a record column's, or
    differs from another only in case; `types` maps each declared name to its type, `kind` names the payload
    ("JSON", "Avro") in the suggestion to read the field under another name with `from`."""
    if not types:
        raise ValueError("declare at least one field as `name: spark_sql_type`, e.g. `payment_id: string`")
    seen: dict[str, str] = {}
    for name, kind_of in types.items():
        if not _NAME.fullmatch(name):
            raise ValueError(f"'{name}' is not a column name (letters, digits and _, not starting with a digit, "
                             f"at most 63); name the column so and read the {kind} name with `from`, e.g. "
                             f"`{_suggest(name)}: {{type: {kind_of}, from: \"{name}\"}}`")
        if name.lower() in RESERVED_NAMES:
            raise ValueError(f"'{name}' is the name of a record column; rename the decoded column and read the "
                             f"{kind} field with `from`, e.g. `payload_{name.lower()}: {{type: {kind_of}, "
                             f"from: {name}}}`")
        if name.lower() in seen:
            raise ValueError(f"'{seen[name.lower()]}' and '{name}' differ only in case, which Spark's column "
                             "names do not tell apart; rename one and read its name with `from`")
        seen[name.lower()] = name


def _suggest(name: str) -> str:
    cleaned = re.sub(r"[^A-Za-z0-9_]+", "_", name).strip("_") or "field"
    return f"_{cleaned}" if cleaned[0].isdigit() else cleaned
