"""The README's paths, exactly as a new user runs them, on ONE local stack (one stack start, one `make down`: the
suite's budget): `make demo` in a fresh copy of the repository (a fresh `.cache`, the shipped `include/pipelines`,
no MICROBATCH_* or AIRFLOW_* variable set), the CLI right after it with no `source env.sh`, `make connect` on the
running stack, a sweep of everything the stack and the commands wrote for its secrets; then `make airflow` on that
stack, sample lines from `microbatch generate`, the shipped `ip_count` DAG unpaused and run by the scheduler as a
client of the stack's Spark Connect server, every socket of every process of the stack on 127.0.0.1 only and no
secret in any process's arguments, task log, CLI output, ledger page or rendered template; then `make down`, which
must leave no process of the stack running. `make demo` runs once in the suite. The printed results and the
scheduled run's table are checked against an independent recount of the topic.

Only the venv and Maven's download cache are shared with this checkout (`make -o` keeps make from reinstalling
the venv; the copy's Maven repository starts as hard links to this checkout's, as a machine that built the
project before keeps ~/.m2): `make demo` still resolves and copies its jars, and Kafka, PostgreSQL and Airflow's
home are the copy's own. The fresh-clone `.ci/run` downloads everything from nothing.
"""

from __future__ import annotations

import configparser
import contextlib
import ipaddress
import json
import os
import re
import shutil
import signal
import subprocess
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

from microbatch.dev.airflow import api_call, api_token
from microbatch.dev.process import free_port, listening_sockets, port_open
from microbatch.dev.stack import STACK_ID_ENV
from microbatch.ledger.database import transaction
from tests.e2e.helpers import read_topic
from tests.e2e.test_secure_defaults import leaks, process_arguments

pytestmark = pytest.mark.e2e
ROOT = Path(__file__).resolve().parents[2]
VENV = ROOT / ".venv"
SUMMARY = re.compile(r"ip_counts \(postgres_aggregate\): (\d+) rows, sum of count (\d+); (\d+) dead letters, "
                     r"(\d+) late records")
CLICKS_SUMMARY = re.compile(r"clicks_raw \(postgres_append\): (\d+) rows")
# The oracle's own reading of an nginx access-log line (not the Spark job's parser).
LINE = re.compile(r'^(\S+) \S+ \S+ \[(\d{2}/\w{3}/\d{4}:\d{2}:\d{2}:\d{2} [+-]\d{4})\] "[^"]*" \d{3} \d+')
GENERATED = 2000
"""Lines `microbatch generate` adds for the scheduled run under `make airflow`."""


def _well_formed(value: bytes) -> bool:
    match = LINE.match(value.decode("utf-8", errors="replace"))
    if not match:
        return False
    try:
        ipaddress.ip_address(match.group(1))
        datetime.strptime(match.group(2), "%d/%b/%Y:%H:%M:%S %z")
    except ValueError:
        return False
    return True


def _valid_click(value: bytes) -> bool:
    """The oracle's own reading of a JSON click: an object with a string user, an ISO-8601 ts with a zone, and
    a string page unless it forgets the user."""
    try:
        click = json.loads(value)
    except ValueError:
        return False
    if not isinstance(click, dict) or not isinstance(click.get("user"), str) or not isinstance(click.get("ts"), str):
        return False
    if click.get("forget") is not True and not isinstance(click.get("page"), str):
        return False
    try:
        return datetime.fromisoformat(click["ts"].replace("Z", "+00:00")).tzinfo is not None
    except ValueError:
        return False


