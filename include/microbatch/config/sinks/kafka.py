"""The `kafka` sink model: rows published to a topic, its own or another sink's."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

from pydantic import Field, field_validator, model_validator

from microbatch.column_types import ColumnType
from microbatch.config.columns import SOURCE_COORDINATES, OutputTopic, SinkModel, _check_row_columns
from microbatch.config.primitives import _check_identifier


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
