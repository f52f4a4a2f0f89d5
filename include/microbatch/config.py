"""Pipeline specs (`include/pipelines/<name>.yaml`), validated by pydantic.

Unknown keys are rejected. A bad spec raises `SpecError` with one sentence that names the
file and the field. Connections and secrets never live in a spec: a spec names an Airflow
connection id, and the connection (or an environment variable) holds the address.
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from dataclasses import field as dataclass_field
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal, get_args

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from microbatch.errors import SpecError
from microbatch.formats.base import Format
from microbatch.formats.raw import RawSpec
from microbatch.formats.record import decoded_columns, record_key_columns
from microbatch.formats.registry import FormatSpecs, format_for

if TYPE_CHECKING:
    from microbatch.sql import SinkQuery

PIPELINES_DIR = Path(__file__).resolve().parent.parent / "pipelines"
PIPELINES_DIR_ENV = "MICROBATCH_PIPELINES_DIR"
_IDENTIFIER = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")
_DURATION = re.compile(r"^(\d+)\s*(s|m|h|d)$")
_CRON_PRESETS = {"@once", "@continuous", "@hourly", "@daily", "@weekly", "@monthly", "@yearly"}


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Startup(StrEnum):
    """Where a partition the ledger has never seen starts (Flink's startup modes)."""

    EARLIEST = "earliest"
    LATEST = "latest"
    GROUP_OFFSETS = "group_offsets"
    TIMESTAMP = "timestamp"
    SPECIFIC_OFFSETS = "specific_offsets"


class OffsetReset(StrEnum):
    """Start of a partition that has no committed group offset (Kafka's `auto.offset.reset`)."""

    EARLIEST = "earliest"
    LATEST = "latest"


class OnDataLoss(StrEnum):
    """What to do when the ledger's position lies below the partition's earliest offset."""

    FAIL = "fail"
    SKIP = "skip"


_PARTITION_KEY = re.compile(r"^([A-Za-z0-9._-]{1,249}):(\d+)$")


def _epoch_ms(value: int | str) -> int:
    """An ISO-8601 time (a naive one is UTC) or epoch milliseconds, as epoch milliseconds."""
    if isinstance(value, int) or (isinstance(value, str) and value.strip().isdigit()):
        return int(value)
    try:
        moment = datetime.fromisoformat(str(value).strip().replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(f"'{value}' is neither an ISO-8601 time nor epoch milliseconds") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return int(moment.timestamp() * 1000)


class StartupSpec(_Strict):
    """`source.startup`: a mode name, or a mapping with the mode and its arguments.

    It applies only to partitions the ledger has never seen; the ledger always wins after that.
    """

    mode: Startup = Startup.EARLIEST
    timestamp: int | None = None
    """Mode `timestamp`: ISO-8601 or epoch ms; each partition starts at the first offset at or after it."""
    offsets: dict[str, int] = Field(default_factory=dict)
    """Mode `specific_offsets`: `"topic:partition": offset`; unlisted partitions fall back to group offsets."""
    group_id: str | None = None
    """Modes `group_offsets`/`specific_offsets`: the group to take over from; defaults to the mirror group."""
    reset: OffsetReset = OffsetReset.EARLIEST
    """Start of a partition with no committed group offset."""

    @field_validator("timestamp", mode="before", json_schema_input_type=int | str | None)
    @classmethod
    def _timestamp(cls, value: Any) -> int | None:
        if value is None:
            return None
        if isinstance(value, datetime):
            value = value.isoformat()
        if isinstance(value, bool) or not isinstance(value, int | str):
            raise ValueError("must be an ISO-8601 time or epoch milliseconds")
        millis = _epoch_ms(value)
        if millis < 0:
            raise ValueError("must not be before 1970")
        return millis

    @field_validator("offsets")
    @classmethod
    def _offsets(cls, offsets: dict[str, int]) -> dict[str, int]:
        for key, offset in offsets.items():
            if not _PARTITION_KEY.fullmatch(key):
                raise ValueError(f"key '{key}' must look like 'topic:partition', e.g. 'events:0'")
            if offset < 0:
                raise ValueError(f"offset {offset} of '{key}' must not be negative")
        return offsets

    @model_validator(mode="after")
    def _arguments_fit_the_mode(self) -> StartupSpec:
        if self.mode is Startup.TIMESTAMP and self.timestamp is None:
            raise ValueError("mode 'timestamp' needs 'timestamp' (ISO-8601 or epoch milliseconds)")
        if self.mode is Startup.SPECIFIC_OFFSETS and not self.offsets:
            raise ValueError("mode 'specific_offsets' needs 'offsets', a map of 'topic:partition' to offset")
        if self.timestamp is not None and self.mode is not Startup.TIMESTAMP:
            raise ValueError(f"'timestamp' is only used by mode 'timestamp', not '{self.mode.value}'")
        if self.offsets and self.mode is not Startup.SPECIFIC_OFFSETS:
            raise ValueError(f"'offsets' is only used by mode 'specific_offsets', not '{self.mode.value}'")
        return self

    @property
    def specific_offsets(self) -> dict[tuple[str, int], int]:
        """The `offsets` map keyed by (topic, partition)."""
        parsed = {}
        for key, offset in self.offsets.items():
            match = _PARTITION_KEY.fullmatch(key)
            assert match is not None  # checked by the validator
            parsed[(match.group(1), int(match.group(2)))] = offset
        return parsed


class CommitGroupOffsets(_Strict):
    """`source.commit_group_offsets`: mirror the ledger into a consumer group after each commit (lag tools only).

    `true`/`false` is accepted as a short form of `{enabled: true/false}`.
    """

    enabled: bool = False
    group_id: str | None = None
    """Consumer group of the mirror; defaults to `microbatch.<pipeline>`."""

    def __bool__(self) -> bool:
        return self.enabled


class SourceSpec(_Strict):
    """The Kafka source: which topics, where new partitions start, and how much one batch reads."""

    connection: str = "kafka_default"
    """Airflow connection id of the Kafka cluster; `MICROBATCH_KAFKA_BOOTSTRAP` overrides it."""
    topic_pattern: str | None = None
    """A regular expression (full match) of topic names, instead of `topics`; matched on every plan."""
    topics: list[str] | None = Field(default=None, validate_default=True)
    """Topics to read; partitions are discovered on every plan. Exactly one of `topics`/`topic_pattern`."""
    startup: StartupSpec = Field(default_factory=StartupSpec)
    """Start of a partition the ledger has never seen."""
    max_records_per_batch: int = Field(default=1_000_000, gt=0)
    """Upper bound of offsets one batch reads, split across partitions by backlog."""
    max_records_per_partition: int | None = Field(default=None, gt=0)
    """Upper bound of offsets one batch reads from any one partition."""
    max_batches_per_run: int = Field(default=1, ge=1, le=1000)
    """How many consecutive batches one run may plan when the backlog is larger than one batch. Each reads at most
    `max_records_per_batch` and commits in its own transaction; one Spark application stages them all, in order,
    so a pipeline that is behind pays one Spark start per run instead of one per batch (like Structured
    Streaming's `Trigger.AvailableNow` with `maxOffsetsPerTrigger`)."""
    min_records_per_batch: int | None = Field(default=None, gt=0)
    """Wait for at least this many new offsets before running a batch, but no longer than `max_wait_seconds`."""
    max_wait_seconds: float | None = Field(default=None, gt=0)
    """The longest a smaller batch is deferred since the last batch; 900 when `min_records_per_batch` is set."""
    min_spark_partitions: int = Field(default=0, ge=0)
    """If set, Spark splits large ranges so at least this many tasks read the batch."""
    on_data_loss: OnDataLoss = OnDataLoss.FAIL
    isolation_level: Literal["read_committed", "read_uncommitted"] = "read_committed"
    include_headers: bool = False
    """Hand the job each record's Kafka headers too, as a `headers` column (array<struct<key: string, value:
    binary>>, in the producer's order), and keep them with dead letters and late records (`headers`, a JSON array
    of {"key", "value" in base64}). Off by default: the job then sees `key`, `value`, `topic`, `partition`,
    `offset`, `timestamp` and `timestamp_type` (0 CreateTime, 1 LogAppendTime)."""
    commit_group_offsets: CommitGroupOffsets = Field(default_factory=CommitGroupOffsets)
    """Mirror the ledger into the consumer group after each commit, for lag tools only."""
    key: FormatSpecs = Field(default_factory=RawSpec)
    """The format of the record key (`formats/`): `raw` (the default: the `key` column's bytes as they are), `text`
    (UTF-8 into `key_text`), `json` with declared fields (each `key_<field>`) or `avro` (the subject
    `<topic>-key`). A key that its format cannot read makes the record a dead letter whose reason names the field."""
    value: FormatSpecs = Field(default_factory=RawSpec)
    """The format of the record value: `raw` (the default: the job decodes `value` itself), `text` (`value_text`),
    `json` with declared fields (`fields: {payment_id: string, amount_cents: bigint}`, optional `required`), or
    `avro` in the Confluent wire format with its schemas in a schema registry (`fields` as for json, `subject`,
    `version`: docs/formats.md), each a typed column of the same name. The decode runs in the read's pass; a value
    that its format cannot read (not JSON, a field of another type, a required field missing, an unknown schema id)
    is a dead letter whose reason names the field. A tombstone (a key with a null value) is never bad: it deletes its
    key in a sink keyed by the record key and is skipped by every other (docs/formats.md#tombstones)."""

    @model_validator(mode="before")
    @classmethod
    def _legacy_group_id(cls, data: Any) -> Any:
        # Older specs set `group_id` next to a boolean `commit_group_offsets`; fold it into the object form.
        if isinstance(data, dict) and "group_id" in data:
            data = dict(data)
            group_id = data.pop("group_id")
            mirror = data.get("commit_group_offsets", False)
            if isinstance(mirror, bool):
                data["commit_group_offsets"] = {"enabled": mirror, "group_id": group_id}
        return data

    @field_validator("commit_group_offsets", mode="before", json_schema_input_type=CommitGroupOffsets | bool)
    @classmethod
    def _mirror_short_form(cls, value: Any) -> Any:
        return {"enabled": value} if isinstance(value, bool) else value

    @field_validator("startup", mode="before", json_schema_input_type=StartupSpec | Startup)
    @classmethod
    def _startup_short_form(cls, value: Any) -> Any:
        if isinstance(value, str):
            if value not in {mode.value for mode in Startup}:
                raise ValueError(f"'{value}' is not a startup mode; use one of {', '.join(m.value for m in Startup)}")
            return {"mode": value}
        return value

    @field_validator("topic_pattern")
    @classmethod
    def _compiles(cls, pattern: str | None) -> str | None:
        if pattern is None:
            return None
        try:
            re.compile(pattern)
        except re.error as exc:
            raise ValueError(f"'{pattern}' is not a valid regular expression ({exc})") from None
        return pattern

    @field_validator("topics")
    @classmethod
    def _distinct_topics(cls, topics: list[str] | None, info: ValidationInfo) -> list[str]:
        has_pattern = info.data.get("topic_pattern") is not None
        if topics is None:
            if has_pattern or "topic_pattern" not in info.data:  # a bad pattern is reported on its own
                return []
            raise PydanticCustomError(
                "topics_missing", "is required; list the topics to read, or set source.topic_pattern instead"
            )
        if has_pattern:
            raise ValueError("cannot be set together with topic_pattern; keep exactly one of them")
        if not topics:
            raise ValueError("must list at least one topic")
        if len(set(topics)) != len(topics):
            raise ValueError("lists a topic twice; list each topic once")
        for topic in topics:
            if not re.fullmatch(r"[A-Za-z0-9._-]{1,249}", topic):
                raise ValueError(f"'{topic}' is not a valid Kafka topic name")
        return topics

    @model_validator(mode="after")
    def _limits_agree(self) -> SourceSpec:
        if self.max_wait_seconds is not None and self.min_records_per_batch is None:
            raise ValueError("max_wait_seconds only applies with min_records_per_batch; set both or neither")
        if self.min_records_per_batch is not None and self.min_records_per_batch > self.max_records_per_batch:
            raise ValueError(
                f"min_records_per_batch ({self.min_records_per_batch}) is above max_records_per_batch "
                f"({self.max_records_per_batch}); lower it"
            )
        return self

    @model_validator(mode="after")
    def _decoded_names(self) -> SourceSpec:
        columns = decoded_columns(self.key_format, self.value_format)  # refuses two columns of one name
        for name in columns:
            if name.lower() in JOB_COLUMN_NAMES:
                raise ValueError(f"value.fields: '{name}' is a column the job adds itself ({name} of "
                                 f"transform.py's contract); rename it and read the JSON field with `from`, e.g. "
                                 f"`{name}_field: {{type: {columns[name]}, from: {name}}}`")
        return self

    @model_validator(mode="after")
    def _registry_subjects(self) -> SourceSpec:
        for side, fmt in (("key", self.key_format), ("value", self.value_format)):
            if fmt.uses_registry and fmt.subject(side, self.topics or []) is None:
                reads = "a topic pattern" if self.topic_pattern else "several topics"
                raise ValueError(f"{side}.subject: the source reads {reads}, so the TopicNameStrategy gives no one "
                                 f"subject; name the subject of the schemas, e.g. `subject: orders-{side}`")
        return self

    @property
    def key_format(self) -> Format[Any]:
        """The format that decodes the record key."""
        return format_for(self.key)

    @property
    def value_format(self) -> Format[Any]:
        """The format that decodes the record value."""
        return format_for(self.value)

    @property
    def decodes(self) -> bool:
        """Whether the platform decodes the key or the value (a format other than `raw`)."""
        return bool(self.key_format.columns() or self.value_format.columns())

    @property
    def group_id(self) -> str | None:
        """The consumer group of the mirror, if the spec names one."""
        return self.commit_group_offsets.group_id

    @property
    def wait_limit_seconds(self) -> float:
        """How long a batch below `min_records_per_batch` may be deferred."""
        return self.max_wait_seconds if self.max_wait_seconds is not None else 900.0

    def matches(self, topic: str) -> bool:
        """Whether `topic` belongs to this source (listed, or a full match of the pattern)."""
        if self.topic_pattern is not None:
            return re.fullmatch(self.topic_pattern, topic) is not None
        return topic in self.topics


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


ColumnType = Literal["text", "bigint", "integer", "smallint", "double precision", "real", "numeric", "boolean",
                     "timestamptz", "timestamp", "date", "jsonb", "bytea", "uuid"]
"""The PostgreSQL types a sink column may have."""

SOURCE_COORDINATES = ("topic", "partition", "offset")
"""Columns the platform adds to row sinks: where each row came from. A spec may not declare them."""
JOB_COLUMN_NAMES = ("error", "late", "event_time")
"""Columns of the job contract (`transform.py`) that `parse` adds to the records: no decoded column may take them."""
KEYS_FROM = Literal["columns", "record_key"]
"""Where an upsert sink's keys come from: the `keys` it lists (columns of the job's output), or the record key
(`record_key`: the decoded key's columns, `formats.record.record_key_columns`), with a tombstone (a record whose
value is null) as the delete of its key."""


@dataclass(frozen=True)
class OutputTopic:
    """A topic a sink publishes to, on the cluster of its Kafka `connection`; None: the broker's default."""

    connection: str
    name: str
    partitions: int | None = None
    replication_factor: int | None = None
    config: dict[str, str] = dataclass_field(default_factory=dict)


class SinkModel(_Strict):
    """What every sink spec model answers, so that a check across sinks never asks a sink's type."""

    name: str
    sql: str | None = None
    """A Spark SQL query over the view `records` (the record columns and the decoded ones) that gives this sink's
    rows, instead of a Python job: e.g. `SELECT payment_id, amount_cents FROM records WHERE status = 'captured'`.
    The platform adds the source coordinates (row sinks) or the per-partition grouping (aggregates) itself."""

    @property
    def query_kind(self) -> Literal["rows", "partials"] | None:
        """What a query of this sink returns: one row per record (`rows`), per-partition partial sums
        (`partials`), or None: this sink takes no query."""
        return None

    @property
    def query_columns(self) -> list[str]:
        """The columns this sink's query must return."""
        return []

    @property
    def published_columns(self) -> list[str] | None:
        """The columns of the rows a kafka sink may publish from this sink (its key is one of them); None: this
        sink's rows cannot be published."""
        return None

    def check_among(self, sinks: Mapping[str, SinkModel]) -> None:
        """Raise `ValueError` (one sentence naming the field) if this sink does not fit the pipeline's other
        `sinks` (by name)."""
        return None

    @property
    def output_topic(self) -> OutputTopic | None:
        """The Kafka topic this sink publishes to, as `microbatch migrate` creates it; None: it publishes nothing."""
        return None

    @property
    def keyed_by_record(self) -> bool:
        """An upsert keyed by the record key (`keys_from: record_key`): its tombstones are deletes of their keys."""
        return getattr(self, "keys_from", "columns") == "record_key"

    @property
    def keeps_tombstones(self) -> bool:
        """An append sink that keeps each tombstone as a row (`keep_tombstones`)."""
        return bool(getattr(self, "keep_tombstones", False))


def _check_columns(columns: dict[str, str]) -> dict[str, str]:
    for name in columns:
        _check_identifier(name)
    return columns


def _check_row_columns(columns: dict[str, str]) -> dict[str, str]:
    """The columns of a sink whose rows carry their source coordinates: it may not declare those itself."""
    reserved = sorted(set(columns) & set(SOURCE_COORDINATES))
    if reserved:
        raise ValueError(f"declares {', '.join(reserved)}, which the platform adds itself; remove or rename it")
    return _check_columns(columns)


def _check_keys_given(keys_from: str, keys: list[str]) -> None:
    if keys_from == "columns" and not keys:
        raise ValueError("keys: list the key columns, or set keys_from: record_key to key the table by the record key")


TIME_TYPES = ("timestamptz", "timestamp")


def _keyed_by_record(sink: Any, source: SourceSpec) -> Any:
    """`sink` (an upsert sink with `keys_from: record_key`) with its `keys` set to the record key's columns, which
    it must declare; ValueError with one sentence naming the field otherwise."""
    key_columns = record_key_columns(source.key_format)
    where = f"sinks: upsert sink '{sink.name}'"
    if sink.keys and list(sink.keys) != list(key_columns):
        raise ValueError(f"{where} takes its keys from the record key ({', '.join(key_columns)}); remove its keys")
    missing = [name for name in key_columns if name not in sink.columns]
    if missing:
        example = ", ".join(f"{name}: {POSTGRES_FOR_SPARK.get(key_columns[name], 'text')}" for name in missing)
        raise ValueError(f"{where} is keyed by the record key's column(s) {', '.join(missing)}; declare them in its "
                         f"columns, e.g. `{example}`")
    known = {*sink.columns, *SOURCE_COORDINATES}
    _check_upsert_columns(list(key_columns), sink.order_by, sink.delete_column, sink.columns, known=known)
    if sink.order_by is not None and sink.columns.get(sink.order_by) not in TIME_TYPES:
        raise ValueError(f"{where}: order_by '{sink.order_by}' must be a timestamptz or timestamp column (the record "
                         "`timestamp` or a decoded time), since a tombstone takes part in the order by its record "
                         "timestamp; or remove order_by to keep Kafka's order (the latest offset wins)")
    return sink.model_copy(update={"keys": list(key_columns)})


POSTGRES_FOR_SPARK = {"string": "text", "binary": "bytea", "bigint": "bigint", "int": "integer",
                      "smallint": "smallint", "tinyint": "smallint", "boolean": "boolean", "double": "double precision",
                      "float": "real", "timestamp": "timestamptz", "timestamp_ntz": "timestamp", "date": "date"}
"""A column type to declare for a Spark SQL type, for the examples of the spec's error sentences."""


def _check_upsert_columns(keys: list[str], order_by: str | None, delete_column: str | None,
                          columns: dict[str, str], known: set[str]) -> None:
    """An upsert sink's keys and order column are among the `known` columns; its delete column is not stored."""
    for field_name, names in (("keys", keys), ("order_by", [order_by] if order_by else [])):
        unknown = [n for n in names if n not in known]
        if unknown:
            raise ValueError(f"{field_name}: {', '.join(unknown)} is not among the columns; declare it in columns")
    if delete_column is not None and delete_column in columns:
        raise ValueError(f"delete_column: '{delete_column}' marks deletes and is not stored; remove it from columns")


class PostgresAggregateSink(SinkModel):
    """A Postgres table whose numeric columns are summed on conflict of its key columns."""

    type: Literal["postgres_aggregate"] = "postgres_aggregate"
    table: str
    columns: dict[str, ColumnType] | None = None
    """Each column's PostgreSQL type (the keys and the sum columns); with it, `microbatch migrate` creates the
    table, its contributions table and its staging table. Without it, they must exist."""
    keys: list[str] = Field(min_length=1)
    sum_columns: list[str] = Field(min_length=1)
    window: WindowSpec | None = None
    """Set for event-time windowed aggregates: finality (and publishing) follows the watermark."""
    contributions: Literal["per_partition", "per_batch"] = "per_partition"
    """What each commit keeps so that a replay can take its part of the sums back. `per_partition`: the job's
    partial sums per source partition, so a replay can recompute any committed range. `per_batch`: one sum per
    key and batch, as many times fewer rows as the batch has partitions, so the staging write and the commit are
    smaller; a replay then recomputes every partition of each batch it touches, and the job may leave out
    `topic` and `partition` (the stage sums them away). Chosen when the tables are created: `microbatch
    migrate` refuses to change it on an existing sink."""

    @field_validator("name", "table")
    @classmethod
    def _identifier(cls, value: str) -> str:
        return _check_identifier(value)

    @field_validator("keys", "sum_columns")
    @classmethod
    def _identifiers(cls, values: list[str]) -> list[str]:
        return [_check_identifier(v) for v in values]

    @field_validator("columns")
    @classmethod
    def _column_names(cls, columns: dict[str, str] | None) -> dict[str, str] | None:
        return None if columns is None else _check_columns(columns)

    @model_validator(mode="after")
    def _window_in_keys(self) -> PostgresAggregateSink:
        if self.window and not {self.window.start, self.window.end} <= set(self.keys):
            raise ValueError("window: its start and end columns must be among the keys")
        if self.columns is not None and set(self.columns) != {*self.keys, *self.sum_columns}:
            missing = sorted({*self.keys, *self.sum_columns} - set(self.columns))
            extra = sorted(set(self.columns) - {*self.keys, *self.sum_columns})
            raise ValueError(f"columns: must type exactly the keys and sum columns (missing {missing or 'none'}, "
                             f"not a key or sum column {extra or 'none'})")
        return self

    @property
    def staging_table(self) -> str:
        """The staging table Spark writes to, tagged by (batch_id, attempt)."""
        return f"stage_{self.table}"

    @property
    def contributions_table(self) -> str:
        """Every committed partial aggregate per (batch, topic, partition), or per batch, kept so a replay can
        retract it."""
        return f"{self.table}_contributions"

    @property
    def per_partition(self) -> bool:
        """Staged rows and contributions carry the source `topic` and `partition`."""
        return self.contributions == "per_partition"

    @property
    def key_and_sum_columns(self) -> list[str]:
        return [*self.keys, *self.sum_columns]

    @property
    def query_kind(self) -> Literal["rows", "partials"] | None:
        return "partials"

    @property
    def query_columns(self) -> list[str]:
        return self.key_and_sum_columns

    @property
    def published_columns(self) -> list[str] | None:
        """A windowed aggregate publishes each final window once."""
        return self.key_and_sum_columns if self.window is not None else None


class _RowSink(SinkModel):
    """A Postgres table of rows (not sums): each row keeps the source coordinates of the record it came from."""

    table: str
    columns: dict[str, ColumnType] = Field(min_length=1)
    """Each column's PostgreSQL type, in table order; `microbatch migrate` creates the table from it, with the
    source coordinates `topic`, `partition` and `offset` added."""
    include_late: bool = True
    """Take records whose event-time window was already final (a raw landing table takes every valid record);
    false: they go to `late_records` as for an aggregate."""

    @field_validator("name", "table")
    @classmethod
    def _identifier(cls, value: str) -> str:
        return _check_identifier(value)

    @field_validator("columns")
    @classmethod
    def _column_names(cls, columns: dict[str, str]) -> dict[str, str]:
        return _check_row_columns(columns)

    @property
    def staging_table(self) -> str:
        return f"stage_{self.table}"

    @property
    def query_kind(self) -> Literal["rows", "partials"] | None:
        return "rows"

    @property
    def query_columns(self) -> list[str]:
        delete = getattr(self, "delete_column", None)
        return [*self.columns, *([delete] if delete else [])]


class PostgresAppendSink(_RowSink):
    """Every output row inserted once, with its source topic, partition and offset; a replay replaces the rows
    of the ranges it recomputes."""

    type: Literal["postgres_append"]
    keep_tombstones: bool = False
    """Keep each tombstone (a key with a null value) as a row: the record's coordinates, the columns named as the
    decoded key's (`key_text`, `key_<field>`), every other column null; by default an append sink skips it
    (docs/formats.md#tombstones)."""

    @property
    def published_columns(self) -> list[str] | None:
        """Each row is published once."""
        return list(self.columns)


class PostgresUpsertSink(_RowSink):
    """The last value per key: the greatest (`order_by`, then topic, partition, offset) among all committed
    records; a record whose `delete_column` is true, or whose non-key columns are all null, removes the key."""

    type: Literal["postgres_upsert"]
    keys_from: KEYS_FROM = "columns"
    """`record_key`: the table is keyed by the record key's columns, and a tombstone deletes its key."""
    keys: list[str] = Field(default_factory=list)
    """The key columns (with `keys_from: record_key`, the record key's columns, filled in by the pipeline)."""
    order_by: str | None = None
    """A column that orders the versions of a key before the source coordinates (e.g. an event time)."""
    delete_column: str | None = None
    """A boolean output column (not stored) that marks a record as a delete of its key: a tombstone."""

    @model_validator(mode="after")
    def _columns_known(self) -> PostgresUpsertSink:
        _check_keys_given(self.keys_from, self.keys)
        if self.keys_from == "columns":
            _check_upsert_columns(self.keys, self.order_by, self.delete_column, self.columns, known=set(self.columns))
        return self


class KafkaSink(SinkModel):
    """Publishes rows to a Kafka topic, exactly once, via the outbox: its own rows (the job's output of its name, or
    its `sql`), each once, or the rows of another sink named in `source`: each final window of a windowed
    aggregate, or each row of an append sink. A replay publishes only what it changed."""

    type: Literal["kafka"]
    topic: str
    source: str | None = None
    """The sink whose rows are published: a windowed `postgres_aggregate` (each final window once) or a
    `postgres_append` (each row once). Without it the sink publishes rows of its own, declared in `columns`."""
    columns: dict[str, ColumnType] | None = None
    """Without `source`: the published columns and their PostgreSQL types, as a row sink declares them; each row
    also carries its record's `topic`, `partition` and `offset` (the value's JSON holds them too)."""
    key: str
    """The column used as the Kafka record key (its text)."""
    format: Literal["json"] = "json"
    """The record value: the row as a JSON object (its columns, and the source coordinates of a row)."""
    headers: dict[str, str] = Field(default_factory=dict)
    """Record headers beside `microbatch.seq`: header name -> a column of the published rows (its text), e.g.
    `{source-offset: offset}`; a row whose column is null gets no such header. Names starting with `microbatch.`
    are the platform's."""
    include_late: bool = True
    """Own rows: take records whose event-time window was already final, as an append sink does."""
    partitions: int | None = Field(default=None, ge=1)
    """Partitions of the topic `microbatch migrate` creates when it is missing (the broker's default if unset)."""
    replication_factor: int | None = Field(default=None, ge=1)
    """Its replication factor (the broker's `default.replication.factor` if unset)."""
    topic_config: dict[str, str] = Field(default_factory=dict)
    """Its topic-level configs, e.g. `{cleanup.policy: compact}`."""
    connection: str = "kafka_default"
    transaction_size: int = Field(default=500, gt=0, le=100_000)
    """Records per Kafka transaction."""

    @field_validator("name", "key")
    @classmethod
    def _identifier(cls, value: str) -> str:
        return _check_identifier(value)

    @field_validator("columns")
    @classmethod
    def _column_names(cls, columns: dict[str, str] | None) -> dict[str, str] | None:
        return None if columns is None else _check_row_columns(columns)

    @model_validator(mode="after")
    def _own_rows_or_source(self) -> KafkaSink:
        if self.source is not None:
            if self.columns is not None:
                raise ValueError(f"sinks: kafka sink '{self.name}' publishes the rows of '{self.source}'; remove "
                                 "columns (its source's columns are published), or remove source to publish rows "
                                 "of its own")
            if self.sql is not None:
                raise ValueError(f"sinks: kafka sink '{self.name}' publishes the rows of '{self.source}'; give the "
                                 "query to that sink, or remove source to publish the query's rows directly")
            return self
        if not self.columns:
            raise ValueError(f"sinks: kafka sink '{self.name}' has no source: declare the columns it publishes "
                             "(columns: {name: type}), or name the sink whose rows it publishes in source")
        published = [*self.columns, *SOURCE_COORDINATES]
        if self.key not in published:
            raise ValueError(f"sinks: kafka sink '{self.name}' key '{self.key}' is not one of its columns "
                             f"({', '.join(published)})")
        self._check_headers(published)
        return self

    def _check_headers(self, published: list[str]) -> None:
        for header, column in self.headers.items():
            if header.startswith("microbatch.") or not header:
                raise ValueError(f"sinks: kafka sink '{self.name}' header '{header}': names starting with "
                                 "microbatch. are the platform's own (microbatch.seq, microbatch.correction); name "
                                 "the header otherwise")
            if column not in published:
                raise ValueError(f"sinks: kafka sink '{self.name}' header '{header}' takes '{column}', which is "
                                 f"not a published column ({', '.join(published)})")

    @property
    def own_rows(self) -> bool:
        """The sink publishes rows of its own (no `source`)."""
        return self.source is None

    @property
    def staging_table(self) -> str | None:
        """Own rows: the table the stage writes them to (the commit moves them to the outbox)."""
        return f"stage_kafka_{self.name}" if self.own_rows else None

    @property
    def output_topic(self) -> OutputTopic | None:
        return OutputTopic(self.connection, self.topic, self.partitions, self.replication_factor,
                           dict(self.topic_config))

    @property
    def query_kind(self) -> Literal["rows", "partials"] | None:
        return "rows" if self.own_rows else None

    @property
    def query_columns(self) -> list[str]:
        return list(self.columns or {})

    @property
    def transactional_id(self) -> str:
        return f"microbatch.{self.name}"

    def check_among(self, sinks: Mapping[str, SinkModel]) -> None:
        """The source is a sink whose rows can be published, and the key and the headers' columns are among
        their columns."""
        if self.source is None:
            return
        source = sinks.get(self.source)
        columns = source.published_columns if source is not None else None
        if columns is None:
            raise ValueError(f"sinks: kafka sink '{self.name}' must name a windowed postgres_aggregate sink "
                             "or a postgres_append sink in 'source', or declare columns of its own")
        if self.key not in columns:
            raise ValueError(f"sinks: kafka sink '{self.name}' key '{self.key}' is not a column of '{self.source}'")
        rows = [*columns, *(SOURCE_COORDINATES if source.query_kind == "rows" else ())]
        self._check_headers(rows)


_PARTITION_TRANSFORM = re.compile(r"(?:(year|month|day|hour)\(([a-z_][a-z0-9_]*)\)|([a-z_][a-z0-9_]*))")


class LakeMaintenance(_Strict):
    """The `<pipeline>__maintenance` DAG of a lakehouse sink: for Delta, compact small files, then remove the files
    no retained version needs; for Iceberg, remove the files of attempts that never committed."""

    schedule: str = "@daily"
    """Cron expression or preset of the maintenance DAG."""
    retain_hours: int = Field(default=168, ge=0)
    """VACUUM keeps the files of versions younger than this (Delta's default: 7 days); an Iceberg table's
    maintenance keeps the orphaned files of attempts younger than this."""
    listing_tasks: int = Field(default=64, ge=1)
    """Spark tasks VACUUM lists the table's directories with (`spark.sql.sources.parallelPartitionDiscovery.
    parallelism` during VACUUM). Spark's default, 10,000, makes 10,000 tiny tasks whatever the table's size: 20 s
    against 6.4 s with 64 for a table of 20 files in local mode (docs/performance.md). Raise it for a table of very
    many partition directories."""


class DeltaSink(SinkModel):
    """A Delta Lake table written by Spark's executors, exactly once per batch: each batch is ONE Delta commit
    carrying the batch's idempotency key (`txnAppId`) and its ranges (`userMetadata`); the ledger keeps which
    table version holds which batch. (Its Iceberg counterpart is the `iceberg` sink: see docs/sinks.md.)"""

    type: Literal["delta"]
    path: str | None = None
    """The table's location: a folder under the warehouse (`MICROBATCH_WAREHOUSE`, default `.cache/warehouse`),
    an absolute path, or a URI such as `s3a://bucket/tables/clicks` (Spark's Hadoop settings give the
    credentials). Default: the sink's name under the warehouse."""
    mode: Literal["append", "upsert"] = "append"
    columns: dict[str, ColumnType] = Field(min_length=1)
    """Each column's type (the PostgreSQL names, mapped to Spark's); the table gets `topic`, `partition` and
    `offset` added."""
    partition_by: list[str] = Field(default_factory=list)
    """Columns or transforms `year(c)`, `month(c)`, `day(c)`, `hour(c)` of a timestamp column (a generated
    column `c_day` etc.)."""
    include_late: bool = True
    """Append mode: take records whose window was already final (a landing table takes every valid record)."""
    keep_tombstones: bool = False
    """Append mode: keep each tombstone (a key with a null value) as a row: the record's coordinates, the columns
    named as the decoded key's (`key_text`, `key_<field>`), every other column null; by default an append sink skips
    it (docs/formats.md#tombstones)."""
    keys_from: KEYS_FROM = "columns"
    """Upsert mode: `record_key` keys the table by the record key's columns, and a tombstone deletes its key."""
    keys: list[str] = Field(default_factory=list)
    """Upsert mode: the key columns (required, unless `keys_from: record_key`)."""
    order_by: str | None = None
    """Upsert mode: a column ordering the versions of a key before the source coordinates."""
    delete_column: str | None = None
    """Upsert mode: a boolean output column (not stored) marking a record as a delete of its key; a record whose
    value columns are all null deletes it too. The table keeps a deleted key's row with `_deleted` true."""
    snapshot_partitions: int = Field(default=4, ge=1)
    """Spark tasks that read the table's log into its snapshot at each batch's commit and at maintenance (Delta's
    `spark.databricks.delta.snapshotPartitions`). Delta's default, 50, suits tables of very many files and made
    each small batch's commit wait for 50 tiny tasks: 5.7 s against 1.4 s per commit with 4 in local mode
    (bench/delta_commit.py, docs/performance.md). Raise it for a table whose log holds very many files."""
    maintenance: LakeMaintenance = Field(default_factory=LakeMaintenance)

    @field_validator("name")
    @classmethod
    def _identifier(cls, value: str) -> str:
        return _check_identifier(value)

    @field_validator("columns")
    @classmethod
    def _column_names(cls, columns: dict[str, str]) -> dict[str, str]:
        return _check_row_columns(columns)

    @model_validator(mode="after")
    def _fits_the_mode(self) -> DeltaSink:
        if self.mode == "upsert":
            _check_keys_given(self.keys_from, self.keys)
        if self.mode == "append" and (self.keys or self.order_by or self.delete_column or self.keys_from != "columns"):
            raise ValueError("keys: only an upsert table has keys, keys_from, order_by or delete_column; set mode: "
                             "upsert")
        if "_deleted" in self.columns:
            raise ValueError("columns: '_deleted' is the upsert table's tombstone flag; rename the column")
        if self.mode == "upsert" and self.keep_tombstones:
            raise ValueError("keep_tombstones: an upsert table applies a tombstone as the delete of its key; keep them "
                             "as rows in an append table (mode: append)")
        known = {*self.columns, *SOURCE_COORDINATES}
        if self.keys_from == "columns":
            _check_upsert_columns(self.keys, self.order_by, self.delete_column, self.columns, known=known)
        for item in self.partition_by:
            match = _PARTITION_TRANSFORM.fullmatch(item)
            column = match and (match.group(2) or match.group(3))
            if not column or column not in known:
                raise ValueError(f"partition_by: '{item}' is neither a column nor year|month|day|hour(column) of "
                                 "a declared column")
            if match.group(1) and self.columns.get(column) not in ("timestamptz", "timestamp", "date"):
                raise ValueError(f"partition_by: '{item}' needs a timestamp or date column")
        return self

    @property
    def query_kind(self) -> Literal["rows", "partials"] | None:
        return "rows"

    @property
    def query_columns(self) -> list[str]:
        return [*self.columns, *([self.delete_column] if self.delete_column else [])]

    @property
    def partition_columns(self) -> list[tuple[str, str | None, str]]:
        """(table column, transform or None, source column) for each `partition_by` item."""
        out = []
        for item in self.partition_by:
            match = _PARTITION_TRANSFORM.fullmatch(item)
            assert match is not None
            if match.group(1):
                out.append((f"{match.group(2)}_{match.group(1)}", match.group(1), match.group(2)))
            else:
                out.append((match.group(3), None, match.group(3)))
        return out


class IcebergSink(SinkModel):
    """An Apache Iceberg table, append only, exactly once per batch: Spark's executors write the batch's Parquet
    files and ONE pyiceberg commit adds them, its snapshot summary naming the batch; the catalog is pyiceberg's
    SQL catalog in the ledger's database (docs/sinks.md)."""

    type: Literal["iceberg"]
    namespace: str = "microbatch"
    """The catalog namespace of the table."""
    table: str | None = None
    """The table's name in the catalog. Default: the sink's name."""
    path: str | None = None
    """The table's location, as a Delta sink's `path`: a folder under the warehouse (`MICROBATCH_WAREHOUSE`,
    default `.cache/warehouse`), an absolute path, or a URI such as `s3://bucket/tables/clicks` (pyiceberg's and
    Spark's settings give the credentials). Default: the sink's name under the warehouse."""
    mode: Literal["append"] = "append"
    columns: dict[str, ColumnType] = Field(min_length=1)
    """Each column's type (the PostgreSQL names, mapped to Iceberg's); the table gets `topic`, `partition` and
    `offset` added."""
    partition_by: list[str] = Field(default_factory=list)
    """Columns or transforms `year(c)`, `month(c)`, `day(c)`, `hour(c)` of a timestamp or date column: the
    table's partition spec (Iceberg's hidden partitioning, no extra column)."""
    include_late: bool = True
    """Take records whose window was already final (a landing table takes every valid record)."""
    keep_tombstones: bool = False
    """Keep each tombstone (a key with a null value) as a row: the record's coordinates, the columns named as the
    decoded key's (`key_text`, `key_<field>`), every other column null; by default an append sink skips it
    (docs/formats.md#tombstones)."""
    maintenance: LakeMaintenance = Field(default_factory=LakeMaintenance)

    @field_validator("name", "namespace", "table")
    @classmethod
    def _identifier(cls, value: str | None) -> str | None:
        return None if value is None else _check_identifier(value)

    @field_validator("columns")
    @classmethod
    def _column_names(cls, columns: dict[str, str]) -> dict[str, str]:
        return _check_row_columns(columns)

    @model_validator(mode="after")
    def _partitions_known(self) -> IcebergSink:
        known = {*self.columns, *SOURCE_COORDINATES}
        for item in self.partition_by:
            match = _PARTITION_TRANSFORM.fullmatch(item)
            column = match and (match.group(2) or match.group(3))
            if not column or column not in known:
                raise ValueError(f"partition_by: '{item}' is neither a column nor year|month|day|hour(column) of "
                                 "a declared column")
            if match.group(1) and self.columns.get(column) not in ("timestamptz", "timestamp", "date"):
                raise ValueError(f"partition_by: '{item}' needs a timestamp or date column")
            if match.group(1) == "hour" and self.columns.get(column) == "date":
                raise ValueError(f"partition_by: '{item}' needs a timestamp column (a date has no hour)")
        return self

    @property
    def query_kind(self) -> Literal["rows", "partials"] | None:
        return "rows"

    @property
    def query_columns(self) -> list[str]:
        return list(self.columns)

    @property
    def partition_columns(self) -> list[tuple[str, str | None, str]]:
        """(partition field name, transform or None, source column) for each `partition_by` item."""
        out = []
        for item in self.partition_by:
            match = _PARTITION_TRANSFORM.fullmatch(item)
            assert match is not None
            if match.group(1):
                out.append((f"{match.group(2)}_{match.group(1)}", match.group(1), match.group(2)))
            else:
                out.append((match.group(3), None, match.group(3)))
        return out


SinkSpec = Annotated[PostgresAggregateSink | PostgresAppendSink | PostgresUpsertSink | KafkaSink | DeltaSink
                     | IcebergSink, Field(discriminator="type")]
SINK_MODELS: tuple[type[SinkModel], ...] = get_args(get_args(SinkSpec)[0])
SINK_TAGS: frozenset[str] = frozenset(tag for model in SINK_MODELS
                                      for tag in get_args(model.model_fields["type"].annotation))
"""The spec's sink `type`s, read from the union: each names its module `microbatch.sinks.<type>`."""


class RetrySpec(_Strict):
    """Task retries: 3 by default, the first after 10 s, each next one `backoff` times later (Airflow adds up to one
    delay again, so that retries of several tasks spread), at most `max_delay_seconds` apart: 10-20 s, 20-40 s and
    40-80 s, so that a service restarting meanwhile (a Spark Connect server, a broker) is found again. `backoff: 1`
    is Flink's `fixedDelayRestart(3, 10s)`."""

    count: int = Field(default=3, ge=0, le=20)
    delay_seconds: float = Field(default=10.0, ge=0)
    backoff: float = Field(default=2.0, ge=1)
    max_delay_seconds: float = Field(default=120.0, gt=0)

    def delay_bounds(self) -> list[tuple[float, float]]:
        """The (shortest, longest) wait before each retry, in seconds, as Airflow computes it from
        `retry_delay`, `retry_exponential_backoff` and `max_retry_delay`."""
        if self.backoff == 1:
            return [(self.delay_seconds, self.delay_seconds)] * self.count
        bounds = []
        for retry in range(self.count):
            low = max(1, math.ceil(self.delay_seconds * self.backoff ** retry))
            bounds.append((min(low, self.max_delay_seconds), min(2 * low - 1, self.max_delay_seconds)))
        return bounds


SPARK_CONNECTION_DEFAULTS = {"submit": "spark_default", "connect": "spark_connect_default"}


class SparkSpec(_Strict):
    """How the stage task runs the Spark job: spark-submit per batch, or a client of a Spark Connect server."""

    mode: Literal["submit", "connect", "auto"] = "submit"
    """`submit`: each stage task runs spark-submit (a new driver JVM per batch). `connect`: the stage task is a
    Spark Connect client of a long-lived server (`MICROBATCH_SPARK_REMOTE`, else `connection`), so no JVM
    starts per batch. `auto`: `connect` where `MICROBATCH_SPARK_REMOTE` is set when the DAG is built (the local
    stack of `make demo` / `make airflow` and the compose file set it), else `submit`; the shipped pipelines
    use it."""
    connection: str | None = None
    """Airflow connection id: mode `submit`, a Spark master (host `local[*]` or `spark://host:7077`), default
    `spark_default`; mode `connect`, a `spark_connect` connection (host `sc://HOST`, port 15002), default
    `spark_connect_default`. Mode `auto` takes the default of the mode it resolves to."""
    conf: dict[str, str] = Field(default_factory=dict)
    """Spark settings. In modes `connect` and `auto` only `spark.sql.*` settings, which a Connect session may
    change."""

    @model_validator(mode="before")
    @classmethod
    def _connection_default_of_the_mode(cls, data: Any) -> Any:
        if isinstance(data, dict) and "connection" not in data:
            default = SPARK_CONNECTION_DEFAULTS.get(data.get("mode", "submit"))
            if default:
                data = {**data, "connection": default}
        return data

    @field_validator("connection")
    @classmethod
    def _auto_takes_the_default(cls, connection: str | None, info: ValidationInfo) -> str | None:
        if info.data.get("mode") == "auto" and connection is not None:
            raise ValueError("is not used in mode 'auto', which takes the default connection of the mode it "
                             "resolves to; remove it, or set mode 'submit' or 'connect' with it")
        return connection

    @field_validator("conf")
    @classmethod
    def _settable_in_the_mode(cls, conf: dict[str, str], info: ValidationInfo) -> dict[str, str]:
        mode = info.data.get("mode")
        if mode not in ("connect", "auto"):
            return conf
        server_side = sorted(key for key in conf if not key.startswith("spark.sql."))
        if server_side:
            auto = "; mode 'auto' runs as a Connect client where MICROBATCH_SPARK_REMOTE is set" if mode == "auto" \
                else ""
            raise ValueError(
                f"sets {', '.join(server_side)}, which a Spark Connect session cannot change (only spark.sql.* "
                f"settings apply per session{auto}); set it on the Connect server (its --conf) and remove it here, "
                "or use mode 'submit'"
            )
        return conf

    def resolved(self, connect_server_set: bool) -> SparkSpec:
        """This spec with a concrete mode and connection: `auto` becomes `connect` when a Connect server is set
        (`MICROBATCH_SPARK_REMOTE`), else `submit`."""
        if self.mode != "auto":
            return self
        mode = "connect" if connect_server_set else "submit"
        return self.model_copy(update={"mode": mode, "connection": SPARK_CONNECTION_DEFAULTS[mode]})

    def for_submit(self) -> SparkSpec:
        """The settings of a spark-submit of this pipeline whatever its stage's mode (the Delta maintenance job):
        its own connection in mode `submit`, else the default Spark connection (`spark_default`)."""
        if self.mode == "submit":
            return self
        return self.model_copy(update={"mode": "submit", "connection": SPARK_CONNECTION_DEFAULTS["submit"]})


def _duration_seconds(value: str | int | float) -> float:
    """Seconds of `5s`, `1m`, `2h`, `1d` (or a number of seconds)."""
    if isinstance(value, int | float):
        return float(value)
    match = _DURATION.fullmatch(str(value).strip())
    if not match:
        raise ValueError(f"'{value}' is not a duration; write e.g. 5s, 1m or 2h")
    return float(int(match.group(1)) * {"s": 1, "m": 60, "h": 3600, "d": 86400}[match.group(2)])


class EventTimeSpec(_Strict):
    """The pipeline's event time, declared once (Flink's watermark strategy): the watermark is the greatest event
    time seen minus `allowed_lateness`, kept in the pipeline state and committed with the batch; a valid record whose
    `window` was final (its end at or before the watermark) when its batch began is late, and goes to
    `late_records` (and to row sinks with `include_late`)."""

    column: str
    """The event time: a timestamp column of `records` (a decoded field such as `ts`, or the record `timestamp`).
    A SQL pipeline reads it from the records; a Python job computes its own `event_time` column, and the helpers
    of `spark_jobs/event_time.py` read `window` and `allowed_lateness` from this section."""
    window: str | None = None
    """The tumbling window width (`60s`, `1m`, `1h`) of `window_start(ts)`/`window_end(ts)` in SQL and of the
    Python helpers; unset: a record is late when its event time is at or before the watermark."""
    allowed_lateness: str = "5s"
    """How far behind the greatest event time seen a record may be before its window closes."""
    max_future: str = "1d"
    """How far ahead of its Kafka timestamp (a Python job without it: its batch's planned time) an event time may be;
    a record further ahead is a dead letter and does not move the watermark (a producer's clock set to 2999 would
    otherwise make every later record late)."""

    @field_validator("window", "allowed_lateness", "max_future", mode="before")
    @classmethod
    def _duration(cls, value: Any) -> Any:
        if value is not None:
            _duration_seconds(value)
        return None if value is None else str(value)

    @property
    def window_seconds(self) -> int | None:
        return None if self.window is None else int(_duration_seconds(self.window))

    @property
    def allowed_lateness_seconds(self) -> float:
        return _duration_seconds(self.allowed_lateness)

    @property
    def max_future_seconds(self) -> float:
        return _duration_seconds(self.max_future)


EVENT_TIME_TYPES = ("timestamp", "timestamp_ntz")
"""What an event time column may be: a time, never a number read as seconds (epoch milliseconds would put the
watermark tens of thousands of years ahead)."""


def event_time_type_problem(column: str, kind: str) -> str:
    """The one sentence of an event time column that is not a timestamp, with the fix."""
    if kind in ("bigint", "int", "smallint", "tinyint") or kind.startswith("decimal") or kind == "double":
        fix = (f"if it holds epoch milliseconds, declare the field `{column}: {{type: timestamp, unit: ms}}` "
               "(unit: s or us for seconds or microseconds)")
    elif kind == "string":
        fix = (f"declare the field `{column}: timestamp` (ISO-8601), or `{column}: {{type: timestamp, format: "
               "\"dd/MM/yyyy HH:mm:ss\"}` for another pattern")
    else:
        fix = "name a timestamp column"
    return f"event_time.column: '{column}' is {kind}, not a timestamp; {fix}"


EVENT_TIME_OPTIONS = ("window_seconds", "allowed_lateness_seconds", "max_future_seconds")
"""The job options the platform fills in from `event_time` (`PipelineSpec.job_options`)."""


class PipelineSpec(_Strict):
    """One pipeline: a source, a transform, sinks, a schedule and retries."""

    name: str
    description: str = ""
    schedule: str | None = "30s"
    """Cron expression, preset (`@continuous`, `@hourly`, ...), a duration (`30s`, `5m`) or null."""
    source: SourceSpec
    job: JobSpec | None = None
    """A Python job (`job.transform`); without it, each sink gives its rows as a SQL query (`sql`)."""
    event_time: EventTimeSpec | None = None
    """The event time, its window and its allowed lateness, for SQL and Python jobs alike."""
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
        keyed = [_keyed_by_record(s, self.source) if s.keyed_by_record else s for s in self.sinks]
        if keyed != self.sinks:
            object.__setattr__(self, "sinks", keyed)  # the record key's columns as the keys (frozen model)
        by_name = {s.name: s for s in self.sinks}
        for sink in self.sinks:
            sink.check_among(by_name)
        self._check_job_or_queries()
        return self

    def _check_job_or_queries(self) -> None:
        """A Python job, or a query for every sink that takes one; queries checked against `records`."""
        queried = [s.name for s in self.sinks if s.sql is not None]
        if self.job is not None:
            if queried:
                raise ValueError(f"job: the pipeline has a Python job and sink {queried[0]} has sql; a pipeline is "
                                 "either a Python job or SQL per sink, so remove job or the sinks' sql")
            taken = [o for o in EVENT_TIME_OPTIONS if o in self.job.options]
            if taken and self.event_time is not None:
                raise ValueError(f"job.options: {taken[0]} is set by event_time now; remove it from job.options")
            return
        lacking = [s.name for s in self.sinks if s.query_kind is not None and s.sql is None]
        if lacking:
            raise ValueError(f"sinks: sink '{lacking[0]}' has no sql, and the pipeline has no job; give each sink a "
                             "query over records (sql: SELECT ... FROM records), or a Python job in job.transform")
        available = self.records_columns
        window = self.event_time.window_seconds if self.event_time is not None else None
        if self.event_time is not None and self.event_time.column not in available:
            raise ValueError(f"event_time.column: '{self.event_time.column}' is not a column of records; name a "
                             f"timestamp column among {', '.join(available)}")
        if self.event_time is not None and available[self.event_time.column] not in EVENT_TIME_TYPES:
            raise ValueError(event_time_type_problem(self.event_time.column, available[self.event_time.column]))
        from microbatch.sql import sink_query  # sqlglot, only for a spec with queries (not at every spec load)

        for sink in self.sinks:
            if sink.sql is not None and sink.query_kind is not None:
                sink_query(sink.name, sink.sql, sink.query_kind, available, sink.query_columns, window)

    @property
    def records_columns(self) -> dict[str, str]:
        """The columns of the view `records` a sink's query reads: the record columns, the headers when read, and
        the decoded ones, each with its Spark SQL type."""
        record = {"key": "binary", "value": "binary", "topic": "string", "partition": "int", "offset": "bigint",
                  "timestamp": "timestamp", "timestamp_type": "int"}
        headers = {"headers": "array<struct<key:string,value:binary>>"} if self.source.include_headers else {}
        return {**record, **headers, **decoded_columns(self.source.key_format, self.source.value_format)}

    def sink_queries(self) -> dict[str, SinkQuery]:
        """Each sink's checked, rewritten query, by sink name (SQL pipelines)."""
        from microbatch.sql import sink_query

        window = self.event_time.window_seconds if self.event_time is not None else None
        return {s.name: sink_query(s.name, s.sql, s.query_kind, self.records_columns, s.query_columns, window)
                for s in self.sinks if s.sql is not None and s.query_kind is not None}

    @property
    def job_options(self) -> dict[str, Any]:
        """The options a Python job is given: `job.options`, with `window_seconds` and `allowed_lateness_seconds`
        from `event_time` when the spec declares it (what `spark_jobs/event_time.py` reads)."""
        options = dict(self.job.options) if self.job is not None else {}
        if self.event_time is not None:
            options["allowed_lateness_seconds"] = self.event_time.allowed_lateness_seconds
            options["max_future_seconds"] = self.event_time.max_future_seconds
            if self.event_time.window_seconds is not None:
                options["window_seconds"] = self.event_time.window_seconds
        return options

    @property
    def record_keyed_sinks(self) -> list[str]:
        """The upsert sinks keyed by the record key, whose tombstones the platform stages as deletes."""
        return [s.name for s in self.sinks if s.keyed_by_record]

    @property
    def tombstone_sinks(self) -> list[str]:
        """The sinks that take the tombstones: deletes of their keys (`record_keyed_sinks`), or kept as rows."""
        return [s.name for s in self.sinks if s.keyed_by_record or s.keeps_tombstones]

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
    field = ".".join(str(part) for part in first["loc"] if part not in SINK_TAGS) or "(top level)"
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


def encode_spec(spec: PipelineSpec) -> str:
    """The validated spec as one command-line-safe token (base64url of its JSON), for a stage driver that
    may run where the spec files are not: inside the `--py-files` zip, or on another machine. A spec holds
    no secrets (connections are ids), so it may be seen in `ps`."""
    return base64.urlsafe_b64encode(spec.model_dump_json().encode()).decode()


def decode_spec(token: str) -> PipelineSpec:
    """The spec that `encode_spec` packed, validated again."""
    try:
        return PipelineSpec.model_validate_json(base64.urlsafe_b64decode(token.encode()))
    except (ValueError, ValidationError) as exc:
        raise SpecError(f"The --spec argument is not an encoded pipeline spec ({type(exc).__name__}).",
                        fix="Let the stage task pass it, or use --pipeline alone to read the spec file.") from None


def find_spec(name: str, directory: Path | None = None) -> PipelineSpec:
    """Load the spec of the pipeline called `name`."""
    directory = directory or pipelines_dir()
    path = directory / f"{name}.yaml"
    if not path.exists():
        known = ", ".join(p.stem for p in spec_paths(directory)) or "none"
        raise SpecError(f"There is no pipeline '{name}' in {directory}.", fix=f"Known pipelines: {known}.")
    return load_spec(path)
