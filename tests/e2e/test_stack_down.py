"""The README's Airflow path, as a user runs it: `make airflow`, sample lines from `microbatch generate`, the
shipped `ip_count` DAG unpaused and run by the scheduler (the shipped spec directory, no
MICROBATCH_PIPELINES_DIR) as a client of the Spark Connect server that `make airflow` starts (the shipped
`spark.mode: auto`), `make connect` (which finds that server up), then `make down`, which must leave no process
of that stack running. Meanwhile the stack is secure by default (docs/running-for-real.md): every socket of every
process of it listens on 127.0.0.1 only (read with psutil while the scheduler runs), and no process's arguments,
task log, `microbatch status`/`history`/`verify` output, ledger page (HTML, JSON), rendered template or `make
connect` output holds a secret (the ledger password, the Connect token, Airflow's JWT secret and secret key).

The sink is compared with a recount of the topic's lines made here, by a parse of its own.
"""

from __future__ import annotations

import configparser
import contextlib
import ipaddress
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path

import psutil
import pytest
from sqlalchemy import make_url, text

from microbatch.dev.process import free_port, listening_sockets, port_open
from microbatch.ledger.database import transaction
from microbatch.runtime import cache_dir
from tests.e2e.helpers import read_topic
from tests.e2e.test_secure_defaults import leaks, process_arguments

pytestmark = pytest.mark.e2e
ROOT = Path(__file__).resolve().parents[2]
# `-o`: the venv under test is the suite's own; never reinstall it in the middle of a test.
MAKE = ["make", "-s", "--no-print-directory", "-o", ".venv/.installed"]
LINES = 2000
LINE = re.compile(rb'^(\S+) - \S+ \[([^\]]+)\] "')


def stack_env(cache: Path, api_port: int) -> dict[str, str]:
    """A user's environment: no MICROBATCH_* override and none of the suite's AIRFLOW_* settings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MICROBATCH_", "AIRFLOW"))}
    base = f"http://127.0.0.1:{api_port}"
    return {
        **env,
        # Isolation only, which users never set: a cache of this test's own (hence AIRFLOW_HOME=<cache>/airflow
        # and the stack's state), and Airflow's ports off 8080/8793/8794, away from a developer's `make airflow`.
        "MICROBATCH_CACHE_DIR": str(cache),
        "AIRFLOW__API__PORT": str(api_port),
        "AIRFLOW__API__HOST": "127.0.0.1",
        "AIRFLOW__API__BASE_URL": base,
        "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{base}/execution/",
        "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(free_port()),
        "AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT": str(free_port()),
    }


def stack_processes(cache: Path, session: int) -> list[psutil.Process]:
    """The live processes of this test's stack: in the session of its `make airflow`, or with an environment
    that names its cache (Kafka, PostgreSQL and spark-submit start sessions of their own). The environment
    alone would miss Airflow's components: their titles (setproctitle) overwrite it."""
    me = psutil.Process()
    spared = {me.pid, *(p.pid for p in me.parents())}
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.pid in spared or proc.status() == psutil.STATUS_ZOMBIE:
                continue
            if os.getsid(proc.pid) == session:
                found.append(proc)
                continue
            env = proc.environ()
        except (psutil.Error, ProcessLookupError):
            continue
        if env.get("MICROBATCH_CACHE_DIR") == str(cache) or env.get("AIRFLOW_HOME", "").startswith(str(cache)):
            found.append(proc)
    return found


def describe(procs: list[psutil.Process]) -> str:
    lines = []
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            lines.append(f"{proc.pid} {' '.join(proc.cmdline())[:160]}")
    return "\n".join(lines)


def wait_for(predicate, timeout: float, what: str, context=lambda: "") -> object:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(2)
    raise AssertionError(f"{what} within {timeout:.0f}s\n{context()}")


