"""Shared plumbing of the benchmarks: a private local stack (Kafka + PostgreSQL on loopback), a
modified ip_count spec, fast data production with Kafka's ProducerPerformance, spark-submit with
psutil RSS sampling of the whole process tree, and result tables.

Every benchmark starts its own broker and PostgreSQL under a temporary directory and stops them
at the end, so it never touches the detached demo stack or a running test suite.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psutil
import yaml

from microbatch.settings import KafkaSettings

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
APPS = ROOT / "bench" / "spark_apps"
PYTHON = sys.executable


def reproduce_command(script: str, argv: list[str]) -> str:
    return f"cd {ROOT} && PYTHONPATH=include:. .venv/bin/python bench/{script} {' '.join(argv)}".strip()


# ---------------------------------------------------------------- the stack


@dataclass
class Stack:
    work_dir: Path
    bootstrap: str
    postgres: object
    broker: object
    databases: list[str] = field(default_factory=list)

    def fresh_ledger(self, name: str) -> str:
        """A new, migrated ledger database; every measured run starts from an empty ledger."""
        from microbatch.sinks.schema import migrate

        self.postgres.create_database(name)
        url = self.postgres.url(name)
        migrate(url)
        return url


# The peer's tables (bench/spark_apps/peer_stream.py), in the peer's own database.
PEER_DDL = [
    "CREATE TABLE IF NOT EXISTS peer_stage_ip_counts (batch_id bigint NOT NULL, window_start timestamptz NOT NULL, "
    "window_end timestamptz NOT NULL, ip text NOT NULL, count bigint NOT NULL)",
    "CREATE INDEX IF NOT EXISTS ix_peer_stage ON peer_stage_ip_counts (batch_id)",
    "CREATE TABLE IF NOT EXISTS peer_ip_counts (window_start timestamptz NOT NULL, window_end timestamptz NOT NULL, "
    "ip text NOT NULL, count bigint NOT NULL, PRIMARY KEY (window_start, window_end, ip))",
    "CREATE TABLE IF NOT EXISTS peer_progress (batch_id bigint PRIMARY KEY, at timestamptz NOT NULL DEFAULT now())",
]


def create_peer_tables(url: str) -> None:
    """The peer's tables (PEER_DDL) in the database at `url`."""
    from sqlalchemy import text

    from microbatch.ledger.database import transaction

    with transaction(url) as session:
        for ddl in PEER_DDL:
            session.execute(text(ddl))


@contextmanager
def local_stack(prefix: str = "mb-bench-"):
    from microbatch.dev.kafka import KafkaBroker
    from microbatch.dev.postgres import DATABASE, LocalPostgres

    # `kill` of a bench unwinds it like Ctrl-C, so that its broker, database and Spark server stop with it.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    work = Path(tempfile.mkdtemp(prefix=prefix))
    os.chmod(work, 0o755)  # the embedded PostgreSQL may run as its own system user
    postgres = LocalPostgres(work / "postgres")
    broker = KafkaBroker(work / "kafka")
    try:
        postgres.start()
        postgres.create_database(DATABASE)
        broker.start()
        yield Stack(work, broker.bootstrap_servers, postgres, broker)
    finally:
        broker.stop()
        postgres.stop()
        shutil.rmtree(work, ignore_errors=True)


BY_BATCH_TABLE = "ip_counts_by_batch"


def write_spec(directory: Path, topics: list[str], max_records: int, shuffle_partitions: int = 4,
               batches_per_run: int = 1, contributions: str = "per_partition") -> Path:
    """ip_count.yaml reading `topics`, without its Kafka sink (no publish phase is measured). With contributions
    `per_batch`, the sink is the table BY_BATCH_TABLE (the ledger's own `ip_counts` keeps them per partition),
    which `microbatch migrate` creates."""
    spec = yaml.safe_load((ROOT / "include/pipelines/ip_count.yaml").read_text())
    spec["source"].update(topics=topics, max_records_per_batch=max_records, commit_group_offsets=False,
                          max_batches_per_run=batches_per_run)
    spec["sinks"] = [s for s in spec["sinks"] if s["type"] != "kafka"]
    if contributions != "per_partition":
        spec["sinks"][0].update(table=BY_BATCH_TABLE, contributions=contributions)
    spec["spark"]["mode"] = "submit"  # each run picks its stage: spark-submit, or bench/connect_stage.py
    spec["spark"]["conf"] = {**spec["spark"]["conf"], "spark.ui.enabled": "false",
                             "spark.sql.shuffle.partitions": str(shuffle_partitions)}
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "ip_count.yaml").write_text(yaml.safe_dump(spec))
    return directory


