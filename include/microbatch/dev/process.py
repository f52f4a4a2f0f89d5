"""Processes and ports of the local stack: free ports, readiness waits, stopping process groups, and the
sockets a set of processes listens on."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def port_open(port: int) -> bool:
    """Whether something accepts TCP connections on 127.0.0.1:`port`."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(0.5)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def alive(pid: int) -> bool:
    """Whether a process with this pid exists (a zombie counts: it still holds its pid)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def children(pid: int) -> list[int]:
    """The pids whose parent is `pid`, from /proc (empty where /proc is missing)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return found


def wait_until(predicate: callable, timeout: float, what: str, log_file: Path | None = None) -> None:  # type: ignore[valid-type]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.3)
    tail = ""
    if log_file and log_file.exists():
        tail = "\n".join(log_file.read_text(errors="replace").splitlines()[-30:])
    raise RuntimeError(f"{what} did not become ready within {timeout:.0f}s.\n{tail}")



def terminate_group(process: subprocess.Popen, timeout: float) -> None:
    """SIGTERM the process group `process` leads (started with start_new_session), then SIGKILL it if
    `process` has not exited within `timeout`."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout)


@dataclass(frozen=True)
class ListeningSocket:
    pid: int
    name: str
    protocol: str  # "tcp" or "udp"
    address: str
    port: int

    @property
    def loopback_only(self) -> bool:
        """Whether only this machine can reach it: bound to 127.0.0.0/8 (also as ::ffff:127.x, as a JVM shows
        it) or ::1, never to a wildcard or another interface."""
        import ipaddress

        address = ipaddress.ip_address(self.address.split("%")[0])
        mapped = getattr(address, "ipv4_mapped", None)
        return (mapped or address).is_loopback

    def __str__(self) -> str:
        return f"{self.name} (pid {self.pid}) {self.protocol} {self.address}:{self.port}"


def listening_sockets(pids: Iterable[int]) -> list[ListeningSocket]:
    """Every TCP socket in LISTEN and every unconnected bound UDP socket that the processes `pids` hold, from
    one read of /proc/net/tcp*, udp* by psutil (which maps each socket's inode to its process)."""
    import psutil

    wanted = set(pids)
    names: dict[int, str] = {}
    found = []
    for conn in psutil.net_connections(kind="inet"):
        if conn.pid not in wanted or not conn.laddr:
            continue
        tcp = conn.type == socket.SOCK_STREAM
        if (tcp and conn.status == psutil.CONN_LISTEN) or (not tcp and not conn.raddr):
            if conn.pid not in names:
                try:
                    names[conn.pid] = " ".join(psutil.Process(conn.pid).cmdline()[:3])[:80]
                except psutil.Error:
                    names[conn.pid] = "?"
            found.append(ListeningSocket(conn.pid, names[conn.pid], "tcp" if tcp else "udp", conn.laddr.ip,
                                         conn.laddr.port))
    return found


def write_log4j(path: Path, log_file: Path, extra: str = "") -> None:
    """A log4j2 configuration at `path` for a dev JVM (the broker, the Connect worker): INFO and above into
    `log_file`, plus `extra` lines (e.g. a logger's level)."""
    path.write_text(
        "rootLogger.level = INFO\nrootLogger.appenderRef.file.ref = FILE\n"
        "appender.file.type = File\nappender.file.name = FILE\n"
        f"appender.file.fileName = {log_file}\n"
        "appender.file.layout.type = PatternLayout\nappender.file.layout.pattern = [%d] %p %m (%c)%n\n" + extra
    )
