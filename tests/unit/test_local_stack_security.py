"""The local stack's security settings, without starting a service: what counts as listening on loopback only,
the loopback defaults of the local Airflow, and where the Spark secret and the Connect token go (a file and the
environment, never a command line). tests/e2e/test_secure_defaults.py runs the services themselves."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from microbatch.dev.airflow import COMPONENTS, LOOPBACK, loopback_env, loopback_hostname
from microbatch.dev.process import ListeningSocket
from microbatch.dev.spark import SparkConnectServer, SparkStandalone


@pytest.mark.parametrize(("address", "loopback"), [
    ("127.0.0.1", True), ("127.0.1.1", True), ("::1", True),
    ("::ffff:127.0.0.1", True),  # how a JVM bound to 127.0.0.1 shows in /proc/net/tcp6
    ("0.0.0.0", False), ("::", False), ("10.1.2.3", False), ("::ffff:10.1.2.3", False), ("fe80::1%eth0", False),
])
def test_only_loopback_addresses_count_as_loopback(address: str, loopback: bool) -> None:
    assert ListeningSocket(1, "x", "tcp", address, 1).loopback_only is loopback


def test_the_local_airflow_defaults_to_loopback_and_skips_the_log_servers_that_bind_everywhere() -> None:
    env = loopback_env({"PATH": "/bin"})
    assert env["AIRFLOW__API__HOST"] == LOOPBACK
    assert env["AIRFLOW__CORE__HOSTNAME_CALLABLE"] == "microbatch.dev.airflow.loopback_hostname"
    assert loopback_hostname() == LOOPBACK
    assert loopback_env({"AIRFLOW__API__HOST": "0.0.0.0"})["AIRFLOW__API__HOST"] == "0.0.0.0"  # an explicit choice
    for component in COMPONENTS:
        if component[0] in ("scheduler", "triggerer"):
            assert "--skip-serve-logs" in component


def test_the_standalone_cluster_secret_is_in_an_owner_only_file(tmp_path: Path) -> None:
    cluster = SparkStandalone(tmp_path / "spark")
    assert cluster.secret and len(cluster.secret) >= 32
    cluster._write_conf()
    defaults = cluster.conf_dir / "spark-defaults.conf"
    assert stat.S_IMODE(defaults.stat().st_mode) == 0o600
    assert stat.S_IMODE(cluster.conf_dir.stat().st_mode) == 0o700
    assert defaults.read_text() == f"spark.authenticate true\nspark.authenticate.secret {cluster.secret}\n"
    assert cluster.client_env() == {"SPARK_CONF_DIR": str(cluster.conf_dir)}
    assert SparkStandalone(tmp_path / "open", authenticate=False).client_env() == {}


def test_the_connect_token_reaches_neither_the_command_line_nor_a_non_localhost_remote(tmp_path: Path) -> None:
    server = SparkConnectServer(tmp_path, port=15999, token="tok-123")
    assert "tok-123" not in " ".join(server.command())
    # The Connect client sends a token without TLS to `localhost` only.
    assert server.remote == "sc://localhost:15999/;token=tok-123"
    assert SparkConnectServer(tmp_path, port=15999).remote == "sc://127.0.0.1:15999"


def test_the_local_scheduler_naps_briefly_between_idle_loops_unless_told_otherwise() -> None:
    """Each batch of a @continuous DAG waited out the scheduler's idle sleep between its tasks (Airflow's 1 s)."""
    assert float(loopback_env({})["AIRFLOW__SCHEDULER__SCHEDULER_IDLE_SLEEP_TIME"]) < 1
    assert loopback_env({"AIRFLOW__SCHEDULER__SCHEDULER_IDLE_SLEEP_TIME": "1"})[
        "AIRFLOW__SCHEDULER__SCHEDULER_IDLE_SLEEP_TIME"] == "1"