# ---------------------------------------------------------------- data


def payload_file(path: Path, ips: int = 10_000, seed: int = 7) -> Path:
    """One access-log line (~105 bytes) per IP, all inside one 5-second event-time window.

    ProducerPerformance picks payload lines at random, so event time cannot grow with the offset;
    keeping every line inside one window means no record is ever late, whatever the batch split,
    and every batch produces at most `ips` output rows.
    """
    from microbatch.dev.datagen import format_line

    rng = random.Random(seed)
    start = datetime(2026, 11, 22, 12, 0, 0, tzinfo=UTC)
    lines = []
    for i in range(1, ips + 1):
        ip = f"10.{i // 65536 % 256}.{i // 256 % 256}.{i % 256}"
        lines.append(format_line(ip, start + timedelta(seconds=rng.randrange(5))).decode())
    path.write_text("\n".join(lines))
    return path


def kafka_tool(main: str, *args: str, timeout: float = 3600) -> subprocess.CompletedProcess[str]:
    from microbatch.runtime import ensure_jars

    command = ["java", "-Xmx1g", "-cp", str(ensure_jars("kafka") / "*"), main, *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=True)


def produce(bootstrap: str, topic: str, records: int, payload: Path) -> dict:
    """Kafka's ProducerPerformance from the payload file; returns records/s and seconds."""
    started = time.monotonic()
    out = kafka_tool(
        "org.apache.kafka.tools.ProducerPerformance", "--topic", topic, "--num-records", str(records),
        "--throughput", "-1", "--payload-file", str(payload), "--producer-props",
        f"bootstrap.servers={bootstrap}", "acks=1", "linger.ms=20", "batch.size=524288",
        "compression.type=none", "buffer.memory=134217728",
    ).stdout
    seconds = time.monotonic() - started
    summary = [line for line in out.splitlines() if "records sent" in line][-1]
    return {"records": records, "seconds": round(seconds, 2), "tool_summary": summary.strip()}


def end_offsets(bootstrap: str, topic: str) -> dict[int, int]:
    from microbatch.kafka.offsets import discover_partitions, offset_bounds, offsets_client

    with offsets_client(KafkaSettings(bootstrap)) as consumer:
        _, latest = offset_bounds(consumer, discover_partitions(consumer, [topic]))
    return {tp.partition: offset for tp, offset in latest.items()}


def filled_topic(stack: Stack, topic: str, records: int, partitions: int) -> tuple[dict, dict[int, int], Path]:
    """A new topic holding `records` payload lines: (production figures, end offsets, a ranges file over all of it)."""
    from microbatch.dev.kafka import create_topic

    create_topic(stack.bootstrap, topic, partitions)
    produced = produce(stack.bootstrap, topic, records, payload_file(stack.work_dir / "payload.txt"))
    ends = end_offsets(stack.bootstrap, topic)
    if sum(ends.values()) != records:
        raise RuntimeError(f"the topic holds {sum(ends.values())} records, expected {records}")
    ranges = stack.work_dir / "ranges.json"
    ranges.write_text(json.dumps([{"topic": topic, "partition": p, "start": 0, "end": e}
                                  for p, e in sorted(ends.items())]))
    return produced, ends, ranges


# ---------------------------------------------------------------- processes


@dataclass
class Sampled:
    returncode: int
    seconds: float
    stdout: str
    stderr: str
    peak_rss_mb: dict[str, float]

    def json_lines(self) -> list[dict]:
        """Lines of the child's stdout that start with BENCH: and carry JSON."""
        return [json.loads(line.split("BENCH:", 1)[1]) for line in self.stdout.splitlines() if "BENCH:" in line]


def _kind(proc: psutil.Process) -> str:
    try:
        name = proc.name()
        cmd = " ".join(proc.cmdline()[:3])
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return "gone"
    if "java" in name:
        return "jvm"
    if "pyspark.daemon" in cmd or "pyspark/daemon" in cmd or "pyspark.worker" in cmd:
        return "python_workers"
    if "python" in name:
        return "python_driver"
    return "other"


