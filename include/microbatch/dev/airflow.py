"""Airflow for the local stack: what `airflow standalone` runs, with every listening socket on 127.0.0.1.

`airflow standalone` cannot do that: its scheduler and triggerer start log servers on every interface
(Airflow's serve_logs has no host setting). `python -m microbatch.dev.airflow` runs the same components
(metadata DB, scheduler, dag-processor, API server, triggerer) with the API server on 127.0.0.1, the
components' own log servers off, and one worker log server on 127.0.0.1 in their place, so the UI still
shows a running task's log. `AirflowStandalone` starts it on free ports for the UI tests and benchmarks.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from microbatch.dev.process import free_port, terminate_group

log = logging.getLogger(__name__)

LOOPBACK = "127.0.0.1"
MODULE = "microbatch.dev.airflow"  # this module, also when it runs as __main__
# Each component as `airflow <args>`; --skip-serve-logs: their log servers would listen on every interface.
COMPONENTS = (("scheduler", "--skip-serve-logs"), ("dag-processor",), ("api-server",),
              ("triggerer", "--skip-serve-logs"))
TITLE = "airflow standalone"  # how `make down` (dev/stopping.is_airflow) recognizes the supervisor


PRELOAD = {
    "AIRFLOW__SCHEDULER__MP_START_METHOD": "forkserver",
    "AIRFLOW__SCHEDULER__MP_FORKSERVER_PRELOAD": "airflow,airflow.executors.local_executor,microbatch.airflow.preload",
}
"""The scheduler's workers fork from a forkserver that imported what microbatch's tasks import, so each task
process starts with them (`microbatch.airflow.preload`); docker-compose.yaml sets the same."""


def loopback_hostname() -> str:
    """The local Airflow's `hostname_callable`: the API server fetches a running task's log from the worker
    log server at the task's hostname, and that server listens on loopback only."""
    return LOOPBACK


def loopback_env(environ: dict[str, str]) -> dict[str, str]:
    """`environ` with the loopback settings of the local Airflow (the API server's host, the hostname the
    log server is reached at) and standalone's executor and auth manager, where `environ` has none."""
    return {
        "AIRFLOW__API__HOST": LOOPBACK,
        "AIRFLOW__CORE__HOSTNAME_CALLABLE": f"{MODULE}.loopback_hostname",
        "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
        "AIRFLOW__CORE__AUTH_MANAGER": "airflow.api_fastapi.auth.managers.simple.simple_auth_manager.SimpleAuthManager",
        # The scheduler's nap when a loop found nothing to do (Airflow's default 1 s): each batch waited it out
        # between its tasks and before the next @continuous run. 0.2 s: 2.3 s -> 0.9 s of gaps per batch; 0.1 s:
        # 1.45 -> 1.24 s per batch beyond its Spark job, the scheduler at 17 % of a core instead of 11 % while a
        # @continuous DAG runs (0.05 s: 1.16 s at 26 %) (bench/airflow_overhead.py --connect, docs/performance.md).
        "AIRFLOW__SCHEDULER__SCHEDULER_IDLE_SLEEP_TIME": "0.1",
        **PRELOAD,
        **environ,
    }


def serve_logs() -> None:
    """The worker log server (Airflow's own app, which checks a JWT signed with the JWT secret) on loopback."""
    import uvicorn
    from airflow.configuration import conf
    from setproctitle import setproctitle

    setproctitle("airflow serve-logs")
    uvicorn.run("airflow.utils.serve_logs.log_server:get_app", factory=True, host=LOOPBACK,
                port=conf.getint("logging", "worker_log_server_port"), log_config=None, access_log=False)


