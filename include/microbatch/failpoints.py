"""Failpoints: real process deaths at named points, for crash tests.

Every failpoint is registered in `REGISTRY` with the modes it supports. A module that has one declares it at
import, `BEFORE_COMMIT = failpoints.point("commit.before_commit")`, and calls `BEFORE_COMMIT.hit()` where the
process must die: a misspelled name raises when that module is imported.

`MICROBATCH_FAILPOINTS` lists armed points, comma-separated:

- `name` (or `name=exit`) exits with `os._exit(86)`;
- `name=kill` sends SIGKILL to the own process;
- `name=pause:S` does not crash: it holds the process S seconds at the point, so that a test can break
  something outside it (a Kafka broker) at that moment;
- for a point that counts records (`stage.read`): `name=N` exits after N records, `name=N:kill` dies by
  SIGKILL after N records (a bare `name` or `name=kill` fires at the first record).

An unknown name, or a mode the point does not support, is refused with a ValueError. With
`MICROBATCH_FAILPOINT_DIR` set, each point fires once: a marker file records that it fired, so the retry
goes through; and the file `.armed` in that directory, if present, arms more points in the same syntax,
read at each hit, so a test can arm a point in processes that are already running. Unarmed points cost
one dict lookup (plus a file read when the directory is set, in tests only). A point that fires in another
process (a Spark Python worker) takes the marker directory from the process that armed it (`crash`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import signal
import time
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)
FAILPOINTS_ENV = "MICROBATCH_FAILPOINTS"
FAILPOINT_DIR_ENV = "MICROBATCH_FAILPOINT_DIR"
EXIT_CODE = 86
ARMED_FILE = ".armed"
EXIT, KILL, PAUSE = "exit", "kill", "pause"
CRASH_MODES = (EXIT, KILL)


@dataclass(frozen=True)
class Registered:
    """What a registered failpoint supports: its modes, and whether it fires after a count of records."""

    modes: frozenset[str]
    counts_records: bool = False


_CRASH = frozenset(CRASH_MODES)
REGISTRY: dict[str, Registered] = {
    "plan.list_offsets": Registered(frozenset({PAUSE})),  # between the earliest and latest offset lookups
    "stage.before_read": Registered(frozenset({PAUSE})),  # the stage's driver, before its Spark job reads Kafka
    "stage.read": Registered(_CRASH, counts_records=True),  # a Spark Python worker, mid-read
    "stage.after_write": Registered(_CRASH),
    "stage.after_staged": Registered(_CRASH),
    "stage.before_lake_commit": Registered(_CRASH | {PAUSE}),  # pause: a zombie holds before its table commit
    "stage.after_lake_commit": Registered(_CRASH),
    "commit.before_commit": Registered(_CRASH | {PAUSE}),  # pause: the chaos harness holds a run in its commit
    "commit.after_commit": Registered(_CRASH),
    "publish.before_commit": Registered(_CRASH | {PAUSE}),
    "publish.after_commit": Registered(_CRASH),
    "publish.between_transactions": Registered(_CRASH),
}


@dataclass(frozen=True)
class Arming:
    """How an armed failpoint fires: its mode, the seconds a pause holds, the records a counting point lets by."""

    mode: str
    seconds: float = 0.0
    limit: int = 0


@dataclass(frozen=True)
class Point:
    """A registered failpoint, declared once at module import by `point()`."""

    name: str

    def arming(self) -> Arming | None:
        """How this point fires if it is armed and has not fired yet, else None."""
        return arming(self.name)

    def hit(self) -> None:
        """Crash (or pause) here if this point is armed."""
        hit(self.name)


def point(name: str) -> Point:
    """The registered failpoint `name`; an unknown name raises ValueError."""
    if name not in REGISTRY:
        raise ValueError(f"Unknown failpoint '{name}': the registered ones are {', '.join(sorted(REGISTRY))}.")
    return Point(name)


def forms(name: str) -> list[str]:
    """The items of `MICROBATCH_FAILPOINTS` that arm the registered point `name`."""
    registered = REGISTRY[name]
    out = []
    if EXIT in registered.modes:
        out += [name, f"{name}=N"] if registered.counts_records else [name]
    if KILL in registered.modes:
        out += [f"{name}=kill", f"{name}=N:kill"] if registered.counts_records else [f"{name}=kill"]
    if PAUSE in registered.modes:
        out.append(f"{name}=pause:S")
    return out


_COUNT = re.compile(r"(\d+)(?::(exit|kill))?")


def parse_item(item: str, source: str = FAILPOINTS_ENV) -> tuple[str, Arming]:
    """One item of an armed list (`name`, `name=kill`, `name=pause:S`, `name=N`, `name=N:kill`), checked
    against the registry; a bad item raises ValueError naming it."""
    name, _, arg = item.partition("=")
    if name not in REGISTRY:
        raise ValueError(f"{source} item '{item}' names an unknown failpoint: the registered ones are "
                         f"{', '.join(sorted(REGISTRY))}.")
    registered = REGISTRY[name]
    count = _COUNT.fullmatch(arg)
    seconds = 0.0
    if arg.startswith("pause:"):
        mode = PAUSE
        try:
            seconds = float(arg.removeprefix("pause:"))
        except ValueError:
            mode = ""
    elif count and registered.counts_records:
        mode = count.group(2) or EXIT
    else:
        mode = {"": EXIT, EXIT: EXIT, KILL: KILL}.get(arg, "")
    if mode not in registered.modes:
        raise ValueError(f"{source} item '{item}' is not a form failpoint {name} supports: use one of "
                         f"{', '.join(forms(name))}.")
    return name, Arming(mode, seconds, int(count.group(1)) if count and registered.counts_records else 0)


def parse(spec: str, source: str = FAILPOINTS_ENV) -> dict[str, Arming]:
    """The failpoints a comma-separated list arms (a later item for the same point wins)."""
    return dict(parse_item(part.strip(), source) for part in spec.split(",") if part.strip())


def env_marker_dir() -> str | None:
    """The directory of the marker files (and of the armed file), from the environment."""
    return os.environ.get(FAILPOINT_DIR_ENV) or None


def armed() -> dict[str, Arming]:
    """The armed failpoints, read from the environment and the armed file; a bad item raises ValueError."""
    points = parse(os.environ.get(FAILPOINTS_ENV, ""))
    directory = env_marker_dir()
    if directory:
        path = Path(directory) / ARMED_FILE
        with contextlib.suppress(FileNotFoundError):
            points.update(parse(path.read_text(), str(path)))
    return points


def arming(name: str) -> Arming | None:
    """How the failpoint `name` fires if it is armed and has not fired yet, else None."""
    point(name)
    found = armed().get(name)
    directory = env_marker_dir()
    if found is None or (directory and (Path(directory) / name).exists()):
        return None
    return found


def crash(name: str, mode: str = EXIT, marker_dir: str | None = None) -> None:
    """Die now, the hard way (`kill`: SIGKILL, else os._exit), after recording in `marker_dir` (default: the
    environment's) that the failpoint fired. A Spark Python worker gets the directory from the armed process."""
    _mark(name, marker_dir)
    log.error("failpoint %s fired: the process dies now (test crash injection)", name)
    for handler in logging.getLogger().handlers:
        handler.flush()
    if mode == KILL:
        os.kill(os.getpid(), signal.SIGKILL)
    os._exit(EXIT_CODE)


def _mark(name: str, directory: str | None = None) -> None:
    directory = directory or env_marker_dir()
    if directory:
        Path(directory).mkdir(parents=True, exist_ok=True)
        (Path(directory) / name).touch()


RELEASE_SUFFIX = ".release"


def release(name: str, marker_dir: str | Path) -> None:
    """End a pause at `name` before its seconds are up: the test that held a run there has applied its fault."""
    Path(marker_dir).mkdir(parents=True, exist_ok=True)
    (Path(marker_dir) / f"{name}{RELEASE_SUFFIX}").touch()


def _hold(name: str, seconds: float) -> None:
    """Sleep `seconds`, or less once `release(name)` was called in the marker directory."""
    directory = env_marker_dir()
    released = Path(directory) / f"{name}{RELEASE_SUFFIX}" if directory else None
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        if released is not None and released.exists():
            log.warning("failpoint %s: released after %.1fs of %.0fs", name, seconds - left, seconds)
            return
        time.sleep(min(0.1, left))


def hit(name: str) -> None:
    """Crash here if the failpoint `name` is armed (or pause here, for `name=pause:S`: S seconds, or until the
    test `release`s it)."""
    found = arming(name)
    if found is None:
        return
    if found.mode == PAUSE:
        log.warning("failpoint %s: holding here %.0fs (test fault injection)", name, found.seconds)
        _mark(name)
        _hold(name, found.seconds)
        return
    crash(name, found.mode)
