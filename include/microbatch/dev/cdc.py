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
import re
import signal
import subprocess
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from microbatch.dev.kafka import DEV_JVM_OPTIONS
from microbatch.dev.postgres import DATABASE, LocalPostgres
from microbatch.dev.process import free_port, port_open, terminate_group, wait_until, write_log4j
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
        write_log4j(self.work_dir / "log4j2.properties", self.log_file,
                    "logger.reflections.name = org.reflections\nlogger.reflections.level = ERROR\n")
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

    def stored_offsets(self) -> list[dict[str, Any]]:
        """The source partitions and offsets in the worker's offset file as it last flushed them (every second while
        its connectors have records Kafka acknowledged): the JSON objects in the file's Java serialization."""
        with contextlib.suppress(OSError):
            found = re.findall(rb"\{[^{}]*\}", (self.work_dir / "offsets.dat").read_bytes())
            return [json.loads(raw) for raw in found if raw.startswith(b'{"')]
        return []

    def wait_lsn_flushed(self, lsn: int, timeout: float = 30) -> None:
        """Wait until the offset file holds a Debezium PostgreSQL offset at or after `lsn`: the events up to it then
        survive a SIGKILL (a restarted connector resumes after the offsets flushed before its kill, or snapshots
        again when there were none)."""
        wait_until(lambda: any(offset.get("lsn", -1) >= lsn for offset in self.stored_offsets()), timeout,
                   f"an offset flush at LSN {lsn} by the Kafka Connect worker {self.rest_url}", self.log_file)

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


