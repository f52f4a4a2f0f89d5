"""`unchanged_values.resolve`, the pure walk that replaces a change stream's placeholders (issue 65)."""

from __future__ import annotations

from microbatch.sinks.unchanged_values import StagedChange, resolve

HOLD = "__debezium_unavailable_value"


def change(key: int, order: int, offset: int, body: str | None, *, deleted: bool = False, partition: int = 0
           ) -> StagedChange:
    return StagedChange((key,), order, deleted, {"body": body}, ("t", partition, offset))


def nothing(_: object) -> None:
    return None


def test_a_placeholder_takes_the_stored_value_then_the_batchs_latest() -> None:
    stored = {(1,): {"body": "stored"}}
    changes = [change(1, 20, 1, HOLD), change(1, 10, 0, HOLD), change(1, 30, 2, "new"), change(1, 40, 3, HOLD)]
    assert resolve(changes, stored.get, nothing, HOLD) == {
        ("t", 0, 0): {"body": "stored"}, ("t", 0, 1): {"body": "stored"}, ("t", 0, 3): {"body": "new"}}


def test_a_primary_key_change_carries_the_old_keys_value_whatever_the_partitions_order() -> None:
    # The create of key 2 sits at a lower offset of another partition than the delete of key 1: same position.
    changes = [change(2, 50, 0, HOLD, partition=1), change(1, 50, 7, None, deleted=True), change(1, 10, 6, "old")]
    assert resolve(changes, nothing, nothing, HOLD) == {
        ("t", 1, 0): {"body": "old"},  # the create takes the old key's value
        ("t", 0, 7): {"body": "old"},  # the delete keeps the value its key had, for a later batch's create
    }


def test_a_create_of_a_later_batch_finds_the_delete_an_earlier_batch_kept() -> None:
    kept = {50: {"body": "old"}}
    assert resolve([change(2, 50, 0, HOLD)], nothing, kept.get, HOLD) == {("t", 0, 0): {"body": "old"}}


def test_a_key_never_seen_whole_stays_held_and_a_delete_forgets_the_key() -> None:
    assert resolve([change(3, 5, 0, HOLD)], nothing, nothing, HOLD) == {}
    changes = [change(4, 1, 0, "v"), change(4, 2, 1, None, deleted=True), change(4, 3, 2, HOLD)]
    assert resolve(changes, nothing, nothing, HOLD) == {("t", 0, 1): {"body": "v"}}  # key 4 re-created: held
