"""The tutorial, docs/your-own-pipeline.md, as written: every ```bash block of the page runs, in order, with
bash -e, in a fresh copy of the repository (its tracked files, `.venv` linked to this checkout's). The test
session's Kafka and PostgreSQL stand in for the stack `make demo` leaves running: the environment holds their
addresses and `.cache/devstack/env.sh` exports them, as the stack's does, its `.cache/jars/kafka` is the broker's
jars (the page creates its topic with Kafka's own kafka-topics.sh class from them), and the copy's Airflow home
(`.cache/airflow`) holds a migrated metadata DB, as `make demo` leaves it (the fresh home's `airflow db migrate` is
the demo test's). The page is YAML-first: `new --from-topic`
writes the `orders` pipeline from the topic, its table then holds exactly the orders the page produced (its bad
record a dead letter), the aggregate by SQL added later and filled by a replay holds the amount per minute of event
time, and the Python pipeline `orders_py` of the second half lands the same orders."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest
from sqlalchemy import text

from microbatch.ledger.database import transaction
from microbatch.runtime import ensure_jars
from tests.e2e.helpers import migrated_airflow_home
from tests.e2e.test_demo_e2e import VENV, _fresh_copy, _user_env

pytestmark = pytest.mark.e2e
ROOT = Path(__file__).resolve().parents[2]
BLOCK = re.compile(r"^```bash\n(.*?)^```", re.DOTALL | re.MULTILINE)


def test_the_tutorial_runs_as_written(service_env, ledger_url, tmp_path: Path) -> None:
    blocks = BLOCK.findall((ROOT / "docs" / "your-own-pipeline.md").read_text())
    assert len(blocks) >= 5 and "microbatch new orders --from-topic orders" in blocks[1]
    assert "microbatch.dev" not in blocks[0] and "--create --if-not-exists --topic orders" in blocks[0]  # issue 64
    copy = _fresh_copy(tmp_path / "repo")
    (copy / ".venv").symlink_to(VENV)
    devstack = copy / ".cache" / "devstack"
    devstack.mkdir(parents=True)
    (devstack / "env.sh").write_text("".join(f"export {k}='{v}'\n" for k, v in service_env.items()))
    migrated_airflow_home(copy / ".cache" / "airflow")  # the home `make demo` migrated (localenv's AIRFLOW_HOME)
    (copy / ".cache" / "jars").mkdir()  # the broker's jars `make demo` fetched: the page's kafka-topics.sh class
    (copy / ".cache" / "jars" / "kafka").symlink_to(ensure_jars("kafka"), target_is_directory=True)
    env = {**_user_env(copy), **service_env, "PYTHONPATH": f"{copy / 'include'}{os.pathsep}{copy}"}

    outputs = []
    for number, block in enumerate(blocks, 1):
        done = subprocess.run(["bash", "-e", "-c", block], cwd=copy, env=env, capture_output=True, text=True,
                              timeout=900, check=False)
        outputs.append(done.stdout + done.stderr)
        assert done.returncode == 0, f"block {number}:\n{block}\n{outputs[-1][-4000:]}"

    landed = " ".join(outputs[2].split())
    assert "orders (postgres_append): 100 rows; 1 dead letters" in landed, outputs[2][-3000:]
    with transaction(ledger_url) as session:
        rows = session.execute(text("SELECT id, amount, ts FROM orders")).all()
        assert sorted((i, a) for i, a, _ in rows) == sorted((f"o{i}", i) for i in range(100))
        starts = sorted({ts.replace(second=0) for *_, ts in rows})
        per_minute = session.execute(text(
            "SELECT window_start, orders, amount FROM orders_per_minute ORDER BY window_start")).all()
        assert [(w, n) for w, n, _ in per_minute] == [(w, 20) for w in starts]  # an order every 3 s
        assert sum(a for *_, a in per_minute) == sum(range(100))
        assert sorted(session.execute(text("SELECT id, amount FROM orders_py")).all()) == \
            sorted((f"o{i}", i) for i in range(100))
        assert session.execute(text(
            "SELECT p.name, count(*) FROM dead_letters d JOIN pipelines p ON p.id = d.pipeline_id "
            "GROUP BY p.name ORDER BY 1")).all() == [("orders", 1), ("orders_py", 1)]
