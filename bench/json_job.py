"""A JSON value decoded by the platform against the same decode written by hand in a Python job (issue 43), as the
issue words it: two microbatch pipelines on the same topic, records per second end to end, side by side in one run on
one local stack (Kafka, PostgreSQL), alternating, --reps rounds.

The data: --records payment events as bench/decode.py makes them (`payment_id`, `merchant`, `amount_cents`,
`currency`, `status`, an ISO-8601 `ts`, an undeclared `channel`; ~170 bytes), one in 100 bad (decode.py's
BAD_VALUES: a string amount, a missing payment_id, not JSON, a fractional amount, a number as payment_id),
produced round-robin over --partitions partitions with confluent-kafka's Producer (not timed).

Each round runs two legs, each one batch of all the records into a `postgres_append` table of the six fields (and
the record's topic, partition and offset) on a fresh ledger, run as bench/avro.py runs its microbatch leg
(`common.run_microbatch`: plan, stage by spark-submit of bench/spark_apps/stage_entry.py, commit):

- `platform`: a SQL pipeline, `source.value: {format: json, fields: {...}, required: [payment_id, amount_cents]}`,
  the sink's `sql: SELECT ... FROM records`; a value the format cannot read is a dead letter with its reason;
- `hand`: the raw value (the default format) and the Python job bench/spark_apps/json_hand.py (`job.transform:
  json_hand:transform`, bench/spark_apps on the path):
  `from_json(value::string, 'payment_id string, ...')`, a record lacking payment_id or amount_cents a dead letter
  (spark_jobs/clicks.py's way).

Each leg then checks that rows + dead letters = records, that its good records (`pay-...`) all landed, and that
both legs landed the same good rows (a hash of their fields). The platform is stricter than `from_json` on one
bad kind: a number in the string field payment_id, which from_json reads as its text; so `hand` lands those rows
and `platform` makes them dead letters.

"wall" and "engine" are as bench/avro.py defines them for microbatch (`common.run_microbatch`); records/s count every
record read (good or dead letter). Ratios are records/s of platform over hand (below 1: the platform is slower), of
the medians and round by round.

    PYTHONPATH=include:. .venv/bin/python bench/json_job.py --records 1000000 --reps 3
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (
    APPS,
    ROOT,
    Stack,
    end_offsets,
    local_stack,
    machine,
    median,
    print_table,
    reproduce_command,
    run_microbatch,
    write_results,
)
from decode import BAD_VALUES, FIELDS, REQUIRED

log = logging.getLogger(__name__)

TOPIC = "bench_json_job"
PIPELINE = "bench_json_job"
TABLE = "payments"
COLUMNS = {"payment_id": "text", "merchant": "text", "amount_cents": "bigint", "currency": "text", "status": "text",
           "ts": "timestamptz"}
LEGS = ("platform", "hand")
T0 = datetime(2025, 11, 28, tzinfo=UTC)  # decode.py's timestamp_millis(1764288000000)


def value(i: int) -> bytes:
    """Record `i`'s value, as bench/decode.py's GOOD and BAD make it for `id` i."""
    if i % 100 == 42:
        return BAD_VALUES[(i // 100) % 5].encode()
    ts = (T0 + timedelta(milliseconds=37 * i)).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"
    return json.dumps({"payment_id": f"pay-{i:09d}", "merchant": ("acme", "globex", "initech", "umbrella", "hooli",
                                                                  "stark")[i % 6],
                       "amount_cents": (i * 7919) % 250_000, "currency": ("EUR", "USD", "GBP")[i % 3],
                       "status": ("authorized", "captured", "refunded", "failed")[i % 4], "ts": ts,
                       "channel": "web"}, separators=(",", ":")).encode()


def expected(records: int) -> dict[str, int]:
    """The good records, and the bad ones with a number as payment_id (which only `hand` lands)."""
    bad = [i for i in range(42, records, 100)]
    numeric_id = sum(1 for i in bad if BAD_VALUES[(i // 100) % 5].startswith('{"payment_id": 17'))
    return {"good": records - len(bad), "bad": len(bad), "numeric_id": numeric_id}


def fill(bootstrap: str, records: int, partitions: int) -> dict[str, Any]:
    """`records` values round-robin over the partitions of a new topic; production figures."""
    from confluent_kafka import Producer

    from microbatch.dev.kafka import create_topic

    create_topic(bootstrap, TOPIC, partitions)
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "1", "linger.ms": 50, "batch.size": 1 << 20,
                         "queue.buffering.max.messages": 2_000_000, "queue.buffering.max.kbytes": 1 << 21,
                         "compression.type": "none"})
    started = time.monotonic()
    size = 0
    for i in range(records):
        data = value(i)
        size += len(data)
        while True:
            try:
                producer.produce(TOPIC, value=data, partition=i % partitions)
                break
            except BufferError:
                producer.poll(0.1)
        if i % 10_000 == 0:
            producer.poll(0)
    left = producer.flush(300)
    if left:
        raise RuntimeError(f"{left} records were not delivered")
    seconds = time.monotonic() - started
    ends = end_offsets(bootstrap, TOPIC)
    if sum(ends.values()) != records:
        raise RuntimeError(f"the topic holds {sum(ends.values())} records, expected {records}")
    return {"records": records, "seconds": round(seconds, 2), "mean_value_bytes": round(size / records, 1),
            "partition_ends": ends}


def write_spec(directory: Path, records: int, leg: str) -> Path:
    import yaml

    source: dict[str, Any] = {"topics": [TOPIC], "max_records_per_batch": records, "commit_group_offsets": False}
    sink: dict[str, Any] = {"name": TABLE, "type": "postgres_append", "table": TABLE, "columns": COLUMNS}
    spec: dict[str, Any] = {"name": PIPELINE, "schedule": None, "source": source, "sinks": [sink],
                            "spark": {"mode": "submit", "conf": {"spark.ui.enabled": "false",
                                                                 "spark.sql.shuffle.partitions": "4"}}}
    if leg == "platform":
        source["value"] = {"format": "json", "fields": FIELDS, "required": REQUIRED}
        sink["sql"] = f"SELECT {', '.join(COLUMNS)} FROM records"
    else:
        spec["job"] = {"transform": "json_hand:transform",
                       "options": {"fields": FIELDS, "required": REQUIRED}}
    directory.mkdir(parents=True, exist_ok=True)
    (directory / f"{PIPELINE}.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    return directory


def landed(url: str) -> dict[str, Any]:
    """The table's rows, its good records' rows (`pay-...`) and a hash of their fields, and the dead letters."""
    from sqlalchemy import text

    from microbatch.ledger.database import transaction

    fields = ", ".join(COLUMNS)
    with transaction(url) as session:
        rows, good, fingerprint = session.execute(text(
            f"SELECT count(*), count(*) FILTER (WHERE payment_id LIKE 'pay-%'), "
            f"coalesce(sum(hashtextextended(concat_ws('|', {fields}), 0)::numeric) "
            f"FILTER (WHERE payment_id LIKE 'pay-%'), 0) FROM {TABLE}")).one()
        dead = session.execute(text("SELECT count(*) FROM dead_letters")).scalar_one()
    return {"rows": rows, "good_rows": good, "dead_letters": dead, "fingerprint": str(fingerprint)}


def leg_run(stack: Stack, leg: str, name: str, records: int, driver_memory: str) -> dict[str, Any]:
    spec_dir = write_spec(stack.work_dir / "specs" / name, records, leg)
    # The job's module as a top-level one (bench/ is no package): bench/spark_apps on the plan's and the stage's path.
    path = os.pathsep.join(str(p) for p in (ROOT / "include", ROOT, APPS))
    url, out = run_microbatch(stack, name, PIPELINE, spec_dir, {"PYTHONPATH": path}, driver_memory)
    check = landed(url)
    want = expected(records)
    rows = want["good"] + (want["numeric_id"] if leg == "hand" else 0)
    if (check["rows"] + check["dead_letters"] != records or check["good_rows"] != want["good"]
            or check["rows"] != rows or out["batches"] != 1):
        raise RuntimeError(f"{name}: {check} in {out['batches']} batches; expected {rows} rows of {records} records "
                           f"({want['good']} good) in one batch")
    return {**out, "check": check, "load_1m_after": round(os.getloadavg()[0], 2)}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--driver-memory", default="1g", help="spark-submit --driver-memory (Spark's default: 1g)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(message)s")
    log.setLevel(logging.INFO)
    n = args.records
    results: dict[str, Any] = {"machine": machine(), "args": vars(args), "expected": expected(n),
                               "command": reproduce_command("json_job.py", argv), "runs": {leg: [] for leg in LEGS}}
    runs = results["runs"]
    with local_stack("mb-bench-json-job-") as stack:
        results["produce"] = fill(stack.bootstrap, n, args.partitions)
        log.info("produced %s records (%s bytes each on average) in %ss", n, results["produce"]["mean_value_bytes"],
                 results["produce"]["seconds"])
        for rep in range(args.reps):
            for leg in LEGS if rep % 2 == 0 else tuple(reversed(LEGS)):
                runs[leg].append(leg_run(stack, leg, f"{leg}_{rep}", n, args.driver_memory))
                log.info("round %s/%s: %s %ss wall, %ss engine, load %s", rep + 1, args.reps, leg,
                         runs[leg][-1]["wall_s"], runs[leg][-1]["engine_s"], runs[leg][-1]["load_1m_after"])
            platform, hand = runs["platform"][-1]["check"], runs["hand"][-1]["check"]
            if platform["fingerprint"] != hand["fingerprint"]:
                raise RuntimeError(f"round {rep + 1}: the legs landed different good rows: {platform} {hand}")
    results["machine"]["load_avg_at_end"] = os.getloadavg()

    summary = {leg: {kind: median([r[kind] for r in runs[leg]]) for kind in ("wall_s", "engine_s", "stage_wall_s",
                                                                            "commit_s", "processes_s")}
               for leg in LEGS}
    for values in summary.values():
        values["wall_rate"] = round(n / values["wall_s"])
        values["engine_rate"] = round(n / values["engine_s"])
    ratios = {kind: {"medians": round(summary["hand"][f"{kind}_s"] / summary["platform"][f"{kind}_s"], 3),
                     "each_round": [round(h[f"{kind}_s"] / p[f"{kind}_s"], 3)
                                    for p, h in zip(runs["platform"], runs["hand"], strict=True)]}
              for kind in ("wall", "engine")}
    for values in ratios.values():
        values["median_of_rounds"] = median(values["each_round"])
    results["summary"], results["ratios"] = summary, ratios
    rows = [[f"{leg} ({rep + 1})", r["wall_s"], round(n / r["wall_s"]), r["engine_s"], round(n / r["engine_s"]),
             r["check"]["rows"], r["check"]["dead_letters"], r["load_1m_after"]]
            for rep in range(args.reps) for leg in LEGS for r in [runs[leg][rep]]]
    rows += [[f"{leg} (median)", s["wall_s"], s["wall_rate"], s["engine_s"], s["engine_rate"], "", "", ""]
             for leg, s in summary.items()]
    print_table(f"{n:,} JSON values ({results['produce']['mean_value_bytes']} bytes each, 1 % bad) over "
                f"{args.partitions} partitions into PostgreSQL, one batch each, {args.reps} rounds (alternating)",
                ["leg (round)", "wall s", "wall rec/s", "engine s", "engine rec/s", "rows", "dead letters", "load 1m"],
                rows)
    print_table("platform / hand (records/s)", ["", "medians", "median of rounds", "each round"],
                [[kind, v["medians"], v["median_of_rounds"], str(v["each_round"])] for kind, v in ratios.items()])
    print(f"load average: {results['machine']['load_avg_at_start']} at the start, "
          f"{results['machine']['load_avg_at_end']} at the end")
    print(f"results: {write_results(f'json_job-{n}', results)}\nreproduce: {results['command']}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
