"""A profile of the stage: Kafka read, parse, observe, aggregate and staging write, step by step, one session.
With --pairs N, goal 2 of issue 22 instead: N rounds of the bare job (b2), the stage (c) and the peer's micro-batch
(d) alternated in one application, each round's executor CPU per run from the event log (spark_apps/cpu_pairs.py).

Explains the gap between c (microbatch's stage) and b (a raw Spark read + count()) in bench/throughput.py:
it produces the same kind of topic (N ~105-byte access-log lines over 8 partitions) and runs
bench/spark_apps/stage_profile.py, which times each step as its own Spark action, --reps times
(the last repetition is the steady state, with the JIT warm).

    PYTHONPATH=include:. .venv/bin/python bench/stage_profile.py --records 1000000 --reps 3
    PYTHONPATH=include:. .venv/bin/python bench/stage_profile.py --records 1000000 --pairs 9 --contributions per_batch
    PYTHONPATH=include:. .venv/bin/python bench/stage_profile.py --records 1000000 --pairs 8 --runs b2,c,cw,cw0,d

With --cold, every run of every round is its own spark-submit instead, a cold JVM as a batch staged by spark-submit
meets it; every round counts (--pairs 5 --cold: 5 cold runs of each).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (
    APPS,
    create_peer_tables,
    event_logged,
    filled_topic,
    local_stack,
    machine,
    median,
    print_table,
    reproduce_command,
    spark_submit,
    task_metrics_by_group,
    write_results,
    write_spec,
)

TOPIC = "bench_profile"
PAIR_RUNS = ("b2", "b2o", "b2o1", "c", "cp", "cw", "cw0", "d")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--pairs", type=int, default=0, help="rounds of b2, c and d alternated (goal 2) instead")
    parser.add_argument("--contributions", choices=["per_partition", "per_batch"], default="per_batch",
                        help="the sink's contributions in c's spec (with --pairs)")
    parser.add_argument("--cold", action="store_true",
                        help="with --pairs: each run of each round in its own spark-submit (a cold JVM)")
    parser.add_argument("--runs", default="b2,c,d",
                        help="with --pairs: the runs of each round, of b2, b2o, b2o1, c, cp, cw, cw0, d")
    args = parser.parse_args(argv)
    if args.pairs:
        if not {"b2", "c", "d"} <= set(args.runs.split(",")) or not set(args.runs.split(",")) <= set(PAIR_RUNS):
            parser.error(f"--runs takes b2, c and d, and may add b2o, b2o1, cp, cw and cw0; got {args.runs!r}")
        return pairs(args, argv)
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


def pairs(args: argparse.Namespace, argv: list[str]) -> int:
    """Executor CPU of b2, c and d in alternated rounds of one application; each round's own c/d ratio."""
    from microbatch.sinks.schema import migrate_sinks

    n = args.records
    results: dict = {"machine": machine(), "args": vars(args)}
    with local_stack("mb-pairs-") as stack:
        results["produce"], _, ranges = filled_topic(stack, TOPIC, n, args.partitions)
        ledger = stack.fresh_ledger("pairs")
        spec_dir = write_spec(stack.work_dir / "specs", [TOPIC], n, contributions=args.contributions)
        migrate_sinks(ledger, spec_dir)
        create_peer_tables(ledger)
        env = {"MICROBATCH_KAFKA_BOOTSTRAP": stack.bootstrap, "MICROBATCH_LEDGER_URL": ledger,
               "MICROBATCH_PIPELINES_DIR": str(spec_dir)}

        def submit(rounds: int, runs: str, events: Path) -> list[dict[str, float]]:
            run = spark_submit(APPS / "cpu_pairs.py", [str(ranges), str(rounds), runs], env,
                               conf={"spark.sql.shuffle.partitions": "4", **event_logged(events)}, driver_memory="1g")
            return run.json_lines()[-1]["wall"]

        names = tuple(args.runs.split(","))
        if not args.cold:
            wall = submit(args.pairs, args.runs, stack.work_dir / "events")
            by_group = task_metrics_by_group(stack.work_dir / "events")
        else:  # each run in its own spark-submit, as a batch staged by spark-submit runs: a cold JVM every time
            wall, by_group = [], {}
            for i in range(args.pairs):
                wall.append({})
                for name in names[i % len(names):] + names[:i % len(names)]:
                    wall[i].update(submit(1, name, stack.work_dir / "events" / f"{i}-{name}")[0])
                    by_group[f"{i}:{name}"] = task_metrics_by_group(stack.work_dir / "events" / f"{i}-{name}")[
                        f"0:{name}"]

    def per_round(metric: str) -> list[dict[str, float]]:
        return [{name: by_group.get(f"{i}:{name}", {}).get(metric, 0.0) for name in names} for i in range(args.pairs)]

    cpu, read_cpu = per_round("cpu_s"), per_round("read_cpu_s")
    for i, per_run in enumerate(cpu):
        if min(per_run.values()) <= 0:
            raise RuntimeError(f"round {i}: the event log holds no executor CPU for one of {names}: {per_run}")
    results.update(wall=wall, cpu=cpu, read_cpu=read_cpu, by_group=by_group)
    def counted(per_round: list) -> list:  # cold: every round; in one application, round 0 warms the JIT
        return per_round if args.cold else per_round[1:] or per_round

    steady = counted(cpu)
    ratios = [r["c"] / r["d"] for r in steady]
    results["summary"] = {
        "cpu_us_per_record": {name: median([r[name] for r in steady]) * 1e6 / n for name in names},
        "wall_s": {name: median([r[name] for r in counted(wall)]) for name in names},
        "read_cpu_us_per_record": {name: median([r[name] for r in counted(read_cpu)]) * 1e6 / n for name in names},
        "c_over_d_each_round": [round(x, 3) for x in ratios],
        "c_over_d_median": median(ratios),
        "rounds_c_below_d": sum(x < 1 for x in ratios),
        "c_over_b2_median": median([r["c"] / r["b2"] for r in steady]),
        "d_over_b2_median": median([r["d"] / r["b2"] for r in steady]),
        **{f"{name}_over_b2_median": median([r[name] / r["b2"] for r in steady])
           for name in ("b2o", "b2o1", "cp", "cw", "cw0") if name in names},
    }
    results["command"] = reproduce_command("stage_profile.py", argv)
    path = write_results("cpu_cold" if args.cold else "cpu_pairs", results)
    where = "each in its own spark-submit" if args.cold else "in one application"
    print_table(f"Executor CPU per run, {n:,} records over {args.partitions} partitions, {args.pairs} rounds of "
                f"{', '.join(names)} alternated {where} "
                f"(c: contributions {args.contributions})",
                ["round", *[f"{name} CPU s" for name in names], "c / d", *[f"{name} wall s" for name in names]],
                [[i, *[r[name] for name in names], r["c"] / r["d"], *[wall[i][name] for name in names]]
                 for i, r in enumerate(cpu)])
    summary = results["summary"]
    print_table(f"Medians of rounds 1..{args.pairs}, every run in a cold JVM" if args.cold else
                f"Medians of rounds 2..{args.pairs} (round 1 warms the JIT)",
                ["run", "executor CPU µs/record", "of it in the tasks that read Kafka", "wall s"],
                [[name, summary["cpu_us_per_record"][name], summary["read_cpu_us_per_record"][name],
                  summary["wall_s"][name]] for name in names])
    print(f"c/d executor CPU, each round: {summary['c_over_d_each_round']}; median {summary['c_over_d_median']}; "
          f"c below d in {summary['rounds_c_below_d']} of {len(ratios)} rounds")
    print(f"results: {path}\nreproduce: {results['command']}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
