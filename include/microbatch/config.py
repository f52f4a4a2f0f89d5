"""Pipeline specs (`include/pipelines/<name>.yaml`), validated by pydantic.

Unknown keys are rejected. A bad spec raises `SpecError` with one sentence that names the
file and the field. Connections and secrets never live in a spec: a spec names an Airflow
connection id, and the connection (or an environment variable) holds the address.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from datetime import timedelta
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from microbatch.errors import SpecError

PIPELINES_DIR = Path(__file__).resolve().parent.parent / "pipelines"
PIPELINES_DIR_ENV = "MICROBATCH_PIPELINES_DIR"
_IDENTIFIER = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")
_DURATION = re.compile(r"^(\d+)\s*(s|m|h|d)$")
_CRON_PRESETS = {"@once", "@continuous", "@hourly", "@daily", "@weekly", "@monthly", "@yearly"}


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Startup(StrEnum):
    """Where a partition the ledger has never seen starts."""

    EARLIEST = "earliest"
    LATEST = "latest"


class OnDataLoss(StrEnum):
    """What to do when the ledger's position lies below the partition's earliest offset."""

    FAIL = "fail"
    SKIP = "skip"


class SourceSpec(_Strict):
    """The Kafka source: which topics, where new partitions start, and how much one batch reads."""

    connection: str = "kafka_default"
    """Airflow connection id of the Kafka cluster; `MICROBATCH_KAFKA_BOOTSTRAP` overrides it."""
    topics: list[str] = Field(min_length=1)
    """Topics to read; partitions are discovered on every plan."""
    startup: Startup = Startup.EARLIEST
    """Start of a partition the ledger has never seen."""
    max_records_per_batch: int = Field(default=1_000_000, gt=0)
    """Upper bound of offsets one batch reads, split across partitions by backlog."""
    min_spark_partitions: int = Field(default=0, ge=0)
    """If set, Spark splits large ranges so at least this many tasks read the batch."""
    on_data_loss: OnDataLoss = OnDataLoss.FAIL
    isolation_level: Literal["read_committed", "read_uncommitted"] = "read_committed"
    commit_group_offsets: bool = False
    """Mirror the ledger into the consumer group after each commit, for lag tools only."""
    group_id: str | None = None
    """Consumer group used for the mirror; defaults to `microbatch.<pipeline>`."""

    @field_validator("topics")
    @classmethod
    def _distinct_topics(cls, topics: list[str]) -> list[str]:
        if len(set(topics)) != len(topics):
            raise ValueError("lists a topic twice; list each topic once")
        for topic in topics:
            if not re.fullmatch(r"[A-Za-z0-9._-]{1,249}", topic):
                raise ValueError(f"'{topic}' is not a valid Kafka topic name")
        return topics


class JobSpec(_Strict):
    """The Spark transform: `module:function`, called with (kafka DataFrame, options, state)."""

    transform: str
    options: dict[str, Any] = Field(default_factory=dict)

    @field_validator("transform")
    @classmethod
    def _module_function(cls, value: str) -> str:
        if not re.fullmatch(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*", value):
            raise ValueError("must look like 'package.module:function', e.g. 'spark_jobs.ip_count:transform'")
        return value


def _check_identifier(value: str) -> str:
    if not _IDENTIFIER.fullmatch(value):
        raise ValueError(f"'{value}' must be a lower-case SQL identifier (letters, digits, underscore)")
    return value


class WindowSpec(_Strict):
    """The event-time window columns of an aggregate sink; a window is final once the watermark passes its end."""

    start: str = "window_start"
    end: str = "window_end"

    @field_validator("start", "end")
    @classmethod
    def _identifier(cls, value: str) -> str:
        return _check_identifier(value)


class PostgresAggregateSink(_Strict):
    """A Postgres table whose numeric columns are summed on conflict of its key columns."""

    name: str
    type: Literal["postgres_aggregate"] = "postgres_aggregate"
    table: str
    keys: list[str] = Field(min_length=1)
    sum_columns: list[str] = Field(min_length=1)
    window: WindowSpec | None = None
    """Set for event-time windowed aggregates: finality (and publishing) follows the watermark."""

    @field_validator("name", "table")
    @classmethod
    def _identifier(cls, value: str) -> str:
        return _check_identifier(value)

    @field_validator("keys", "sum_columns")
    @classmethod
    def _identifiers(cls, values: list[str]) -> list[str]:
        return [_check_identifier(v) for v in values]

    @model_validator(mode="after")
    def _window_in_keys(self) -> PostgresAggregateSink:
        if self.window and not {self.window.start, self.window.end} <= set(self.keys):
            raise ValueError("window: its start and end columns must be among the keys")
        return self

    @property
    def staging_table(self) -> str:
        """The staging table Spark writes to, tagged by (batch_id, attempt)."""
        return f"stage_{self.table}"

    @property
    def columns(self) -> list[str]:
        return [*self.keys, *self.sum_columns]


class KafkaSink(_Strict):
    """Publishes the final windows of an aggregate sink to a Kafka topic, exactly once, via the outbox."""

    name: str
    type: Literal["kafka"]
    topic: str
    source: str
    """The name of the windowed `postgres_aggregate` sink whose final windows are published."""
    key: str
    """The column used as the Kafka record key."""
    connection: str = "kafka_default"
    transaction_size: int = Field(default=500, gt=0, le=100_000)
    """Records per Kafka transaction."""

    @field_validator("name", "key")
    @classmethod
    def _identifier(cls, value: str) -> str:
        return _check_identifier(value)

    @property
    def transactional_id(self) -> str:
        return f"microbatch.{self.name}"


SinkSpec = Annotated[PostgresAggregateSink | KafkaSink, Field(discriminator="type")]
_SINK_TAGS = {"postgres_aggregate", "kafka"}


class RetrySpec(_Strict):
    """Task retries: Flink's `fixedDelayRestart(3, 10s)` by default."""

    count: int = Field(default=3, ge=0, le=20)
    delay_seconds: float = Field(default=10.0, ge=0)


