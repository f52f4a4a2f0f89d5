"""A profile of the stage: Kafka read, parse, observe, aggregate and staging write, step by step, one session.

Explains the gap between c (microbatch's stage) and b (a raw Spark read + count()) in bench/throughput.py:
it produces the same kind of topic (N ~105-byte access-log lines over 8 partitions) and runs
bench/spark_apps/stage_profile.py, which times each step as its own Spark action, --reps times
(the last repetition is the steady state, with the JIT warm).

    PYTHONPATH=include:. .venv/bin/python bench/stage_profile.py --records 1000000 --reps 3
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (
    APPS,
    filled_topic,
    local_stack,
    machine,
    median,
    print_table,
    reproduce_command,
    spark_submit,
    write_results,
)

TOPIC = "bench_profile"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args(argv)
    n = args.records
    results: dict = {"machine": machine(), "args": vars(args)}
    with local_stack("mb-profile-") as stack:
        results["produce"], _, ranges = filled_topic(stack, TOPIC, n, args.partitions)
        ledger = stack.fresh_ledger("profile")  # step 6 writes to its stage_ip_counts like the stage does
        run = spark_submit(APPS / "stage_profile.py", [str(ranges), str(args.reps)],
                           {"MICROBATCH_KAFKA_BOOTSTRAP": stack.bootstrap, "MICROBATCH_LEDGER_URL": ledger},
                           conf={"spark.sql.shuffle.partitions": "4"}, driver_memory="1g")
    reported = run.json_lines()[-1]
    runs, cpu = reported["runs"], reported["cpu"]
    results["runs"], results["cpu"] = runs, cpu
    steady = {step: median([r[step] for r in runs[1:] or runs]) for step in runs[0]}
    steady_cpu = {step: median([r[step] for r in cpu[1:] or cpu]) for step in cpu[0]}
    results["steady_s"], results["steady_cpu_s"] = steady, steady_cpu
    results["command"] = reproduce_command("stage_profile.py", argv)
    path = write_results("stage_profile", results)
    base = steady["1 read + count()"]
    print_table(f"The stage's read, step by step: {n:,} records, {args.partitions} partitions "
                f"(median of reps 2..{args.reps}; rep 1 warms the JIT)",
                ["step", "first rep s", "steady s", "records/s", "x read + count()", "steady CPU s", "CPU µs/record"],
                [[step, runs[0][step], s, n / s, s / base, steady_cpu[step], steady_cpu[step] / n * 1e6]
                 for step, s in steady.items()])
    print(f"results: {path}\nreproduce: {results['command']}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
