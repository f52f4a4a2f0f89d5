"""Secure by default, on real services (issue 23; docs/running-for-real.md):

- a Spark standalone cluster configured by the compose file's entrypoint (spark.authenticate, RPC encryption,
  the shared secret; a master and two workers) runs ip_count's stages exactly once (cluster mode) and refuses a
  driver without the secret;
- the compose file's Kafka settings, converted as the apache/kafka image converts them, on a real broker: the
  published SASL listener refuses a client without the password;
- a Spark Connect server with a token refuses a client without it, accepts the header form the compose file
  uses, and the stage runs through it exactly once;
- the local stack as `make airflow` runs it (on the stack `make demo` left): tests/e2e/test_demo_e2e.py (every
  socket on 127.0.0.1, no secret anywhere a user or a process listing looks, and `make down` stops all of it).
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from pathlib import Path

import psutil
import pytest
import yaml
from sqlalchemy import make_url

from microbatch.dev.datagen import generate_lines, produce_lines
from microbatch.dev.kafka import KafkaBroker, create_topic
from microbatch.dev.process import free_port, listening_sockets
from microbatch.dev.spark import SparkStandalone
from microbatch.runtime import spark_home
from tests.e2e.helpers import assert_exactly_once, run_log, run_watching_arguments, write_test_spec

pytestmark = pytest.mark.e2e
ROOT = Path(__file__).resolve().parents[2]
SPARK_ENTRYPOINT = ROOT / "include/docker/spark-entrypoint.sh"
JOB = 'from pyspark.sql import SparkSession\nspark = SparkSession.builder.appName("{name}").getOrCreate()\n' \
      'print("COUNT", spark.range(1000).repartition(2).count())\nspark.stop()\n'


def process_arguments() -> list[str]:
    """Every process's command line (as /proc shows it to anyone on the machine)."""
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            with contextlib.suppress(OSError):
                found.append((proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"))
    return found


def leaks(secrets: dict[str, str], texts: dict[str, str]) -> list[str]:
    """'<secret name> in <where>' for each secret value found in a text."""
    return [f"{name} in {where}" for name, value in secrets.items() for where, body in texts.items()
            if value and value in body]


def family(pids: list[int]) -> list[int]:
    """`pids` and all their descendants."""
    found = set(pids)
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            found.update(child.pid for child in psutil.Process(pid).children(recursive=True))
    return sorted(found)


# --- Spark standalone, configured as the compose file configures it ------------------------------------------


class ComposeConfiguredCluster(SparkStandalone):
    """A local standalone cluster whose spark-defaults.conf is written by include/docker/spark-entrypoint.sh,
    the entrypoint of the compose file's Spark services: spark.authenticate, RPC encryption, the secret."""

    def _write_conf(self) -> None:
        subprocess.run(["bash", str(SPARK_ENTRYPOINT), "true"], check=True, env={
            "PATH": os.environ["PATH"], "SPARK_AUTH_SECRET": self.secret or "", "SPARK_CONF_DIR": str(self.conf_dir)})


def test_ip_count_on_a_standalone_cluster_with_spark_authenticate_which_refuses_a_driver_without_the_secret(
        service_env, topic, kafka, ledger_url, tmp_path: Path) -> None:
    """Cluster mode, as the compose file configures it: the stage's spark-submit drivers run ip_count on a master
    and two workers (separate JVMs from the pyspark wheel, the library shipped by --py-files), exactly once;
    meanwhile no process's arguments hold the cluster's secret and every socket of the cluster, its executors and
    the drivers is on loopback; a driver without the secret is refused."""
    cluster = ComposeConfiguredCluster(tmp_path / "spark", workers=2, cores_per_worker=1, memory="1g").start()
    refused = None
    try:
        assert "spark.network.crypto.enabled true" in (cluster.conf_dir / "spark-defaults.conf").read_text()
        # One batch (each is an application of its own on the cluster: a driver and two executors' JVMs).
        specs = write_test_spec(tmp_path / "pipelines", topic, max_records=5000, bootstrap=kafka.bootstrap_servers,
                                spark_mode="submit")
        connection = {"conn_type": "spark", "host": "spark://127.0.0.1", "port": cluster.port}
        # client_env: the secret reaches spark-submit through SPARK_CONF_DIR, never an argument.
        env = {**service_env, **cluster.client_env(), "MICROBATCH_PIPELINES_DIR": str(specs),
               "AIRFLOW_CONN_SPARK_DEFAULT": json.dumps(connection)}
        lines = generate_lines(5_000, ips=30, span_seconds=60, out_of_order=0.1, malformed=0.03, seed=31)
        coords = produce_lines(kafka.bootstrap_servers, topic, lines)

        # Meanwhile a driver without the secret: the master does not let it register, and it gives up after
        # Spark's registration retries (three of 20 s), so it runs beside the pipeline's own.
        submit = [str(spark_home() / "bin" / "spark-submit"), "--master", cluster.master_url]
        plain = {k: v for k, v in os.environ.items() if k != "SPARK_CONF_DIR"}
        plain.update(SPARK_LOCAL_IP="127.0.0.1", PYSPARK_PYTHON=sys.executable)
        (tmp_path / "without_secret.py").write_text(JOB.format(name="without_secret"))
        with (tmp_path / "without_secret.log").open("w") as out:
            refused = subprocess.Popen([*submit, str(tmp_path / "without_secret.py")], env=plain, stdout=out,
                                       stderr=subprocess.STDOUT, text=True)

        with (tmp_path / "run.log").open("w") as out:
            run = subprocess.Popen([sys.executable, "-m", "microbatch.cli", "run", "ip_count"],
                                   env={**os.environ, **env}, stdout=out, stderr=subprocess.STDOUT,
                                   start_new_session=True)
        seen_arguments, sockets = [], set()
        deadline = time.monotonic() + 600
        while run.poll() is None and time.monotonic() < deadline:
            seen_arguments += [line[:200] for line in process_arguments() if cluster.secret in line]
            pids = family([p.pid for p in cluster.processes] + [run.pid])
            sockets.update(listening_sockets(pids))
            time.sleep(0.5)
        output = run_log((tmp_path / "run.log").read_text())
        assert run.wait(10) == 0, output[-3000:]
        assert f"master {cluster.master_url}" in output
        assert_exactly_once(ledger_url, env, lines, coords, f"{topic}_out")
        assert not seen_arguments, seen_arguments
        assert {s.port for s in sockets} >= {cluster.port, cluster.webui_port}
        assert all(s.loopback_only for s in sockets), [str(s) for s in sockets if not s.loopback_only]
        with urllib.request.urlopen(f"http://127.0.0.1:{cluster.webui_port}/json/", timeout=5) as response:
            apps = [app["name"] for app in json.load(response)["completedapps"]]
        assert "without_secret" not in apps and len(apps) >= 1, apps  # the staged batch's application

        # Without the secret the master did not let the driver register: the application was given up.
        assert refused.wait(timeout=240) != 0
        output = (tmp_path / "without_secret.log").read_text()
        assert "COUNT" not in output, output[-3000:]
        assert "All masters are unresponsive" in output, output[-3000:]
        master_log = "".join(p.read_text(errors="replace") for p in (tmp_path / "spark").glob("master-*.log"))
        assert "authentication enabled" in master_log and "Expected SaslMessage" in master_log
        with urllib.request.urlopen(f"http://127.0.0.1:{cluster.webui_port}/json/", timeout=5) as response:
            status = json.load(response)
        assert "without_secret" not in [app["name"] for app in status["completedapps"] + status["activeapps"]]
    finally:
        if refused is not None and refused.poll() is None:
            refused.kill()
        cluster.stop()


# --- Kafka, configured as the compose file configures it ------------------------------------------------------


def image_properties(environment: dict[str, object]) -> dict[str, str]:
    """The server.properties the apache/kafka image makes of KAFKA_* variables: strip the prefix, then
    `___` -> `-`, `__` -> `_`, `_` -> `.`, lower case."""
    properties = {}
    for key, value in environment.items():
        if key.startswith("KAFKA_"):
            name = key.removeprefix("KAFKA_").replace("___", "-").replace("__", "\0").replace("_", ".")
            properties[name.replace("\0", "_").lower()] = str(value)
    return properties


class ComposeConfiguredBroker(KafkaBroker):
    """A local broker with the compose file's Kafka settings; only the host names and ports are this machine's
    (loopback, free ports), and the data directory a temporary one."""

    def __init__(self, work_dir: Path, environment: dict[str, object]) -> None:
        super().__init__(work_dir)
        self.external_port = free_port()
        ports = {"9092": str(self.port), "9093": str(self.controller_port), "9094": str(self.external_port)}
        properties = image_properties(environment)
        for key in ("listeners", "advertised.listeners", "controller.quorum.voters"):
            value = properties[key].replace("://:", "://127.0.0.1:").replace("kafka:", "127.0.0.1:")
            value = value.replace("localhost:", "127.0.0.1:")
            for compose_port, port in ports.items():
                value = value.replace(f":{compose_port}", f":{port}")
            properties[key] = value
        self.properties = {**properties, "log.dirs": str(self.work_dir / "data")}

    def _configure(self) -> Path:
        self.work_dir.mkdir(parents=True, exist_ok=True)
        path = self.work_dir / "server.properties"
        path.write_text("".join(f"{k}={v}\n" for k, v in self.properties.items()))
        (self.work_dir / "log4j2.properties").write_text(
            "rootLogger.level = INFO\nrootLogger.appenderRef.file.ref = FILE\nappender.file.type = File\n"
            f"appender.file.name = FILE\nappender.file.fileName = {self.log_file}\n"
            "appender.file.layout.type = PatternLayout\nappender.file.layout.pattern = [%d] %p %m (%c)%n\n")
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        self._java("kafka.tools.StorageTool", "format", f"--cluster-id={cluster_id}", "-c", str(path), wait=True)
        return path


def list_topics(port: int, **security: str) -> set[str]:
    from kafka import KafkaConsumer

    consumer = KafkaConsumer(bootstrap_servers=f"127.0.0.1:{port}", request_timeout_ms=8000, bootstrap_timeout_ms=5000,
                             **security)
    try:
        return set(consumer.topics())
    finally:
        consumer.close()


def test_the_compose_kafka_settings_on_a_real_broker_require_sasl_outside(tmp_path: Path) -> None:
    from kafka.errors import KafkaError

    password = "compose-kafka-" + uuid.uuid4().hex
    compose = (ROOT / "docker-compose.yaml").read_text()
    compose = compose.replace("${KAFKA_SASL_PASSWORD:?run include/docker/make-env.sh}", password)
    compose = compose.replace("${KAFKA_SASL_USERNAME:-microbatch}", "microbatch")
    compose = compose.replace("${MICROBATCH_KAFKA_EXTERNAL_HOST:-localhost}", "localhost")
    environment = yaml.safe_load(compose)["services"]["kafka"]["environment"]
    broker = ComposeConfiguredBroker(tmp_path / "kafka", environment)
    assert broker.properties["listener.name.external.plain.sasl.jaas.config"].endswith(
        f'user_microbatch="{password}";')
    broker.start()
    try:
        create_topic(broker.bootstrap_servers, "inside", 1)  # the compose network's PLAINTEXT listener
        sasl = {"security_protocol": "SASL_PLAINTEXT", "sasl_mechanism": "PLAIN",
                "sasl_plain_username": "microbatch"}
        assert "inside" in list_topics(broker.external_port, **sasl, sasl_plain_password=password)
        with pytest.raises(KafkaError):
            list_topics(broker.external_port, **sasl, sasl_plain_password="wrong-" + password)
        with pytest.raises(KafkaError):
            list_topics(broker.external_port)  # no SASL at all
        sockets = listening_sockets([broker.pid])
        assert {s.port for s in sockets} == {broker.port, broker.controller_port, broker.external_port}
    finally:
        broker.stop()


# --- Spark Connect with a token -------------------------------------------------------------------------------

CONNECT_CLIENT = """
import os
from pyspark.sql import SparkSession
try:
    spark = SparkSession.builder.remote(os.environ["PROBE_REMOTE"]).create()
    print("COUNT", spark.range(7).count())
    spark.stop()
except Exception as exc:
    print("REFUSED", str(exc).splitlines()[0][:300])
    for line in str(exc).splitlines():
        if "details =" in line:
            print("DETAILS", line.strip())
"""


def connect_client(remote: str) -> str:
    """A Spark Connect client in its own process, the remote in its environment (never in its arguments)."""
    env = {k: v for k, v in os.environ.items() if k != "SPARK_CONNECT_AUTHENTICATE_TOKEN"}
    result = subprocess.run([sys.executable, "-c", CONNECT_CLIENT], env={**env, "PROBE_REMOTE": remote},
                            capture_output=True, text=True, timeout=180, check=False)
    return result.stdout


def connect_spec(directory: Path, topic: str, bootstrap: str, max_records: int) -> Path:
    """The test copy of ip_count in connect mode (only the spark.sql.* settings a session may change)."""
    return write_test_spec(directory, topic, max_records, bootstrap=bootstrap, spark_mode="connect")


def test_spark_connect_refuses_a_client_without_its_token_and_the_stage_runs_with_it(
        spark_connect, service_env, topic, kafka, ledger_url, tmp_path: Path) -> None:
    server = spark_connect  # the suite's server, started with a token as `make connect` starts the stack's
    token = server.token
    assert server.remote == f"sc://localhost:{server.port}/;token={token}"
    assert token not in " ".join(psutil.Process(server.pid).cmdline())
    assert "No authentication token provided" in connect_client(f"sc://localhost:{server.port}")
    assert "Invalid authentication token" in connect_client(f"sc://localhost:{server.port}/;token=wrong")
    assert "COUNT 7" in connect_client(server.remote)
    # The compose file's form: a plaintext channel to a host other than localhost, the token as a header.
    assert "COUNT 7" in connect_client(f"sc://127.0.0.1:{server.port}/;authorization=Bearer%20{token}")
    assert all(s.loopback_only for s in listening_sockets(family([server.pid])))

    # The stage through it: the remote (with its token) reaches the task through the environment only.
    specs = connect_spec(tmp_path / "pipelines", topic, kafka.bootstrap_servers, max_records=1500)
    env = {**service_env, "MICROBATCH_PIPELINES_DIR": str(specs), "MICROBATCH_SPARK_REMOTE": server.remote}
    lines = generate_lines(2_000, ips=20, span_seconds=30, out_of_order=0.1, malformed=0.05, seed=23)
    coords = produce_lines(kafka.bootstrap_servers, topic, lines)
    password = make_url(ledger_url).password
    started = time.time()
    run = run_watching_arguments(env, [token, password], tmp_path / "run.log", max_runs=3)
    assert run.returncode == 0, run.log[-4000:]
    assert not run.leaked, run.leaked
    assert f"through Spark Connect at sc://localhost:{server.port}" in run.log
    assert_exactly_once(ledger_url, env, lines, coords, f"{topic}_out")
    # `microbatch run` writes the task logs (dag.test) to the log file it names (run.log holds both); any Airflow log
    # file written meanwhile is checked too.
    assert "staged batch 1 through Spark Connect" in run.log and "rows merged into ip_counts" in run.log
    logs = {str(path): path.read_text(errors="replace")
            for path in Path(os.environ["AIRFLOW_HOME"]).rglob("*.log") if path.stat().st_mtime >= started}
    assert not leaks({"token": token, "ledger password": password}, {"the task logs": run.log, **logs})
