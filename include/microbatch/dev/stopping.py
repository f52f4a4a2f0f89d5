"""Finding and stopping the local stack's processes (`stack down`): a recorded process by its pid and command line,
a process group, `airflow standalone` with everything it started, and every process that carries the stack's id;
SIGTERM first, SIGKILL after a timeout."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import time
from pathlib import Path

from microbatch.dev.process import wait_until
from microbatch.runtime import cache_dir

log = logging.getLogger("microbatch.dev.stack")  # a line of the stack's own log


def runs(pid: int, marker: bytes) -> bool:
    """Whether `pid` is alive and its command line holds `marker` (a recycled pid belongs to something else;
    a zombie has an empty command line and counts as gone)."""
    try:
        return marker in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def stop_group(pid: int | None, marker: bytes, what: str) -> None:
    """SIGTERM the process group that `pid` leads while `pid` is still the process whose command line holds `marker`,
    then SIGKILL it if it has not ended after 30 s."""
    if not pid or not runs(pid, marker):
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGTERM)
    try:
        wait_until(lambda: not runs(pid, marker), 30, f"{what} shutdown")
    except RuntimeError:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)


def is_airflow(cmdline: list[str]) -> bool:
    """Whether a command line is an Airflow command: `airflow ...`, `python .../airflow ...`, or a title that
    an Airflow component set for itself ("airflow scheduler -- ...", "airflow worker -- LocalExecutor")."""
    words = " ".join(cmdline[:2]).split()
    if not words:
        return False
    if Path(words[0]).name == "airflow":
        return True
    return Path(words[0]).name.startswith("python") and len(words) > 1 and Path(words[1]).name == "airflow"


def spared_pids() -> set[int]:
    """This process and its ancestors: `down` may run from a shell or a task of the stack itself."""
    import psutil

    me = psutil.Process()
    return {me.pid, *(parent.pid for parent in me.parents())}


def airflow_processes(state: dict) -> list:
    """The recorded `airflow standalone` and every Airflow process of the stack, each with all its descendants.

    An Airflow component writes its title over its environment (setproctitle), so one that outlived its
    parent is recognised by its process group (standalone's, which its components keep) and its title. An
    Airflow process with the stack's AIRFLOW_HOME in its environment counts too: a standalone that was
    started before standalones were recorded."""
    import psutil

    roots: list[psutil.Process] = []
    started = state.get("airflow_started", 0)
    with contextlib.suppress(psutil.Error):
        recorded = psutil.Process(state.get("airflow_pid") or 0)
        if abs(recorded.create_time() - started) < 1 and is_airflow(recorded.cmdline()):
            roots.append(recorded)
    pgid = state.get("airflow_pgid")
    home = str(state.get("airflow_home") or cache_dir() / "airflow")
    for proc in psutil.process_iter():
        try:
            if not is_airflow(proc.cmdline()):
                continue
            in_group = bool(pgid) and os.getpgid(proc.pid) == pgid and proc.create_time() >= started - 1
            if in_group or proc.environ().get("AIRFLOW_HOME") == home:
                roots.append(proc)
        except (psutil.Error, ProcessLookupError):  # gone, or another user's
            continue
    found: dict[int, psutil.Process] = {}
    for root in roots:
        with contextlib.suppress(psutil.Error):
            found.update({p.pid: p for p in (root, *root.children(recursive=True))})
    spared = spared_pids()
    return [proc for pid, proc in found.items() if pid not in spared]


def processes_with_env(match: dict[str, str]) -> list:
    """The processes (but this one and its ancestors) whose environment has every `match` item."""
    import psutil

    spared = spared_pids()
    found = []
    for proc in psutil.process_iter():
        if proc.pid in spared:
            continue
        try:
            env = proc.environ()
        except psutil.Error:  # gone, or another user's
            continue
        if all(env.get(key) == value for key, value in match.items()):
            found.append(proc)
    return found


def stop_processes(procs: list, timeout: float) -> int:
    """SIGTERM `procs`, then SIGKILL those still running after `timeout` seconds; return how many there were.
    A zombie counts as stopped: it holds no resource but its pid until its parent reaps it."""
    import psutil

    def running(proc: psutil.Process) -> bool:
        try:
            return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
        except psutil.Error:
            return False

    procs = [proc for proc in procs if running(proc)]
    count = len(procs)
    for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 10)):
        procs = [proc for proc in procs if running(proc)]
        for proc in procs:
            with contextlib.suppress(psutil.Error):
                proc.send_signal(sig)  # psutil refuses a pid that was reused since `proc` was found
        deadline = time.monotonic() + wait
        while any(running(proc) for proc in procs) and time.monotonic() < deadline:
            time.sleep(0.2)
    left = [proc.pid for proc in procs if running(proc)]
    if left:
        log.warning("processes %s did not exit after SIGKILL", left)
    return count
