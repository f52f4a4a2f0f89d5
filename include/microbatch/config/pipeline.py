"""The whole spec of one pipeline (`PipelineSpec`): its sections and the checks across them."""

from __future__ import annotations

import hashlib
import json
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from pydantic import Field, field_validator, model_validator

from microbatch.config.columns import _keyed_by_record
from microbatch.config.primitives import _DURATION, _IDENTIFIER, _Strict
from microbatch.config.run import (
    EVENT_TIME_OPTIONS,
    EVENT_TIME_TYPES,
    EventTimeSpec,
    JobSpec,
    RetrySpec,
    SparkSpec,
    event_time_type_problem,
)
from microbatch.config.sinks import SinkSpec
from microbatch.config.source import SourceSpec
from microbatch.formats.record import decoded_columns

if TYPE_CHECKING:
    from microbatch.sql import SinkQuery

_CRON_PRESETS = {"@once", "@continuous", "@hourly", "@daily", "@weekly", "@monthly", "@yearly"}


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
