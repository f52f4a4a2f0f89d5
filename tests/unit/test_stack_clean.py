"""`make clean` (`python -m microbatch.dev.stack clean`) removes the local stack's data and the lake tables of the
ledger it removes, the default warehouse, and says in one line what it leaves (issue 58). On a cache folder of the
test's own (MICROBATCH_CACHE_DIR)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from microbatch.dev import postgres_root, stack

STACK_LEDGER = "postgresql://microbatch:pw@127.0.0.1:5433/microbatch"


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A cache folder as the stack leaves it after `down`: its state (with the ledger's URL) and PostgreSQL data,
    Airflow's home, a Delta and an Iceberg table in the default warehouse."""
    root = tmp_path / "cache"
    for folder in ("devstack/postgres", "airflow", "warehouse/clicks_lake/_delta_log", "warehouse/orders/metadata"):
        (root / folder).mkdir(parents=True)
    (root / "devstack" / "state.json").write_text(json.dumps({"env": {"MICROBATCH_LEDGER_URL": STACK_LEDGER}}))
    (root / "jars").mkdir()
    monkeypatch.setenv("MICROBATCH_CACHE_DIR", str(root))
    # As root, clean also prunes the moved PostgreSQL data of checkouts that are gone (dev/postgres_root.py): the
    # machine's, not this test's; an empty folder of its own here.
    monkeypatch.setattr(postgres_root, "SHARED_ROOT", tmp_path / "postgres-shared")
    for name in ("MICROBATCH_WAREHOUSE", "MICROBATCH_LEDGER_URL"):
        monkeypatch.delenv(name, raising=False)
    return root


def test_clean_removes_the_stack_its_ledger_and_the_default_warehouse(cache, capsys, monkeypatch) -> None:
    stack.clean()
    assert sorted(p.name for p in cache.iterdir()) == ["jars"]  # the downloads stay
    out = capsys.readouterr().out
    assert out == f"removed {cache / 'devstack'}, {cache / 'airflow'}, {cache / 'warehouse'}\n"

    # The stack's own ledger named (its env.sh sourced): its tables go too.
    (cache / "devstack").mkdir()
    (cache / "devstack" / "state.json").write_text(json.dumps({"env": {"MICROBATCH_LEDGER_URL": STACK_LEDGER}}))
    (cache / "warehouse").mkdir()
    monkeypatch.setenv("MICROBATCH_LEDGER_URL", STACK_LEDGER)
    stack.clean()
    assert sorted(p.name for p in cache.iterdir()) == ["jars"]
    assert capsys.readouterr().out == f"removed {cache / 'devstack'}, {cache / 'warehouse'}\n"


def test_clean_says_what_it_leaves(cache, tmp_path, capsys, monkeypatch) -> None:
    elsewhere = tmp_path / "lake"
    (elsewhere / "clicks_lake").mkdir(parents=True)
    monkeypatch.setenv("MICROBATCH_WAREHOUSE", str(elsewhere))
    stack.clean()
    assert not (cache / "warehouse").exists() and (elsewhere / "clicks_lake").exists()
    lines = capsys.readouterr().out.splitlines()
    assert lines[1:] == [f"left the lake tables in {elsewhere} (MICROBATCH_WAREHOUSE): remove them yourself once no "
                         "ledger you keep records their batches"]

    # A ledger that is not the stack's: the default warehouse may hold its tables, and stays.
    monkeypatch.delenv("MICROBATCH_WAREHOUSE")
    monkeypatch.setenv("MICROBATCH_LEDGER_URL", "postgresql://u:p@db.example:5432/ledger")
    (cache / "warehouse" / "orders").mkdir(parents=True)
    stack.clean()
    assert (cache / "warehouse" / "orders").exists()
    assert capsys.readouterr().out.splitlines() == [
        "nothing to remove",
        f"left the lake tables in {cache / 'warehouse'}: MICROBATCH_LEDGER_URL names a ledger that `make clean` does "
        "not remove (it is not the local stack's)"]
