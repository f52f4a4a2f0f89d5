"""`airflow standalone` on free ports, in its own AIRFLOW_HOME and process group (the UI tests and benchmarks)."""

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


class AirflowStandalone:
    """`airflow standalone` on free ports, in its own AIRFLOW_HOME and process group."""

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
            self.proc = subprocess.Popen([str(Path(sys.executable).parent / "airflow"), "standalone"], env=env,
                                         stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    def wait_ready(self, timeout: float = 90) -> dict[str, str]:
        """Wait for the api-server's health endpoint; return the generated login of the test user."""
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"airflow standalone exited: {self.log_path.read_text()[-3000:]}")
            try:
                with urllib.request.urlopen(f"{self.base}/api/v2/monitor/health", timeout=2):
                    break
            except (urllib.error.URLError, OSError) as exc:
                if time.monotonic() > self.started + timeout:
                    raise RuntimeError(f"the api-server did not come up: {self.log_path.read_text()[-3000:]}") from exc
                time.sleep(0.5)
        log.info("airflow standalone answered after %.1fs", time.monotonic() - self.started)
        passwords = json.loads((self.home / "simple_auth_manager_passwords.json.generated").read_text())
        self.admin_password = passwords["admin"]
        return {"user": "operator", "password": passwords["operator"]}

    def api(self, method: str, path: str, body: dict | None = None) -> tuple[int, dict]:
        """Airflow's REST API as the admin user (a JWT from /auth/token)."""
        if not getattr(self, "token", None):
            request = urllib.request.Request(
                f"{self.base}/auth/token", method="POST", headers={"Content-Type": "application/json"},
                data=json.dumps({"username": "admin", "password": self.admin_password}).encode())
            with urllib.request.urlopen(request, timeout=20) as response:
                self.token = json.loads(response.read())["access_token"]
        request = urllib.request.Request(
            f"{self.base}{path}", method=method, data=None if body is None else json.dumps(body).encode(),
            headers={"Authorization": f"Bearer {self.token}", "Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=20) as response:
                return response.status, json.loads(response.read() or b"{}")
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read() or b"{}")

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
