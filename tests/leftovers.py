"""The processes a test run left behind, found at the end of the run (tests/conftest.py's pytest_sessionfinish).

Every process a run starts inherits RUN_ENV from it: the run's id in the process that runs the tests, and
`<id>/<worker>` in each pytest-xdist worker's. A process of the run is one whose environment carries the marker,
or a descendant of the process checking that leads a session of its own (a service); this process, its ancestors
and the helpers that end with it (pyspark's gateway JVM, multiprocessing's resource tracker, any descendant in its
session) are not. The xdist controller checks once its workers have ended, for every marker of the run."""

from __future__ import annotations

import contextlib
import os
import sys
import time

RUN_ENV = "MICROBATCH_TEST_RUN"


def _helpers() -> set[int]:
    """The pids of this process's helpers that end when it ends: pyspark's gateway JVM and its children,
    multiprocessing's resource tracker and forkserver."""
    import psutil

    pids: set[int] = set()
    if "pyspark" in sys.modules:
        from pyspark import SparkContext

        gateway = getattr(SparkContext, "_gateway", None)
        proc = getattr(gateway, "proc", None)
        if proc is not None:
            pids.add(proc.pid)
            with contextlib.suppress(psutil.Error):
                pids.update(child.pid for child in psutil.Process(proc.pid).children(recursive=True))
    for module, attribute in (("multiprocessing.resource_tracker", "_resource_tracker"),
                              ("multiprocessing.forkserver", "_forkserver")):
        helper = getattr(sys.modules.get(module), attribute, None)
        pid = getattr(helper, "_pid", None) or getattr(helper, "_forkserver_pid", None)
        if pid:
            pids.add(pid)
    return pids


def _running(marker: str, with_workers: bool) -> list:
    """The processes of the run of `marker` (with `with_workers`, also those of its xdist workers' markers) that
    outlive this process: those that carry the marker, and this process's descendants that lead a session of their
    own (a service started with start_new_session). A descendant in this process's session is left to the check
    after it (the xdist controller's): most are helpers that end with it."""
    import psutil

    me = psutil.Process()
    session = os.getsid(0)
    spared = {me.pid, *(parent.pid for parent in me.parents()), *_helpers()}
    descendants = {child.pid: child for child in me.children(recursive=True)}
    found = {}
    for pid, child in descendants.items():
        with contextlib.suppress(psutil.Error, OSError):
            if os.getsid(pid) == pid:
                found[pid] = child
    for proc in psutil.process_iter():
        try:
            value = proc.environ().get(RUN_ENV)
            if proc.pid in descendants and os.getsid(proc.pid) == session:
                continue
        except (psutil.Error, OSError):  # gone, or another user's
            continue
        if value == marker or (with_workers and value and value.startswith(f"{marker}/")):
            found[proc.pid] = proc
    left = []
    for pid, proc in sorted(found.items()):
        try:
            if pid not in spared and proc.status() != psutil.STATUS_ZOMBIE:
                left.append(proc)
        except psutil.Error:
            continue
    return left


def describe(proc) -> str:
    import psutil

    try:
        return f"pid {proc.pid}: {' '.join(proc.cmdline())[:160] or proc.name()}"
    except psutil.Error:
        return f"pid {proc.pid}"


def check(with_workers: bool = False, grace_s: float = 3.0) -> list[str]:
    """The processes of this run still running, after up to `grace_s` for them to end by themselves; each named,
    then stopped (SIGTERM, SIGKILL after 10 s), so that a failed run leaves nothing behind either."""
    from microbatch.dev.stopping import stop_processes

    marker = os.environ.get(RUN_ENV)
    if not marker:
        return []
    deadline = time.monotonic() + grace_s
    left = _running(marker, with_workers)
    while left and time.monotonic() < deadline:
        time.sleep(0.5)
        left = _running(marker, with_workers)
    names = [describe(proc) for proc in left]
    stop_processes(left, timeout=10)
    return names
