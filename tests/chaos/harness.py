"""The exactly-once chaos harness, modelled on Kafka's `transactions_test.py` and Kafka Streams' EOS test.

It starts its own broker and Postgres, produces input in chunks (some malformed, some late, plus
source transactions that are aborted on purpose), runs the pipeline's DAG over and over
(`microbatch run`, i.e. Airflow dag.test with real spark-submit, or on a Spark Connect server with
`--spark-remote`) while it injects faults at random
times, by SIGKILL and by SIGTERM, then quiesces and checks:

- no loss: every input offset is in a committed range (the ledger audit passes, positions reach the end);
- dead letters equal the malformed set; late records equal the late set;
- the hanging-transaction marker probe passes;
- liveness: a commit followed every fault within a bound;

and per pipeline:

- `ip_count` (access-log lines): no duplicate, the ip_counts totals equal an independent recount of the
  input; read_committed consumers of the output topic, one running during the faults and one after, each
  see every final window exactly once, with a gap-free sequence;
- `clicks` (JSON clicks, the shipped clicks.yaml with its row sinks): `clicks_raw` holds every valid click
  once with its coordinates, late ones and forgets included; `page_views` equals a recount over the
  committed batches; `user_last_page` equals the history replayed in order, tombstones included; the two
  read_committed consumers see each clicks_raw row exactly once, with a gap-free sequence.

    PYTHONPATH=include:. .venv/bin/python -m tests.chaos.harness --records 100000 --rounds 3
    PYTHONPATH=include:. .venv/bin/python -m tests.chaos.harness --pipeline clicks --records 20000 --rounds 1
    PYTHONPATH=include:. .venv/bin/python -m tests.chaos.harness --cluster --partitions 6 --records 100000 --rounds 3

With `--cluster` it runs on three KRaft brokers (replication factor 3, `min.insync.replicas` 2, replicated
offsets and transaction-state topics) and applies the cluster's fault kinds instead: the leader of a source
partition killed as the stage reads it, the leader of an output partition and the sink's transaction
coordinator killed while the publisher holds an open transaction, a broker killed between plan's offset
lookups, and two brokers down at once. A run holds at a pause failpoint while the fault hits, so every fault
applies; each killed node comes back on its ports and data a few seconds later.

A fast subset runs inside `make test` (tests/chaos/test_harness.py).
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
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psutil
from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from sqlalchemy import text

from microbatch.config import load_spec
from microbatch.dev import localenv
from microbatch.dev.datagen import (
    Click,
    LogLine,
    format_click,
    format_line,
    generate_clicks,
    generate_lines,
    produce_lines,
)
from microbatch.dev.kafka import KafkaBroker, KafkaCluster, create_topic
from microbatch.dev.postgres import LocalPostgres
from microbatch.failpoints import ARMED_FILE, FAILPOINT_DIR_ENV, RELEASE_SUFFIX, release
from microbatch.ledger.database import get_engine, transaction
from microbatch.sinks.schema import migrate
from tests.e2e.helpers import (
    clicks_raw_table,
    committed_batches,
    dead_letter_coordinates,
    expected_clicks_raw,
    expected_user_last_page,
    late_coordinates,
    page_views_table,
    pipeline_dag_folder,
    published_clicks_problems,
    read_output,
    recount,
    recount_page_views,
    sink_counts,
    user_last_page_table,
    verify_ledger,
    write_clicks_test_spec,
    write_test_spec,
)

SOURCE = "chaos_source"
PROBE = "chaos_probe"  # the cluster run's write probe while two brokers are down
# Where a run holds (a pause failpoint) while the cluster fault hits, and for how long.
HOLD_POINTS = {
    "kill the leader of a source partition as the stage reads it": "stage.before_read",
    "kill the leader of an output partition inside a publisher transaction": "publish.before_commit",
    "kill the transaction coordinator of the sink's transactional_id": "publish.before_commit",
    "kill a broker while plan lists offsets": "plan.list_offsets",
}
HOLD_SECONDS = 8
# Faults that hit a run held inside its commit, and how long the hold lasts: the killed runner never wakes; after
# a Postgres restart the held run wakes to a dead connection (a short hold keeps the wait short).
COMMIT_HOLDS = {"kill the process running the commit": 60, "restart Postgres during a commit": 15}
PIPELINES = ("ip_count", "clicks")
# What the aborted source transactions hold: a record the pipeline would take, were it ever read.
ABORTED_VALUE = {
    "ip_count": b'10.9.9.9 - - [22/Nov/2026:12:00:00 +0000] "GET / HTTP/1.1" 200 1',
    "clicks": b'{"user": "aborted", "page": "/aborted", "ts": "2026-11-22T12:00:00Z"}',
}


@dataclass
class FaultRecord:
    name: str
    sig: str
    at: float
    done: bool = False
    detail: str = ""
    recovered_s: float | None = None


@dataclass
class Check:
    name: str
    ok: bool
    detail: str


@dataclass
class Harness:
    work: Path
    records: int = 20_000
    chunks: int = 8
    batch_size: int = 4_000
    seed: int = 1
    liveness_bound_s: float = 240.0
    pipeline: str = "ip_count"  # or "clicks"
    cluster: bool = False  # three KRaft brokers, RF 3, min.insync.replicas 2, and the cluster's fault kinds
    partitions: int = 4  # of the source topic
    spark_remote: str | None = None
    """Stage on this Spark Connect server (the shipped `spark.mode: auto`, as on the local stack) instead of by
    spark-submit; the faults that kill spark-submit's driver or its Python workers then do not apply."""
    lines: list[LogLine | Click] = field(default_factory=list)
    coords: list[tuple[int, int]] = field(default_factory=list)
    faults: list[FaultRecord] = field(default_factory=list)
    runners: list[subprocess.Popen] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.pipeline not in PIPELINES:
            raise ValueError(f"the harness runs {', '.join(PIPELINES)}, not {self.pipeline}")
        self.rng = random.Random(self.seed)
        self.stop = threading.Event()
        self.loop_done = threading.Event()
        self.lock = threading.Lock()
        self.observed: list[tuple[int, dict]] = []
        self.armed: dict[str, str] = {}  # failpoints every new run gets, until disarmed
        self.bounces: list[threading.Thread] = []  # cluster nodes on their way back up

    # services -------------------------------------------------------------------------------------
    def start(self) -> None:
        localenv.apply()
        os.environ["AIRFLOW_HOME"] = str(self.work / "airflow")
        if self.cluster:
            self.kafka = KafkaCluster(self.work / "kafka")
            self.kafka.start()
            self.bootstrap = self.kafka.bootstrap_servers
            create_topic(self.bootstrap, PROBE, 1)
        else:
            self.broker = KafkaBroker(self.work / "kafka")
            self.broker.start()
            self.bootstrap = self.broker.bootstrap_servers
        self.postgres = LocalPostgres(self.work / "postgres")
        self.postgres.start()
        self.postgres.create_database("chaos")
        self.url = self.postgres.url("chaos")
        migrate(self.url)
        create_topic(self.bootstrap, SOURCE, self.partitions)
        if self.pipeline == "clicks":
            # Retries 1, 2-3 and 4-7 s apart, as before: a restarting service may need them.
            specs = write_clicks_test_spec(self.work / "pipelines", SOURCE, self.batch_size,
                                           bootstrap=self.bootstrap, spark_mode=self.spark_mode, retry_backoff=2)
            dags = pipeline_dag_folder(self.work, self.pipeline)  # the shipped dags/ would load ip_count too
        else:
            specs = write_test_spec(self.work / "pipelines", SOURCE, self.batch_size,
                                    bootstrap=self.bootstrap, spark_mode=self.spark_mode, retry_backoff=2)
            dags = {}
        self.output = f"{SOURCE}_out"
        self.env = {
            **os.environ,
            **dags,
            "MICROBATCH_LEDGER_URL": self.url,
            "MICROBATCH_KAFKA_BOOTSTRAP": self.bootstrap,
            "MICROBATCH_PIPELINES_DIR": str(specs),
            FAILPOINT_DIR_ENV: str(self.work / "failpoints"),
        }
        if self.spark_remote:
            self.env["MICROBATCH_SPARK_REMOTE"] = self.spark_remote
        else:
            self.env.pop("MICROBATCH_SPARK_REMOTE", None)
        if self.pipeline == "clicks":  # its sink tables, from the spec, as an operator makes them
            subprocess.run([sys.executable, "-m", "microbatch.cli", "migrate"], env=self.env, check=True,
                           capture_output=True, text=True, timeout=300)

    def close(self) -> None:
        """Stop everything `start` started, also when it failed partway (what it did not reach is skipped)."""
        self.stop.set()
        for runner in self.runners:
            if runner.poll() is None:
                runner.kill()
        if hasattr(self, "env"):
            for proc in _matching("run_batch.py", self.env["MICROBATCH_PIPELINES_DIR"]):
                proc.kill()
        for thread in self.bounces:
            thread.join(timeout=180)
        kafka = getattr(self, "kafka" if self.cluster else "broker", None)
        if kafka is not None:
            kafka.stop()
        if getattr(self, "postgres", None) is not None:
            self.postgres.stop()

    # input ----------------------------------------------------------------------------------------
    def produce_chunk(self, index: int) -> None:
        start = datetime(2026, 11, 22, 12, 0, 0, tzinfo=UTC) + timedelta(seconds=60 * index)
        chunk = (self._clicks_chunk if self.pipeline == "clicks" else self._lines_chunk)(index, start)
        coords = _retrying(lambda: produce_lines(self.bootstrap, SOURCE, chunk))
        self._aborted_transaction()
        with self.lock:
            self.lines.extend(chunk)
            self.coords.extend(coords)

    def _lines_chunk(self, index: int, start: datetime) -> list[LogLine]:
        chunk = generate_lines(self.records // self.chunks, ips=40, span_seconds=60, out_of_order=0.15,
                               malformed=0.02, start=start, seed=self.seed * 1000 + index)
        if index > 0:  # a few stragglers far behind: late by the time they are read
            for i in self.rng.sample(range(len(chunk)), k=max(1, len(chunk) // 100)):
                old = chunk[i]
                if not old.malformed:
                    when = old.event_time - timedelta(seconds=40)
                    chunk[i] = LogLine(format_line(old.ip, when), old.ip, when)
        return chunk

    def _clicks_chunk(self, index: int, start: datetime) -> list[Click]:
        """A minute of clicks of 40 users (3% forgets, 2% malformed); after the first chunk, 1% stragglers
        two minutes behind: in a one-minute window that the previous chunks' watermark has closed."""
        chunk = generate_clicks(self.records // self.chunks, users=40, pages=10, span_seconds=60, malformed=0.02,
                                late=0.0, forget=0.03, start=start, seed=self.seed * 1000 + index)
        if index > 0:
            for i in self.rng.sample(range(len(chunk)), k=max(1, len(chunk) // 100)):
                old = chunk[i]
                if not old.malformed:
                    payload = json.loads(old.value)
                    when = old.event_time - timedelta(seconds=130)
                    value = format_click(old.user, payload.get("page"), when, forget=bool(payload.get("forget")))
                    chunk[i] = Click(value, old.user, when)
        return chunk

    def _aborted_transaction(self) -> None:
        """Source records in a transaction that is aborted on purpose: read_committed never counts them."""
        def abort() -> None:
            producer = KafkaProducer(bootstrap_servers=self.bootstrap,
                                     transactional_id=f"chaos-aborter-{uuid.uuid4()}")
            producer.init_transactions()
            producer.begin_transaction()
            for partition in range(self.partitions):
                producer.send(SOURCE, value=ABORTED_VALUE[self.pipeline], partition=partition)
            producer.flush()
            producer.abort_transaction()
            producer.close()
        _retrying(abort)

    # the pipeline -----------------------------------------------------------------------------------
    def start_runner(self, max_runs: int = 2) -> subprocess.Popen:
        log = (self.work / "runs.log").open("a")
        runner = subprocess.Popen([sys.executable, "-m", "microbatch.cli", "run", self.pipeline, "--max-runs",
                                   str(max_runs)], env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                  start_new_session=True)
        self.runners.append(runner)
        return runner

    def pipeline_loop(self) -> None:
        while not self.loop_done.is_set():
            runner = self.start_runner()
            while runner.poll() is None and not self.loop_done.is_set():
                time.sleep(0.5)

    def consume_during(self) -> None:
        """A read_committed consumer of the output topic that runs through the faults."""
        consumer = None
        while not self.stop.is_set():
            try:
                if consumer is None:
                    consumer = KafkaConsumer(bootstrap_servers=self.bootstrap, group_id=None,
                                             isolation_level="read_committed", enable_auto_commit=False)
                    tps = [TopicPartition(self.output, p) for p in range(4)]
                    consumer.assign(tps)
                    consumer.seek_to_beginning()
                for records in consumer.poll(timeout_ms=500).values():
                    for record in records:
                        seq = int(dict(record.headers)["microbatch.seq"].decode())
                        self.observed.append((seq, json.loads(record.value)))
            except Exception:
                time.sleep(1)
        if consumer is not None:
            consumer.close()

    # faults -----------------------------------------------------------------------------------------
    @property
    def spark_mode(self) -> str:
        return "auto" if self.spark_remote else "submit"

    def fault_kinds(self) -> dict[str, Callable[[int], str]]:
        if self.cluster:
            return {
                "kill the leader of a source partition as the stage reads it": self.kill_source_leader,
                "kill the leader of an output partition inside a publisher transaction": self.kill_output_leader,
                "kill the transaction coordinator of the sink's transactional_id": self.kill_coordinator,
                "kill a broker while plan lists offsets": self.kill_broker_in_plan,
                "take two brokers down at once (min.insync.replicas 2 refuses writes)": self.two_brokers_down,
            }
        spark_submit = {} if self.spark_remote else {
            "kill the spark-submit driver": self.kill_driver,
            "kill a Spark Python worker": self.kill_python_worker,
        }
        return {
            **spark_submit,
            "kill the process running the commit": self.kill_commit,
            "kill the publisher after its Kafka commit": self.kill_publisher,
            "restart the Kafka broker": self.restart_broker,
            "restart Postgres during a commit": self.restart_postgres,
            "start a duplicate concurrent run (zombie)": self.zombie_run,
            "start a backfill overlapping the scheduled range": self.overlapping_backfill,
        }

    def kill_driver(self, sig: int) -> str:
        procs = _wait_for(lambda: _matching("run_batch.py", self.env["MICROBATCH_PIPELINES_DIR"]), 90)
        for proc in procs:
            proc.send_signal(sig)
        return f"{len(procs)} driver process(es)"

    def _arm(self, point: str) -> None:
        """Arm a failpoint in every process from now on, running ones included: they read the armed file
        at each hit. With the marker directory a failpoint fires once."""
        name, _, arg = point.partition("=")
        with self.lock:
            self.armed[name] = arg
            self._write_armed()

    def _disarm(self, name: str) -> None:
        with self.lock:
            self.armed.pop(name, None)
            self._write_armed()

    def _write_armed(self) -> None:
        path = Path(self.env[FAILPOINT_DIR_ENV]) / ARMED_FILE
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(",".join(f"{n}={a}" if a else n for n, a in self.armed.items()))
        tmp.replace(path)  # readers see the old list or the new one, never half of it

    def kill_python_worker(self, sig: int) -> str:
        """Kill the Python workers of a stage mid-read. Both jobs run in the JVM, so prepare() armed
        `stage.read` with a limit it never reaches: the records then pass through a Python (Arrow) worker,
        as in a job with Python UDFs, and that worker is the one killed."""
        try:
            procs = _wait_for(lambda: _matching("pyspark.daemon", self.env["MICROBATCH_PIPELINES_DIR"]), 180)
        finally:
            self._disarm("stage.read")
        for proc in procs:
            try:
                proc.send_signal(sig)
            except psutil.NoSuchProcess:
                continue
        return f"{len(procs)} Python worker process(es)"

    def kill_commit(self, sig: int) -> str:
        """Wait until a run is held inside its commit (before COMMIT: `prepare` armed the pause there), then
        send `sig` to every live runner. A poll for a staged batch missed the moment on Connect, where a stage
        and its commit are a second apart."""
        marker = Path(self.env[FAILPOINT_DIR_ENV]) / "commit.before_commit"
        try:
            _wait_for(marker.exists, 300)
            runners = [r for r in self.runners if r.poll() is None]
            for runner in runners:
                os.killpg(runner.pid, sig)
        finally:
            self._disarm("commit.before_commit")
        return f"{len(runners)} runner(s) held inside a commit"

    def kill_publisher(self, sig: int) -> str:
        marker = Path(self.env[FAILPOINT_DIR_ENV]) / "publish.after_commit"
        try:  # applied only once a publisher has died there: its marker file says so
            _wait_for(marker.exists, 300)
        finally:
            self._disarm("publish.after_commit")
        return "a publisher died between its Kafka commit and its progress record"

    def prepare(self, name: str, sig: int) -> None:
        """Arm what a fault needs before its input is produced, so the run that takes that input has it."""
        if self.cluster:
            self.wait_cluster_whole()
            if point := HOLD_POINTS.get(name):
                (Path(self.env[FAILPOINT_DIR_ENV]) / point).unlink(missing_ok=True)
                self._arm(f"{point}=pause:{HOLD_SECONDS}")
            return
        if name == "kill a Spark Python worker":
            self._arm("stage.read=1000000000000")
        elif name in COMMIT_HOLDS:
            for marker in ("commit.before_commit", "commit.before_commit" + RELEASE_SUFFIX):
                (Path(self.env[FAILPOINT_DIR_ENV]) / marker).unlink(missing_ok=True)
            self._arm(f"commit.before_commit=pause:{COMMIT_HOLDS[name]}")
        elif name == "kill the publisher after its Kafka commit":
            (Path(self.env[FAILPOINT_DIR_ENV]) / "publish.after_commit").unlink(missing_ok=True)
            self._arm("publish.after_commit" + ("=kill" if sig == signal.SIGKILL else ""))

    def restart_broker(self, sig: int) -> str:
        self.broker.restart(hard=sig == signal.SIGKILL)
        return f"broker back on {self.bootstrap}"

    # faults of the three-broker cluster ------------------------------------------------------------------
    def _held(self, point: str) -> None:
        """Wait until a run holds at the pause failpoint `point` (its marker file appears), then disarm it."""
        try:
            _wait_for((Path(self.env[FAILPOINT_DIR_ENV]) / point).exists, 300)
        finally:
            self._disarm(point)

    def _bounce(self, nodes: list[int], sig: int, down_s: float = 8.0) -> None:
        """Take `nodes` down by `sig` now, and start them again on their ports and data `down_s` later,
        in the background (the next fault waits until the cluster is whole and fully replicated again)."""
        for node in nodes:
            self.kafka.down(node, sig)

        def back() -> None:
            time.sleep(down_s)
            for node in nodes:
                self.kafka.node(node).launch()
            for node in nodes:
                self.kafka.node(node).wait_ready(180)
        thread = threading.Thread(target=back, daemon=True)
        thread.start()
        self.bounces.append(thread)

    def wait_cluster_whole(self) -> None:
        for thread in self.bounces:
            thread.join(timeout=240)
        _retrying(lambda: self.kafka.wait_replicated(240))

    def kill_source_leader(self, sig: int) -> str:
        self._held("stage.before_read")
        partition = self._staged_partition()
        node = self.kafka.leader_of(SOURCE, partition)
        self._bounce([node], sig)
        return f"node {node}, the leader of {SOURCE}[{partition}], in the batch being read"

    def kill_output_leader(self, sig: int) -> str:
        self._held("publish.before_commit")
        partition = self.rng.randrange(4)
        node = self.kafka.leader_of(self.output, partition)
        self._bounce([node], sig)
        return f"node {node}, the leader of {self.output}[{partition}], while the publisher's transaction was open"

    def kill_coordinator(self, sig: int) -> str:
        self._held("publish.before_commit")
        transactional_id = self._transactional_id()
        node = self.kafka.transaction_coordinator(transactional_id)
        self._bounce([node], sig)
        return f"node {node}, the transaction coordinator of {transactional_id}, while its transaction was open"

    def kill_broker_in_plan(self, sig: int) -> str:
        self._held("plan.list_offsets")
        node = self.rng.choice(sorted(self.kafka.nodes))
        led = sorted(p for p in range(self.partitions) if self.kafka.leader_of(SOURCE, p) == node)
        self._bounce([node], sig)
        return f"node {node} (leader of {SOURCE}{led}) between plan's two offset lookups"

    def two_brokers_down(self, sig: int, down_s: float = 12.0) -> str:
        nodes = self.rng.sample(sorted(self.kafka.nodes), 2)
        self._bounce(nodes, sig, down_s)
        refused = self._probe_write()
        return f"nodes {nodes[0]} and {nodes[1]} down for {down_s:.0f}s; a probe write with acks=all: {refused}"

    def _probe_write(self) -> str:
        """Write one record with acks=all while two of three brokers are down: with min.insync.replicas 2 (and
        the controller quorum lost) no broker may acknowledge it."""
        from kafka.errors import KafkaError

        producer = None
        try:
            producer = KafkaProducer(bootstrap_servers=self.bootstrap, acks="all", retries=0,
                                     request_timeout_ms=4000, max_block_ms=4000, delivery_timeout_ms=5000)
            producer.send(PROBE, b"probe").get(timeout=6)
            return "accepted"
        except KafkaError as exc:
            return f"not acknowledged ({type(exc).__name__})"
        finally:
            if producer is not None:
                producer.close(timeout=2)

    def _staged_partition(self) -> int:
        """A source partition with records in the batch the stage is about to read (else any)."""
        with transaction(self.url) as session:
            rows = session.execute(text(
                "SELECT r.partition FROM ranges r JOIN batches b ON b.id = r.batch_id WHERE b.state = 'planned' "
                "AND r.end_offset > r.start_offset ORDER BY b.id DESC")).scalars().all()
        return self.rng.choice(rows) if rows else self.rng.randrange(self.partitions)

    def _transactional_id(self) -> str:
        """The publisher's transactional_id, as the spec's Kafka sink derives it."""
        spec = load_spec(Path(self.env["MICROBATCH_PIPELINES_DIR"]) / f"{self.pipeline}.yaml")
        return next(s for s in spec.sinks if s.type == "kafka").transactional_id

    def restart_postgres(self, sig: int) -> str:
        """Restart PostgreSQL while a run is held inside its commit (`prepare` armed a short pause there)."""
        marker = Path(self.env[FAILPOINT_DIR_ENV]) / "commit.before_commit"
        try:
            _wait_for(marker.exists, 300)
            self.postgres.restart(hard=sig == signal.SIGKILL)
            # Restarted under the held run: it wakes now to a dead connection, not at the end of its hold.
            release("commit.before_commit", self.env[FAILPOINT_DIR_ENV])
        finally:
            self._disarm("commit.before_commit")
        get_engine(self.url).dispose()
        return "postgres restarted while a run was inside its commit"

    def zombie_run(self, sig: int) -> str:
        self.start_runner(max_runs=1)
        return "second runner started"

    def overlapping_backfill(self, sig: int) -> str:
        """A fill over the whole topic while the scheduled runs go on: it may only take what nobody committed."""
        log = (self.work / "runs.log").open("a")
        runner = subprocess.Popen([sys.executable, "-m", "microbatch.cli", "backfill", self.pipeline, "--topic",
                                   SOURCE, "--start", "0", "--end", "latest"], env=self.env, stdout=log,
                                  stderr=subprocess.STDOUT, start_new_session=True)
        self.runners.append(runner)
        return "backfill over [0, latest) started"

    def full_schedule(self, rounds: int) -> list[tuple[str, int]]:
        """Every fault, by SIGKILL and by SIGTERM, `rounds` times each, in a random order."""
        schedule = [(name, sig) for name in self.fault_kinds() for sig in (signal.SIGKILL, signal.SIGTERM)
                    for _ in range(rounds)]
        self.rng.shuffle(schedule)
        return schedule

    def inject(self, schedule: list[tuple[str, int]], spacing_s: tuple[float, float]) -> None:
        """Input arrives through the whole schedule: before each fault, the chunks due by then are produced,
        so every fault finds a batch to hit (and newly final windows for the publisher to publish)."""
        produced = 0
        for k, (name, sig) in enumerate(schedule):
            due = -(-(k + 1) * self.chunks // len(schedule))  # ceil: all chunks are out by the last fault
            self.prepare(name, sig)
            while produced < due:
                self.produce_chunk(produced)
                produced += 1
            time.sleep(self.rng.uniform(*spacing_s))
            record = FaultRecord(name, signal.Signals(sig).name, time.time())
            try:
                record.detail = self.fault_kinds()[name](sig)
                record.done = True
                if self.cluster:  # these wait for a run to reach its hold point, then hit at once
                    record.at = time.time()
            except TimeoutError as exc:
                record.detail = f"not applied: {exc}"
            self.faults.append(record)
            hit_at = datetime.fromtimestamp(record.at, UTC).strftime("%H:%M:%S.%f")[:-3]
            print(f"[chaos] {hit_at} {record.sig:7} {name}: {record.detail}", flush=True)

    # the run ------------------------------------------------------------------------------------------
    def run(self, schedule: list[tuple[str, int]], spacing_s: tuple[float, float] = (5, 20)) -> list[Check]:
        threading.Thread(target=self.pipeline_loop, daemon=True).start()
        consumer = threading.Thread(target=self.consume_during, daemon=True)
        consumer.start()
        self.inject(schedule, spacing_s)
        _stamp("faults done; quiescing")
        self.quiesce()
        _stamp("caught up; checking")
        checks = self.check(consumer)
        _stamp("checked")
        return checks

    def quiesce(self) -> None:
        """Stop injecting, let running work end, then run cleanly until caught up and published."""
        self.stop_loop()
        for _ in range(4):
            result = subprocess.run([sys.executable, "-m", "microbatch.cli", "run", self.pipeline, "--max-runs", "30"],
                                    env=self.env,  # stop_loop() disarmed every failpoint
                                    capture_output=True, text=True, check=False)
            if result.returncode == 0:
                return
            (self.work / "quiesce.log").write_text(result.stdout + result.stderr)
        raise RuntimeError("the pipeline did not catch up after the faults:\n" + result.stdout[-3000:])

    def stop_loop(self) -> None:
        _stamp("stopping the loop")
        with self.lock:
            self.armed.clear()
            self._write_armed()
        self.loop_done.set()
        deadline = time.time() + 300
        for runner in self.runners:
            while runner.poll() is None and time.time() < deadline:
                time.sleep(1)
            if runner.poll() is None:
                runner.kill()

    # checks -------------------------------------------------------------------------------------------
    def check(self, consumer: threading.Thread) -> list[Check]:
        if self.pipeline == "clicks":
            return self.check_clicks(consumer)
        checks = []
        expected = recount(self.lines, self.coords, committed_batches(self.url))
        good = sum(1 for line in self.lines if not line.malformed)
        actual = sink_counts(self.url)
        checks.append(Check("no duplicate: ip_counts == recount", actual == expected.counts,
                            f"{sum(actual.values())} counted, {len(expected.late)} late, {good} well-formed lines"))
        audit = verify_ledger({"MICROBATCH_LEDGER_URL": self.url, "MICROBATCH_PIPELINES_DIR":
                               self.env["MICROBATCH_PIPELINES_DIR"]})
        ends = _end_offsets(self.bootstrap, SOURCE, self.partitions)
        with transaction(self.url) as session:
            positions = dict(session.execute(text("SELECT partition, next_offset FROM positions")).all())
        checks.append(Check("no loss: ranges cover every offset to the end", audit["ok"] and positions == ends,
                            f"{audit['ranges']} committed ranges, positions {positions}, ends {ends}"))
        checks.append(Check("microbatch verify", audit["ok"], "; ".join(audit["problems"]) or "ok"))
        malformed = sorted(c for c, line in zip(self.coords, self.lines, strict=True) if line.malformed)
        checks.append(Check("dead letters == malformed set", dead_letter_coordinates(self.url) == malformed,
                            f"{len(malformed)} malformed"))
        checks.append(Check("late records == late set", late_coordinates(self.url) == expected.late,
                            f"{len(expected.late)} late"))
        final = {(start.isoformat(), ip): n for (start, ip), n in expected.counts.items()
                 if start + timedelta(seconds=5) <= expected.watermark}
        _stamp("ledger checked")
        after = read_output(self.bootstrap, self.output)
        _stamp("output read")
        checks.append(Check("read_committed consumer after: each final window once", _published_ok(after, final),
                            f"{len(after)} records, {len(final)} final windows"))
        deadline = time.time() + 60
        while len(self.observed) < len(after) and time.time() < deadline:
            time.sleep(1)
        self.stop.set()
        consumer.join(timeout=10)
        checks.append(Check("read_committed consumer during faults: each final window once",
                            _published_ok(self.observed, final), f"{len(self.observed)} records"))
        _stamp("observed")
        checks.append(Check("no hanging transaction (marker probe)", _marker_probe(self.bootstrap,
                                                                                   self.output), "markers visible"))
        checks.append(self._liveness())
        return checks

    def check_clicks(self, consumer: threading.Thread) -> list[Check]:
        """The checks of the clicks pipeline, each against an oracle computed from the produced clicks."""
        checks = []
        raw = expected_clicks_raw(self.lines, self.coords)
        actual_raw = clicks_raw_table(self.url)
        forgets = sum(1 for facts in raw.values() if facts[1] is None)
        checks.append(Check("no loss, no duplicate: clicks_raw == every valid click once, with its coordinates",
                            actual_raw == raw, f"{len(actual_raw)} rows, {len(raw)} valid clicks ({forgets} forgets)"))
        batches = committed_batches(self.url)
        expected = recount_page_views(self.lines, self.coords, batches)
        views = page_views_table(self.url)
        checks.append(Check("no duplicate: page_views == recount over the committed batches",
                            views == expected.counts, f"{sum(views.values())} views in {len(views)} windows, "
                            f"{len(batches)} batches"))
        winners = expected_user_last_page(self.lines, self.coords)
        checks.append(Check("user_last_page == the history replayed in order, tombstones included",
                            user_last_page_table(self.url) == winners,
                            f"{len(winners)} users, {len({f[0] for f in raw.values()}) - len(winners)} forgotten"))
        audit = json.loads(subprocess.run(
            [sys.executable, "-m", "microbatch.cli", "verify", self.pipeline, "--json"], env=self.env,
            capture_output=True, text=True, timeout=120, check=False).stdout)
        ends = _end_offsets(self.bootstrap, SOURCE, self.partitions)
        with transaction(self.url) as session:
            positions = dict(session.execute(text("SELECT partition, next_offset FROM positions")).all())
        checks.append(Check("no loss: ranges cover every offset to the end", audit["ok"] and positions == ends,
                            f"{audit['ranges']} committed ranges, positions {positions}, ends {ends}"))
        checks.append(Check("microbatch verify", audit["ok"], "; ".join(audit["problems"]) or "ok"))
        malformed = sorted(c for c, click in zip(self.coords, self.lines, strict=True) if click.malformed)
        checks.append(Check("dead letters == malformed set", dead_letter_coordinates(self.url) == malformed,
                            f"{len(malformed)} malformed"))
        checks.append(Check("late records == late set", late_coordinates(self.url) == expected.late,
                            f"{len(expected.late)} late"))
        _stamp("ledger checked")
        after = read_output(self.bootstrap, self.output)
        _stamp("output read")
        problems = published_clicks_problems(after, raw)
        checks.append(Check("read_committed consumer after: each clicks_raw row once", not problems,
                            "; ".join(problems) or f"{len(after)} records"))
        deadline = time.time() + 60
        while len(self.observed) < len(after) and time.time() < deadline:
            time.sleep(1)
        self.stop.set()
        consumer.join(timeout=10)
        problems = published_clicks_problems(self.observed, raw)
        checks.append(Check("read_committed consumer during faults: each clicks_raw row once", not problems,
                            "; ".join(problems) or f"{len(self.observed)} records"))
        _stamp("observed")
        checks.append(Check("no hanging transaction (marker probe)", _marker_probe(self.bootstrap,
                                                                                   self.output), "markers visible"))
        checks.append(self._liveness())
        return checks

    def _liveness(self) -> Check:
        with transaction(self.url) as session:
            commits = [t.timestamp() for t in session.execute(
                text("SELECT committed_at FROM batches WHERE committed_at IS NOT NULL ORDER BY 1")).scalars()]
        worst, idle = 0.0, 0
        for fault in self.faults:
            later = [t for t in commits if t > fault.at]
            if not later:
                # Nothing was committed after it: all input was already committed before the fault (the
                # no-loss check proves the ranges reach the topic's end), so there was nothing to recover.
                idle += 1
                continue
            fault.recovered_s = later[0] - fault.at
            worst = max(worst, fault.recovered_s)
        return Check(f"liveness: a commit within {self.liveness_bound_s:.0f}s of every fault",
                     worst <= self.liveness_bound_s,
                     f"worst {worst:.0f}s over {len(self.faults) - idle} faults"
                     + (f" ({idle} after the last input was committed)" if idle else ""))


def _published_ok(published: list[tuple[int, dict]], final: dict) -> bool:
    seqs = sorted(seq for seq, _ in published)
    if seqs != list(range(1, len(seqs) + 1)):
        return False
    got = {(datetime.fromisoformat(v["window_start"]).astimezone(UTC).isoformat(), v["ip"]): v["count"]
           for _, v in published}
    return len(got) == len(published) and got == final


def _marker_probe(bootstrap: str, topic: str) -> bool:
    probe = KafkaProducer(bootstrap_servers=bootstrap, transactional_id=f"probe-{uuid.uuid4()}")
    probe.init_transactions()
    probe.begin_transaction()
    marker = uuid.uuid4().hex.encode()
    for partition in range(4):
        probe.send(topic, value=marker, partition=partition)
    probe.commit_transaction()
    probe.close()
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, isolation_level="read_committed", group_id=None)
    consumer.assign([TopicPartition(topic, p) for p in range(4)])
    consumer.seek_to_beginning()
    seen: set[int] = set()
    deadline = time.monotonic() + 30
    while len(seen) < 4 and time.monotonic() < deadline:
        for tp, records in consumer.poll(timeout_ms=500).items():
            seen.update(tp.partition for r in records if r.value == marker)
    consumer.close()
    return len(seen) == 4


def _end_offsets(bootstrap: str, topic: str, partitions: int) -> dict[int, int]:
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, isolation_level="read_committed", group_id=None)
    try:
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        return {tp.partition: end for tp, end in consumer.end_offsets(tps).items()}
    finally:
        consumer.close()


def _matching(needle: str, pipelines_dir: str | None = None) -> list[psutil.Process]:
    """Processes whose command line holds `needle`; with `pipelines_dir`, only those of this harness
    (their MICROBATCH_PIPELINES_DIR), so a fault never reaches another run on the same machine."""
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        cmdline = " ".join(proc.info["cmdline"] or [])
        if needle in cmdline and "pytest" not in cmdline:
            if pipelines_dir is not None:
                try:
                    if proc.environ().get("MICROBATCH_PIPELINES_DIR") != pipelines_dir:
                        continue
                except psutil.Error:
                    continue
            found.append(proc)
    return found


def _stamp(what: str) -> None:
    print(f"[chaos] {datetime.now(UTC):%H:%M:%S.%f}"[:-3] + f" {what}", flush=True)


def _wait_for(probe: Callable[[], object], timeout: float) -> object:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = probe()
        if value:
            return value
        time.sleep(0.2)
    raise TimeoutError(f"condition not reached within {timeout:.0f}s")


def _retrying(action: Callable[[], object], attempts: int = 10) -> object:
    for attempt in range(attempts):
        try:
            return action()
        except Exception:
            if attempt == attempts - 1:
                raise
            time.sleep(3)
    return None


def print_report(harness: Harness, checks: list[Check]) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    faults = Table(title="faults")
    for column in ("signal", "fault", "applied", "commit after (s)", "detail"):
        faults.add_column(column)
    for f in harness.faults:
        faults.add_row(f.sig, f.name, "yes" if f.done else "no",
                       "-" if f.recovered_s is None else f"{f.recovered_s:.0f}", f.detail)
    console.print(faults)
    table = Table(title=f"exactly-once checks over {len(harness.lines)} lines")
    for column in ("check", "result", "detail"):
        table.add_column(column)
    for c in checks:
        table.add_row(c.name, "[green]PASS[/green]" if c.ok else "[red]FAIL[/red]", c.detail)
    console.print(table)


def run_and_check(harness: Harness, schedule: list[tuple[str, int]], spacing_s: tuple[float, float]) -> list[Check]:
    """What each fast subset in `make test` does: start, run the schedule, print the report, then require every
    fault applied and every check passed."""
    try:
        harness.start()
        checks = harness.run(schedule, spacing_s=spacing_s)
    finally:
        harness.close()
    print_report(harness, checks)
    assert all(f.done for f in harness.faults), [(f.name, f.detail) for f in harness.faults]
    failed = [(c.name, c.detail) for c in checks if not c.ok]
    assert not failed, failed
    return checks


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--chunks", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=3, help="times each fault is applied per signal")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--pipeline", choices=PIPELINES, default="ip_count")
    parser.add_argument("--liveness-bound", type=float, default=300.0, help="seconds from a fault to the next commit")
    parser.add_argument("--cluster", action="store_true",
                        help="three KRaft brokers (RF 3, min.insync.replicas 2) and the cluster's fault kinds")
    parser.add_argument("--partitions", type=int, default=4, help="of the source topic")
    parser.add_argument("--spark-remote", default=None, metavar="sc://HOST:PORT",
                        help="stage on this Spark Connect server instead of by spark-submit "
                             "(the spark-submit fault kinds then do not apply)")
    parser.add_argument("--json", type=Path, default=None, help="also write the result here")
    args = parser.parse_args()
    started = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix="microbatch-chaos-"))
    harness = Harness(work, args.records, args.chunks, args.batch_size, args.seed, args.liveness_bound,
                      args.pipeline, cluster=args.cluster, partitions=args.partitions, spark_remote=args.spark_remote)
    schedule = harness.full_schedule(args.rounds)
    harness.chunks = max(harness.chunks, len(schedule))  # at least one fresh chunk before every fault
    try:
        harness.start()
        checks = harness.run(schedule)
    finally:
        harness.close()
    print_report(harness, checks)
    print(f"{len(harness.lines)} lines, {len(harness.faults)} faults, {time.monotonic() - started:.0f}s; "
          f"work dir: {work}")
    if args.json:
        args.json.write_text(json.dumps({
            "pipeline": args.pipeline, "records": len(harness.lines), "seed": args.seed,
            "brokers": 3 if args.cluster else 1, "partitions": args.partitions,
            "seconds": round(time.monotonic() - started),
            "faults": [{"fault": f.name, "signal": f.sig, "applied": f.done, "commit_after_s": f.recovered_s,
                        "detail": f.detail} for f in harness.faults],
            "checks": [{"check": c.name, "ok": c.ok, "detail": c.detail} for c in checks],
        }, indent=2))
    return 0 if all(c.ok for c in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