def run_standalone() -> int:
    """Migrate the metadata DB, then run the components and the log server in this process group until one
    of them exits or this process gets SIGTERM/SIGINT; then stop them all (SIGTERM, SIGKILL after 20 s).
    Return the exit code of the component that ended first (0 on a signal)."""
    from setproctitle import setproctitle

    setproctitle(TITLE)
    env = loopback_env(dict(os.environ))
    airflow = str(Path(sys.executable).parent / "airflow")
    # What standalone does first: create or upgrade the metadata DB. Through the CLI, which also writes a missing
    # airflow.cfg with a generated JWT secret: before the components start, so they all read the same one.
    subprocess.run([airflow, "db", "migrate"], env=env, check=True)
    stopping: list[int] = []

    def stop(signum: int, frame: object) -> None:
        stopping.append(signum)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    processes = [subprocess.Popen([airflow, *args], env=env) for args in COMPONENTS]
    processes.append(subprocess.Popen([sys.executable, "-m", MODULE, "serve-logs"], env=env))
    print(f"{TITLE}: the API server on http://{env['AIRFLOW__API__HOST']}:{env.get('AIRFLOW__API__PORT', '8080')}, "
          f"the log server on {LOOPBACK}, no other listening socket", flush=True)
    while not stopping and all(process.poll() is None for process in processes):
        time.sleep(0.5)
    ended = next((process.returncode for process in processes if process.poll() is not None), 0)
    for process in processes:
        if process.poll() is None:
            process.terminate()
    deadline = time.monotonic() + 20
    for process in processes:
        try:
            process.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    return 0 if stopping else ended


class AirflowStandalone:
    """The local Airflow (`python -m microbatch.dev.airflow`, every socket on loopback) on free ports, in its
    own AIRFLOW_HOME and process group."""

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
            self.proc = subprocess.Popen([sys.executable, "-m", MODULE], env=env, stdout=log,
                                         stderr=subprocess.STDOUT, start_new_session=True)

    def wait_ready(self, timeout: float = 90) -> dict[str, str]:
        """Wait for the api-server's health endpoint; return the generated login of the test user."""
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the local Airflow exited: {self.log_path.read_text()[-3000:]}")
            try:
                with urllib.request.urlopen(f"{self.base}/api/v2/monitor/health", timeout=2):
                    break
            except (urllib.error.URLError, OSError) as exc:
                if time.monotonic() > self.started + timeout:
                    raise RuntimeError(f"the api-server did not come up: {self.log_path.read_text()[-3000:]}") from exc
                time.sleep(0.5)
        log.info("the local Airflow answered after %.1fs", time.monotonic() - self.started)
        passwords = json.loads((self.home / "simple_auth_manager_passwords.json.generated").read_text())
        self.admin_password = passwords["admin"]
        return {"user": "operator", "password": passwords["operator"]}

    def api(self, method: str, path: str, body: dict | None = None) -> tuple[int, dict]:
        """Airflow's REST API as the admin user (a JWT from /auth/token)."""
        if not getattr(self, "token", None):
            self.token = api_token(self.base, "admin", self.admin_password)
        code, answer = api_call(self.base, self.token, method, path, body)
        return code, json.loads(answer or b"{}")

    def stop(self) -> None:
        # standalone runs its components as its children, in the session it leads: stop exactly that group.
        terminate_group(self.proc, 20)
        # Its components may outlive it for a moment: wait for the whole group, then kill what is left.
        for attempt in range(50):  # 10 s at most; zombies awaiting their reaper can stay listed
            try:
                os.killpg(self.proc.pid, signal.SIGKILL if attempt == 25 else 0)
            except ProcessLookupError:
                return
            time.sleep(0.2)


if __name__ == "__main__":
    if sys.argv[1:] == ["serve-logs"]:
        serve_logs()
    else:
        sys.exit(run_standalone())


def api_token(base: str, username: str, password: str) -> str:
    """A JWT for Airflow's REST API at `base`, from its /auth/token (the simple auth manager's users)."""
    request = urllib.request.Request(
        f"{base}/auth/token", method="POST", headers={"Content-Type": "application/json"},
        data=json.dumps({"username": username, "password": password}).encode())
    with urllib.request.urlopen(request, timeout=20) as response:
        return json.loads(response.read())["access_token"]


def api_call(base: str, token: str, method: str, path: str, body: dict | None = None,
             timeout: float = 30) -> tuple[int, bytes]:
    """(status, body) of one request to Airflow's REST API at `base` with `token`; an HTTP error is an answer."""
    request = urllib.request.Request(
        f"{base}{path}", method=method, data=None if body is None else json.dumps(body).encode(),
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()
