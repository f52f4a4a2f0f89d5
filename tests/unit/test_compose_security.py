"""docker-compose.yaml is secure by default (issue 23), checked by reading it as compose would (no Docker engine
here): every published port binds loopback unless MICROBATCH_BIND_ADDRESS says otherwise, every secret is
required and none has a default in the repository, include/docker/make-env.sh generates each one, Spark runs
with spark.authenticate and a shared secret that no command line holds, the Connect server requires its token,
and Kafka's only published listener takes SASL."""

from __future__ import annotations

import base64
import os
import re
import stat
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker-compose.yaml"
MAKE_ENV = ROOT / "include/docker/make-env.sh"
SPARK_ENTRYPOINT = ROOT / "include/docker/spark-entrypoint.sh"
BIND_VARIABLE = "MICROBATCH_BIND_ADDRESS"
# The ports that authenticate their clients; only these follow MICROBATCH_BIND_ADDRESS beyond loopback.
AUTHENTICATED = {"airflow-api-server": {8080}, "postgres": {5432}, "kafka": {9094}, "spark-master": {7077}}
SECRET_NAME = re.compile(r"PASSWORD|SECRET|TOKEN|KEY")
# ${NAME}, ${NAME:-default}, ${NAME-default}, ${NAME:?message}, ${NAME?message}; $$ is a literal dollar.
VARIABLE = re.compile(r"(?<!\$)\$\{([A-Za-z_][A-Za-z0-9_]*)(?:(:?[-?])([^}]*))?\}")


class Missing(Exception):
    """What compose does when a `${NAME:?message}` variable is unset or empty: refuse to start."""


def interpolate(text: str, env: dict[str, str]) -> str:
    """The file as compose interpolates it with `env` (`$$` stays an escaped `$`)."""
    def value(match: re.Match[str]) -> str:
        name, operator, argument = match.group(1), match.group(2), match.group(3)
        current = env.get(name)
        unset = current is None or (operator in (":-", ":?") and current == "")
        if operator in (":?", "?") and unset:
            raise Missing(f"{name}: {argument}")
        if operator in (":-", "-") and unset:
            return argument
        return current or ""

    return VARIABLE.sub(value, text)


def load(env: dict[str, str]) -> dict:
    return yaml.safe_load(interpolate(COMPOSE.read_text(), env))["services"]


def variables() -> list[tuple[str, str | None, str]]:
    return [(m.group(1), m.group(2), m.group(0)) for m in VARIABLE.finditer(COMPOSE.read_text())]


def required_secrets() -> set[str]:
    return {name for name, operator, _ in variables() if operator == ":?"}


def generated_env(tmp_path: Path) -> dict[str, str]:
    env_file = tmp_path / ".env"
    subprocess.run(["bash", str(MAKE_ENV), str(env_file)], check=True, capture_output=True, text=True)
    return dict(line.split("=", 1) for line in env_file.read_text().splitlines())


def published(services: dict) -> list[tuple[str, str, int]]:
    """(service, host address, host port) of every published port, in the short syntax the file uses."""
    found = []
    for name, service in services.items():
        for port in service.get("ports", []):
            assert isinstance(port, str), f"{name}: use HOST_IP:HOST_PORT:CONTAINER_PORT, not {port!r}"
            parts = port.rsplit(":", 2)
            assert len(parts) == 3, f"{name}: {port!r} names no host address, so Docker binds every interface"
            found.append((name, parts[0], int(parts[1])))
    return found


def test_every_published_port_binds_loopback_by_default():
    services = load({"MICROBATCH_BIND_ADDRESS": "", **{name: "x" for name in required_secrets()}})
    ports = published(services)
    assert {(name, port) for name, _, port in ports} >= {(s, p) for s, ps in AUTHENTICATED.items() for p in ps}
    exposed = [(name, address, port) for name, address, port in ports if address != "127.0.0.1"]
    assert not exposed, f"published beyond loopback by default: {exposed}"
    for name, service in services.items():
        assert "network_mode" not in service, f"{name}: host networking would bypass the port bindings"


def test_one_documented_variable_opens_only_the_authenticated_ports():
    raw = yaml.safe_load(COMPOSE.read_text())["services"]
    for name, address, _ in published(raw):
        assert address in (f"${{{BIND_VARIABLE}:-127.0.0.1}}", "127.0.0.1"), f"{name} binds {address}"
    services = load({BIND_VARIABLE: "0.0.0.0", **{name: "x" for name in required_secrets()}})
    opened = {(name, port) for name, address, port in published(services) if address == "0.0.0.0"}
    assert opened == {(s, p) for s, ps in AUTHENTICATED.items() for p in ps}
    # The Spark master's UI (no login) and Spark Connect (a token over plaintext gRPC) never follow it.
    assert ("spark-master", "127.0.0.1", 8081) in published(services)
    assert ("spark-connect", "127.0.0.1", 15002) in published(services)
    page = (ROOT / "docs/running-for-real.md").read_text()
    assert BIND_VARIABLE in page and BIND_VARIABLE in COMPOSE.read_text().split("services:")[0]


