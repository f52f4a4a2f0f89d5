"""Change data capture for the local stack (`make cdc`) and the tests: a source PostgreSQL with logical decoding, a
Kafka Connect worker (`ConnectStandalone`, the Apache jars of `ensure_jars("connect")`) with Debezium's PostgreSQL
connector as its plugin (`ensure_jars("debezium")`), and the REST calls that register a connector and wait for it.

The database password never reaches a connector's config: the worker reads it from an owner-only file of its own
through Kafka's FileConfigProvider (`${file:...}`), so neither the REST API, the worker's log nor this module's
log shows it. A standalone worker keeps its connectors only while it runs: each registered connector's config is
also kept as a file that the next start of the worker passes on its command line, so a killed and restarted worker
carries on from the offsets in its offset file.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from microbatch.dev.kafka import DEV_JVM_OPTIONS
from microbatch.dev.postgres import DATABASE, LocalPostgres
from microbatch.dev.process import free_port, port_open, terminate_group, wait_until
from microbatch.runtime import ensure_jars

log = logging.getLogger(__name__)

SOURCE_SETTINGS = {"wal_level": "logical", "max_replication_slots": "10", "max_wal_senders": "10"}
"""The server settings of a source database: logical decoding, and slots and senders for a few connectors."""
POSTGRES_CONNECTOR = "io.debezium.connector.postgresql.PostgresConnector"
WORKER_CLASS = "org.apache.kafka.connect.cli.ConnectStandalone"
PROCESS_MARKER = WORKER_CLASS.encode()
"""In the worker JVM's command line: how the stack recognises its worker's pid."""
HEAP = "384m"
PLUGIN_NAME = "debezium-connector-postgres"


def source_postgres(work_dir: Path, port: int | None = None) -> LocalPostgres:
    """A PostgreSQL with logical decoding (`SOURCE_SETTINGS`), not started; its user is the cluster's superuser, who
    may replicate and create the publication."""
    return LocalPostgres(work_dir, port, settings=SOURCE_SETTINGS)


def worker_properties(bootstrap_servers: str, port: int, work_dir: Path, plugin_path: Path, secrets_dir: Path, *,
                      schemas_enable: bool = True) -> dict[str, str]:
    """The standalone worker's settings: JSON keys and values (with their schemas unless `schemas_enable` is off:
    Debezium's default is on), source offsets in a file of `work_dir` flushed every second, the REST API on
    127.0.0.1 only, Debezium's plugin folder, and the file config provider for the files of `secrets_dir`."""
    schemas = str(schemas_enable).lower()
    return {
        "bootstrap.servers": bootstrap_servers,
        "key.converter": "org.apache.kafka.connect.json.JsonConverter",
        "value.converter": "org.apache.kafka.connect.json.JsonConverter",
        "key.converter.schemas.enable": schemas,
        "value.converter.schemas.enable": schemas,
        "offset.storage.file.filename": str(work_dir / "offsets.dat"),
        "offset.flush.interval.ms": "1000",
        "listeners": f"http://127.0.0.1:{port}",
        "rest.advertised.host.name": "127.0.0.1",
        "rest.advertised.port": str(port),
        "plugin.path": str(plugin_path),
        "plugin.discovery": "service_load",
        "config.providers": "file",
        "config.providers.file.class": "org.apache.kafka.common.config.provider.FileConfigProvider",
        "config.providers.file.param.allowed.paths": str(secrets_dir),
    }


def postgres_connector_config(source: LocalPostgres, *, tables: list[str], topic_prefix: str, slot: str,
                              password_reference: str, database: str = DATABASE, decimal_handling: str = "precise",
                              partitions: int = 1, extra: dict[str, str] | None = None) -> dict[str, str]:
    """The config of a Debezium PostgreSQL connector for `tables` (`schema.table`) of `source`: pgoutput, a
    publication of those tables only, an initial snapshot, and Connect creating each `<prefix>.<schema>.<table>` topic
    with `partitions` partitions (this project's brokers do not create topics on first use). The password is
    `password_reference`, a `${file:...}` the worker resolves: this dict holds no secret."""
    return {
        "connector.class": POSTGRES_CONNECTOR,
        "tasks.max": "1",
        "plugin.name": "pgoutput",
        "database.hostname": "127.0.0.1",
        "database.port": str(source.port),
        "database.user": source.user,
        "database.password": password_reference,
        "database.dbname": database,
        "topic.prefix": topic_prefix,
        "table.include.list": ",".join(tables),
        "slot.name": slot,
        "publication.name": f"{slot}_publication",
        "publication.autocreate.mode": "filtered",
        "decimal.handling.mode": decimal_handling,
        "snapshot.mode": "initial",
        "topic.creation.default.partitions": str(partitions),
        "topic.creation.default.replication.factor": "-1",
        **(extra or {}),
    }


