"""The detached local stack of `make demo`, `make airflow`, `make connect`, `make registry` and `make cdc`: which
services run, on which ports, and how to stop every process they started. Each service is a module of its own beside
this one (kafka.py, postgres.py, spark.py, registry.py, cdc.py with cdc_stack.py, airflow.py), finding and stopping
their processes is stopping.py; the jars come from `microbatch.runtime`.

`python -m microbatch.dev.stack services|up|connect|registry|cdc|airflow-down|down|clean|cluster|env|jars` manages a
detached stack for the demo and the UI; `services` (`make up`) starts Kafka, PostgreSQL and Spark Connect, `up`
the first two; `connect` adds a Spark Connect server for pipelines in `spark.mode: connect`, `registry` a schema
registry (Apicurio, in memory), `cdc` a source PostgreSQL whose sample table a Kafka Connect worker with Debezium
captures into Kafka; `make airflow` records its `airflow standalone` here (`record_airflow`),
`airflow-down` stops that alone, `down` stops all of it and `clean` removes its data (`make clean`). The
registry's first start fetches its distribution (no shipped pipeline needs it yet).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
import shutil
import signal
import sys
import time
import uuid
from pathlib import Path

from microbatch.dev.cdc_stack import STATE_KEYS as _CDC_KEYS
from microbatch.dev.cdc_stack import start_stack as start_cdc
from microbatch.dev.cdc_stack import stop_stack as stop_cdc
from microbatch.dev.kafka import KafkaBroker, KafkaCluster
from microbatch.dev.postgres import DATABASE, LocalPostgres
from microbatch.dev.process import port_open, wait_until
from microbatch.dev.registry import PROCESS_MARKER, SchemaRegistry, answers
from microbatch.dev.spark import SparkConnectServer
from microbatch.dev.stopping import (
    airflow_processes,
    is_airflow,
    processes_with_env,
    runs,
    spared_pids,
    stop_group,
    stop_processes,
)
from microbatch.runtime import JAR_KINDS, cache_dir, ensure_jars, formats_jar
from microbatch.settings import SCHEMA_REGISTRY_URL_ENV, SPARK_REMOTE_ENV

log = logging.getLogger(__name__)
# The names the process helpers had here before they moved to dev/stopping.py.
_runs, _stop_group, _is_airflow, _spared, _stop_processes = runs, stop_group, is_airflow, spared_pids, stop_processes
_airflow_processes, _processes_with_env = airflow_processes, processes_with_env

# The detached stack of `make demo` / `make airflow`.

# Every process the stack starts inherits this variable (never exported to the user's shell by env.sh), so
# `down` finds what left the process tree it started, e.g. a spark-submit whose Airflow task was killed.
STACK_ID_ENV = "MICROBATCH_STACK_ID"
WAREHOUSE_ENV = "MICROBATCH_WAREHOUSE"
"""Where the lakehouse sinks put a table whose `path` is relative (default `<cache>/warehouse`): `clean` removes the
default one."""


def _state_file() -> Path:
    return cache_dir() / "devstack" / "state.json"


def _healthy(state: dict) -> bool:
    return bool(state.get("kafka_port") and state.get("postgres_port")) and port_open(state["kafka_port"]) \
        and port_open(state["postgres_port"])


def _load_state() -> dict:
    state_file = _state_file()
    return json.loads(state_file.read_text()) if state_file.exists() else {}


def _save_state(state: dict) -> None:
    """Write the state and `env.sh` with its environment (both hold the ledger password and the Connect token:
    owner-only)."""
    root = cache_dir() / "devstack"
    root.mkdir(parents=True, exist_ok=True)
    _state_file().write_text(json.dumps(state, indent=2))
    _state_file().chmod(0o600)
    env_sh = root / "env.sh"
    env_sh.touch(mode=0o600)
    env_sh.chmod(0o600)  # before the secrets are written: the ledger password and the Connect token
    env_sh.write_text("".join(f"export {k}='{v}'\n" for k, v in state.get("env", {}).items()))
    (root / "env.sh").chmod(0o600)


_CONNECT_KEYS = ("connect_port", "connect_pid", "connect_token")
_REGISTRY_KEYS = ("registry_port", "registry_pid")
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
    try:
        postgres.create_database(DATABASE)
        broker.start()
    except BaseException:  # nothing recorded yet, so `down` would not find it: stop it here
        postgres.stop()
        raise
    env = {"MICROBATCH_KAFKA_BOOTSTRAP": broker.bootstrap_servers, "MICROBATCH_LEDGER_URL": postgres.url()}
    connect = {key: state[key] for key in _CONNECT_KEYS if key in state}
    if connect and _connect_alive(state):
        env[SPARK_REMOTE_ENV] = state["env"][SPARK_REMOTE_ENV]
    registry_state = {key: state[key] for key in _REGISTRY_KEYS if key in state}
    if _registry_alive(state) and SCHEMA_REGISTRY_URL_ENV in state.get("env", {}):
        env[SCHEMA_REGISTRY_URL_ENV] = state["env"][SCHEMA_REGISTRY_URL_ENV]
    state = {"kafka_port": broker.port, "controller_port": broker.controller_port, "kafka_pid": broker.pid,
             "postgres_port": postgres.port, "postgres_pid": postgres.pid, **connect, **registry_state,
             **{key: state[key] for key in (*_AIRFLOW_KEYS, *_CDC_KEYS) if key in state}, "stack_id": stack_id,
             "env": env}
    _save_state(state)
    print(f"local stack up: Kafka {broker.bootstrap_servers}, PostgreSQL 127.0.0.1:{postgres.port}")
    return env


def _mark_stack(state: dict) -> str:
    """The stack's id (a new one if none is recorded), set in this process's environment so that every
    service, Airflow component and task started from here carries it."""
    stack_id = state.get("stack_id") or uuid.uuid4().hex
    os.environ[STACK_ID_ENV] = stack_id
    return stack_id


def _is_connect_server(pid: int) -> bool:
    """Whether `pid` is still our Spark Connect server."""
    return runs(pid, b"SparkConnectServer")


def _connect_alive(state: dict) -> bool:
    pid, port = state.get("connect_pid"), state.get("connect_port")
    return bool(pid and port) and _is_connect_server(pid) and port_open(port)


def connect() -> str:
    """Start a detached Spark Connect server under `.cache/devstack/connect` (or reuse a live one) that requires
    the stack's token, record its port, pid and token in the stack's state, and return its remote
    (`sc://localhost:PORT/;token=...`). What it prints never holds the token: env.sh does."""
    from microbatch.spark_remote import display

    state = _load_state()
    if _connect_alive(state):
        remote = state.get("env", {}).get(SPARK_REMOTE_ENV) or f"sc://127.0.0.1:{state['connect_port']}"
        print(f"Spark Connect server already up on {display(remote)} (pid {state['connect_pid']})")
    else:
        server = _start_connect(state)
        remote = server.remote
        print(f"Spark Connect server up on {display(remote)}, token required; log: {server.log_file}")
    print(f"source {cache_dir() / 'devstack' / 'env.sh'}   # exports {SPARK_REMOTE_ENV} with the token")
    return remote


def _start_connect(state: dict) -> SparkConnectServer:
    """Start the stack's Spark Connect server, detached, on its recorded port if that is free and with its token
    (one per stack, kept across restarts like the port, so an exported remote stays valid); record it."""
    _stop_connect(state)
    state["stack_id"] = _mark_stack(state)
    state["connect_token"] = state.get("connect_token") or secrets.token_urlsafe(32)
    _save_state(state)
    port = state.get("connect_port")
    server = SparkConnectServer(cache_dir() / "devstack" / "connect",
                                port=port if port and not port_open(port) else None, token=state["connect_token"])
    server.start()
    state = {**_load_state(), "connect_port": server.port, "connect_pid": server.pid}
    state["env"] = {**state.get("env", {}), SPARK_REMOTE_ENV: server.remote}
    _save_state(state)
    return server


def restart_dead_connect(remote: str) -> bool:
    """Start the local stack's Spark Connect server again if `remote` is the one the stack recorded and that server
    is dead, on the same port with the same token (so `remote` stays valid); True if it did. A server the stack did
    not start (another remote, or a recorded port someone else now holds) is never touched."""
    from microbatch.spark_remote import display

    state = _load_state()
    if not remote or state.get("env", {}).get(SPARK_REMOTE_ENV) != remote or _connect_alive(state):
        return False
    port = state.get("connect_port")
    if not port or port_open(port):
        return False
    started = time.monotonic()
    server = _start_connect(state)
    if server.port != port:  # cannot happen while the port is free; never leave a remote that points nowhere
        return False
    log.warning("the local stack's Spark Connect server at %s had died: started it again on the same port with "
                "the same token in %.1f s (pid %s)", display(remote), time.monotonic() - started, server.pid)
    return True


def _stop_connect(state: dict) -> None:
    """Stop the recorded Spark Connect server (its whole process group: spark-submit and the JVM)."""
    stop_group(state.get("connect_pid"), b"SparkConnectServer", "Spark Connect server")


def _registry_alive(state: dict) -> bool:
    pid, port = state.get("registry_pid"), state.get("registry_port")
    return bool(pid and port) and runs(pid, PROCESS_MARKER) and port_open(port)


def registry() -> str:
    """Start a detached schema registry (Apicurio, in memory) under `.cache/devstack/registry` on its recorded port if
    that is free (or reuse a live one), record its port and pid in the stack's state, export its URL in env.sh as
    `MICROBATCH_SCHEMA_REGISTRY_URL`, and return it. Its schemas live as long as its process: `make down` loses them."""
    state = _load_state()
    url = state.get("env", {}).get(SCHEMA_REGISTRY_URL_ENV)
    if _registry_alive(state) and url and answers(url):
        print(f"schema registry already up on {url} (pid {state['registry_pid']})")
    else:
        _stop_registry(state)
        state["stack_id"] = _mark_stack(state)
        port = state.get("registry_port")
        server = SchemaRegistry(cache_dir() / "devstack" / "registry",
                                port=port if port and not port_open(port) else None)
        server.start()
        url = server.url
        state = {**_load_state(), "stack_id": state["stack_id"], "registry_port": server.port,
                 "registry_pid": server.pid}
        state["env"] = {**state.get("env", {}), SCHEMA_REGISTRY_URL_ENV: url}
        _save_state(state)
        print(f"schema registry (Apicurio, in memory) up on {url}; log: {server.log_file}")
    print(f"source {cache_dir() / 'devstack' / 'env.sh'}   # exports {SCHEMA_REGISTRY_URL_ENV}")
    return url


def _stop_registry(state: dict) -> None:
    """Stop the recorded schema registry (its process group: the JVM leads it)."""
    stop_group(state.get("registry_pid"), PROCESS_MARKER, "schema registry")


def cdc() -> None:
    """`make cdc`: Kafka and PostgreSQL as `up` starts them (or reuses them), then a source PostgreSQL with logical
    decoding and a Kafka Connect worker with Debezium's connector for its sample table (dev/cdc_stack.py), recorded here
    so that `down` stops them and `clean` removes their data."""
    bootstrap = up()["MICROBATCH_KAFKA_BOOTSTRAP"]
    state = _load_state()
    state["stack_id"] = _mark_stack(state)
    start_cdc(state, bootstrap, lambda recorded: _save_state({**_load_state(), **recorded}))


def record_airflow() -> None:
    """Record the calling process as the stack's `airflow standalone`: the caller `exec`s it next, which keeps
    the pid. With its start time (against pid reuse), process group and AIRFLOW_HOME, so that `down` stops it
    and every process it starts."""
    import psutil

    state = _load_state()
    me = psutil.Process()
    _save_state({**state, "stack_id": _mark_stack(state), "airflow_pid": me.pid, "airflow_pgid": os.getpgid(0),
                 "airflow_started": me.create_time(), "airflow_home": os.environ["AIRFLOW_HOME"]})


def services() -> dict[str, str]:
    """`make up`: the services only (Kafka, PostgreSQL and the Spark Connect server, each reused while it lives),
    no sample data and no DAG run; return their environment. A service that does not start raises RuntimeError."""
    env = up()
    connect()
    return {**env, **_load_state().get("env", {})}


def stop_airflow() -> int:
    """Stop the stack's `airflow standalone` and every process it started, nothing else (the services keep
    running); return how many processes there were."""
    state = _load_state()
    stopped = stop_processes(airflow_processes(state), timeout=30)
    if state:
        _save_state({key: value for key, value in state.items() if key not in _AIRFLOW_KEYS})
    print(f"airflow standalone stopped ({stopped} processes); the services keep running" if stopped
          else "no airflow standalone of the local stack runs")
    return stopped


def down() -> None:
    """Stop everything the stack started: `airflow standalone` and every process it started, the Spark
    Connect server, the schema registry, the CDC worker and its source PostgreSQL, Kafka and PostgreSQL, then any
    process left that carries the stack's id. Guarantees that no process of the stack runs when it returns (SIGTERM
    first, SIGKILL after a timeout)."""
    state = _load_state()
    stopped = stop_processes(airflow_processes(state), timeout=30)
    if stopped:
        print(f"airflow standalone stopped ({stopped} processes)")
    if not state:
        return
    _stop_connect(state)
    _stop_registry(state)
    stop_cdc(state)  # before Kafka, which its worker writes to
    if state.get("kafka_port"):
        _stop_kafka_and_postgres(state)
    # Whatever left the trees above (a spark-submit orphaned by a killed task, a stray backend) goes too.
    if state.get("stack_id"):
        stop_processes(processes_with_env({STACK_ID_ENV: state["stack_id"]}), timeout=20)
    # The ports stay recorded, so the next `up`/`connect` reuses the exported addresses.
    _save_state({key: value for key, value in state.items()
                 if key not in ("connect_pid", "registry_pid", "cdc_worker_pid", *_AIRFLOW_KEYS)}
                | {"env": {k: v for k, v in state.get("env", {}).items()
                           if k not in (SPARK_REMOTE_ENV, SCHEMA_REGISTRY_URL_ENV)}})
    print("local stack stopped")


def clean() -> None:
    """`make clean`, after `down`: remove the local stack's data (its PostgreSQL, the embedded ledger), Airflow's
    home and the lake tables of that ledger, the default warehouse `<cache>/warehouse` (their batches, and a
    catalog's pointers to them, were in the ledger). What it leaves it says in one line: a warehouse that
    MICROBATCH_WAREHOUSE puts elsewhere, or the default one while MICROBATCH_LEDGER_URL names another ledger than
    the stack's."""
    from microbatch.settings import LEDGER_URL_ENV
    from microbatch.sinks.registry import driver_env

    cache = cache_dir()
    stack_ledger = _load_state().get("env", {}).get(LEDGER_URL_ENV)
    other_ledger = os.environ.get(LEDGER_URL_ENV) not in (None, "", stack_ledger)
    default = cache / "warehouse"
    folders = [cache / "devstack", cache / "airflow", *([] if other_ledger else [default])]
    removed = [str(folder) for folder in folders if folder.exists()]
    for folder in folders:
        shutil.rmtree(folder, ignore_errors=True)
    if os.geteuid() == 0:  # the PostgreSQL data that a private checkout keeps in /var/tmp (dev/postgres_root.py)
        from microbatch.dev.postgres_root import prune

        removed += [str(folder) for folder in prune()]
    print(f"removed {', '.join(removed)}" if removed else "nothing to remove")
    if other_ledger and default.exists():
        print(f"left the lake tables in {default}: {LEDGER_URL_ENV} names a ledger that `make clean` does not "
              "remove (it is not the local stack's)")
    chosen = driver_env().get(WAREHOUSE_ENV)  # where the lakehouse sinks resolve their tables' relative paths
    if chosen and ("://" in chosen or Path(chosen).resolve() != default.resolve()):
        print(f"left the lake tables in {chosen} ({WAREHOUSE_ENV}): remove them yourself once no ledger you keep "
              "records their batches")


def _stop_kafka_and_postgres(state: dict) -> None:
    pid = state.get("kafka_pid")
    if pid and runs(pid, b"kafka.Kafka"):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
        try:  # the JVM, not only its port: it still writes its log after it stops listening
            wait_until(lambda: not runs(pid, b"kafka.Kafka"), 30, "Kafka shutdown")
        except RuntimeError:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    LocalPostgres(cache_dir() / "devstack" / "postgres", state.get("postgres_port")).stop()


def cluster() -> None:
    """A three-node KRaft cluster (RF 3, min.insync.replicas 2) in the foreground, until Ctrl-C: for trying a
    pipeline against broker failures by hand. Its data is fresh each time."""
    root = cache_dir() / "cluster"
    shutil.rmtree(root, ignore_errors=True)
    with KafkaCluster(root) as kafka:
        print(f"three-broker Kafka cluster up; point pipelines at it with\n"
              f"  export MICROBATCH_KAFKA_BOOTSTRAP={kafka.bootstrap_servers}\n"
              f"node pids: {', '.join(f'{n}={b.pid}' for n, b in kafka.nodes.items())}; Ctrl-C stops it", flush=True)
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # unwinds the `with`: the nodes stop too
        with contextlib.suppress(KeyboardInterrupt):
            while True:
                time.sleep(3600)


def main(argv: list[str]) -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    logging.getLogger("kafka").setLevel(logging.WARNING)
    command = argv[0] if argv else "up"
    if command == "services":
        try:
            services()
        except RuntimeError as exc:  # one sentence and the log, not a traceback
            print(f"The local stack did not start: {exc} Fix the cause in that log, then run `make down` and "
                  "`make up` again.", file=sys.stderr)
            return 1
        print(f"source {cache_dir() / 'devstack' / 'env.sh'}   # the services' environment, for your own clients")
    elif command == "up":
        up()
    elif command == "airflow-down":
        stop_airflow()
    elif command == "connect":
        connect()
    elif command == "registry":
        registry()
    elif command == "cdc":
        try:
            cdc()
        except RuntimeError as exc:  # one sentence and the log, not a traceback
            print(f"CDC did not start: {exc} Fix the cause in that log, then run `make cdc` again.", file=sys.stderr)
            return 1
    elif command == "down":
        down()
    elif command == "clean":
        clean()
    elif command == "cluster":
        cluster()
    elif command == "env":
        print((cache_dir() / "devstack" / "env.sh").read_text(), end="")
    elif command == "jars":
        for kind in JAR_KINDS:
            print(f"{kind} jars: {ensure_jars(kind)}")
        print(f"formats jar: {formats_jar()}")
    else:
        print("usage: python -m microbatch.dev.stack "
              "services|up|connect|registry|cdc|airflow-down|down|clean|cluster|env|jars", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