def test_the_schema_registry_has_no_authentication_and_so_publishes_no_port():
    text = COMPOSE.read_text()
    registry = yaml.safe_load(text)["services"]["apicurio-registry"]
    assert "ports" not in registry and "network_mode" not in registry
    assert str((registry.get("environment") or {}).get("AUTH_ENABLED", "false")).lower() == "false"
    # What opening it would take is written beside it: Apicurio's authentication is OIDC (Keycloak).
    comment = text.split("  apicurio-registry:\n")[0].rsplit("\n\n", 1)[1]
    assert "OIDC" in comment and "Keycloak" in comment and BIND_VARIABLE in comment


def test_no_secret_has_a_default_and_compose_refuses_to_start_without_one():
    secret_variables = [(name, operator, text) for name, operator, text in variables() if SECRET_NAME.search(name)]
    assert secret_variables
    for name, operator, text in secret_variables:
        assert operator == ":?", f"{text}: a secret must be required (${{{name}:?...}}), never defaulted"
    assert required_secrets() == {name for name, *_ in secret_variables}
    with pytest.raises(Missing):
        load({})
    for missing in sorted(required_secrets()):
        with pytest.raises(Missing, match=missing):
            load({name: "x" for name in required_secrets() - {missing}})


def test_every_secret_setting_takes_its_value_from_a_required_variable():
    sentinels = {name: f"SENTINEL{i}" for i, name in enumerate(sorted(required_secrets()))}
    services = load(sentinels)
    checked = 0
    for name, service in services.items():
        environment = service.get("environment") or {}
        for key, setting in environment.items():
            value = str(setting)
            url_password = re.search(r"://[^:/@\s]+:([^@\s]*)@", value)
            if url_password:
                assert url_password.group(1) in sentinels.values(), f"{name} {key}: a literal password in a URL"
                checked += 1
            if SECRET_NAME.search(key) or "JAAS" in key:
                assert any(s in value for s in sentinels.values()), f"{name} {key}: not from a required variable"
                checked += 1
    assert checked >= 15
    # No secret on a command line: the Spark secret goes through spark-defaults.conf, the token through the env.
    for name, service in services.items():
        command = " ".join(service["command"]) if isinstance(service.get("command"), list) else \
            str(service.get("command", ""))
        assert not any(s in command for s in sentinels.values()), f"{name}'s command holds a secret"
        assert "spark.authenticate.secret" not in command and "authenticate.token" not in command


def test_make_env_generates_every_required_secret_once(tmp_path: Path):
    first = generated_env(tmp_path)
    assert set(first) == required_secrets()
    assert stat.S_IMODE((tmp_path / ".env").stat().st_mode) == 0o600
    for name, value in first.items():
        if name == "AIRFLOW_FERNET_KEY":
            assert len(base64.urlsafe_b64decode(value)) == 32  # what Airflow's Fernet accepts
        else:
            assert re.fullmatch(r"[A-Za-z0-9]{40}", value), name  # safe in URLs, SQL literals and JAAS strings
    again = generated_env(tmp_path)  # a second run keeps every value a volume may already hold
    assert again == first
    other = tmp_path / "other"
    other.mkdir()
    assert not set(generated_env(other).values()) & set(first.values())
    load(first)  # with them, compose starts: nothing required is missing
    assert ".env" in (ROOT / ".gitignore").read_text().split()


