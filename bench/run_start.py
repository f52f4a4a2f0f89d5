"""What a `microbatch run` process costs before its pipeline does any work: a run of ip_count that finds nothing
new (plan skipped), as `microbatch run` starts it, in its own process, wall seconds and CPU seconds.

Two ways, alternated pair by pair in one run on one stack: as shipped (dag.test()'s in-process Task Execution
API serves only the API version its client speaks, `runner.serve_only_the_current_task_api`), and with Airflow's
full version bundle (that function replaced by a no-op in the measured process only).

    PYTHONPATH=include:. .venv/bin/python bench/run_start.py --pairs 5
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import PYTHON, ROOT, local_stack, machine, median, print_table, reproduce_command, write_results, write_spec

from microbatch.dev.kafka import create_topic

FULL_BUNDLE = ("import sys; import microbatch.airflow.runner as r; r.serve_only_the_current_task_api = lambda: None; "
               "from microbatch.cli import main; sys.argv[0] = 'microbatch'; main()")
WAYS = {"as shipped": ["-m", "microbatch.cli"], "Airflow's full bundle": ["-c", FULL_BUNDLE]}


def timed(args: list[str], env: dict[str, str]) -> tuple[float, float]:
    """(wall seconds, CPU seconds of the process and its children) of one `microbatch run`."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.monotonic()
    done = subprocess.run([PYTHON, *args, "run", "ip_count", "--max-runs", "1"], env=env, capture_output=True,
                          text=True, check=False)
    wall = time.monotonic() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0 or "plan skipped" not in done.stdout:
        raise SystemExit(f"the run failed or found work:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=5)
    args = parser.parse_args(argv)
    with local_stack("mb-run-start-") as stack, tempfile.TemporaryDirectory() as tmp:
        topic = "run_start_source"
        create_topic(stack.bootstrap, topic, 4)
        specs = write_spec(Path(tmp) / "pipelines", [topic], max_records=1000)
        env = {**os.environ, "PYTHONPATH": f"{ROOT / 'include'}:{ROOT}",
               "MICROBATCH_LEDGER_URL": stack.fresh_ledger("run_start"),
               "MICROBATCH_KAFKA_BOOTSTRAP": stack.bootstrap, "MICROBATCH_PIPELINES_DIR": str(specs),
               "AIRFLOW_HOME": str(Path(tmp) / "airflow")}
        env.pop("MICROBATCH_SPARK_REMOTE", None)
        subprocess.run([PYTHON, "-m", "microbatch.cli", "migrate"], env=env, check=True, capture_output=True)
        timed(WAYS["as shipped"], env)  # the Airflow metadata DB's migration and the first DAG sync, not measured
        samples: dict[str, list[tuple[float, float]]] = {way: [] for way in WAYS}
        for _ in range(args.pairs):
            for way, way_args in WAYS.items():
                samples[way].append(timed(way_args, env))
    rows = [[way, median([w for w, _ in s]), median([c for _, c in s]), len(s)] for way, s in samples.items()]
    shipped, full = rows[0], rows[1]
    rows.append(["ratio (full / shipped)", round(full[1] / shipped[1], 2), round(full[2] / shipped[2], 2), ""])
    print_table("a `microbatch run` that finds nothing new (medians)", ["way", "wall s", "CPU s", "runs"], rows)
    print(reproduce_command("run_start.py", argv))
    write_results("run_start", {"machine": machine(), "rows": rows})


if __name__ == "__main__":
    main(sys.argv[1:])
