"""A randomized soak, in the style of Spark's Kafka stress suite: many iterations of random actions
on a pipeline subscribed by `topic_pattern`, then the exactly-once checks.

Each iteration is one of: produce lines to a matching topic; run the pipeline; run it and kill it
(SIGKILL or SIGTERM, the whole run or only the spark-submit driver) at a random moment; hard- or
soft-restart the broker; add partitions to a topic; create a new topic that matches the pattern.
The seed is printed first: the same seed replays the same actions.

After the last iteration the pipeline runs until it has caught up, and the soak checks:
- the ledger positions equal the end offsets of every partition of every matching topic;
- the ip_counts windows equal an independent recount (Flink's watermark rule over the committed batches);
- the late records equal the recount's late set, and the dead letters equal the malformed lines;
- the output topic holds a gap-free sequence and each window once;
- `microbatch verify` passes.

    PYTHONPATH=include:. .venv/bin/python -m tests.chaos.soak --iterations 50 --seed 42
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

import yaml
from kafka import KafkaConsumer, TopicPartition
from kafka.admin import KafkaAdminClient, NewPartitions
from sqlalchemy import text

from microbatch.dev import localenv
from microbatch.dev.datagen import LogLine, generate_lines, produce_lines
from microbatch.dev.kafka import KafkaBroker, create_topic
from microbatch.dev.postgres import LocalPostgres
from microbatch.ledger.database import transaction
from microbatch.sinks.schema import migrate
from tests.chaos.harness import _matching, _retrying
from tests.e2e.helpers import ROOT, committed_batches, read_output, recount, sink_counts, verify_ledger

PATTERN = "soak_.*"
OUTPUT = "soakout"
T0 = datetime(2026, 11, 22, 16, 0, 0, tzinfo=UTC)
ACTIONS = {  # name: weight
    "produce": 30, "run": 22, "run and kill": 18, "restart broker": 6, "add partitions": 12, "new topic": 12,
}


@dataclass
class Soak:
    work: Path
    seed: int
    batch_size: int = 2_000
    lines: list[LogLine] = field(default_factory=list)
    coords: list[tuple[str, int, int]] = field(default_factory=list)
    topics: dict[str, int] = field(default_factory=dict)
    done: Counter = field(default_factory=Counter)
    runs_failed: int = 0

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        self.clock = 0

    def start(self) -> None:
        localenv.apply()
        os.environ["AIRFLOW_HOME"] = str(self.work / "airflow")
        self.broker = KafkaBroker(self.work / "kafka")
        self.broker.start()
        self.postgres = LocalPostgres(self.work / "postgres")
        self.postgres.start()
        self.postgres.create_database("soak")
        self.url = self.postgres.url("soak")
        migrate(self.url)
        create_topic(self.broker.bootstrap_servers, OUTPUT, 4)
        self.new_topic()
        spec = yaml.safe_load((ROOT / "include/pipelines/ip_count.yaml").read_text())
        spec["source"].pop("topics")
        spec["source"].update(topic_pattern=PATTERN, max_records_per_batch=self.batch_size, startup="earliest",
                              commit_group_offsets=False)
        for sink in spec["sinks"]:
            if sink["type"] == "kafka":
                sink["topic"] = OUTPUT
        spec["retries"] = {"count": 2, "delay_seconds": 1}
        spec["spark"] = {"mode": "submit", "conf": {**spec["spark"]["conf"], "spark.ui.enabled": "false"}}
        self.pipelines = str(self.work / "pipelines")
        (self.work / "pipelines").mkdir()
        (self.work / "pipelines" / "ip_count.yaml").write_text(yaml.safe_dump(spec))
        self.env = {**os.environ, "MICROBATCH_LEDGER_URL": self.url,
                    "MICROBATCH_KAFKA_BOOTSTRAP": self.broker.bootstrap_servers,
                    "MICROBATCH_PIPELINES_DIR": str(self.work / "pipelines")}

    def close(self) -> None:
        """Stop everything `start` started, also when it failed partway (what it did not reach is skipped)."""
        if hasattr(self, "pipelines"):
            for proc in _matching("run_batch.py", self.pipelines) + _matching("microbatch.cli run", self.pipelines):
                proc.kill()
        for service in (getattr(self, "broker", None), getattr(self, "postgres", None)):
            if service is not None:
                service.stop()

    # actions --------------------------------------------------------------------------------------
    def produce(self) -> str:
        topic = self.rng.choice(sorted(self.topics))
        self.clock += 1
        count = self.rng.randint(200, 2_500)
        chunk = generate_lines(count, ips=25, span_seconds=30, out_of_order=0.1, malformed=0.02,
                               start=T0 + timedelta(seconds=30 * self.clock), seed=self.seed * 10_000 + self.clock)
        coords = _retrying(lambda: produce_lines(self.broker.bootstrap_servers, topic, chunk))
        self.lines.extend(chunk)
        self.coords.extend((topic, p, o) for p, o in coords)
        return f"{count} lines to {topic}"

    def run(self, kill: bool = False) -> str:
        log = (self.work / "runs.log").open("a")
        runner = subprocess.Popen([sys.executable, "-m", "microbatch.cli", "run", "ip_count", "--max-runs", "3"],
                                  env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        detail = "ran"
        if kill:
            sig = self.rng.choice([signal.SIGKILL, signal.SIGTERM])
            target = self.rng.choice(["the run", "the driver"])
            deadline = time.monotonic() + self.rng.uniform(1.5, 10)  # runs of a small batch take ~10 s
            while runner.poll() is None and time.monotonic() < deadline:
                time.sleep(0.2)
            if runner.poll() is None:
                if target == "the run":
                    os.killpg(runner.pid, sig)
                else:
                    for proc in _matching("run_batch.py", self.pipelines):
                        proc.send_signal(sig)
                detail = f"{signal.Signals(sig).name} to {target}"
            else:
                detail = "finished before the kill"
        try:
            runner.wait(timeout=900)
        except subprocess.TimeoutExpired:
            os.killpg(runner.pid, signal.SIGKILL)
            runner.wait()
            detail += ", timed out"
        for proc in _matching("run_batch.py", self.pipelines):  # a driver orphaned by a killed run
            proc.kill()
        if runner.returncode != 0:
            self.runs_failed += 1
        return f"{detail} (exit {runner.returncode})"

    def restart_broker(self) -> str:
        hard = self.rng.random() < 0.5
        self.broker.restart(hard=hard)
        return "hard" if hard else "clean"

    def add_partitions(self) -> str:
        candidates = sorted(t for t, n in self.topics.items() if n < 8)
        if not candidates:
            return self.new_topic()
        topic = self.rng.choice(candidates)
        total = self.topics[topic] + self.rng.randint(1, 2)

        def grow() -> None:
            admin = KafkaAdminClient(bootstrap_servers=self.broker.bootstrap_servers)
            try:
                admin.create_partitions({topic: NewPartitions(total_count=min(total, 8))})
            finally:
                admin.close()
        _retrying(grow)
        self.topics[topic] = min(total, 8)
        return f"{topic} now has {self.topics[topic]} partitions"

    def new_topic(self) -> str:
        name = f"soak_{len(self.topics)}"
        partitions = self.rng.randint(1, 3)
        _retrying(lambda: create_topic(self.broker.bootstrap_servers, name, partitions))
        self.topics[name] = partitions
        return f"{name} with {partitions} partitions"

    def iterate(self, iterations: int) -> None:
        names, weights = zip(*ACTIONS.items(), strict=True)
        for i in range(iterations):
            action = self.rng.choices(names, weights)[0]
            started = time.monotonic()
            detail = {
                "produce": self.produce, "run": self.run, "run and kill": lambda: self.run(kill=True),
                "restart broker": self.restart_broker, "add partitions": self.add_partitions,
                "new topic": self.new_topic,
            }[action]()
            self.done[action] += 1
            print(f"[soak {i + 1:3}/{iterations}] {action}: {detail} ({time.monotonic() - started:.0f}s)", flush=True)

    def quiesce(self) -> None:
        for _ in range(4):
            result = subprocess.run([sys.executable, "-m", "microbatch.cli", "run", "ip_count", "--max-runs", "40"],
                                    env=self.env, capture_output=True, text=True, check=False)
            if result.returncode == 0:
                return
        raise RuntimeError("the pipeline did not catch up:\n" + result.stdout[-3000:])

    # checks -----------------------------------------------------------------------------------------
    def check(self) -> list[tuple[str, bool, str]]:
        checks = []
        consumer = KafkaConsumer(bootstrap_servers=self.broker.bootstrap_servers, isolation_level="read_committed",
                                 group_id=None)
        tps = [TopicPartition(t, p) for t, n in self.topics.items() for p in range(n)]
        ends = {(tp.topic, tp.partition): end for tp, end in consumer.end_offsets(tps).items()}
        consumer.close()
        with transaction(self.url) as session:
            positions = {(t, p): o for t, p, o in session.execute(
                text("SELECT topic, partition, next_offset FROM positions")).all()}
        checks.append(("no loss: positions == end offsets of every partition", positions == ends,
                       f"{len(ends)} partitions over {len(self.topics)} topics, {sum(ends.values())} offsets"))
        expected = recount(self.lines, self.coords, committed_batches(self.url, with_topic=True))
        actual = sink_counts(self.url)
        checks.append(("no duplicate: ip_counts == recount", actual == expected.counts,
                       f"{sum(actual.values())} counted, {len(self.lines)} lines in"))
        with transaction(self.url) as session:
            late = {tuple(r) for r in session.execute(
                text('SELECT topic, partition, "offset" FROM late_records')).all()}
            dead = sorted(tuple(r) for r in session.execute(
                text('SELECT topic, partition, "offset" FROM dead_letters')).all())
        checks.append(("late records == late set", late == expected.late, f"{len(late)} late"))
        malformed = sorted(c for c, line in zip(self.coords, self.lines, strict=True) if line.malformed)
        checks.append(("dead letters == malformed set", dead == malformed, f"{len(malformed)} malformed"))
        published = read_output(self.broker.bootstrap_servers, OUTPUT)
        seqs = sorted(seq for seq, _ in published)
        keys = Counter((v["window_start"], v["ip"]) for _, v in published)
        once = seqs == list(range(1, len(seqs) + 1)) and all(n == 1 for n in keys.values())
        checks.append(("output: gap-free sequence, each window once", once, f"{len(published)} records"))
        audit = verify_ledger({"MICROBATCH_LEDGER_URL": self.url,
                               "MICROBATCH_PIPELINES_DIR": self.env["MICROBATCH_PIPELINES_DIR"]})
        checks.append(("microbatch verify", audit["ok"], "; ".join(audit["problems"]) or "ok"))
        return checks


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--iterations", type=int, default=50)
    parser.add_argument("--seed", type=int, default=None, help="replay a run; random when omitted")
    parser.add_argument("--json", type=Path, default=None, help="also write the result here")
    args = parser.parse_args()
    seed = args.seed if args.seed is not None else random.randrange(1 << 30)
    print(f"[soak] seed {seed}", flush=True)
    work = Path(tempfile.mkdtemp(prefix="microbatch-soak-"))
    soak = Soak(work, seed)
    started = time.monotonic()
    try:
        soak.start()
        soak.iterate(args.iterations)
        soak.quiesce()
        checks = soak.check()
    finally:
        soak.close()
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"soak: seed {seed}, {args.iterations} iterations, {len(soak.lines)} lines, "
                        f"{time.monotonic() - started:.0f}s")
    for column in ("check", "result", "detail"):
        table.add_column(column)
    for name, ok, detail in checks:
        table.add_row(name, "[green]PASS[/green]" if ok else "[red]FAIL[/red]", detail)
    console = Console()
    console.print("actions: " + ", ".join(f"{n} {a}" for a, n in sorted(soak.done.items())) +
                  f"; {soak.runs_failed} runs ended non-zero (killed or retried out)")
    console.print(table)
    if args.json:
        args.json.write_text(json.dumps({"seed": seed, "iterations": args.iterations, "lines": len(soak.lines),
                                         "actions": dict(soak.done), "runs_failed": soak.runs_failed,
                                         "checks": [{"check": n, "ok": ok, "detail": d} for n, ok, d in checks]},
                                        indent=2))
    print(f"work dir: {work}")
    return 0 if all(ok for _, ok, _ in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