def test_spark_master_workers_and_drivers_authenticate_with_the_shared_secret(tmp_path: Path):
    raw = yaml.safe_load(COMPOSE.read_text())
    services = raw["services"]
    for name in ("spark-master", "spark-worker", "spark-connect"):
        assert services[name]["entrypoint"][0] == "/opt/microbatch/include/docker/spark-entrypoint.sh", name
        assert services[name]["environment"]["SPARK_AUTH_SECRET"].startswith("${SPARK_AUTH_SECRET:?")
        assert ".:/opt/microbatch:ro" in services[name]["volumes"], f"{name} cannot reach the entrypoint"
    # The Airflow containers are drivers too (the stage's spark-submit): their entrypoint hands over to the same one.
    for name in ("airflow-scheduler", "airflow-api-server"):
        assert "SPARK_AUTH_SECRET" in services[name]["environment"]
    airflow_entrypoint = (ROOT / "include/docker/airflow-entrypoint.sh").read_text()
    assert 'exec /opt/microbatch/include/docker/spark-entrypoint.sh "$@"' in airflow_entrypoint
    for script in (SPARK_ENTRYPOINT, MAKE_ENV, ROOT / "include/docker/airflow-entrypoint.sh"):
        assert os.access(script, os.X_OK), f"{script} is not executable"

    # What the entrypoint does, run here: an owner-only spark-defaults.conf, the secret gone from the environment
    # of the command it runs, and the command's arguments untouched.
    conf_dir = tmp_path / "conf"
    env = {"PATH": os.environ["PATH"], "SPARK_AUTH_SECRET": "s3cret-value", "SPARK_CONF_DIR": str(conf_dir)}
    out = subprocess.run(["bash", str(SPARK_ENTRYPOINT), "bash", "-c", 'echo "args:$1"; env', "_", "one two"],
                         env=env, capture_output=True, text=True, check=True).stdout
    assert "args:one two" in out and "s3cret-value" not in out and f"SPARK_CONF_DIR={conf_dir}" in out
    defaults = conf_dir / "spark-defaults.conf"
    assert stat.S_IMODE(defaults.stat().st_mode) == 0o600
    settings = dict(line.split(" ", 1) for line in defaults.read_text().splitlines())
    assert settings == {"spark.authenticate": "true", "spark.network.crypto.enabled": "true",
                        "spark.authenticate.secret": "s3cret-value"}
    refused = subprocess.run(["bash", str(SPARK_ENTRYPOINT), "true"], env={"PATH": os.environ["PATH"]},
                             capture_output=True, text=True, check=False)
    assert refused.returncode != 0 and "SPARK_AUTH_SECRET" in refused.stderr


def test_spark_connect_requires_its_token_and_airflow_sends_it_without_tls():
    from pyspark.sql.connect.client.core import DefaultChannelBuilder

    from microbatch.settings import SPARK_REMOTE_ENV
    from microbatch.spark_remote import display

    services = load({name: f"value-of-{name}" for name in required_secrets()})
    connect = services["spark-connect"]
    assert connect["environment"]["SPARK_CONNECT_AUTHENTICATE_TOKEN"] == "value-of-SPARK_CONNECT_TOKEN"
    assert connect["ports"] == ["127.0.0.1:15002:15002"]
    for name in ("airflow-scheduler", "airflow-api-server", "airflow-triggerer", "airflow-dag-processor"):
        remote = services[name]["environment"][SPARK_REMOTE_ENV]
        assert "SPARK_CONNECT_AUTHENTICATE_TOKEN" not in services[name]["environment"]  # it would force TLS
        builder = DefaultChannelBuilder(remote)
        # PySpark's own parsing: a plaintext channel to spark-connect:15002 with the header the server checks.
        assert (builder.host, builder.endpoint, builder.secure) == ("spark-connect", "spark-connect:15002", False)
        assert ("authorization", "Bearer value-of-SPARK_CONNECT_TOKEN") in builder.metadata()
        assert display(remote) == "sc://spark-connect:15002"  # how logs show it


def test_kafka_publishes_only_its_sasl_listener():
    services = load({name: f"value-of-{name}" for name in required_secrets()})
    kafka = services["kafka"]["environment"]
    listeners = dict(item.split("://")[0:2] for item in kafka["KAFKA_LISTENERS"].split(","))
    protocols = dict(item.split(":") for item in kafka["KAFKA_LISTENER_SECURITY_PROTOCOL_MAP"].split(","))
    ports = {name: int(address.rsplit(":", 1)[1]) for name, address in listeners.items()}
    published_ports = {port for name, _, port in published(services) if name == "kafka"}
    assert published_ports == {ports["EXTERNAL"]} and protocols["EXTERNAL"] == "SASL_PLAINTEXT"
    assert ports["PLAINTEXT"] not in published_ports and ports["CONTROLLER"] not in published_ports
    assert kafka["KAFKA_SASL_ENABLED_MECHANISMS"] == "PLAIN"
    jaas = kafka["KAFKA_LISTENER_NAME_EXTERNAL_PLAIN_SASL_JAAS_CONFIG"]
    assert jaas == ('org.apache.kafka.common.security.plain.PlainLoginModule required '
                    'user_microbatch="value-of-KAFKA_SASL_PASSWORD";')
    assert kafka["KAFKA_INTER_BROKER_LISTENER_NAME"] == "PLAINTEXT"
    # Inside the compose network the services keep the PLAINTEXT listener; the bootstrap they use names it.
    assert services["airflow-scheduler"]["environment"]["MICROBATCH_KAFKA_BOOTSTRAP"] == "kafka:9092"
