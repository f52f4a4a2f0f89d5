"""Spark from the pyspark wheel: a standalone cluster (master + workers) and a Spark Connect server."""

from __future__ import annotations

import json
import logging
import os
import secrets
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

from microbatch.dev.process import free_port, port_open, terminate_group, wait_until
from microbatch.runtime import PROJECT_ROOT, spark_jars
from microbatch.runtime import spark_home as runtime_spark_home
from microbatch.sinks.registry import any_spark_session_conf
from microbatch.spark_remote import display

log = logging.getLogger(__name__)
# Where the Spark Connect server (and the PySpark client, when the URL has no token) reads its token.
CONNECT_TOKEN_ENV = "SPARK_CONNECT_AUTHENTICATE_TOKEN"


class SparkStandalone:
    """A Spark standalone cluster from the pyspark wheel: one master and `workers` workers, each its own JVM.

    With `authenticate` (the default) every RPC needs the cluster's generated secret (`spark.authenticate`):
    it lives in `conf_dir`/spark-defaults.conf (owner-only), never on a command line; a driver gets it
    through `client_env()`."""

    def __init__(self, work_dir: Path, workers: int = 2, cores_per_worker: int = 1, memory: str = "1g",
                 authenticate: bool = True) -> None:
        self.work_dir = Path(work_dir)
        self.port = free_port()
        self.webui_port = free_port()
        self.workers = workers
        self.cores_per_worker = cores_per_worker
        self.memory = memory
        self.secret = secrets.token_hex(32) if authenticate else None
        self.processes: list[subprocess.Popen[bytes]] = []

    @property
    def master_url(self) -> str:
        return f"spark://127.0.0.1:{self.port}"

    @property
    def conf_dir(self) -> Path:
        return self.work_dir / "conf"

    def client_env(self) -> dict[str, str]:
        """The environment a driver (spark-submit, a Connect server) needs to use this cluster: SPARK_CONF_DIR
        with spark.authenticate and the secret; empty without authentication."""
        return {"SPARK_CONF_DIR": str(self.conf_dir)} if self.secret else {}

    def _write_conf(self) -> None:
        self.conf_dir.mkdir(parents=True, exist_ok=True)
        self.conf_dir.chmod(0o700)
        defaults = self.conf_dir / "spark-defaults.conf"
        defaults.touch(mode=0o600)
        defaults.chmod(0o600)  # before the secret is written
        lines = ["spark.authenticate true", f"spark.authenticate.secret {self.secret}"] if self.secret else []
        defaults.write_text("".join(f"{line}\n" for line in lines))

    def _spark_class(self, name: str, *args: str) -> subprocess.Popen[bytes]:
        spark_home = runtime_spark_home()
        env = {**os.environ, "SPARK_HOME": str(spark_home), "SPARK_LOCAL_IP": "127.0.0.1",
               "SPARK_WORKER_DIR": str(self.work_dir / "work"), "SPARK_LOG_DIR": str(self.work_dir),
               "SPARK_CONF_DIR": str(self.conf_dir)}
        out = (self.work_dir / f"{name.rsplit('.', 1)[-1].lower()}-{len(self.processes)}.log").open("ab")
        command = [str(spark_home / "bin" / "spark-class"), name, *args]
        return subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)

    def start(self, timeout: float = 90) -> SparkStandalone:
        self.work_dir.mkdir(parents=True, exist_ok=True)
        self._write_conf()
        self.processes.append(self._spark_class("org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                                                "--port", str(self.port), "--webui-port", str(self.webui_port)))
        wait_until(lambda: port_open(self.port) and self._master_status() is not None, timeout,
                   f"Spark master on {self.master_url}")
        for _ in range(self.workers):
            # Port 0: each worker's UI takes its own ephemeral port, so none can take the master's.
            self.processes.append(self._spark_class(
                "org.apache.spark.deploy.worker.Worker", self.master_url, "--host", "127.0.0.1",
                "--cores", str(self.cores_per_worker), "--memory", self.memory, "--webui-port", "0"))
        wait_until(lambda: self.alive_workers() >= self.workers, timeout, f"{self.workers} Spark workers")
        log.info("Spark standalone up on %s with %s workers", self.master_url, self.workers)
        return self

    def _master_status(self) -> dict | None:
        """The master's JSON status page, or None while it is not serving it (yet)."""

        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.webui_port}/json/", timeout=2) as response:
                status = json.load(response)
        except (OSError, ValueError):
            return None
        return status if isinstance(status, dict) and "workers" in status else None

    def alive_workers(self) -> int:
        """Workers registered with the master, from its JSON status page."""

        status = self._master_status() or {}
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



class SparkConnectServer:
    """A long-lived Spark Connect server (the pyspark wheel's `SparkConnectServer` class, which
    `start-connect-server.sh` runs) with the connector jars, on a free loopback port.

    The stage task of a pipeline in `spark.mode: connect` submits to it through the Connect client,
    so no JVM starts per batch. Its Python workers import the platform from `include/` (failpoints,
    UDFs of a job), as the executors of a spark-submit do.

    With a `token`, the server refuses a client without it; the server reads it from its environment
    (SPARK_CONNECT_AUTHENTICATE_TOKEN), never from its command line.
    """

    def __init__(self, work_dir: Path, port: int | None = None, master: str = "local[2]",
                 driver_memory: str = "1g", conf: dict[str, str] | None = None, token: str | None = None) -> None:
        self.work_dir = Path(work_dir)
        self.port = port or free_port()
        self.master = master
        self.driver_memory = driver_memory
        self.conf = dict(conf or {})
        self.token = token
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def remote(self) -> str:
        """The Connect URL for `SparkSession.builder.remote()` / `SPARK_REMOTE`; with a token, the token too,
        on `localhost`: the only host on which the Connect client sends a token without TLS."""
        if self.token:
            return f"sc://localhost:{self.port}/;token={self.token}"
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
            **any_spark_session_conf(),  # static settings: a Connect session cannot set them later
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
        env.pop(CONNECT_TOKEN_ENV, None)
        if self.token:
            env[CONNECT_TOKEN_ENV] = self.token
        self.process = subprocess.Popen(self.command(), env=env, stdout=self.log_file.open("ab"),
                                        stderr=subprocess.STDOUT, start_new_session=True, cwd=root)
        process = self.process

        def ready() -> bool:
            if process.poll() is not None:
                raise RuntimeError(f"the Spark Connect server exited with {process.returncode}; see {self.log_file}")
            return port_open(self.port)

        # Never the remote itself in a message: it holds the token.
        try:
            wait_until(ready, timeout, f"Spark Connect server on {display(self.remote)}", self.log_file)
        except BaseException:  # a server that did not come up is not left running
            self.stop()
            raise
        log.info("Spark Connect server up on %s (pid %s)%s", display(self.remote), process.pid,
                 ", token required" if self.token else "")
        return self

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None

    def stop(self, timeout: float = 30) -> None:
        if self.process is not None and self.process.poll() is None:
            terminate_group(self.process, timeout)

    def __enter__(self) -> SparkConnectServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
