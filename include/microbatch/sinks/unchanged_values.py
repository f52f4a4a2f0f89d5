"""A change stream's unchanged values (`postgres_upsert` with `unavailable_value`): the placeholder Debezium writes
for a TOASTed column that an update did not change, replaced by the value it stands for before the batch is merged.

The batch's changes are walked in the source's log order (`order_by`, a delete before a create of the same
position, then the coordinates). Each key's state is what the table holds for it before the batch, then each change
of the batch in turn; a placeholder takes the key's current value. A create with a placeholder whose key has no value
(deleted, or never seen) is the second half of a primary-key change when a delete of another key has the same
position (Debezium writes an UPDATE of the key as a delete of the old key and a create of the new one, both at the
update's LSN, and the create carries the placeholder for what the update left alone): it takes the old key's values,
from the batch, or from the delete's version when an earlier batch committed it. For that, a delete keeps the values
its key had (its row is a delete all the same: its `delete_column` says so). Otherwise the placeholder stays, and the
key is held until a change with the full value arrives (`postgres_upsert._filled`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

Key = tuple[Any, ...]
Coordinates = tuple[str, int, int]


@dataclass(frozen=True)
class StagedChange:
    """One staged record: its key, its position (`order`, the `order_by` value), whether it deletes its key, the
    values of the columns that may hold the placeholder, and its source coordinates."""

    key: Key
    order: Any
    deleted: bool
    values: Mapping[str, Any]
    coordinates: Coordinates


def resolve(changes: Sequence[StagedChange], stored: Callable[[Key], Mapping[str, Any] | None],
            deleted_at: Callable[[Any], Mapping[str, Any] | None], placeholder: str
            ) -> dict[Coordinates, dict[str, Any]]:
    """The values to write into the staged changes, by their coordinates (only the columns that change): a
    placeholder's value, and a delete's key's values. `stored(key)`: the key's values in the table before the batch,
    None when it has no row; `deleted_at(order)`: the values a delete of an earlier batch at that position kept."""
    state: dict[Key, dict[str, Any] | None] = {}
    before_delete: dict[Any, dict[str, Any]] = {}  # a delete's position -> the values its key had
    out: dict[Coordinates, dict[str, Any]] = {}

    def current(key: Key) -> dict[str, Any] | None:
        if key not in state:
            row = stored(key)
            state[key] = dict(row) if row is not None else None
        return state[key]

    ordered = sorted(changes, key=lambda c: (c.order is not None, c.order, not c.deleted, c.coordinates))
    for change in ordered:
        values = current(change.key)
        if change.deleted:
            if values is not None:
                if change.order is not None:
                    before_delete[change.order] = values
                kept = {c: v for c, v in values.items() if v != change.values.get(c)}
                if kept:
                    out[change.coordinates] = kept
            state[change.key] = None
            continue
        source = values
        if source is None and change.order is not None and placeholder in change.values.values():
            source = before_delete.get(change.order) or deleted_at(change.order)
        filled = dict(change.values)
        for column, value in change.values.items():
            if value == placeholder and source is not None and source.get(column) != placeholder:
                filled[column] = source[column]
        replaced = {c: v for c, v in filled.items() if v != change.values[c]}
        if replaced:
            out[change.coordinates] = replaced
        state[change.key] = filled
    return out
