"""A real Apache Kafka from the Apache jars on Maven Central (KRaft): a single node, or a three-node cluster
with replicated topics; and topic creation."""

from __future__ import annotations

import base64
import logging
import subprocess
import uuid
from pathlib import Path

from microbatch.dev.process import free_port, port_open, wait_until, write_log4j
from microbatch.runtime import ensure_jars
from microbatch.settings import KafkaSettings

log = logging.getLogger(__name__)

# A development broker (the local stack, the tests, the chaos harness) moves thousands of records, not millions:
# the client compiler only and the serial collector start it with 1.7 times less CPU than C2 and G1 (2.3 against
# 3.9 CPU-s, bench/dev_costs.py, docs/performance.md), which a 2-core laptop running Spark beside it feels. A
# production broker is not this class.
DEV_JVM_OPTIONS = ("-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC")


class KafkaBroker:
    """A KRaft broker+controller in one JVM, with its data under `work_dir`: a single node by default, or node
    `node_id` of a cluster whose controller quorum is `voters` (node id -> controller port) and whose topics
    are replicated `replication` times (`min.insync.replicas` one less)."""

    def __init__(self, work_dir: Path, port: int | None = None, controller_port: int | None = None,
                 sasl_users: dict[str, str] | None = None, *, node_id: int = 1,
                 voters: dict[int, int] | None = None, replication: int = 1, cluster_id: str | None = None) -> None:
        self.work_dir = Path(work_dir)
        self.port = port or free_port()
        self.controller_port = controller_port or free_port()
        self.node_id = node_id
        self.voters = voters
        self.replication = replication
        self.cluster_id = cluster_id
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
        replication, min_isr = str(self.replication), str(max(1, self.replication - 1))
        quorum = ({"controller.quorum.voters": ",".join(f"{n}@127.0.0.1:{p}" for n, p in sorted(self.voters.items()))}
                  if self.voters else {"controller.quorum.bootstrap.servers": f"127.0.0.1:{self.controller_port}"})
        settings = {
            "process.roles": "broker,controller",
            "node.id": str(self.node_id),
            **quorum,
            "listeners": f"PLAINTEXT://127.0.0.1:{self.port},CONTROLLER://127.0.0.1:{self.controller_port}",
            "advertised.listeners": f"PLAINTEXT://127.0.0.1:{self.port}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "log.dirs": str(self.work_dir / "data"),
            "num.partitions": "4",
            "auto.create.topics.enable": "false",
            "default.replication.factor": replication,
            "min.insync.replicas": min_isr,
            "offsets.topic.replication.factor": replication,
            "offsets.topic.num.partitions": "4",
            "transaction.state.log.replication.factor": replication,
            "transaction.state.log.min.isr": min_isr,
            "transaction.state.log.num.partitions": "4",
            "group.initial.rebalance.delay.ms": "0",
            "log.cleaner.backoff.ms": "1000",
            "share.coordinator.state.topic.replication.factor": replication,
            "share.coordinator.state.topic.min.isr": min_isr,
        }
        if self.voters:  # a restarted node catches up and takes its leaderships back soon
            settings.update({"leader.imbalance.check.interval.seconds": "5",
                             "controlled.shutdown.enable": "true"})
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
        write_log4j(self.work_dir / "log4j2.properties", self.log_file)
        if not (self.work_dir / "data" / "meta.properties").exists():
            cluster_id = self.cluster_id or new_cluster_id()
            # `--cluster-id=`: a random id may start with '-', which would read as an option. A static quorum
            # (`controller.quorum.voters`) is formatted as it is; a single node formats itself as the quorum.
            self._java("kafka.tools.StorageTool", "format", f"--cluster-id={cluster_id}", "-c", str(properties),
                       *(() if self.voters else ("--standalone",)), wait=True)
        return properties

    def _java(self, main: str, *args: str, wait: bool = False) -> subprocess.Popen[bytes]:
        classpath = str(ensure_jars("kafka") / "*")
        command = [
            "java", "-Xmx512m", "-Xms128m", *DEV_JVM_OPTIONS, "-Djava.awt.headless=true",
            f"-Dlog4j2.configurationFile={self.work_dir / 'log4j2.properties'}",
            "-cp", classpath, main, *args,
        ]
        if wait:
            subprocess.run(command, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            return None  # type: ignore[return-value]
        out = (self.work_dir / "broker.out").open("ab")
        return subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)

    def start(self, timeout: float = 90) -> KafkaBroker:
        """Start the broker and wait until it answers metadata requests (a broker that does not is stopped)."""
        self.launch()
        try:
            self.wait_ready(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def launch(self) -> None:
        """Start the JVM without waiting (the nodes of a cluster start together: each waits for a quorum)."""
        properties = self._configure()
        self.process = self._java("kafka.Kafka", str(properties))

    def wait_ready(self, timeout: float = 90) -> None:
        wait_until(self._ready, timeout, f"Kafka broker on {self.bootstrap_servers}", self.log_file)
        log.info("Kafka broker %s up on %s (pid %s)", self.node_id, self.bootstrap_servers, self.pid)

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def _ready(self) -> bool:
        if self.process is not None and self.process.poll() is not None:
            raise RuntimeError(f"the Kafka broker exited with code {self.process.returncode}; see {self.log_file}")
        if not port_open(self.port):
            return False
        from microbatch.kafka import clients

        try:
            admin = clients.admin(KafkaSettings(self.bootstrap_servers), request_timeout_ms=5000)
        except Exception:
            return False
        try:
            admin.list_topics()
            return True
        except Exception:
            return False
        finally:
            admin.close()

    def signal(self, sig: int) -> None:
        """Send `sig` (SIGKILL: a crash; SIGTERM: a controlled shutdown) and wait for the JVM to end."""
        if self.running:
            assert self.process is not None
            self.process.send_signal(sig)
            try:
                self.process.wait(60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

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

def new_cluster_id() -> str:
    return base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")


class KafkaCluster:
    """Three KRaft nodes (each a broker and a voter of the controller quorum) on loopback ports, with
    replication factor 3 and `min.insync.replicas` 2 for new topics and for the internal offsets and
    transaction-state topics, as in Kafka's own transactions system test."""

    def __init__(self, work_dir: Path, size: int = 3) -> None:
        self.work_dir = Path(work_dir)
        controllers = {n: free_port() for n in range(1, size + 1)}
        cluster_id = new_cluster_id()
        self.nodes = {n: KafkaBroker(self.work_dir / f"node{n}", controller_port=controllers[n], node_id=n,
                                     voters=controllers, replication=size, cluster_id=cluster_id)
                      for n in controllers}

    @property
    def bootstrap_servers(self) -> str:
        return ",".join(node.bootstrap_servers for node in self.nodes.values())

    def start(self, timeout: float = 120) -> KafkaCluster:
        """Start the nodes together and wait for a fully replicated cluster; if that fails, every node launched
        is stopped."""
        try:
            for node in self.nodes.values():
                node.launch()
            for node in self.nodes.values():
                node.wait_ready(timeout)
            self.wait_replicated(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def node(self, node_id: int) -> KafkaBroker:
        return self.nodes[node_id]

    def down(self, node_id: int, sig: int) -> None:
        """Take a node down by `sig`: SIGKILL (a crash) or SIGTERM (a controlled shutdown)."""
        self.nodes[node_id].signal(sig)

    def up(self, node_id: int, timeout: float = 120) -> None:
        """Start a node again on its ports and data."""
        self.nodes[node_id].start(timeout)

    def wait_replicated(self, timeout: float = 120, topics: list[str] | None = None) -> None:
        """Wait until every partition of `topics` (default: all) has its full in-sync replica set again."""
        wait_until(lambda: not self.under_replicated(topics), timeout, "a fully replicated cluster",
                   self.nodes[1].log_file)

    def under_replicated(self, topics: list[str] | None = None) -> list[tuple[str, int]]:
        live = [n for n in self.nodes.values() if n.running]
        described = describe_partitions(",".join(n.bootstrap_servers for n in live), topics)
        return [(t, p) for (t, p), info in described.items() if len(info["isr"]) < len(self.nodes)]

    def leader_of(self, topic: str, partition: int) -> int:
        return describe_partitions(self._live_bootstrap(), [topic])[(topic, partition)]["leader"]

    def transaction_coordinator(self, transactional_id: str) -> int:
        return find_transaction_coordinator(self._live_bootstrap(), transactional_id)

    def _live_bootstrap(self) -> str:
        return ",".join(n.bootstrap_servers for n in self.nodes.values() if n.running)

    def stop(self) -> None:
        for node in self.nodes.values():
            node.stop()

    def __enter__(self) -> KafkaCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def describe_partitions(bootstrap_servers: str, topics: list[str] | None = None) -> dict[tuple[str, int], dict]:
    """{(topic, partition): {"leader": node id, "replicas": [...], "isr": [...]}} from a metadata request."""
    from microbatch.kafka import clients

    admin = clients.admin(KafkaSettings(bootstrap_servers), request_timeout_ms=10_000)
    try:
        described = admin.describe_topics(topics)
    finally:
        admin.close()
    return {(t["name"], p["partition_index"]): {"leader": p["leader_id"], "replicas": list(p["replica_nodes"]),
                                                "isr": list(p["isr_nodes"])}
            for t in described for p in t["partitions"]}


def find_transaction_coordinator(bootstrap_servers: str, transactional_id: str) -> int:
    """The node id of the transaction coordinator of `transactional_id`, as the admin client finds it (a
    FindCoordinator request of the transaction kind, then DescribeTransactions there). The id must have been
    used by a producer already."""
    from microbatch.kafka import clients

    admin = clients.admin(KafkaSettings(bootstrap_servers), request_timeout_ms=10_000)
    try:
        return admin.describe_transactions([transactional_id])[transactional_id].coordinator_id
    finally:
        admin.close()


def create_topic(bootstrap_servers: str, name: str, partitions: int, replication: int = -1,
                 config: dict[str, str] | None = None) -> None:
    """Create a topic (with topic-level `config`) and wait for its partitions' leaders; a topic that already
    exists is left as it is. The replication factor defaults to the brokers' `default.replication.factor` (1 on a
    single node, 3 on the cluster)."""
    from microbatch.config import OutputTopic
    from microbatch.kafka.topics import create_topics

    create_topics(KafkaSettings(bootstrap_servers), [OutputTopic("", name, partitions,
                                                                 None if replication == -1 else replication,
                                                                 dict(config or {}))])
