"""Two costs of the development stack, each measured against its alternative in one run, alternating:

  broker: a development Kafka broker (`microbatch.dev.kafka.KafkaBroker`: the local stack, the tests, the chaos
      harness) from launch until it answers metadata, with the JVM options it ships (`DEV_JVM_OPTIONS`: the client
      compiler only, the serial collector) against the JVM's defaults for a server (C2 and G1): wall seconds to
      ready, and CPU seconds of its JVMs (the storage format tool's and the broker's, read with psutil).
  vacuum: Delta's `VACUUM ... RETAIN 0 HOURS` of a table of --files small files, in one local Spark session with
      Delta's extension, listing the table's directories in `maintenance.listing_tasks` (64) tasks against Spark's
      default `spark.sql.sources.parallelPartitionDiscovery.parallelism` (10,000).

    PYTHONPATH=include:. .venv/bin/python bench/dev_costs.py --pairs 3 --files 20
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import local_delta_session, machine, median, print_table, reproduce_command, write_results

from microbatch.dev import kafka as devkafka
from microbatch.sinks.delta import LISTING_PARALLELISM

SERVER_DEFAULTS = ("-XX:+UseG1GC",)  # the JVM's own choice on a server: tiered C1 + C2, and G1
SPARK_DEFAULT_LISTING = 10_000


def broker_start(options: tuple[str, ...], work: Path) -> tuple[float, float, float]:
    """(wall seconds until the broker answers, CPU seconds of the format tool, CPU seconds of the broker's JVM
    until then) with `options` as the JVM options of both."""
    devkafka.DEV_JVM_OPTIONS = options
    before = psutil.Process().cpu_times()
    started = time.monotonic()
    broker = devkafka.KafkaBroker(work)
    try:
        broker.start()  # the format tool runs to its end first (waited: its CPU is in children_*)
        wall = time.monotonic() - started
        after = psutil.Process().cpu_times()
        formatted = (after.children_user - before.children_user) + (after.children_system - before.children_system)
        times = psutil.Process(broker.pid).cpu_times()
        return wall, formatted, times.user + times.system
    finally:
        broker.stop()


def bench_broker(pairs: int) -> dict:
    shipped, defaults = devkafka.DEV_JVM_OPTIONS, SERVER_DEFAULTS
    rows: dict[str, dict[str, list[float]]] = {"shipped": {"wall": [], "format": [], "broker": []},
                                               "defaults": {"wall": [], "format": [], "broker": []}}
    with tempfile.TemporaryDirectory(prefix="mb-bench-broker-") as tmp:
        for i in range(pairs):
            for name, options in (("shipped", shipped), ("defaults", defaults)):
                wall, formatted, broker = broker_start(options, Path(tmp) / f"{name}-{i}")
                rows[name]["wall"].append(wall)
                rows[name]["format"].append(formatted)
                rows[name]["broker"].append(broker)
    devkafka.DEV_JVM_OPTIONS = shipped
    return {name: {k: median(v) for k, v in values.items()} | {"raw": values} for name, values in rows.items()}


def bench_vacuum(pairs: int, files: int) -> dict:
    spark = local_delta_session("bench-dev-costs")
    spark.conf.set("spark.databricks.delta.retentionDurationCheck.enabled", "false")
    times: dict[int, list[float]] = {64: [], SPARK_DEFAULT_LISTING: []}
    with tempfile.TemporaryDirectory(prefix="mb-bench-vacuum-") as tmp:
        path = str(Path(tmp) / "table")
        (spark.range(files * 25).selectExpr("id", "id % 7 AS page").repartition(files)
         .write.format("delta").save(path))
        spark.sql(f"VACUUM delta.`{path}` RETAIN 0 HOURS").collect()  # warm: classes loaded, JIT under way
        for _ in range(pairs):
            for tasks in (64, SPARK_DEFAULT_LISTING):
                spark.conf.set(LISTING_PARALLELISM, str(tasks))
                started = time.monotonic()
                spark.sql(f"VACUUM delta.`{path}` RETAIN 0 HOURS").collect()
                times[tasks].append(time.monotonic() - started)
        numfiles = spark.sql(f"DESCRIBE DETAIL delta.`{path}`").collect()[0]["numFiles"]
    spark.stop()
    return {"files": numfiles, **{str(k): {"median_s": median(v), "raw": v} for k, v in times.items()}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", type=int, default=3, help="alternating measurements of each variant")
    parser.add_argument("--files", type=int, default=20, help="small files in the vacuumed table")
    parser.add_argument("--only", choices=["broker", "vacuum"], help="one of the two benchmarks")
    args = parser.parse_args(argv)
    results: dict = {"machine": machine(), "command": reproduce_command("bench/dev_costs.py", argv or sys.argv[1:])}
    if args.only in (None, "broker"):
        broker = results["broker"] = bench_broker(args.pairs)
        print_table(f"a development broker's start (medians of {args.pairs}, alternating)",
                    ["JVM options", "wall to ready (s)", "CPU, format tool (s)", "CPU, broker to ready (s)"],
                    [[" ".join(variant), broker[name]["wall"], broker[name]["format"], broker[name]["broker"]]
                     for name, variant in (("shipped", devkafka.DEV_JVM_OPTIONS), ("defaults", SERVER_DEFAULTS))])
    if args.only in (None, "vacuum"):
        vacuum = results["vacuum"] = bench_vacuum(args.pairs, args.files)
        print_table(f"VACUUM of a table of {vacuum['files']} files (medians of {args.pairs}, alternating)",
                    ["listing tasks", "seconds"],
                    [["64 (maintenance.listing_tasks)", vacuum["64"]["median_s"]],
                     [f"{SPARK_DEFAULT_LISTING:,} (Spark's default)", vacuum[str(SPARK_DEFAULT_LISTING)]["median_s"]]])
    print(f"results: {write_results('dev_costs', results)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
