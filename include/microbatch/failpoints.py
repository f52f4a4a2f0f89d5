"""Failpoints: real process deaths at named points, for crash tests.

`MICROBATCH_FAILPOINTS` lists armed points, comma-separated: `name` exits with `os._exit`,
`name=kill` sends SIGKILL to the own process, `name=N` (for points that count records)
fires after N records, and `name=pause:S` does not crash: it holds the process S seconds at the point,
so that a test can break something outside it (a Kafka broker) at that moment.
With `MICROBATCH_FAILPOINT_DIR` set, each point fires once: a marker
file records that it fired, so the retry goes through; and the file `.armed` in that directory,
if present, arms more points in the same syntax, read at each hit, so a test can arm a point in
processes that are already running. Unarmed points cost one dict lookup (plus a file read when
the directory is set, in tests only).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import time
from pathlib import Path

log = logging.getLogger(__name__)
FAILPOINTS_ENV = "MICROBATCH_FAILPOINTS"
FAILPOINT_DIR_ENV = "MICROBATCH_FAILPOINT_DIR"
EXIT_CODE = 86
ARMED_FILE = ".armed"


def armed() -> dict[str, str]:
    """The armed failpoints and their arguments, read from the environment."""
    spec = os.environ.get(FAILPOINTS_ENV, "")
    marker_dir = os.environ.get(FAILPOINT_DIR_ENV)
    if marker_dir:
        with contextlib.suppress(FileNotFoundError):
            spec += "," + (Path(marker_dir) / ARMED_FILE).read_text()
    points = {}
    for item in filter(None, (part.strip() for part in spec.split(","))):
        name, _, arg = item.partition("=")
        points[name] = arg
    return points


def argument(name: str) -> str | None:
    """The failpoint's argument if it is armed and has not fired yet, else None."""
    points = armed()
    if name not in points:
        return None
    marker_dir = os.environ.get(FAILPOINT_DIR_ENV)
    if marker_dir and (Path(marker_dir) / name).exists():
        return None
    return points[name]


def crash(name: str, mode: str = "") -> None:
    """Die now, the hard way, after recording that the failpoint fired."""
    _mark(name)
    log.error("failpoint %s fired: the process dies now (test crash injection)", name)
    for handler in logging.getLogger().handlers:
        handler.flush()
    if mode == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    os._exit(EXIT_CODE)


def _mark(name: str) -> None:
    marker_dir = os.environ.get(FAILPOINT_DIR_ENV)
    if marker_dir:
        Path(marker_dir).mkdir(parents=True, exist_ok=True)
        (Path(marker_dir) / name).touch()


def hit(name: str) -> None:
    """Crash here if the failpoint `name` is armed (or pause here, for `name=pause:S`)."""
    arg = argument(name)
    if arg is None:
        return
    if arg.startswith("pause:"):
        seconds = float(arg.removeprefix("pause:"))
        log.warning("failpoint %s: holding here %.0fs (test fault injection)", name, seconds)
        _mark(name)
        time.sleep(seconds)
        return
    crash(name, arg)