def run_sampled(command: list[str], env: dict[str, str] | None = None, interval: float = 0.1,
                timeout: float = 7200, py_spy: Path | None = None) -> Sampled:
    """Run `command`, sampling the RSS of its process tree; peaks per process kind and of the tree.
    With `py_spy`, py-spy records the tree's Python driver (attached by pid once it appears, so py-spy
    is not in the sampled tree) into that file, in its raw collapsed-stack format."""
    peaks: dict[str, float] = {}
    started = time.monotonic()
    proc = subprocess.Popen(command, env={**os.environ, **(env or {})}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=ROOT)
    done = threading.Event()
    profiler: list[subprocess.Popen] = []

    def sample() -> None:
        root = psutil.Process(proc.pid)
        while not done.is_set():
            try:
                tree = [root, *root.children(recursive=True)]
            except psutil.NoSuchProcess:
                break
            if py_spy and not profiler:
                driver = next((p for p in tree if _kind(p) == "python_driver"), None)
                if driver is not None:
                    profiler.append(subprocess.Popen(
                        [str(Path(PYTHON).parent / "py-spy"), "record", "--pid", str(driver.pid), "--format", "raw",
                         "--rate", str(PY_SPY_RATE), "--nonblocking", "--output", str(py_spy)],
                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
            total = 0.0
            by_kind: dict[str, float] = {}
            for p in tree:
                try:
                    rss = p.memory_info().rss / 2**20
                except (psutil.NoSuchProcess, psutil.AccessDenied):
                    continue
                total += rss
                kind = _kind(p)
                by_kind[kind] = by_kind.get(kind, 0.0) + rss
            for kind, rss in by_kind.items():
                peaks[kind] = max(peaks.get(kind, 0.0), rss)
            peaks["tree"] = max(peaks.get("tree", 0.0), total)
            done.wait(interval)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    finally:
        done.set()
        sampler.join()
        for p in profiler:  # py-spy stops by itself when its target exits
            p.wait(timeout=60)
    return Sampled(proc.returncode, time.monotonic() - started, stdout, stderr,
                   {k: round(v, 1) for k, v in peaks.items() if k != "gone"})


def spark_env(ledger_url: str = "", bootstrap: str = "", pipelines_dir: Path | None = None) -> dict[str, str]:
    env = {
        "PYSPARK_PYTHON": PYTHON,
        "PYSPARK_DRIVER_PYTHON": PYTHON,
        "PYTHONPATH": os.pathsep.join([str(ROOT / "include"), str(ROOT)]),
        "SPARK_LOCAL_IP": "127.0.0.1",
    }
    if ledger_url:
        env["MICROBATCH_LEDGER_URL"] = ledger_url
    if bootstrap:
        env["MICROBATCH_KAFKA_BOOTSTRAP"] = bootstrap
    if pipelines_dir:
        env["MICROBATCH_PIPELINES_DIR"] = str(pipelines_dir)
    return env


def spark_submit(app: Path, args: list[str], env: dict[str, str], conf: dict[str, str] | None = None,
                 master: str = "local[2]", driver_memory: str = "2g", py_spy: Path | None = None) -> Sampled:
    """spark-submit like the stage task does (same jars, UTC session, no console progress)."""
    import pyspark

    from microbatch.runtime import spark_jars

    spark_home = Path(pyspark.__file__).parent
    settings = {
        "spark.sql.session.timeZone": "UTC",
        "spark.driver.extraJavaOptions": "-Duser.timezone=UTC",
        "spark.ui.showConsoleProgress": "false",
        "spark.ui.enabled": "false",
        "spark.pyspark.python": PYTHON,
        **(conf or {}),
    }
    command = [str(spark_home / "bin" / "spark-submit"), "--master", master, "--driver-memory", driver_memory,
               "--jars", ",".join(str(p) for p in spark_jars())]
    for key, value in settings.items():
        command += ["--conf", f"{key}={value}"]
    command += [str(app), *args]
    result = run_sampled(command, env={**spark_env(), **env, "SPARK_HOME": str(spark_home)}, py_spy=py_spy)
    if result.returncode != 0:
        tail = "\n".join((result.stdout + result.stderr).splitlines()[-40:])
        raise RuntimeError(f"spark-submit {app.name} failed ({result.returncode}):\n{tail}")
    return result


def phase(name: str, env: dict[str, str], *args: str, py_spy: Path | None = None) -> tuple[dict, Sampled]:
    """plan or commit in its own Python process (as an Airflow task would run it), RSS sampled."""
    result = run_sampled([PYTHON, str(ROOT / "bench" / "phase.py"), name, *args], env={**spark_env(), **env},
                         py_spy=py_spy)
    if result.returncode != 0:
        raise RuntimeError(f"phase {name} failed:\n{result.stderr[-3000:]}")
    return result.json_lines()[-1], result


def run_microbatch(stack: Stack, name: str, pipeline: str, spec_dir: Path, env: dict[str, str] | None = None,
                   driver_memory: str = "1g") -> tuple[str, dict[str, Any]]:
    """The pipeline `pipeline` of the specs in `spec_dir` on a fresh ledger `name` (its sinks migrated): plan
    (bench/phase.py), stage (spark-submit bench/spark_apps/stage_entry.py) and commit (bench/phase.py) until a plan
    finds nothing new. Returns the ledger's URL and the figures: "wall_s" is the plan and the commit timed inside
    their processes (as in a worker that imported them already) plus the stage's spark-submit from launch to exit;
    "processes_s" adds the plan's and the commit's Python start; "engine_s" is the stage's read and staging write as
    the ledger records them (also apart: "read_s", "stage_write_s") plus the commit; "dead_letters" the rows of the
    ledger's dead-letter table, "rows_by_sink" the rows each sink committed, "lake_commits" the table commits the
    ledger recorded. The stage is submitted with the settings the stage task gives (the sinks', then the spec's)."""
    from sqlalchemy import text

    from microbatch.config import find_spec
    from microbatch.ledger.database import transaction
    from microbatch.sinks.registry import spark_session_conf
    from microbatch.sinks.schema import migrate_sinks

    url = stack.fresh_ledger(name)
    migrate_sinks(url, spec_dir)
    spec = find_spec(pipeline, spec_dir)
    env = {"MICROBATCH_LEDGER_URL": url, "MICROBATCH_KAFKA_BOOTSTRAP": stack.bootstrap,
           "MICROBATCH_PIPELINES_DIR": str(spec_dir), **(env or {})}
    conf = {**spark_session_conf(spec), **spec.spark.conf}  # as operators.submit_conf gives them
    out = {"plan_s": 0.0, "stage_wall_s": 0.0, "commit_s": 0.0, "batches": 0, "processes_s": 0.0}
    rows: dict[str, int] = {}
    while True:
        plan, plan_proc = phase("plan", env, pipeline)
        out["processes_s"] += plan_proc.seconds
        if plan["batch_id"] is None:
            break
        stage = spark_submit(APPS / "stage_entry.py",
                             ["--pipeline", pipeline, "--batch-id", ",".join(str(b) for b in plan["batch_ids"])],
                             env, conf=conf, driver_memory=driver_memory)
        out["plan_s"] += plan["seconds"]
        out["stage_wall_s"] += stage.seconds
        out["processes_s"] += stage.seconds
        for batch_id in plan["batch_ids"]:
            commit, commit_proc = phase("commit", env, pipeline, str(batch_id))
            out["commit_s"] += commit["transaction_s"]
            out["processes_s"] += commit_proc.seconds
            out["batches"] += 1
            for sink, count in (commit.get("rows_by_sink") or {}).items():
                rows[sink] = rows.get(sink, 0) + int(count or 0)
    with transaction(url) as session:
        timings = session.execute(text("SELECT timings FROM batches ORDER BY id")).scalars().all()
        dead = session.execute(text("SELECT count(*) FROM dead_letters")).scalar_one()
        recorded = session.execute(text("SELECT count(*) FROM lake_commits")).scalar_one()
    read = sum(t.get("read_s", 0) for t in timings)
    write = sum(t.get("stage_write_s", 0) for t in timings)
    return url, {**{k: round(v, 3) for k, v in out.items()},
                 "wall_s": round(out["plan_s"] + out["stage_wall_s"] + out["commit_s"], 3),
                 "engine_s": round(read + write + out["commit_s"], 3), "read_s": round(read, 3),
                 "stage_write_s": round(write, 3), "dead_letters": dead, "rows_by_sink": rows,
                 "lake_commits": recorded}


_WARM: dict[str, object] = {}


def _warm_main(script: str, argv: list[str], env: dict[str, str], conn: object) -> None:
    """In a process forked from the warm forkserver: run bench/`script`.py's main(argv) under `env`, and send back
    (exit code, what it printed)."""
    import importlib
    import io
    from contextlib import redirect_stdout

    os.environ.update(env)
    sys.path.insert(0, str(ROOT / "bench"))
    out = io.StringIO()
    with redirect_stdout(out):
        code = importlib.import_module(script).main(argv)
    conn.send((code, out.getvalue()))  # type: ignore[attr-defined]


def warm_task(script: str, argv: list[str], env: dict[str, str]) -> tuple[dict, float]:
    """bench/`script`.py (phase or connect_stage) in a process forked from a forkserver that imported
    `microbatch.airflow.preload`, as the local stack's Airflow forks each task from a worker that did: (its
    BENCH json, wall seconds from the fork request to the result)."""
    import multiprocessing

    if "context" not in _WARM:
        # The preload imports Airflow, which reads (and may write) its config under AIRFLOW_HOME.
        os.environ.setdefault("AIRFLOW_HOME", tempfile.mkdtemp(prefix="mb-bench-airflow-"))
        context = multiprocessing.get_context("forkserver")
        context.set_forkserver_preload(["microbatch.airflow.preload"])
        starter = context.Process(target=time.sleep, args=(0,))  # starts the forkserver: not part of any timing
        starter.start()
        starter.join()
        _WARM["context"] = context
    context = _WARM["context"]
    receive, send = context.Pipe(duplex=False)  # type: ignore[attr-defined]
    started = time.monotonic()
    process = context.Process(target=_warm_main, args=(script, argv, {**spark_env(), **env}, send))  # type: ignore[attr-defined]
    process.start()
    send.close()  # the child holds the only sending end now: if it dies, recv() ends instead of waiting for ever
    try:
        code, printed = receive.recv()
    except EOFError:
        code, printed = None, "(the process died; its traceback is on stderr)"
    process.join()
    seconds = time.monotonic() - started
    if code != 0 or process.exitcode != 0:
        raise RuntimeError(f"{script} {' '.join(argv)} failed ({code}, exit {process.exitcode}):\n{printed[-3000:]}")
    lines = [json.loads(line[len("BENCH:"):]) for line in printed.splitlines() if line.startswith("BENCH:")]
    return lines[-1], seconds


# ---------------------------------------------------------------- profiles

PY_SPY_RATE = 100  # samples per second


def event_logged(directory: Path) -> dict[str, str]:
    """spark-submit conf that writes the application's event log (the data behind the Spark UI's job and
    stage pages, and what the history server replays) as one plain JSON-lines file under `directory`."""
    directory.mkdir(parents=True, exist_ok=True)
    return {"spark.eventLog.enabled": "true", "spark.eventLog.dir": directory.as_uri(),
            "spark.eventLog.compress": "false", "spark.eventLog.rolling.enabled": "false"}


TASK_METRICS = ("tasks", "run_s", "cpu_s", "read_cpu_s", "gc_s", "deserialize_s", "input_records", "shuffle_write_mb",
                "shuffle_records", "stages")


def _add_task(totals: dict[str, float], metrics: dict) -> None:
    """Add one SparkListenerTaskEnd's metrics to `totals`."""
    shuffle = metrics.get("Shuffle Write Metrics") or {}
    records = (metrics.get("Input Metrics") or {}).get("Records Read", 0)
    totals["tasks"] += 1
    totals["run_s"] += metrics.get("Executor Run Time", 0) / 1e3
    totals["cpu_s"] += metrics.get("Executor CPU Time", 0) / 1e9
    if records:
        totals["read_cpu_s"] += metrics.get("Executor CPU Time", 0) / 1e9
    totals["gc_s"] += metrics.get("JVM GC Time", 0) / 1e3
    totals["deserialize_s"] += metrics.get("Executor Deserialize Time", 0) / 1e3
    totals["input_records"] += records
    totals["shuffle_write_mb"] += shuffle.get("Shuffle Bytes Written", 0) / 2**20
    totals["shuffle_records"] += shuffle.get("Shuffle Records Written", 0)


def _events(directory: Path, names: tuple[str, ...]) -> Iterator[dict]:
    """The events named `names` from every event log in `directory`, in order."""
    for path in sorted(directory.iterdir()):
        with path.open() as log:
            for line in log:
                if any(f'"{name}"' in line for name in names):
                    yield json.loads(line)


def spark_task_metrics(directory: Path) -> dict[str, float]:
    """The Spark UI's task metrics, summed over every task of every application logged in `directory`:
    executor run, CPU, GC and deserialize time (s), records read, shuffle written (MB, records). `read_cpu_s` is the
    CPU of the tasks that read Kafka (the read, the parse, the observed counts and the map side of the aggregation);
    the rest of `cpu_s` went to the tasks after a shuffle (the aggregation's reduce side and the output's write)."""
    return task_metrics_by_group(directory, by_group=False)[""]


def task_metrics_by_group(directory: Path, by_group: bool = True) -> dict[str, dict[str, float]]:
    """`spark_task_metrics` per Spark job group (`setJobGroup`; "" for jobs outside any group): a stage counts for
    the group of the job that ran it."""
    group_of_stage: dict[int, str] = {}
    totals: dict[str, dict[str, float]] = {}
    for event in _events(directory, ("SparkListenerJobStart", "SparkListenerTaskEnd", "SparkListenerStageCompleted")):
        kind = event["Event"]
        if kind == "SparkListenerJobStart":
            group = (event.get("Properties") or {}).get("spark.jobGroup.id", "") if by_group else ""
            group_of_stage.update(dict.fromkeys(event.get("Stage IDs", []), group))
            continue
        stage = event["Stage Info"]["Stage ID"] if kind == "SparkListenerStageCompleted" else event["Stage ID"]
        group_totals = totals.setdefault(group_of_stage.get(stage, ""), dict.fromkeys(TASK_METRICS, 0.0))
        if kind == "SparkListenerStageCompleted":
            group_totals["stages"] += 1
        else:
            _add_task(group_totals, event.get("Task Metrics") or {})
    return {group: {k: round(v, 3) for k, v in t.items()} for group, t in totals.items()} or {
        "": dict.fromkeys(TASK_METRICS, 0.0)}


def py_spy_summary(path: Path, top: int = 4) -> dict:
    """From a py-spy raw profile (one `frame;frame;...;leaf count` line per distinct stack, idle samples
    left out): the Python CPU seconds it saw, the part spent importing modules, and the leaf functions
    with the largest share of the rest."""
    if not path.exists():
        return {"active_s": 0.0, "import_s": 0.0, "top": []}
    by_leaf: dict[str, int] = {}
    total = imports = 0
    for line in path.read_text(errors="replace").splitlines():
        stack, _, count = line.rpartition(" ")
        if not count.isdigit():
            continue
        total += int(count)
        if "importlib" in stack or "zipimport" in stack:
            imports += int(count)
            continue
        leaf = stack.rsplit(";", 1)[-1].strip()
        if leaf:
            function, _, where = leaf.partition(" (")
            name = f"{function} ({where.split(':', 1)[0].rsplit('/', 1)[-1]})"
            by_leaf[name] = by_leaf.get(name, 0) + int(count)
    ranked = sorted(by_leaf.items(), key=lambda item: -item[1])[:top]
    return {"active_s": round(total / PY_SPY_RATE, 3), "import_s": round(imports / PY_SPY_RATE, 3),
            "top": [(name, round(n / total, 3)) for name, n in ranked] if total else []}


# ---------------------------------------------------------------- reporting


def median(values: list[float]) -> float:
    return round(statistics.median(values), 3) if values else float("nan")


def print_table(title: str, columns: list[str], rows: list[list[object]]) -> None:
    try:
        from rich.console import Console
        from rich.table import Table

        table = Table(title=title)
        for column in columns:
            table.add_column(column, justify="right" if column != columns[0] else "left")
        for row in rows:
            table.add_row(*[_fmt(v) for v in row])
        Console(width=160).print(table)
    except ImportError:
        print(title)
        for row in [columns, *rows]:
            print(" | ".join(_fmt(v) for v in row))


def _fmt(value: object) -> str:
    if isinstance(value, float):
        return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.3g}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def write_results(name: str, payload: dict) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps(payload, indent=2, default=str))
    return path


def machine() -> dict:
    return {"cpus": os.cpu_count(), "load_avg_at_start": os.getloadavg(),
            "memory_gb": round(psutil.virtual_memory().total / 2**30, 1), "time": datetime.now(UTC).isoformat()}


def local_delta_session(app_name: str) -> Any:
    """A local Spark session (2 cores, no UI, 2 shuffle partitions) with the project's jars and every sink type's
    static settings (Delta's extension and catalog), for benchmarks of Delta operations in-process."""
    from pyspark.sql import SparkSession

    from microbatch.runtime import spark_jars
    from microbatch.sinks.registry import any_spark_session_conf

    builder = (SparkSession.builder.master("local[2]").appName(app_name)
               .config("spark.jars", ",".join(str(p) for p in spark_jars()))
               .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
               .config("spark.sql.shuffle.partitions", "2"))
    for key, value in any_spark_session_conf().items():
        builder = builder.config(key, value)
    return builder.getOrCreate()