class Api:
    """Airflow's REST API as the generated admin user of `airflow standalone`."""

    def __init__(self, base: str, home: Path) -> None:
        self.base, self.home, self.token = base, home, ""

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.base}/api/v2/monitor/health", timeout=3) as response:
                return response.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def call(self, method: str, path: str, body: dict | None = None) -> tuple[int, dict]:
        code, answer = self.text(method, path, body)
        return code, json.loads(answer or "{}")

    def text(self, method: str, path: str, body: dict | None = None) -> tuple[int, str]:
        if not self.token:
            password = json.loads((self.home / "simple_auth_manager_passwords.json.generated").read_text())["admin"]
            request = urllib.request.Request(
                f"{self.base}/auth/token", method="POST", headers={"Content-Type": "application/json"},
                data=json.dumps({"username": "admin", "password": password}).encode())
            with urllib.request.urlopen(request, timeout=20) as response:
                self.token = json.loads(response.read())["access_token"]
        request = urllib.request.Request(
            f"{self.base}{path}", method=method, data=None if body is None else json.dumps(body).encode(),
            headers={"Authorization": f"Bearer {self.token}", "Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                return response.status, response.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()


def topic_lines(bootstrap: str, topic: str) -> list[bytes]:
    """Every record value of `topic`, read back from Kafka."""
    return [record.value for record in read_topic(bootstrap, topic)]


def recount(values: list[bytes], window: int = 5) -> tuple[Counter, int]:
    """Requests per (window start, ip) of the well-formed lines, and the number of the others."""
    counts: Counter = Counter()
    bad = 0
    for value in values:
        match = LINE.match(value)
        try:
            ip = str(ipaddress.ip_address(match.group(1).decode()))  # type: ignore[union-attr]
            when = datetime.strptime(match.group(2).decode(), "%d/%b/%Y:%H:%M:%S %z")  # type: ignore[union-attr]
        except (AttributeError, ValueError):
            bad += 1
            continue
        epoch = int(when.timestamp())
        counts[(datetime.fromtimestamp(epoch - epoch % window, tz=UTC), ip)] += 1
    return counts, bad


def committed(url: str) -> list[tuple]:
    with transaction(url) as session:
        return session.execute(text(
            "SELECT id, airflow_run_id, (counts->>'records')::int FROM batches WHERE state = 'committed' "
            "ORDER BY id")).all()


def test_scheduled_run_under_make_airflow_on_loopback_without_a_secret_then_make_down_leaves_no_process(
        tmp_path: Path) -> None:
    # A cache of its own (the jars linked from the real one), so the developer's stack is never touched.
    cache = tmp_path / "cache"
    cache.mkdir()
    for name in ("jars", "m2"):
        (cache / name).symlink_to(cache_dir() / name)
    api_port = free_port()
    env = stack_env(cache, api_port)
    api = Api(f"http://127.0.0.1:{api_port}", cache / "airflow")
    log_path = tmp_path / "make-airflow.log"
    state_file = cache / "devstack" / "state.json"

    def log_tail() -> str:
        return log_path.read_text(errors="replace")[-4000:]

    with log_path.open("w") as log:
        airflow = subprocess.Popen([*MAKE, "airflow"], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                                   start_new_session=True)
    try:
        def ready() -> bool:
            if airflow.poll() is not None:
                raise AssertionError(f"make airflow exited with {airflow.returncode}:\n{log_tail()}")
            return state_file.exists() and "airflow_pid" in json.loads(state_file.read_text()) and api.healthy()

        wait_for(ready, 240, "the stack and the Airflow API did not come up", log_tail)
        state = json.loads(state_file.read_text())
        stack = state["env"]
        assert "MICROBATCH_PIPELINES_DIR" not in stack

        generated = subprocess.run([sys.executable, "-m", "microbatch.cli", "generate", "--count", str(LINES)],
                                   env={**env, **stack}, capture_output=True, text=True, timeout=120, check=False)
        assert generated.returncode == 0, generated.stdout + generated.stderr

        # The shipped DAG is paused at creation: unpause it once the dag-processor has parsed it.
        wait_for(lambda: api.call("PATCH", "/api/v2/dags/ip_count", {"is_paused": False})[0] == 200, 120,
                 "the ip_count DAG was not parsed", log_tail)

        def runs() -> str:
            return json.dumps(api.call("GET", "/api/v2/dags/ip_count/dagRuns?order_by=-run_after&limit=5")[1])[:3000]

        # While the scheduler plans, stages and commits: every socket of every process of the stack, read again
        # and again, and every process's arguments, against the stack's secrets.
        cfg = configparser.RawConfigParser()
        cfg.read(cache / "airflow" / "airflow.cfg")
        secrets = {"the ledger password": make_url(stack["MICROBATCH_LEDGER_URL"]).password,
                   "the Connect token": state["connect_token"],
                   "Airflow's JWT secret": cfg.get("api_auth", "jwt_secret"),
                   "Airflow's [api] secret_key": cfg.get("api", "secret_key")}
        assert all(secrets.values()) and state["connect_token"] in stack["MICROBATCH_SPARK_REMOTE"]
        sockets, in_arguments = set(), []
        deadline = time.monotonic() + 300
        while not (batches := committed(stack["MICROBATCH_LEDGER_URL"])):
            sockets.update(listening_sockets([p.pid for p in stack_processes(cache, airflow.pid)]))
            in_arguments += leaks(secrets, {line[:120]: line for line in process_arguments()})
            assert time.monotonic() < deadline, f"the scheduler committed no batch of ip_count\n{runs()}"
            time.sleep(1)
        exposed = [str(s) for s in sockets if not s.loopback_only]
        assert not exposed, "listening beyond loopback:\n" + "\n".join(exposed)
        ports = {s.port for s in sockets}
        expected = {api_port, state["kafka_port"], state["controller_port"], state["postgres_port"],
                    state["connect_port"], int(env["AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT"])}
        assert ports >= expected, (expected - ports, sorted(str(s) for s in sockets))
        assert not in_arguments, in_arguments
        assert all(run_id.startswith("scheduled__") for _, run_id, _ in batches), batches
        assert sum(records for *_, records in batches) == LINES

        # The sink against a recount of the topic, made here; nothing is late in a first batch.
        counts, bad = recount(topic_lines(stack["MICROBATCH_KAFKA_BOOTSTRAP"], "ip_count_source"))
        with transaction(stack["MICROBATCH_LEDGER_URL"]) as session:
            sink = Counter({(start, ip): n for start, ip, n in session.execute(text(
                "SELECT window_start, ip, count FROM ip_counts")).all()})
            dead = session.execute(text("SELECT count(*) FROM dead_letters")).scalar_one()
            late = session.execute(text("SELECT count(*) FROM late_records")).scalar_one()
        assert sum(counts.values()) + bad == LINES
        assert (sink, dead, late) == (counts, bad, 0)
        verify = subprocess.run([sys.executable, "-m", "microbatch.cli", "verify", "ip_count"],
                                env={**env, **stack}, capture_output=True, text=True, timeout=120, check=False)
        assert verify.returncode == 0, verify.stdout + verify.stderr

        # What a user sees and what Airflow keeps holds no secret: CLI output, task logs, the ledger page,
        # the rendered templates of each task.
        def microbatch(*args: str) -> str:
            done = subprocess.run([sys.executable, "-m", "microbatch.cli", *args], env={**env, **stack},
                                  capture_output=True, text=True, timeout=120, check=False)
            assert done.returncode == 0, done.stdout + done.stderr
            return done.stdout + done.stderr

        texts = {"microbatch status": microbatch("status", "ip_count"),
                 "microbatch history": microbatch("history", "ip_count"),
                 "microbatch status --json": microbatch("status", "ip_count", "--json"),
                 "microbatch verify": verify.stdout + verify.stderr}
        log_files = list((cache / "airflow" / "logs").rglob("*.log"))
        assert any("task_id=stage" in str(path) for path in log_files), log_files
        texts.update({str(path): path.read_text(errors="replace") for path in log_files})
        for path in ("/microbatch/ledger", "/microbatch/api/ledger"):
            code, body = api.text("GET", path)
            assert code == 200 and "ip_count" in body, (path, code, body[:500])
            texts[path] = body
        run_id = batches[0][1]
        for task in ("plan", "stage", "commit"):
            code, body = api.text("GET", f"/api/v2/dags/ip_count/dagRuns/{urllib.parse.quote(run_id)}"
                                         f"/taskInstances/{task}")
            assert code == 200 and "rendered_fields" in body, (task, code, body[:500])
            texts[f"the rendered fields of {task}"] = json.dumps(json.loads(body)["rendered_fields"])
        assert not leaks(secrets, texts)

        # The stage tasks ran as clients of the stack's Spark Connect server, which `make airflow` started.
        assert port_open(state["connect_port"]) and stack["MICROBATCH_SPARK_REMOTE"]
        task_logs = " ".join(f.read_text(errors="replace") for f in (cache / "airflow" / "logs").rglob("*.log"))
        assert re.search(rf"staged batch \d+ through Spark Connect at sc://localhost:{state['connect_port']}",
                         task_logs), "no stage task ran on the stack's Spark Connect server"
        # kafka-python's connection steps (~20 INFO lines per plan task) and Alembic's context stay out of the logs.
        chatter = re.findall(r'[^\n]*"level":"(?:info|debug)"[^\n]*"logger":"(?:kafka|alembic)[^\n]*', task_logs)
        assert not chatter, chatter[:3]
        # The scheduler's forkserver had imported the client's modules (microbatch.airflow.preload), so the stage
        # task forked from its worker imported none of them.
        assert "client ready in" in task_logs and "its modules already imported" in task_logs, \
            re.findall(r"[^\n]*client ready in[^\n]*", task_logs)
        # `make connect` finds that server up and keeps it.
        connect = subprocess.run([*MAKE, "connect"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=240,
                                 check=False)
        assert connect.returncode == 0, connect.stdout + connect.stderr
        assert "already up" in connect.stdout, connect.stdout
        assert not leaks(secrets, {"make connect's output": connect.stdout + connect.stderr})
        assert json.loads(state_file.read_text())["connect_port"] == state["connect_port"]
        state = json.loads(state_file.read_text())
        assert port_open(state["connect_port"]) and "airflow_pid" in state
        assert len(stack_processes(cache, airflow.pid)) > 10  # standalone's components, Kafka, PostgreSQL, Connect
        started = time.monotonic()
        down = subprocess.run([*MAKE, "down"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=240,
                              check=False)
        assert down.returncode == 0, down.stdout + down.stderr
        took = time.monotonic() - started
        print(f"make down took {took:.1f}s: {down.stdout.strip()}")
        with contextlib.suppress(subprocess.TimeoutExpired):
            airflow.wait(30)  # `make airflow` ends with its standalone
        left = stack_processes(cache, airflow.pid)
        assert not left, f"`make down` ({took:.0f}s) left processes of the stack running:\n{describe(left)}"
        for port in (api_port, state["kafka_port"], state["controller_port"], state["postgres_port"],
                     state["connect_port"]):
            assert not port_open(port), f"port {port} still open after make down"
    finally:
        # Whatever failed above, take down this test's stack (found by its cache dir) and nothing else.
        leftover = stack_processes(cache, airflow.pid)
        for proc in leftover:
            with contextlib.suppress(psutil.Error):
                proc.send_signal(signal.SIGKILL)
        psutil.wait_procs(leftover, timeout=10)
        if airflow.poll() is None:
            os.killpg(airflow.pid, signal.SIGKILL)
            airflow.wait(10)
