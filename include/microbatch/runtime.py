"""What a stage needs at run time, wherever its driver runs: the connector jars, the jar of the formats' JVM side,
the `--py-files` zip of this package and the jobs, and where the project and its cache are.

No dev-stack import and no pyspark import: the Airflow side calls this before any Spark starts.
"""

from __future__ import annotations

import hashlib
import importlib.util
import logging
import os
import shutil
import subprocess
import tempfile
import time
import zipfile
from pathlib import Path

from microbatch.errors import SetupError

log = logging.getLogger(__name__)

PROJECT_ROOT = Path(__file__).resolve().parents[2]
RUN_BATCH = PROJECT_ROOT / "spark_jobs" / "run_batch.py"
JAR_KINDS = ("kafka", "spark", "connect", "debezium")
JVM_SOURCES = PROJECT_ROOT / "include" / "jvm"
"""The Java sources of the formats' JVM side (the json format's one-pass decoder), compiled by `formats_jar`."""


def cache_dir() -> Path:
    """`<root>/.cache`, or `$MICROBATCH_CACHE_DIR` when set: jars, Maven repo, zips, the local stack."""
    return Path(os.environ.get("MICROBATCH_CACHE_DIR") or PROJECT_ROOT / ".cache")


def spark_home() -> Path:
    """The pyspark wheel's folder (SPARK_HOME of local Spark), found without importing pyspark."""
    spec = importlib.util.find_spec("pyspark")
    if spec is None or spec.origin is None:
        raise SetupError("pyspark is not installed in this Python.", fix="Run `make venv`, which installs it.")
    return Path(spec.origin).parent


def ensure_jars(kind: str) -> Path:
    """Fetch the jars of `kind` ("kafka" broker, "spark" connectors, "connect" worker, "debezium" its plugin) with
    Maven, once; return their folder."""
    if kind not in JAR_KINDS:
        raise ValueError(f"unknown jar kind {kind!r}; use one of {JAR_KINDS}")
    target = cache_dir() / "jars" / kind
    marker = target / ".complete"
    pom = PROJECT_ROOT / "include" / "jars" / kind / "pom.xml"
    if marker.exists() and marker.read_text() == pom.read_text():
        return target
    started = time.monotonic()
    shutil.rmtree(target, ignore_errors=True)
    command = [
        "mvn", "-q", "-B", "-f", str(pom), "dependency:copy-dependencies",
        f"-DoutputDirectory={target}", "-DincludeScope=runtime", f"-Dmaven.repo.local={cache_dir() / 'm2'}",
    ]
    # Maven's console prints stray ANSI resets even with -q -B; keep its output for the error message only.
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        tail = "\n".join((result.stdout + result.stderr).splitlines()[-40:])
        raise SetupError(f"Fetching the {kind} jars with Maven failed ({' '.join(command)}): {tail.strip()}",
                         fix="Check that Maven Central is reachable, then run `make jars` again.")
    marker.write_text(pom.read_text())
    log.info("fetched %s jars into %s in %.1fs", kind, target, time.monotonic() - started)
    return target


def spark_jars() -> list[Path]:
    """The jars for spark-submit `--jars` and the local stack's Connect server: the connectors, minus those the
    pyspark wheel already ships, and `formats_jar()`."""
    shipped = {_artifact(p.name) for p in (spark_home() / "jars").glob("*.jar")}
    connectors = sorted(p for p in ensure_jars("spark").glob("*.jar") if _artifact(p.name) not in shipped)
    return [*connectors, formats_jar()]


def formats_jar() -> Path:
    """The jar of `JVM_SOURCES`, compiled with the JDK's javac against the pyspark wheel's jars (the Spark the stage
    runs on), once per version of the sources and of pyspark; `.cache/jars/microbatch/`."""
    sources = sorted(JVM_SOURCES.rglob("*.java"))
    wheel = sorted(p.name for p in (spark_home() / "jars").glob("spark-sql_*.jar"))
    digest = hashlib.sha256(b"".join([*(p.read_bytes() for p in sources), *(n.encode() for n in wheel)]))
    target = cache_dir() / "jars" / "microbatch" / f"microbatch-formats-{digest.hexdigest()[:12]}.jar"
    if target.exists():
        return target
    java_home = os.environ.get("JAVA_HOME")
    javac = shutil.which("javac") or (java_home and shutil.which(str(Path(java_home) / "bin" / "javac")))
    if not javac:
        raise SetupError("Building microbatch's formats jar needs a JDK's javac, which is not on PATH or in "
                         "JAVA_HOME.", fix="Install one (e.g. openjdk-17-jdk-headless) and run `make jars`.")
    started = time.monotonic()
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="microbatch-javac-") as classes:
        command = [javac, "--release", "17", "-nowarn", "-encoding", "UTF-8", "-cp",
                   str(spark_home() / "jars" / "*"), "-d", classes, *map(str, sources)]
        result = subprocess.run(command, capture_output=True, text=True, check=False)
        if result.returncode != 0:
            raise SetupError(f"Compiling {JVM_SOURCES} failed ({javac}): {(result.stdout + result.stderr).strip()}",
                             fix="Check the JDK (17 or newer) and the sources, then run `make jars` again.")
        partial = target.with_suffix(f".{os.getpid()}.tmp")
        with zipfile.ZipFile(partial, "w", zipfile.ZIP_DEFLATED) as jar:
            jar.writestr("META-INF/MANIFEST.MF", "Manifest-Version: 1.0\nCreated-By: microbatch\n\n")
            for path in sorted(Path(classes).rglob("*.class")):
                jar.write(path, path.relative_to(classes).as_posix())
    partial.replace(target)
    for old in target.parent.glob("microbatch-formats-*.jar"):
        if old != target:
            old.unlink(missing_ok=True)
    log.info("compiled the formats jar %s in %.1fs", target, time.monotonic() - started)
    return target


def _artifact(jar_name: str) -> str:
    """'kafka-clients-3.9.2.jar' -> 'kafka-clients'."""
    parts = jar_name.removesuffix(".jar").split("-")
    while parts and parts[-1][:1].isdigit():
        parts.pop()
    return "-".join(parts)


def library_zip() -> Path:
    """A zip of include/microbatch and spark_jobs for `--py-files`, rebuilt when the code changes."""
    sources = sorted(
        p for folder in (PROJECT_ROOT / "include" / "microbatch", PROJECT_ROOT / "spark_jobs")
        for p in folder.rglob("*.py") if "__pycache__" not in p.parts
    )
    digest = hashlib.sha256(b"".join(p.read_bytes() for p in sources)).hexdigest()[:12]
    target = cache_dir() / "pyfiles" / f"microbatch-{digest}.zip"
    if not target.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_suffix(f".{os.getpid()}.tmp")
        with zipfile.ZipFile(partial, "w", zipfile.ZIP_DEFLATED) as archive:
            for path in sources:
                base = PROJECT_ROOT / "include" if path.is_relative_to(PROJECT_ROOT / "include") else PROJECT_ROOT
                archive.write(path, path.relative_to(base))
        partial.replace(target)
    return target
