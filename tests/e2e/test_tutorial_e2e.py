"""The tutorial, docs/your-own-pipeline.md, as written: every ```bash block of the page runs, in order, with
bash -e, in a fresh copy of the repository (its tracked files, `.venv` linked to this checkout's). The test
session's Kafka and PostgreSQL stand in for the stack `make demo` leaves running: the environment holds their
addresses and `.cache/devstack/env.sh` exports them, as the stack's does. The `orders` table then holds
exactly the orders the page produced, and its bad record is a dead letter."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest
from sqlalchemy import text

from microbatch.ledger.database import transaction
from tests.e2e.test_demo_e2e import VENV, _fresh_copy, _user_env

pytestmark = pytest.mark.e2e
ROOT = Path(__file__).resolve().parents[2]
BLOCK = re.compile(r"^```bash\n(.*?)^```", re.DOTALL | re.MULTILINE)


def test_the_tutorial_runs_as_written(service_env, ledger_url, tmp_path: Path) -> None:
    blocks = BLOCK.findall((ROOT / "docs" / "your-own-pipeline.md").read_text())
    assert len(blocks) >= 3 and "microbatch new orders" in blocks[0]
    copy = _fresh_copy(tmp_path / "repo")
    (copy / ".venv").symlink_to(VENV)
    devstack = copy / ".cache" / "devstack"
    devstack.mkdir(parents=True)
    (devstack / "env.sh").write_text("".join(f"export {k}='{v}'\n" for k, v in service_env.items()))
    env = {**_user_env(copy), **service_env, "PYTHONPATH": f"{copy / 'include'}{os.pathsep}{copy}"}

    outputs = []
    for number, block in enumerate(blocks, 1):
        done = subprocess.run(["bash", "-e", "-c", block], cwd=copy, env=env, capture_output=True, text=True,
                              timeout=900, check=False)
        outputs.append(done.stdout + done.stderr)
        assert done.returncode == 0, f"block {number}:\n{block}\n{outputs[-1][-4000:]}"

    shown = " ".join(outputs[-1].split())
    assert "orders (postgres_append): 100 rows; 1 dead letters" in shown, outputs[-1][-3000:]
    with transaction(ledger_url) as session:
        rows = session.execute(text("SELECT id, amount FROM orders")).all()
        assert sorted(rows) == sorted((f"o{i}", i) for i in range(100))
        assert session.execute(text("SELECT count(*) FROM dead_letters")).scalar_one() == 1
