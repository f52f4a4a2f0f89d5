"""Planning at scale: a pipeline over --topics topics x --partitions-per-topic partitions (1,000 by default).

Measures separately, medians of --reps:
  - the pure planner, microbatch.planning.plan_batch, on the offsets read from the broker;
  - the Kafka round trips of plan (client bootstrap, partition discovery, earliest + latest offsets);
  - the whole plan_next_batch (Kafka + ledger: lock, positions, insert of the batch and its ranges),
    each time on a ledger whose previous batch was committed, so every run plans a new batch.

    PYTHONPATH=include:. .venv/bin/python bench/planning.py
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from microbatch.ledger.database import Ledger
from microbatch.settings import KafkaSettings

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import kafka_tool, local_stack, machine, median, print_table, reproduce_command, write_results, write_spec


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--topics", type=int, default=4)
    parser.add_argument("--partitions-per-topic", type=int, default=250)
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args(argv)
    from microbatch.config import find_spec
    from microbatch.dev.kafka import create_topic
    from microbatch.kafka.offsets import discover_partitions, offset_bounds, offsets_client
    from microbatch.ledger.database import transaction
    from microbatch.phases.commit import commit_batch
    from microbatch.phases.plan import plan_next_batch
    from microbatch.planning import plan_batch

    topics = [f"bench_plan_{i}" for i in range(args.topics)]
    total = args.topics * args.partitions_per_topic
    results: dict = {"machine": machine(), "args": vars(args), "partitions": total}
    with local_stack() as stack:
        for topic in topics:
            create_topic(stack.bootstrap, topic, args.partitions_per_topic)
            kafka_tool("org.apache.kafka.tools.ProducerPerformance", "--topic", topic, "--num-records",
                       str(20 * args.partitions_per_topic), "--throughput", "-1", "--record-size", "100",
                       "--producer-props", f"bootstrap.servers={stack.bootstrap}", "linger.ms=0", "batch.size=200")
        spec = find_spec("ip_count", write_spec(stack.work_dir / "spec", topics, 10_000_000))
        url = stack.fresh_ledger("planning")

        kafka = {"connect_s": [], "discover_s": [], "offsets_s": [], "total_s": []}
        pure = []
        for _ in range(args.reps):
            t0 = time.monotonic()
            with offsets_client(KafkaSettings(stack.bootstrap), spec.source.isolation_level) as consumer:
                t1 = time.monotonic()
                partitions = discover_partitions(consumer, spec.source.topics)
                t2 = time.monotonic()
                earliest, latest = offset_bounds(consumer, partitions)
                t3 = time.monotonic()
            kafka["connect_s"].append(t1 - t0)
            kafka["discover_s"].append(t2 - t1)
            kafka["offsets_s"].append(t3 - t2)
            kafka["total_s"].append(time.monotonic() - t0)
            assert len(partitions) == total, (len(partitions), total)
            positions = {tp: latest[tp] // 2 for tp in partitions}
            t0 = time.perf_counter()
            plan = plan_batch(positions, earliest, latest, spec.source)
            pure.append(time.perf_counter() - t0)
        plan_ranges = len(plan.ranges)

        from kafka import KafkaProducer

        producer = KafkaProducer(bootstrap_servers=stack.bootstrap, linger_ms=5)
        full, ledger_part = [], []
        for _ in range(args.reps):
            # One new record in every partition, so every run has a whole new batch to plan.
            for tp in partitions:
                producer.send(tp.topic, b"x" * 100, partition=tp.partition)
            producer.flush()
            outcome = plan_next_batch(spec, Ledger(url), KafkaSettings(stack.bootstrap))
            full.append(outcome.seconds)
            assert outcome.batch_id is not None and not outcome.reused
            # Commit it with nothing staged, so the next run plans a new batch again.
            with transaction(url) as session:
                from sqlalchemy import text

                session.execute(text("UPDATE batches SET state='staged', attempt=1, staged_attempt=1, "
                                     "counts = counts || '{\"rows_by_sink\": {\"ip_counts\": 0}}' WHERE id=:b"),
                                {"b": outcome.batch_id})
            with transaction(url) as session:
                commit_batch(session, spec, outcome.batch_id)
        producer.close()
        # plan_next_batch reads the broker again; its ledger share is what remains after the Kafka median.
        ledger_part = [f - median(kafka["total_s"]) for f in full]

    summary = {
        "pure_plan_batch_ms": median(pure) * 1000,
        "kafka_connect_ms": median(kafka["connect_s"]) * 1000,
        "kafka_discover_ms": median(kafka["discover_s"]) * 1000,
        "kafka_offsets_ms": median(kafka["offsets_s"]) * 1000,
        "kafka_total_ms": median(kafka["total_s"]) * 1000,
        "plan_next_batch_ms": median(full) * 1000,
        "ledger_and_rest_ms (plan_next_batch - kafka)": median(ledger_part) * 1000,
    }
    results.update(summary=summary, ranges_planned=plan_ranges, raw={"pure_s": pure, "kafka": kafka, "full_s": full},
                   command=reproduce_command("planning.py", argv))
    path = write_results("planning", results)
    print_table(f"Planning {total:,} partitions over {args.topics} topics (medians of {args.reps})",
                ["part", "ms"], [[k, v] for k, v in summary.items()])
    goal = summary["plan_next_batch_ms"] - summary["kafka_total_ms"]
    print(f"plan without Kafka's response time: {goal:.0f} ms (goal <= 1000 ms); ranges planned: {plan_ranges}")
    print(f"results: {path}\nreproduce: {results['command']}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
