"""What one small batch's Delta commit costs with the `delta` sink's `snapshot_partitions` (4) against Delta's own
default of `spark.databricks.delta.snapshotPartitions` (50), in one local Spark session with Delta's extension,
alternating: each round appends --rows rows to each of two tables (one per setting) as the sink's append does,
one idempotent commit each (`txnAppId`, a new `txnVersion`), and times it. Medians of --rounds.

    PYTHONPATH=include:. .venv/bin/python bench/delta_commit.py --rounds 6 --rows 25
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import local_delta_session, machine, median, print_table, reproduce_command, write_results

from microbatch.config import DeltaSink
from microbatch.sinks.delta import SNAPSHOT_PARTITIONS

DELTA_DEFAULT = 50


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--rows", type=int, default=25, help="rows per commit (a small batch)")
    args = parser.parse_args(argv)

    shipped = DeltaSink.model_fields["snapshot_partitions"].default
    spark = local_delta_session("bench-delta-commit")
    seconds: dict[int, list[float]] = {shipped: [], DELTA_DEFAULT: []}
    with tempfile.TemporaryDirectory(prefix="mb-bench-delta-commit-") as tmp:
        paths = {n: str(Path(tmp) / f"partitions_{n}") for n in seconds}
        for path in paths.values():
            spark.range(args.rows).write.format("delta").save(path)
        for round_ in range(args.rounds):
            for n, path in paths.items():
                spark.conf.set(SNAPSHOT_PARTITIONS, str(n))
                rows = spark.range(args.rows).selectExpr(f"id + {(round_ + 1) * args.rows} AS id")
                started = time.monotonic()
                (rows.write.format("delta").mode("append").option("txnAppId", "bench")
                 .option("txnVersion", str(round_ + 1)).save(path))
                seconds[n].append(time.monotonic() - started)
    spark.stop()
    results = {"machine": machine(), "command": reproduce_command("bench/delta_commit.py", argv or sys.argv[1:]),
               **{str(n): {"median_s": median(v), "raw": v} for n, v in seconds.items()}}
    print_table(f"one Delta commit of {args.rows} rows (medians of {args.rounds}, alternating)",
                ["snapshot partitions", "seconds per commit"],
                [[f"{shipped} (the sink's snapshot_partitions)", median(seconds[shipped])],
                 [f"{DELTA_DEFAULT} (Delta's default)", median(seconds[DELTA_DEFAULT])]])
    print(f"results: {write_results('delta_commit', results)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
