"""The README's path, exactly as a new user runs it: `make demo` in a fresh copy of the repository (a
fresh `.cache`, the shipped `include/pipelines`, no MICROBATCH_* or AIRFLOW_* variable set), the CLI
right after it with no `source env.sh`, `make connect` on the running stack, a sweep of everything the stack and
the commands wrote for its secrets, and `make down`. `make demo` runs once in the suite. The printed results
are checked against an independent recount of the topic.

Only the venv and Maven's download cache are shared with this checkout (`make -o` keeps make from reinstalling
the venv; the copy's Maven repository starts as hard links to this checkout's, as a machine that built the
project before keeps ~/.m2): `make demo` still resolves and copies its jars, and Kafka, PostgreSQL and Airflow's
home are the copy's own. The fresh-clone `.ci/run` downloads everything from nothing.
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
import shutil
import subprocess
from datetime import datetime
from pathlib import Path

import pytest
from sqlalchemy import make_url

from microbatch.dev.process import port_open
from tests.e2e.helpers import read_topic

pytestmark = pytest.mark.e2e
ROOT = Path(__file__).resolve().parents[2]
VENV = ROOT / ".venv"
SUMMARY = re.compile(r"ip_counts \(postgres_aggregate\): (\d+) rows, sum of count (\d+); (\d+) dead letters, "
                     r"(\d+) late records")
CLICKS_SUMMARY = re.compile(r"clicks_raw \(postgres_append\): (\d+) rows")
# The oracle's own reading of an nginx access-log line (not the Spark job's parser).
LINE = re.compile(r'^(\S+) \S+ \S+ \[(\d{2}/\w{3}/\d{4}:\d{2}:\d{2}:\d{2} [+-]\d{4})\] "[^"]*" \d{3} \d+')


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


def test_make_demo_on_a_fresh_copy_prints_exact_results_and_keeps_its_secrets(tmp_path: Path) -> None:
    copy = _fresh_copy(tmp_path / "microbatch")
    assert not (copy / ".cache").exists()
    _seed_maven_repository(copy)
    state: dict = {}
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

        # `make connect` on the running stack reuses its server; then the secrets sweep: no Connect token or
        # ledger password in anything the commands printed or the stack wrote (task logs, the Connect server's
        # log, Kafka's and PostgreSQL's logs, Airflow's files), except the owner-only files that keep them.
        connect_again = _make(copy, "connect")
        assert connect_again.returncode == 0, connect_again.stdout + connect_again.stderr
        assert "already up" in connect_again.stdout, connect_again.stdout
        state = json.loads((copy / ".cache" / "devstack" / "state.json").read_text())
        secrets = {"the Connect token": state["connect_token"],
                   "the ledger password": make_url(state["env"]["MICROBATCH_LEDGER_URL"]).password}
        assert all(secrets.values()), "the stack has no token or no password to sweep for"
        kept = ("state.json", "env.sh", "postgres/password")  # where the stack keeps them, owner-only
        for name in kept:
            assert (copy / ".cache" / "devstack" / name).stat().st_mode & 0o077 == 0, f"{name} is not owner-only"
        written = {"make demo": output, "make connect": connect_again.stdout +
                   connect_again.stderr, "status": status.stdout + status.stderr, "history": history.stdout}
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
    finally:
        down = _make(copy, "down")
    assert down.returncode == 0, down.stdout + down.stderr
    assert state, "the demo never wrote the stack's state"
    assert not port_open(state["kafka_port"]) and not port_open(state["postgres_port"])
    assert not port_open(state["connect_port"]), "make down left the Spark Connect server running"
    gone = _cli(copy, "status")
    assert gone.returncode == 2
    assert gone.stdout.strip().startswith("error: ") and "make demo" in gone.stdout and "Traceback" not in gone.stdout
