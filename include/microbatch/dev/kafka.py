"""A real Apache Kafka broker (KRaft, single node) from the Apache jars on Maven Central, and topic creation."""

from __future__ import annotations

import base64
import logging
import subprocess
import uuid
from pathlib import Path

from microbatch.dev.process import free_port, port_open, wait_until
from microbatch.runtime import ensure_jars

log = logging.getLogger(__name__)


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
        wait_until(self._ready, timeout, f"Kafka broker on {self.bootstrap_servers}", self.log_file)
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
        wait_until(lambda: len(consumer.partitions_for_topic(name) or ()) >= partitions, 30, f"topic {name}")
    finally:
        consumer.close()