class SparkSpec(_Strict):
    """How the stage task submits the Spark job."""

    connection: str = "spark_default"
    """Airflow connection id of the Spark master (host `local[*]` or `spark://host:7077`)."""
    conf: dict[str, str] = Field(default_factory=dict)


class PipelineSpec(_Strict):
    """One pipeline: a source, a transform, sinks, a schedule and retries."""

    name: str
    description: str = ""
    schedule: str | None = "30s"
    """Cron expression, preset (`@continuous`, `@hourly`, ...), a duration (`30s`, `5m`) or null."""
    source: SourceSpec
    job: JobSpec
    sinks: list[SinkSpec] = Field(min_length=1)
    retries: RetrySpec = Field(default_factory=RetrySpec)
    spark: SparkSpec = Field(default_factory=SparkSpec)
    tags: list[str] = Field(default_factory=list)

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not _IDENTIFIER.fullmatch(value):
            raise ValueError("must be a lower-case identifier (letters, digits, underscore)")
        return value

    @field_validator("schedule")
    @classmethod
    def _schedule(cls, value: str | None) -> str | None:
        if value is None or value in _CRON_PRESETS or _DURATION.fullmatch(value):
            return value
        if len(value.split()) == 5:
            return value
        raise ValueError("must be a cron expression, a preset like '@continuous', a duration like '30s', or null")

    @model_validator(mode="after")
    def _distinct_sinks(self) -> PipelineSpec:
        names = [sink.name for sink in self.sinks]
        if len(set(names)) != len(names):
            raise ValueError("sinks: two sinks share a name; give each sink its own name")
        aggregates = {s.name: s for s in self.sinks if isinstance(s, PostgresAggregateSink)}
        for sink in self.kafka_sinks:
            source = aggregates.get(sink.source)
            if source is None or source.window is None:
                raise ValueError(f"sinks: kafka sink '{sink.name}' must name a windowed postgres_aggregate sink "
                                 "in 'source'")
            if sink.key not in source.columns:
                raise ValueError(f"sinks: kafka sink '{sink.name}' key '{sink.key}' is not a column of '{source.name}'")
        return self

    @property
    def aggregate_sinks(self) -> list[PostgresAggregateSink]:
        return [s for s in self.sinks if isinstance(s, PostgresAggregateSink)]

    @property
    def kafka_sinks(self) -> list[KafkaSink]:
        return [s for s in self.sinks if isinstance(s, KafkaSink)]

    @property
    def group_id(self) -> str:
        return self.source.group_id or f"microbatch.{self.name}"

    @property
    def schedule_value(self) -> str | timedelta | None:
        """The schedule as Airflow takes it: a duration becomes a `timedelta`."""
        if self.schedule is None:
            return None
        match = _DURATION.fullmatch(self.schedule)
        if not match:
            return self.schedule
        unit = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}[match.group(2)]
        return timedelta(**{unit: int(match.group(1))})

    def spec_hash(self) -> str:
        """A stable hash of the spec, recorded in the ledger to notice spec changes."""
        canonical = json.dumps(self.model_dump(mode="json"), sort_keys=True)
        return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def _describe(error: ValidationError, path: Path) -> str:
    first = error.errors()[0]
    field = ".".join(str(part) for part in first["loc"] if part not in _SINK_TAGS) or "(top level)"
    message = first["msg"].removeprefix("Value error, ")
    if first["type"] == "extra_forbidden":
        message = "is not a known setting; remove it or fix its spelling"
    elif first["type"] == "missing":
        message = "is required; add it"
    return f"{path.name}: field '{field}' {message}."


def load_spec(path: Path) -> PipelineSpec:
    """Read and validate one spec file; raise `SpecError` naming the file and the field."""
    try:
        raw = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise SpecError(f"{path}: cannot read the spec ({exc.strerror}).") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark else ""
        raise SpecError(f"{path.name}: the YAML is malformed{where}.", fix="Fix the syntax.") from None
    if not isinstance(raw, dict):
        raise SpecError(f"{path.name}: a spec must be a YAML mapping of settings.")
    try:
        spec = PipelineSpec.model_validate(raw)
    except ValidationError as exc:
        raise SpecError(_describe(exc, path)) from None
    if spec.name != path.stem:
        raise SpecError(f"{path.name}: field 'name' is '{spec.name}' but must equal the file name '{path.stem}'.")
    return spec


def pipelines_dir() -> Path:
    """Where specs live: `MICROBATCH_PIPELINES_DIR`, else `include/pipelines`."""
    return Path(os.environ.get(PIPELINES_DIR_ENV) or PIPELINES_DIR)


def spec_paths(directory: Path | None = None) -> list[Path]:
    """The spec files of a directory, sorted, without reading them."""
    return sorted((directory or pipelines_dir()).glob("*.yaml"))


def find_spec(name: str, directory: Path | None = None) -> PipelineSpec:
    """Load the spec of the pipeline called `name`."""
    directory = directory or pipelines_dir()
    path = directory / f"{name}.yaml"
    if not path.exists():
        known = ", ".join(p.stem for p in spec_paths(directory)) or "none"
        raise SpecError(f"There is no pipeline '{name}' in {directory}.", fix=f"Known pipelines: {known}.")
    return load_spec(path)
