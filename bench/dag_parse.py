"""DAG parse time with many pipelines (issue 22): --specs pipeline specs and one DAG file each, as
`microbatch new` writes them, parsed by Airflow's own DagBag (the DAG processor's loader), which times every file.

Each spec is a copy of the shipped ip_count.yaml under its own name and topic; each DAG file is the shipped
dags/ip_count.py with that name. Every --reps run parses the folder in a fresh Python process (the first file
pays the imports, as in a fresh DAG processor), with MICROBATCH_PIPELINES_DIR on the generated specs.

    PYTHONPATH=include:. .venv/bin/python bench/dag_parse.py --specs 100
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine, median, print_table, reproduce_command, write_results

ROOT = Path(__file__).resolve().parents[1]
PARSE = """
import json, sys, time
from airflow.dag_processing.dagbag import DagBag
started = time.perf_counter()
bag = DagBag(dag_folder=sys.argv[1], safe_mode=False)
total = time.perf_counter() - started
print(json.dumps({"total_s": total, "dags": len(bag.dags), "errors": len(bag.import_errors),
                  "first_error": next(iter(bag.import_errors.values()), "")[-600:],
                  "files": [s.duration.total_seconds() for s in bag.dagbag_stats]}))
"""


def generate(work: Path, specs: int) -> tuple[Path, Path]:
    """`specs` specs and their DAG files under `work`."""
    base = yaml.safe_load((ROOT / "include/pipelines/ip_count.yaml").read_text())
    dag_file = (ROOT / "dags/ip_count.py").read_text()
    pipelines, dags = work / "pipelines", work / "dags"
    pipelines.mkdir(parents=True)
    dags.mkdir()
    for k in range(specs):
        name = f"pipe_{k:03d}"
        spec = {**base, "name": name, "source": {**base["source"], "topics": [f"{name}_source"]}}
        spec["sinks"] = [sink | ({"table": f"{name}_{sink['table']}"} if "table" in sink else
                                 {"topic": f"{name}_{sink['topic']}"}) for sink in base["sinks"]]
        (pipelines / f"{name}.yaml").write_text(yaml.safe_dump(spec))
        (dags / f"{name}.py").write_text(dag_file.replace("ip_count", name))
    return pipelines, dags


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--specs", type=int, default=100)
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="mb-bench-dag-parse-"))
    pipelines, dags = generate(work, args.specs)
    env = {**os.environ, "MICROBATCH_PIPELINES_DIR": str(pipelines), "AIRFLOW_HOME": str(work / "airflow"),
           "PYTHONPATH": f"{ROOT / 'include'}:{ROOT}"}
    runs = []
    for _ in range(args.reps):
        done = subprocess.run([sys.executable, "-c", PARSE, str(dags)], env=env, capture_output=True, text=True,
                              check=True)
        runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
    assert all(r["errors"] == 0 and r["dags"] >= args.specs * 2 for r in runs), runs
    per_file = [sorted(r["files"]) for r in runs]
    row = {"files": args.specs, "dags": runs[0]["dags"], "total_s": median([r["total_s"] for r in runs]),
           "per_file_median_s": median([f[len(f) // 2] for f in per_file]),
           "per_file_max_s": median([f[-1] for f in per_file])}
    print_table(f"DagBag over {args.specs} pipelines (median of {args.reps} fresh processes)",
                ["DAG files", "DAGs", "total s", "per file median s", "per file max s"],
                [[row["files"], row["dags"], row["total_s"], row["per_file_median_s"], row["per_file_max_s"]]])
    path = write_results("dag_parse", {"machine": machine(), "args": vars(args), "result": row, "runs": runs,
                                       "reproduce": reproduce_command("dag_parse.py", argv)})
    print(f"results: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