def _user_env(copy: Path) -> dict[str, str]:
    """The environment of a user's shell: none of the overrides this suite sets."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("MICROBATCH_", "AIRFLOW", "PYSPARK_", "SPARK_")) and k != "PYTHONPATH"}
    return {**env, "PATH": f"{VENV / 'bin'}{os.pathsep}{env.get('PATH', '')}"}


def _fresh_copy(target: Path) -> Path:
    """The tracked files of this checkout, as `git clone` would give them (mtimes kept)."""
    files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    for name in filter(None, files.decode().split("\0")):
        source = ROOT / name
        if source.is_file():
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target / name)
    return target


def _seed_maven_repository(copy: Path) -> None:
    """The copy's `.cache/m2` from this checkout's Maven repository: its jars as hard links (copies across file
    systems), its metadata as copies."""
    source = (ROOT / ".cache" / "m2").resolve()
    assert source.is_dir(), "the suite runs after `make jars`, which fills .cache/m2"

    def link(src: str, dst: str) -> None:  # the jars only: Maven may rewrite its small metadata files in place
        try:
            os.link(src, dst) if src.endswith(".jar") else shutil.copy2(src, dst)
        except OSError:
            shutil.copy2(src, dst)
    shutil.copytree(source, copy / ".cache" / "m2", copy_function=link)


def _make(copy: Path, *targets: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["make", "-C", str(copy), "-o", str(VENV / ".installed"), f"VENV={VENV}", *targets],
                          env=_user_env(copy), capture_output=True, text=True, timeout=900, check=False)


def _cli(copy: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """`.venv/bin/microbatch ARGS` in the copy (PYTHONPATH points at the copy's code, as make does)."""
    env = {**_user_env(copy), "PYTHONPATH": f"{copy / 'include'}{os.pathsep}{copy}"}
    return subprocess.run([str(VENV / "bin" / "python"), "-m", "microbatch.cli", *args], cwd=copy, env=env,
                          capture_output=True, text=True, timeout=300, check=False)


def _source_records(bootstrap: str, topic: str = "ip_count_source") -> list[bytes]:
    return [record.value for record in read_topic(bootstrap, topic)]


def _summary(output: str) -> tuple[int, int, int]:
    match = SUMMARY.search(output)
    assert match, f"no ip_counts summary in the demo's output:\n{output[-3000:]}"
    _, total, dead, late = (int(g) for g in match.groups())
    return total, dead, late


def _clicks_raw_rows(output: str) -> int:
    match = CLICKS_SUMMARY.search(output)
    assert match, f"no clicks_raw summary in the demo's output:\n{output[-3000:]}"
    return int(match.group(1))


def _airflow_env(copy: Path, api_port: int) -> dict[str, str]:
    """A user's environment, with Airflow's ports off 8080/8793/8794 (isolation from a developer's `make airflow`,
    which users never set)."""
    base = f"http://127.0.0.1:{api_port}"
    return {**_user_env(copy), "AIRFLOW__API__PORT": str(api_port), "AIRFLOW__API__HOST": "127.0.0.1",
            "AIRFLOW__API__BASE_URL": base, "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{base}/execution/",
            "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(free_port()),
            "AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT": str(free_port())}


def _start_make_airflow(copy: Path, env: dict[str, str], log_path: Path) -> subprocess.Popen:
    with log_path.open("w") as log:
        return subprocess.Popen(["make", "-s", "--no-print-directory", "-C", str(copy), "-o", str(VENV / ".installed"),
                                 f"VENV={VENV}", "airflow"], env=env, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)


def _stack_processes(state: dict, session: int | None) -> list[psutil.Process]:
    """The live processes of the copy's stack: in the session of its `make airflow`, or carrying the stack's id in
    their environment (every service, Airflow component and task started from the stack carries it). The
    environment alone would miss Airflow's components: their titles (setproctitle) overwrite it."""
    me = psutil.Process()
    spared = {me.pid, *(p.pid for p in me.parents())}
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.pid in spared or proc.status() == psutil.STATUS_ZOMBIE:
                continue
            in_session = session is not None and os.getsid(proc.pid) == session
            if in_session or proc.environ().get(STACK_ID_ENV) == state["stack_id"]:
                found.append(proc)
        except (psutil.Error, ProcessLookupError):
            continue
    return found


def _describe(procs: list[psutil.Process]) -> str:
    lines = []
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            lines.append(f"{proc.pid} {' '.join(proc.cmdline())[:160]}")
    return "\n".join(lines)


def _wait_for(predicate, timeout: float, what: str, context=lambda: "") -> object:
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
            self.token = api_token(self.base, "admin", password)
        code, answer = api_call(self.base, self.token, method, path, body)
        return code, answer.decode()


def _window_counts(records: list, skip: set[tuple[int, int]], window: int = 5) -> tuple[Counter, int]:
    """Requests per (window start, ip) of the well-formed lines not at a coordinate in `skip` (the late ones), and
    the number of lines that are not well formed: the oracle's own parse."""
    counts: Counter = Counter()
    bad = 0
    for record in records:
        match = LINE.match(record.value.decode("utf-8", errors="replace"))
        if not _well_formed(record.value):
            bad += 1
        elif (record.partition, record.offset) not in skip:
            epoch = int(datetime.strptime(match.group(2), "%d/%b/%Y:%H:%M:%S %z").timestamp())
            ip = str(ipaddress.ip_address(match.group(1)))
            counts[(datetime.fromtimestamp(epoch - epoch % window, tz=UTC), ip)] += 1
    return counts, bad


def _scheduled_run_under_make_airflow(copy: Path, airflow: subprocess.Popen, airflow_env: dict[str, str],
                                      log_path: Path) -> None:
    """`make airflow` on the demo's stack: sample lines, the shipped ip_count DAG unpaused and run by the scheduler
    (the shipped spec directory, no MICROBATCH_PIPELINES_DIR) as a client of the stack's Spark Connect server;
    meanwhile every socket of every process of the stack listens on 127.0.0.1 only, and no process's arguments,
    task log, `microbatch status`/`history`/`verify` output, ledger page (HTML, JSON), rendered template or `make
    connect` output holds a secret (the ledger password, the Connect token, Airflow's JWT secret and secret key)."""
    state_file = copy / ".cache" / "devstack" / "state.json"
    api_port = int(airflow_env["AIRFLOW__API__PORT"])

    def log_tail() -> str:
        return log_path.read_text(errors="replace")[-4000:]

    def up() -> dict | None:
        if airflow.poll() is not None:
            raise AssertionError(f"make airflow exited with {airflow.returncode}:\n{log_tail()}")
        state = json.loads(state_file.read_text())
        if "airflow_pid" in state and Api(f"http://127.0.0.1:{api_port}", Path()).healthy():
            return state
        return None

    state = _wait_for(up, 240, "the Airflow API did not come up on the demo's stack", log_tail)
    stack = state["env"]
    home = Path(state["airflow_home"])
    assert home.is_relative_to(copy / ".cache") and "MICROBATCH_PIPELINES_DIR" not in stack
    api = Api(f"http://127.0.0.1:{api_port}", home)
    env = {**airflow_env, **stack, "PYTHONPATH": f"{copy / 'include'}{os.pathsep}{copy}"}
    ledger = stack["MICROBATCH_LEDGER_URL"]
    with transaction(ledger) as session:
        before = session.execute(text("SELECT coalesce(max(id), 0) FROM batches")).scalar_one()

    def microbatch(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(VENV / "bin" / "python"), "-m", "microbatch.cli", *args], cwd=copy, env=env,
                              capture_output=True, text=True, timeout=300, check=False)

    generated = microbatch("generate", "--count", str(GENERATED))
    assert generated.returncode == 0, generated.stdout + generated.stderr
    # The shipped DAG is paused at creation: unpause it once the dag-processor has parsed it.
    _wait_for(lambda: api.call("PATCH", "/api/v2/dags/ip_count", {"is_paused": False})[0] == 200, 120,
              "the ip_count DAG was not parsed", log_tail)

    def runs() -> str:
        return json.dumps(api.call("GET", "/api/v2/dags/ip_count/dagRuns?order_by=-run_after&limit=5")[1])[:3000]

    def scheduled() -> list[tuple]:
        with transaction(ledger) as session:
            return session.execute(text(
                "SELECT id, airflow_run_id, (counts->>'records')::int FROM batches WHERE state = 'committed' "
                "AND id > :before ORDER BY id"), {"before": before}).all()

    # While the scheduler plans, stages and commits: every socket of every process of the stack, read again and
    # again, and every process's arguments, against the stack's secrets.
    cfg = configparser.RawConfigParser()
    cfg.read(home / "airflow.cfg")
    secrets = {"the ledger password": make_url(ledger).password, "the Connect token": state["connect_token"],
               "Airflow's JWT secret": cfg.get("api_auth", "jwt_secret"),
               "Airflow's [api] secret_key": cfg.get("api", "secret_key")}
    assert all(secrets.values()) and state["connect_token"] in stack["MICROBATCH_SPARK_REMOTE"]
    sockets, in_arguments = set(), []
    deadline = time.monotonic() + 300
    while not (batches := scheduled()):
        sockets.update(listening_sockets([p.pid for p in _stack_processes(state, airflow.pid)]))
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
    assert sum(records for *_, records in batches) == GENERATED

    # The table against a recount of the whole topic made here (the demo's lines and the new ones), the late
    # records (the demo's) aside.
    records = read_topic(stack["MICROBATCH_KAFKA_BOOTSTRAP"], "ip_count_source")
    with transaction(ledger) as session:
        sink = Counter({(start, ip): n for start, ip, n in session.execute(text(
            "SELECT window_start, ip, count FROM ip_counts")).all()})
        dead = session.execute(text("SELECT count(*) FROM dead_letters d JOIN pipelines p ON p.id = d.pipeline_id "
                                    "WHERE p.name = 'ip_count'")).scalar_one()
        late = {(p, o) for p, o in session.execute(text(
            'SELECT l.partition, l."offset" FROM late_records l JOIN pipelines p ON p.id = l.pipeline_id '
            "WHERE p.name = 'ip_count'")).all()}
    counts, bad = _window_counts(records, late)
    assert len(records) == 10_000 + GENERATED
    assert (sink, dead) == (counts, bad)
    verify = microbatch("verify", "ip_count")
    assert verify.returncode == 0, verify.stdout + verify.stderr

    # What a user sees and what Airflow keeps holds no secret: CLI output, task logs, the ledger page, the rendered
    # templates of each task.
    texts = {"microbatch verify": verify.stdout + verify.stderr}
    for args in (("status", "ip_count"), ("history", "ip_count"), ("status", "ip_count", "--json")):
        done = microbatch(*args)
        assert done.returncode == 0, done.stdout + done.stderr
        texts[f"microbatch {' '.join(args)}"] = done.stdout + done.stderr
    log_files = list((home / "logs").rglob("*.log"))
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

    # The stage tasks ran as clients of the stack's Spark Connect server.
    task_logs = " ".join(f.read_text(errors="replace") for f in (home / "logs").rglob("*.log"))
    assert re.search(rf"staged batch \d+ through Spark Connect at sc://localhost:{state['connect_port']}",
                     task_logs), "no stage task ran on the stack's Spark Connect server"
    # kafka-python's connection steps (~20 INFO lines per plan task) and Alembic's context stay out of the logs.
    chatter = re.findall(r'[^\n]*"level":"(?:info|debug)"[^\n]*"logger":"(?:kafka|alembic)[^\n]*', task_logs)
    assert not chatter, chatter[:3]
    # The scheduler's forkserver had imported the client's modules (microbatch.airflow.preload), so the stage task
    # forked from its worker imported none of them.
    assert "client ready in" in task_logs and "its modules already imported" in task_logs, \
        re.findall(r"[^\n]*client ready in[^\n]*", task_logs)
    # `make connect` finds that server up and keeps it, and says nothing secret.
    connect = _make(copy, "connect")
    assert connect.returncode == 0 and "already up" in connect.stdout, connect.stdout + connect.stderr
    assert not leaks(secrets, {"make connect's output": connect.stdout + connect.stderr})
    assert json.loads(state_file.read_text())["connect_port"] == state["connect_port"]




