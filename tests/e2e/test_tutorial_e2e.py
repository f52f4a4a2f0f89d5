"""The tutorial, docs/your-own-pipeline.md, as written: every ```bash block of the page runs, in order, with
bash -e, in a fresh copy of the repository (its tracked files, `.venv` linked to this checkout's). The test
session's Kafka and PostgreSQL stand in for the stack `make demo` leaves running: the environment holds their
addresses and `.cache/devstack/env.sh` exports them, as the stack's does, its `.cache/jars/kafka` is the broker's
jars (the page creates its topic with Kafka's own kafka-topics.sh class from them), and the copy's Airflow home
(`.cache/airflow`) holds a migrated metadata DB, as `make demo` leaves it (the fresh home's `airflow db migrate` is
the demo test's). The page is YAML-first: `new --from-topic`
writes the `orders` pipeline from the topic, its table then holds exactly the orders the page produced (its bad
record a dead letter), the aggregate by SQL added later and filled by a replay holds the amount per minute of event
time, the Avro pipeline `orders_avro` of section 5, which `new --from-topic` writes from a registry's schema, lands
them from Avro in the Confluent wire format (a registry of the test's own, started beside the first blocks, stands in
for `make registry`: env.sh exports its URL, as the stack's does), and the Python pipeline `orders_py` of the second
half lands the same orders."""

from __future__ import annotations

import os
import re
import subprocess
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from sqlalchemy import text

from microbatch.dev.registry import SchemaRegistry
from microbatch.ledger.database import transaction
from microbatch.runtime import ensure_jars
from tests.e2e.helpers import migrated_airflow_home
from tests.e2e.test_demo_e2e import VENV, _fresh_copy, _user_env

pytestmark = pytest.mark.e2e
ROOT = Path(__file__).resolve().parents[2]
BLOCK = re.compile(r"^```bash\n(.*?)^```", re.DOTALL | re.MULTILINE)
AVRO_SECTION = re.compile(r"^## 5\. Avro.*?^## ", re.DOTALL | re.MULTILINE)


def _avro_claims(page: str) -> tuple[str, dict]:
    """What section 5 says `new --from-topic` prints (its ```text block) and writes (its ```yaml block)."""
    section = AVRO_SECTION.search(page)
    assert section, "the tutorial has no section 5, Avro through a schema registry"
    printed = re.search(r"^```text\n(.*?)^```", section.group(0), re.DOTALL | re.MULTILINE)
    written = re.search(r"^```yaml\n(.*?)^```", section.group(0), re.DOTALL | re.MULTILINE)
    assert printed and written, "section 5 shows what `new --from-topic` prints and the spec it writes"
    return printed.group(1), yaml.safe_load(written.group(1))


def _shown(spec: Any, short: Any) -> Any:
    """`spec` cut to what its short form on the page shows (the same keys, at every depth), each string on one line
    (the query `new` writes spans lines)."""
    if isinstance(short, dict) and isinstance(spec, dict):
        return {key: _shown(spec.get(key), value) for key, value in short.items()}
    if isinstance(short, list) and isinstance(spec, list) and len(short) == len(spec):
        return [_shown(whole, part) for whole, part in zip(spec, short, strict=True)]
    return " ".join(spec.split()) if isinstance(spec, str) else spec


def test_the_tutorial_runs_as_written(service_env, ledger_url, tmp_path: Path) -> None:
    page = (ROOT / "docs" / "your-own-pipeline.md").read_text()
    blocks = BLOCK.findall(page)
    assert len(blocks) >= 6 and "microbatch new orders --from-topic orders" in blocks[1]
    assert "microbatch.dev" not in blocks[0] and "--create --if-not-exists --topic orders" in blocks[0]  # issue 64
    (avro_block,) = [n for n, block in enumerate(blocks) if "new orders_avro --from-topic orders-avro" in block]
    printed, written = _avro_claims(page)
    registry = SchemaRegistry(tmp_path / "registry")  # `make registry`, started while the first blocks run
    registry_env = {"MICROBATCH_SCHEMA_REGISTRY_URL": registry.url}
    copy = _fresh_copy(tmp_path / "repo")
    (copy / ".venv").symlink_to(VENV)
    devstack = copy / ".cache" / "devstack"
    devstack.mkdir(parents=True)
    exported = {**service_env, **registry_env}
    (devstack / "env.sh").write_text("".join(f"export {k}='{v}'\n" for k, v in exported.items()))
    migrated_airflow_home(copy / ".cache" / "airflow")  # the home `make demo` migrated (localenv's AIRFLOW_HOME)
    (copy / ".cache" / "jars").mkdir()  # the broker's jars `make demo` fetched: the page's kafka-topics.sh class
    (copy / ".cache" / "jars" / "kafka").symlink_to(ensure_jars("kafka"), target_is_directory=True)
    env = {**_user_env(copy), **exported, "PYTHONPATH": f"{copy / 'include'}{os.pathsep}{copy}"}

    outputs = []
    with ThreadPoolExecutor(1) as pool:
        started = pool.submit(registry.start)
        try:
            for number, block in enumerate(blocks, 1):
                if number - 1 == avro_block:
                    started.result()
                done = subprocess.run(["bash", "-e", "-c", block], cwd=copy, env=env, capture_output=True,
                                      text=True, timeout=900, check=False)
                outputs.append(done.stdout + done.stderr)
                assert done.returncode == 0, f"block {number}:\n{block}\n{outputs[-1][-4000:]}"
        finally:
            started.exception()  # a start that failed is raised by result() above; here it is only awaited
            registry.stop()

    landed = " ".join(outputs[2].split())
    assert "orders (postgres_append): 100 rows; 1 dead letters" in landed, outputs[2][-3000:]
    avro = " ".join(outputs[avro_block].split())
    assert " ".join(printed.split()) in avro, outputs[avro_block][-3000:]
    spec = yaml.safe_load((copy / "include" / "pipelines" / "orders_avro.yaml").read_text())
    assert _shown(spec, written) == written, "section 5's spec in short is not what `new --from-topic` wrote"
    assert "orders_avro (postgres_append): 100 rows; 0 dead letters" in avro, outputs[avro_block][-3000:]
    assert "ok: postgres_append orders_avro: 100 rows of 1 committed batches" in avro, outputs[avro_block][-3000:]
    with transaction(ledger_url) as session:
        rows = session.execute(text("SELECT id, amount, ts FROM orders")).all()
        assert sorted((i, a) for i, a, _ in rows) == sorted((f"o{i}", i) for i in range(100))
        starts = sorted({ts.replace(second=0) for *_, ts in rows})
        per_minute = session.execute(text(
            "SELECT window_start, orders, amount FROM orders_per_minute ORDER BY window_start")).all()
        assert [(w, n) for w, n, _ in per_minute] == [(w, 20) for w in starts]  # an order every 3 s
        assert sum(a for *_, a in per_minute) == sum(range(100))
        from_avro = session.execute(text("SELECT id, amount, ts FROM orders_avro")).all()
        first = min(ts for *_, ts in from_avro)
        assert sorted(from_avro) == sorted((f"o{i}", i, first + timedelta(seconds=3 * i)) for i in range(100))
        assert sorted(session.execute(text("SELECT id, amount FROM orders_py")).all()) == \
            sorted((f"o{i}", i) for i in range(100))
        assert session.execute(text(
            "SELECT p.name, count(*) FROM dead_letters d JOIN pipelines p ON p.id = d.pipeline_id "
            "GROUP BY p.name ORDER BY 1")).all() == [("orders", 1), ("orders_py", 1)]