def topic_name(prefix: str, table: str) -> str:
    """Debezium's topic for `table` (`schema.table`): `<prefix>.<schema>.<table>`."""
    return f"{prefix}.{table}"


class KafkaConnectWorker:
    """One standalone Kafka Connect worker JVM (its own process group) against `bootstrap_servers`, its REST API on
    127.0.0.1, its offsets, log, secrets and connector configs under `work_dir`."""

    def __init__(self, work_dir: Path, bootstrap_servers: str, port: int | None = None, *,
                 schemas_enable: bool = True, heap: str = HEAP) -> None:
        self.work_dir = Path(work_dir)
        self.bootstrap_servers = bootstrap_servers
        self.port = port or free_port()
        self.schemas_enable = schemas_enable
        self.heap = heap
        self.process: subprocess.Popen[bytes] | None = None
        self.log_file = self.work_dir / "connect.log"
        self.secrets_dir = self.work_dir / "secrets"
        self.connectors_dir = self.work_dir / "connectors"

    @property
    def rest_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def _configure(self) -> Path:
        for folder in (self.work_dir, self.secrets_dir, self.connectors_dir, self.work_dir / "plugins"):
            folder.mkdir(parents=True, exist_ok=True)
        self.secrets_dir.chmod(0o700)
        # plugin.path names folders of plugins, each a folder of jars: the Debezium jars are one, linked here.
        plugin = self.work_dir / "plugins" / PLUGIN_NAME
        jars = ensure_jars("debezium")
        if not plugin.is_symlink() or plugin.resolve() != jars.resolve():
            plugin.unlink(missing_ok=True)
            plugin.symlink_to(jars, target_is_directory=True)
        settings = worker_properties(self.bootstrap_servers, self.port, self.work_dir, self.work_dir / "plugins",
                                     self.secrets_dir, schemas_enable=self.schemas_enable)
        properties = self.work_dir / "worker.properties"
        properties.write_text("".join(f"{k}={v}\n" for k, v in settings.items()))
        (self.work_dir / "log4j2.properties").write_text(
            "rootLogger.level = INFO\nrootLogger.appenderRef.file.ref = FILE\n"
            "appender.file.type = File\nappender.file.name = FILE\n"
            f"appender.file.fileName = {self.log_file}\n"
            "appender.file.layout.type = PatternLayout\nappender.file.layout.pattern = [%d] %p %m (%c)%n\n"
            "logger.reflections.name = org.reflections\nlogger.reflections.level = ERROR\n"
        )
        return properties

    def command(self) -> list[str]:
        properties = self._configure()
        connectors = sorted(str(p) for p in self.connectors_dir.glob("*.json"))
        return ["java", f"-Xmx{self.heap}", "-Xms64m", *DEV_JVM_OPTIONS, "-Djava.awt.headless=true",
                f"-Dlog4j2.configurationFile={self.work_dir / 'log4j2.properties'}",
                "-cp", str(ensure_jars("connect") / "*"), WORKER_CLASS, str(properties), *connectors]

    def start(self, timeout: float = 90) -> KafkaConnectWorker:
        """Start the JVM with the connectors registered before (their configs' files) and wait until its REST API
        lists connectors; a worker that does not come up is stopped."""
        if self.running:
            return self
        command = self.command()
        out = (self.work_dir / "connect.out").open("ab")
        self.process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                                        cwd=self.work_dir)
        out.close()
        process = self.process

        def ready() -> bool:
            if process.poll() is not None:
                raise RuntimeError(f"the Kafka Connect worker exited with {process.returncode}; see {self.log_file}")
            return port_open(self.port) and isinstance(self._get("/connectors", quiet=True), list)

        try:
            wait_until(ready, timeout, f"Kafka Connect worker on {self.rest_url}", self.log_file)
        except BaseException:
            self.stop()
            raise
        log.info("Kafka Connect worker up on %s (pid %s)", self.rest_url, process.pid)
        return self

    def stop(self, timeout: float = 30) -> None:
        """SIGTERM (the worker stops its connectors and flushes their offsets), then SIGKILL after `timeout`."""
        if self.running:
            assert self.process is not None
            terminate_group(self.process, timeout)

    def kill(self) -> None:
        """SIGKILL the worker's process group: a crash (offsets not flushed since the last second are lost)."""
        if self.running:
            assert self.process is not None
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()

    def wait_offsets_flushed(self, since: float, timeout: float = 30) -> None:
        """Wait until the worker writes its offset file after the wall-clock time `since` (every second while its
        connectors have records Kafka acknowledged): the records written before `since` then survive a SIGKILL.
        Without a flush, a restarted Debezium connector resumes from the offsets before (or snapshots again)."""
        offsets = self.work_dir / "offsets.dat"

        def flushed() -> bool:
            with contextlib.suppress(OSError):
                return offsets.stat().st_mtime > since and offsets.stat().st_size > 0
            return False

        wait_until(flushed, timeout, f"an offset flush of the Kafka Connect worker {self.rest_url}", self.log_file)

    def restart(self, hard: bool = False, timeout: float = 90) -> None:
        """Stop (SIGKILL when `hard`) and start again on the same port, offsets and connectors."""
        self.kill() if hard else self.stop()
        self.start(timeout)

    def __enter__(self) -> KafkaConnectWorker:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def secret_reference(self, name: str, value: str) -> str:
        """Keep `value` in an owner-only file of the worker; return the `${file:...}` that the worker resolves to it
        in a connector's config."""
        path = self.secrets_dir / f"{name}.properties"
        self.secrets_dir.mkdir(parents=True, exist_ok=True)
        path.touch(mode=0o600)
        path.chmod(0o600)
        escaped = value.replace("\\", "\\\\").replace("\n", "\\n")  # a Java properties file's escapes
        path.write_text(f"value={escaped}\n")
        return f"${{file:{path}:value}}"

    def put_connector(self, name: str, config: dict[str, str]) -> None:
        """Create or update connector `name` (PUT /connectors/NAME/config) and keep its config for the next start.
        The config is never logged (a config from elsewhere may hold a password)."""
        self._request("PUT", f"/connectors/{name}/config", config)
        self.save_connector(name, config)
        log.info("registered connector %s on %s", name, self.rest_url)

    def save_connector(self, name: str, config: dict[str, str]) -> None:
        """Keep connector `name`'s config in the file that each start of the worker passes to it (owner-only)."""
        path = self.connectors_dir / f"{name}.json"
        self.connectors_dir.mkdir(parents=True, exist_ok=True)
        path.touch(mode=0o600)
        path.write_text(json.dumps({"name": name, "config": config}, indent=1))

    def delete_connector(self, name: str) -> None:
        with contextlib.suppress(urllib.error.HTTPError):
            self._request("DELETE", f"/connectors/{name}")
        (self.connectors_dir / f"{name}.json").unlink(missing_ok=True)

    def status(self, name: str) -> dict[str, Any] | None:
        """GET /connectors/NAME/status, or None while the worker does not know it (yet)."""
        answer = self._get(f"/connectors/{name}/status", quiet=True)
        return answer if isinstance(answer, dict) and "connector" in answer else None

    def wait_running(self, name: str, timeout: float = 60) -> None:
        """Wait until connector `name` and each of its tasks are RUNNING; a FAILED one raises with its error."""
        def running() -> bool:
            if self.process is not None and self.process.poll() is not None:  # a connector from a file failed
                raise RuntimeError(f"the Kafka Connect worker exited with {self.process.returncode}; see "
                                   f"{self.log_file}")
            return connector_running(self.status(name))

        wait_until(running, timeout, f"connector {name} RUNNING", self.log_file)

    def postgres_config(self, source: LocalPostgres, *, name: str, tables: list[str], topic_prefix: str,
                        slot: str | None = None, **options: Any) -> dict[str, str]:
        """The config of a Debezium PostgreSQL connector `name` for `tables` of `source`, its password kept in a
        secret file of this worker (`postgres_connector_config`; the slot is the name, `-` as `_`)."""
        return postgres_connector_config(source, tables=tables, topic_prefix=topic_prefix,
                                         slot=slot or name.replace("-", "_"),
                                         password_reference=self.secret_reference(name, source.password), **options)

    def register_postgres(self, source: LocalPostgres, *, name: str, tables: list[str], topic_prefix: str,
                          slot: str | None = None, timeout: float = 60, **options: Any) -> dict[str, str]:
        """Register a Debezium PostgreSQL connector `name` for `tables` of `source` (`postgres_config`) and wait
        until it runs; return its config (without the password)."""
        config = self.postgres_config(source, name=name, tables=tables, topic_prefix=topic_prefix, slot=slot,
                                      **options)
        self.put_connector(name, config)
        self.wait_running(name, timeout)
        return config

    def _get(self, path: str, quiet: bool = False) -> Any:
        try:
            return self._request("GET", path)
        except (OSError, ValueError):
            if quiet:
                return None
            raise

    def _request(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(f"{self.rest_url}{path}", data=data, method=method,
                                         headers={"Content-Type": "application/json", "Accept": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                text = response.read()
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode(errors="replace")[:500]
            raise urllib.error.HTTPError(exc.url, exc.code, f"{method} {path}: {detail}", exc.headers, None) from None
        return json.loads(text) if text else None


def connector_running(status: dict[str, Any] | None) -> bool:
    """Whether a connector status (GET /connectors/NAME/status) says the connector and all of its tasks, at least
    one, are RUNNING; a FAILED connector or task raises RuntimeError with the first line of its trace."""
    if not status:
        return False
    states = [status["connector"], *status.get("tasks", [])]
    for state in states:
        if state.get("state") == "FAILED":
            trace = (state.get("trace") or "no trace").strip().splitlines()[0]
            raise RuntimeError(f"connector {status.get('name')} failed: {trace}")
    return len(states) > 1 and all(state.get("state") == "RUNNING" for state in states)


def wait_for_topic(bootstrap_servers: str, topic: str, timeout: float = 60) -> None:
    """Wait until `topic` exists with a leader for each partition (Connect creates a table's topic with its first
    record)."""
    from microbatch.dev.kafka import describe_partitions

    def exists() -> bool:
        with contextlib.suppress(Exception):
            described = describe_partitions(bootstrap_servers, [topic])
            return bool(described) and all(info["leader"] >= 0 for info in described.values())
        return False

    wait_until(exists, timeout, f"topic {topic}")



# The local stack's CDC (`make cdc`): its state keys in the stack's state file, its folder, its sample table.
STATE_KEYS = ("cdc_source_port", "cdc_worker_port", "cdc_worker_pid")
SAMPLE_TABLE = "public.orders"
SAMPLE_CONNECTOR = "orders-cdc"
SAMPLE_PREFIX = "cdc"
SAMPLE_SQL = """
CREATE TABLE IF NOT EXISTS public.orders (
    region text NOT NULL,
    order_id bigint NOT NULL,
    amount numeric(12, 2) NOT NULL,
    placed_at timestamptz NOT NULL DEFAULT now(),
    note text,
    description text NOT NULL DEFAULT '',
    PRIMARY KEY (region, order_id)
);
INSERT INTO public.orders (region, order_id, amount, placed_at, note, description)
SELECT region, order_id, amount, placed_at, note,
       (SELECT string_agg(md5(order_id::text || i::text), '') FROM generate_series(1, 300) AS i)
FROM (VALUES ('eu', 1, 12.34, timestamptz '2026-01-02 03:04:05.678+00', 'first'),
             ('eu', 2, 0.99, timestamptz '2026-01-02 03:05:00+00', NULL),
             ('us', 1, 1234567890.12, timestamptz '2026-01-03 10:00:00+00', 'large amount'),
             ('us', 2, -5.00, timestamptz '2026-01-03 11:00:00+00', NULL)) AS rows (region, order_id, amount,
                                                                                  placed_at, note)
ON CONFLICT DO NOTHING;
"""
"""The sample table of `make cdc`: a composite primary key, a numeric(12,2), a timestamptz, a nullable column and a
large (TOASTed, 9,600 characters) text, with four rows."""


def stack_root() -> Path:
    from microbatch.runtime import cache_dir

    return cache_dir() / "devstack" / "cdc"


def _worker_alive(state: dict) -> bool:
    from microbatch.dev.stopping import runs

    pid, port = state.get("cdc_worker_pid"), state.get("cdc_worker_port")
    return bool(pid and port) and runs(pid, PROCESS_MARKER) and port_open(port)


def start_stack(state: dict, bootstrap_servers: str, record: Callable[[dict], None]) -> None:
    """`make cdc`, once the stack's Kafka runs: start (or reuse) the source PostgreSQL and the worker under
    `.cache/devstack/cdc`, on their recorded ports while those are free, and `record` their state keys; create the
    sample table, register its connector (a worker that starts creates it from its file, with the source's port of
    now) and wait until it runs and its topic exists; print what runs, never the password."""
    root = stack_root()
    port = state.get("cdc_source_port")
    source = source_postgres(root / "postgres", port)
    if not (port and port_open(port)):  # not running: start it, on its recorded port (free, as it is closed)
        source.start()
    try:
        source.create_database(DATABASE)
        _run_sql(source, SAMPLE_SQL)
        worker_port = state.get("cdc_worker_port")
        alive = _worker_alive(state)
        worker = KafkaConnectWorker(root / "connect", bootstrap_servers,
                                    worker_port if alive or (worker_port and not port_open(worker_port)) else None)
        if not alive:
            worker.save_connector(SAMPLE_CONNECTOR, worker.postgres_config(
                source, name=SAMPLE_CONNECTOR, tables=[SAMPLE_TABLE], topic_prefix=SAMPLE_PREFIX))
            worker.start()
    except BaseException:  # nothing recorded yet, so `down` would not find it: stop it here
        source.stop()
        raise
    recorded = {"cdc_source_port": source.port, "cdc_worker_port": worker.port,
                "cdc_worker_pid": state["cdc_worker_pid"] if alive else worker.pid}
    record(recorded)
    started = time.monotonic()
    if alive and worker.status(SAMPLE_CONNECTOR) is None:  # a worker that runs without it (removed by hand)
        worker.register_postgres(source, name=SAMPLE_CONNECTOR, tables=[SAMPLE_TABLE], topic_prefix=SAMPLE_PREFIX)
    worker.wait_running(SAMPLE_CONNECTOR)
    topic = topic_name(SAMPLE_PREFIX, SAMPLE_TABLE)
    wait_for_topic(bootstrap_servers, topic)
    log.info("connector %s running and its topic there in %.1fs", SAMPLE_CONNECTOR, time.monotonic() - started)
    print(f"CDC up: source PostgreSQL 127.0.0.1:{source.port} (database {DATABASE}, user {source.user}, logical "
          f"decoding; its password is in {root / 'postgres' / 'password'}), table {SAMPLE_TABLE}\n"
          f"Kafka Connect worker {worker.rest_url} (pid {recorded['cdc_worker_pid']}), Debezium connector "
          f"{SAMPLE_CONNECTOR} RUNNING, topic {topic} on {bootstrap_servers}; log: {worker.log_file}")


def stop_stack(state: dict) -> None:
    """`make down`: stop the recorded worker (its process group) and the source PostgreSQL."""
    from microbatch.dev.stopping import stop_group

    stop_group(state.get("cdc_worker_pid"), PROCESS_MARKER, "Kafka Connect worker")
    if state.get("cdc_source_port"):
        source_postgres(stack_root() / "postgres", state["cdc_source_port"]).stop()


def _run_sql(source: LocalPostgres, sql: str) -> None:
    import psycopg

    with psycopg.connect(host="127.0.0.1", port=source.port, user=source.user, password=source.password,
                         dbname=DATABASE, autocommit=True) as conn:
        conn.execute(sql)
