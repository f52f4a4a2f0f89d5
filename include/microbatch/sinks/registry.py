"""Which class implements each sink `type` of the spec. A new sink type is a module beside this one, its
spec model in config.py, and one entry here."""

from __future__ import annotations

from microbatch.config import PipelineSpec, SinkSpec
from microbatch.errors import SpecError
from microbatch.sinks.base import Sink
from microbatch.sinks.delta import DeltaTableSink
from microbatch.sinks.kafka import KafkaTopic
from microbatch.sinks.postgres_aggregate import PostgresAggregate
from microbatch.sinks.postgres_append import PostgresAppend
from microbatch.sinks.postgres_upsert import PostgresUpsert

SINK_TYPES: dict[str, type[Sink]] = {cls.type: cls for cls in (PostgresAggregate, PostgresAppend,
                                                                PostgresUpsert, KafkaTopic, DeltaTableSink)}


def sink_for(spec: SinkSpec) -> Sink:
    """The sink that implements one sink of a spec."""
    cls = SINK_TYPES.get(spec.type)
    if cls is None:  # config.py accepts a type that no module implements
        raise SpecError(f"sink '{spec.name}': no module implements the sink type '{spec.type}'.",
                        fix=f"Use one of {', '.join(sorted(SINK_TYPES))}.")
    return cls(spec)


def sinks_of(spec: PipelineSpec) -> dict[str, Sink]:
    """Every sink of a pipeline by name, in the spec's order (the order the commit writes them in)."""
    return {sink.name: sink_for(sink) for sink in spec.sinks}


def spark_session_conf(spec: PipelineSpec) -> dict[str, str]:
    """The static Spark settings that the stage's session needs for the pipeline's sinks."""
    return {key: value for sink in sinks_of(spec).values() for key, value in sink.spark_session_conf.items()}
