"""A real schema registry for the local stack and the tests: Apicurio Registry from Maven Central, in memory, on a free
loopback port, serving the Confluent-compatible REST API (`/apis/ccompat/v7`) that Avro producers and consumers use.
Its global compatibility rule is BACKWARD, Confluent's default (`COMPATIBILITY`): a new version a reader of the latest
cannot read is refused, as docker-compose.yaml's registry refuses it.

Version 2.6.13.Final: it runs on Java 17, the machine's default `java` (the 3.x line needs Java 21). The distribution
(`io.apicurio:apicurio-registry-app`, classifier `all`, a tar.gz of a Quarkus runner jar and its `lib/`) is fetched
once with Maven by `python -m microbatch.dev.stack jars` (`make jars`), or on the first start where that did not run,
and unpacked under `.cache/registry`.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import shutil
import subprocess
import tarfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from microbatch.dev.process import free_port, port_open, terminate_group, wait_until
from microbatch.runtime import cache_dir

log = logging.getLogger(__name__)

APICURIO_VERSION = "2.6.13.Final"
ARTIFACT = f"io.apicurio:apicurio-registry-app:{APICURIO_VERSION}:tar.gz:all"
RUNNER_JAR = f"apicurio-registry-app-{APICURIO_VERSION}-runner.jar"
CCOMPAT_PATH = "/apis/ccompat/v7"
"""The root of the Confluent-compatible API: what a Confluent client takes as the registry's URL."""
COMPATIBILITY = "BACKWARD"
"""The registry's default global compatibility rule (Confluent's default; Apicurio's own is none): a subject's new
version must read what its latest wrote. docker-compose.yaml's registry sets the same
(REGISTRY_RULES_GLOBAL_COMPATIBILITY). The Confluent API's `GET /config` still answers NONE (it reports only a rule
set through the API); `PUT /config/SUBJECT` overrides it for one subject."""
PROCESS_MARKER = b"apicurio-registry-app"
"""In the JVM's command line (the runner jar's name): how the stack recognises its registry's pid."""

# A development registry holds a handful of schemas: the client compiler only, the serial collector and a small heap
# start it with less CPU and memory, as for the development Kafka broker (dev/kafka.py). The H2 pool (20 connections
# by default) keeps 2.
JVM_OPTIONS = ("-Xmx256m", "-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC", "-Djava.awt.headless=true",
               "-Dquarkus.datasource.jdbc.min-size=2", "-Dquarkus.datasource.jdbc.initial-size=2")


def distribution_dir() -> Path:
    """Where the unpacked distribution lives (its runner jar and `lib/`)."""
    return cache_dir() / "registry" / f"apicurio-registry-app-{APICURIO_VERSION}"


def ensure_registry() -> Path:
    """Fetch and unpack the distribution once (Maven into `.cache/m2`, then `.cache/registry`); return its folder.
    Concurrent callers (pytest-xdist workers) wait for one fetch under a file lock."""
    target = distribution_dir()
    if (target / RUNNER_JAR).exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with _locked(target.parent / ".lock"):
        if (target / RUNNER_JAR).exists():
            return target
        started = time.monotonic()
        download = target.parent / "download"
        unpacked = target.parent / "unpacking"
        for folder in (download, unpacked):
            shutil.rmtree(folder, ignore_errors=True)
        command = ["mvn", "-q", "-B", "dependency:copy", f"-Dartifact={ARTIFACT}", f"-DoutputDirectory={download}",
                   f"-Dmaven.repo.local={cache_dir() / 'm2'}"]
        result = subprocess.run(command, capture_output=True, text=True, check=False)
        if result.returncode != 0:
            tail = "\n".join((result.stdout + result.stderr).splitlines()[-40:])
            raise RuntimeError(f"fetching Apicurio Registry with Maven failed ({' '.join(command)}):\n{tail}")
        (archive,) = download.glob("*.tar.gz")
        with tarfile.open(archive) as tar:
            tar.extractall(unpacked, filter="data")  # no absolute paths, links out of the folder or device files
        shutil.rmtree(target, ignore_errors=True)  # a folder left without its runner jar (by hand)
        unpacked.replace(target)  # the runner jar appears with the whole folder, never before it
        shutil.rmtree(download, ignore_errors=True)
        log.info("fetched Apicurio Registry %s into %s in %.1fs", APICURIO_VERSION, target, time.monotonic() - started)
    return target


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def answers(url: str, timeout: float = 2.0) -> bool:
    """Whether the Confluent-compatible API at `url` lists its subjects (a JSON list): the registry is ready."""
    try:
        with urllib.request.urlopen(f"{url}/subjects", timeout=timeout) as response:
            return isinstance(json.load(response), list)
    except (OSError, ValueError):  # refused, reset, an HTTP error status, or not JSON (yet)
        return False


class SchemaRegistry:
    """Apicurio Registry in one JVM (its process group), bound to 127.0.0.1 only, with in-memory storage (H2): every
    schema is gone when it stops. No authentication: on loopback, only this machine reaches it. Its log (the
    console, Quarkus's only log) and its temporary files are under `work_dir`."""

    def __init__(self, work_dir: Path, port: int | None = None) -> None:
        self.work_dir = Path(work_dir)
        self.port = port or free_port()
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """The root of its Confluent-compatible API, for `MICROBATCH_SCHEMA_REGISTRY_URL` and Confluent clients."""
        return f"http://127.0.0.1:{self.port}{CCOMPAT_PATH}"

    @property
    def log_file(self) -> Path:
        return self.work_dir / "registry.log"

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None

    def command(self, distribution: Path) -> list[str]:
        return ["java", *JVM_OPTIONS, f"-Djava.io.tmpdir={self.work_dir / 'tmp'}",
                f"-Dregistry.rules.global.compatibility={COMPATIBILITY}",
                "-Dquarkus.http.host=127.0.0.1", f"-Dquarkus.http.port={self.port}",
                "-jar", str(distribution / RUNNER_JAR)]

    def start(self, timeout: float = 120) -> SchemaRegistry:
        """Start the JVM and wait until the Confluent-compatible API answers (once: a started registry is kept)."""
        if self.process is not None and self.process.poll() is None:
            return self
        distribution = ensure_registry()
        (self.work_dir / "tmp").mkdir(parents=True, exist_ok=True)
        # cwd: the transaction manager (Narayana) keeps its object store in the working directory.
        self.process = subprocess.Popen(self.command(distribution), stdout=self.log_file.open("ab"),
                                        stderr=subprocess.STDOUT, start_new_session=True, cwd=self.work_dir)
        process = self.process

        def ready() -> bool:
            if process.poll() is not None:
                raise RuntimeError(f"Apicurio Registry exited with {process.returncode}; see {self.log_file}")
            return port_open(self.port) and answers(self.url)

        try:
            wait_until(ready, timeout, f"Apicurio Registry on {self.url}", self.log_file)
        except BaseException:  # a registry that did not come up is not left running
            self.stop()
            raise
        log.info("Apicurio Registry %s up on %s (pid %s)", APICURIO_VERSION, self.url, process.pid)
        return self

    def stop(self, timeout: float = 30) -> None:
        """SIGTERM (Quarkus shuts down cleanly), then SIGKILL after `timeout`."""
        if self.process is not None and self.process.poll() is None:
            terminate_group(self.process, timeout)

    def __enter__(self) -> SchemaRegistry:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
