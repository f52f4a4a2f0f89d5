"""A lakehouse table's data files that microbatch writes itself (the `iceberg` sink's): each attempt's folder
`data/microbatch-<batch>-<attempt>/`, the committed Parquet files in it and the rows their footers hold (the row
check before a table commit), and the orphans, the folders of attempts that never committed (`verify` lists
them, `maintain` removes them). Paths are local or URIs (pyarrow's file systems)."""

from __future__ import annotations

import os
import re
from collections.abc import Iterable

ATTEMPT_DIR = re.compile(r"microbatch-(\d+)-(\d+)")


def attempt_folder(loc: str, batch_id: int, attempt: int) -> str:
    """Where one attempt's Spark job writes the batch's data files."""
    return f"{loc.rstrip('/')}/data/microbatch-{batch_id}-{attempt}"


def orphan_folders(files: Iterable[str], referenced: set[str], open_batches: set[int]) -> dict[str, list[str]]:
    """The attempt folders (by path) whose files no snapshot references, of batches that are not open: what an
    attempt that never committed left. `files` are every file under the table's `data/`; a folder with a
    referenced file is never an orphan, nor one that microbatch did not name."""
    by_folder: dict[str, list[str]] = {}
    for path in files:
        folder, _, rest = path.partition("/data/")
        name = rest.split("/", 1)[0]
        match = ATTEMPT_DIR.fullmatch(name)
        if match is None or int(match.group(1)) in open_batches:
            continue
        by_folder.setdefault(f"{folder}/data/{name}", []).append(path)
    return {folder: sorted(paths) for folder, paths in sorted(by_folder.items())
            if not any(normal_path(p) in referenced for p in paths)}


def normal_path(path: str) -> str:
    """A file's path as a snapshot of the table references it (without `file://`)."""
    return path.removeprefix("file://")


def data_files(folder: str, paths: Iterable[str]) -> list[str]:
    """The Parquet files among `paths` (every file under `folder`) that the write committed: not a file whose name
    starts with `.` or `_` (a checksum, a marker), nor one in a hidden folder or Spark's `_temporary` below
    `folder` (the partition folders are `_p0=...`). Only the part below `folder` is looked at: the folder itself
    may be anywhere, the default warehouse `.cache/warehouse` included."""
    root = folder.rstrip("/") + "/"
    kept = []
    for path in paths:
        *folders, name = (path[len(root):] if path.startswith(root) else path.rsplit("/", 1)[-1]).split("/")
        hidden = name.startswith((".", "_")) or any(f.startswith(".") or f == "_temporary" for f in folders)
        if name.endswith(".parquet") and not hidden:
            kept.append(path)
    return kept


def file_rows(paths: Iterable[str]) -> int:
    """The rows the Parquet files hold, from their footers (no data read)."""
    import pyarrow.parquet as pq
    from pyarrow import fs

    total = 0
    for path in paths:
        filesystem, inner = fs.FileSystem.from_uri(path if "://" in path else f"file://{os.path.abspath(path)}")
        with filesystem.open_input_file(inner) as handle:
            total += pq.ParquetFile(handle).metadata.num_rows
    return total


def list_files(folder: str) -> list[str]:
    """Every file under `folder` (recursively), as paths or URIs as `folder` is given; [] if it does not exist."""
    from pyarrow import fs

    filesystem, root = fs.FileSystem.from_uri(folder if "://" in folder else f"file://{os.path.abspath(folder)}")
    try:
        infos = filesystem.get_file_info(fs.FileSelector(root, recursive=True, allow_not_found=True))
    except FileNotFoundError:
        return []
    prefix = folder[: folder.index("://") + 3] if "://" in folder else ""
    return sorted(prefix + info.path for info in infos if info.type == fs.FileType.File)


def remove_folder(folder: str) -> None:
    from pyarrow import fs

    filesystem, root = fs.FileSystem.from_uri(folder if "://" in folder else f"file://{os.path.abspath(folder)}")
    filesystem.delete_dir(root)


def file_mtime(path: str) -> float:
    """When the file at `path` was last modified (seconds since the epoch; 0 if its file system does not say)."""
    from pyarrow import fs

    filesystem, root = fs.FileSystem.from_uri(path if "://" in path else f"file://{os.path.abspath(path)}")
    info = filesystem.get_file_info(root)
    return info.mtime.timestamp() if info.mtime is not None else 0.0