def test_make_demo_then_make_airflow_on_its_stack_keep_their_secrets_and_make_down_leaves_no_process(
        tmp_path: Path) -> None:
    copy = _fresh_copy(tmp_path / "microbatch")
    assert not (copy / ".cache").exists()
    _seed_maven_repository(copy)
    state: dict = {}
    airflow: subprocess.Popen | None = None
    api_port = free_port()
    stopped = False
    try:
        first = _make(copy, "demo")
        output = first.stdout + first.stderr
        assert first.returncode == 0, output[-4000:]
        assert "There is no pipeline" not in output
        # The summary, not Airflow's structured log: that went to the file whose path is printed.
        log_path = Path(re.search(r"Airflow's task log: (\S+)", output).group(1))
        assert log_path.is_relative_to(copy / ".cache") and "stage" in log_path.read_text()
        # The shipped pipelines (`spark.mode: auto`) staged every batch on the stack's Spark Connect server.
        state = json.loads((copy / ".cache" / "devstack" / "state.json").read_text())
        task_log = log_path.read_text()
        for pipeline in ("ip_count", "clicks"):
            assert re.search(rf"stage {pipeline}: staged batch \d+ through Spark Connect at sc://localhost:"
                             rf"{state['connect_port']}", task_log), pipeline
        assert "spark-submit" not in task_log
        assert "[info     ]" not in output and len(output.splitlines()) < 200, output[-3000:]

        state = json.loads((copy / ".cache" / "devstack" / "state.json").read_text())
        values = _source_records(state["env"]["MICROBATCH_KAFKA_BOOTSTRAP"])
        good = sum(1 for v in values if _well_formed(v))
        total, dead, late = _summary(output)
        assert len(values) == 10_000
        assert (total + late, dead) == (good, len(values) - good)
        clicks = _source_records(state["env"]["MICROBATCH_KAFKA_BOOTSTRAP"], "clicks_source")
        assert len(clicks) == 2_000
        assert _clicks_raw_rows(output) == sum(1 for v in clicks if _valid_click(v))
        assert "page_views (postgres_aggregate)" in output and "user_last_page (postgres_upsert)" in output
        # The Delta table, read back by delta-rs: every valid click once, as in clicks_raw.
        lake = re.search(r"clicks_lake \(delta, read by delta-rs\): (\d+) rows in version", " ".join(output.split()))
        assert lake, output[-3000:]
        assert int(lake.group(1)) == _clicks_raw_rows(output)

        # Right after the demo, with nothing sourced: the CLI finds the running stack.
        status = _cli(copy, "status", "ip_count", "--json")
        assert status.returncode == 0, status.stdout + status.stderr
        rows = json.loads(status.stdout)["ip_count"]
        assert sum(r["position"] for r in rows) == 10_000 and all(r["lag"] == 0 for r in rows)
        assert _cli(copy, "verify", "ip_count").returncode == 0
        history = _cli(copy, "history", "ip_count")
        assert history.returncode == 0 and "committed" in history.stdout
        assert max(len(line) for line in history.stdout.splitlines()) > 80, "piped tables are not cut to 80 columns"

        # The secrets sweep: no Connect token or ledger password in anything the commands printed or the stack
        # wrote (task logs, the Connect server's log, Kafka's and PostgreSQL's logs, Airflow's files), except the
        # owner-only files that keep them. (`make connect` on the running stack, which reuses its server and prints
        # no secret, is checked once, after the scheduled run below.)
        state = json.loads((copy / ".cache" / "devstack" / "state.json").read_text())
        secrets = {"the Connect token": state["connect_token"],
                   "the ledger password": make_url(state["env"]["MICROBATCH_LEDGER_URL"]).password}
        assert all(secrets.values()), "the stack has no token or no password to sweep for"
        kept = ("state.json", "env.sh", "postgres/password")  # where the stack keeps them, owner-only
        for name in kept:
            assert (copy / ".cache" / "devstack" / name).stat().st_mode & 0o077 == 0, f"{name} is not owner-only"
        written = {"make demo": output, "status": status.stdout + status.stderr, "history": history.stdout}
        devstack = copy / ".cache" / "devstack"
        allowed = {devstack / name for name in kept}
        swept = 0
        for path in (copy / ".cache").rglob("*"):
            skipped = path in allowed or {"m2", "jars"} & set(path.relative_to(copy / ".cache").parts)
            if path.is_file() and not skipped and path.stat().st_size < 50_000_000:
                written[str(path)] = path.read_bytes().decode(errors="replace")
                swept += 1
        assert swept > 20 and any("connect-server" in name for name in written), sorted(written)[:50]
        leaked = [(secret, where) for secret, value in secrets.items() for where, text in written.items()
                  if value in text]
        assert not leaked, leaked

        # The README's Airflow path on the same stack: `make airflow`, a scheduled run, then `make down`.
        airflow_env = _airflow_env(copy, api_port)  # its log servers' ports, chosen once
        airflow = _start_make_airflow(copy, airflow_env, tmp_path / "make-airflow.log")
        _scheduled_run_under_make_airflow(copy, airflow, airflow_env, tmp_path / "make-airflow.log")
        state = json.loads((copy / ".cache" / "devstack" / "state.json").read_text())
        assert len(_stack_processes(state, airflow.pid)) > 10  # standalone's components, Kafka, PostgreSQL, Connect
        started = time.monotonic()
        down = _make(copy, "down")
        took = time.monotonic() - started
        assert down.returncode == 0, down.stdout + down.stderr
        print(f"make down took {took:.1f}s: {down.stdout.strip()}")
        with contextlib.suppress(subprocess.TimeoutExpired):
            airflow.wait(30)  # `make airflow` ends with its standalone
        left = _stack_processes(state, airflow.pid)
        assert not left, f"`make down` ({took:.0f}s) left processes of the stack running:\n{_describe(left)}"
        stopped = True
    finally:
        if state and not stopped:  # whatever failed above: this test's stack (found by its id), nothing else
            _make(copy, "down")
            leftover = _stack_processes(state, airflow.pid if airflow else None)
            for proc in leftover:
                with contextlib.suppress(psutil.Error):
                    proc.send_signal(signal.SIGKILL)
            psutil.wait_procs(leftover, timeout=10)
        if airflow and airflow.poll() is None:
            os.killpg(airflow.pid, signal.SIGKILL)
            airflow.wait(10)
    assert state, "the demo never wrote the stack's state"
    for port in (api_port, state["kafka_port"], state["controller_port"], state["postgres_port"],
                 state["connect_port"]):
        assert not port_open(port), f"port {port} still open after make down"
    gone = _cli(copy, "status")
    assert gone.returncode == 2
    assert gone.stdout.strip().startswith("error: ") and "make demo" in gone.stdout and "Traceback" not in gone.stdout
