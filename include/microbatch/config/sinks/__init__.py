"""The sink models of a spec, one module each, and their union `SinkSpec`, discriminated by `type`."""

from __future__ import annotations

from typing import Annotated, get_args

from pydantic import Field

from microbatch.config.columns import SinkModel
from microbatch.config.sinks.aggregate import PostgresAggregateSink, WindowSpec
from microbatch.config.sinks.delta import DeltaSink
from microbatch.config.sinks.iceberg import IcebergSink
from microbatch.config.sinks.kafka import KafkaSink
from microbatch.config.sinks.lake import LakeMaintenance
from microbatch.config.sinks.rows import PostgresAppendSink, PostgresUpsertSink

SinkSpec = Annotated[PostgresAggregateSink | PostgresAppendSink | PostgresUpsertSink | KafkaSink | DeltaSink
                     | IcebergSink, Field(discriminator="type")]
SINK_MODELS: tuple[type[SinkModel], ...] = get_args(get_args(SinkSpec)[0])
SINK_TAGS: frozenset[str] = frozenset(tag for model in SINK_MODELS
                                      for tag in get_args(model.model_fields["type"].annotation))
"""The spec's sink `type`s, read from the union: each names its module `microbatch.sinks.<type>`."""

__all__ = ["SINK_MODELS", "SINK_TAGS", "DeltaSink", "IcebergSink", "KafkaSink", "LakeMaintenance",
           "PostgresAggregateSink", "PostgresAppendSink", "PostgresUpsertSink", "SinkSpec", "WindowSpec"]
