"""The Kafka source of a spec (`source`): topics, startup modes, batch limits and the key and value formats."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any, Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator
from pydantic_core import PydanticCustomError

from microbatch.config.primitives import _Strict
from microbatch.formats.base import Format
from microbatch.formats.raw import RawSpec
from microbatch.formats.record import decoded_columns
from microbatch.formats.registry import FormatSpecs, format_for

JOB_COLUMN_NAMES = ("error", "late", "event_time")
"""Columns of the job contract (`transform.py`) that `parse` adds to the records: no decoded column may take them."""


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
