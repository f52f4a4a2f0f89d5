"""Which class implements each sink `type` of the spec: the `Sink` subclass of the module `sinks/<type>.py`, for
every tag of the spec's union (`config.SINK_TAGS`). A new sink type is that module and its spec model in the
union; nothing here changes. The functions below ask the sinks' capabilities, never their type."""

from __future__ import annotations

import importlib

from microbatch.config import SINK_TAGS, PipelineSpec, SinkSpec
from microbatch.errors import SpecError
from microbatch.sinks.base import Sink
from microbatch.sinks.capabilities import LakeTable, Publisher


def _implementation(tag: str) -> type[Sink]:
    """The `Sink` subclass of `sinks/<tag>.py` whose `type` is `tag`."""
    module = importlib.import_module(f"{__package__}.{tag}")
    found = [cls for cls in vars(module).values()
             if isinstance(cls, type) and issubclass(cls, Sink) and cls.__dict__.get("type") == tag]
    if len(found) != 1:
        raise TypeError(f"{module.__name__} must define one Sink subclass with type = {tag!r}, not {len(found)}")
    return found[0]


SINK_TYPES: dict[str, type[Sink]] = {tag: _implementation(tag) for tag in sorted(SINK_TAGS)}


def sink_for(spec: SinkSpec) -> Sink:
    """The sink that implements one sink of a spec."""
    cls = SINK_TYPES.get(spec.type)
    if cls is None:  # the spec (config/sinks/) accepts a type that no module implements
        raise SpecError(f"sink '{spec.name}': no module implements the sink type '{spec.type}'.",
                        fix=f"Use one of {', '.join(sorted(SINK_TYPES))}.")
    return cls(spec)


def sinks_of(spec: PipelineSpec) -> dict[str, Sink]:
    """Every sink of a pipeline by name, in the spec's order (the order the commit writes them in)."""
    return {sink.name: sink_for(sink) for sink in spec.sinks}


def publishing(spec: PipelineSpec) -> list[Sink]:
    """The sinks that publish to Kafka (each a `Publisher`: the publish task sends their outbox rows), in the
    spec's order."""
    return [sink for sink in sinks_of(spec).values() if isinstance(sink, Publisher)]


def maintained(spec: PipelineSpec) -> list[LakeTable]:
    """The sinks that the `<pipeline>__maintenance` DAG maintains, in the spec's order."""
    return [sink for sink in sinks_of(spec).values()
            if isinstance(sink, LakeTable) and sink.maintenance_schedule is not None]


def spark_session_conf(spec: PipelineSpec) -> dict[str, str]:
    """The static Spark settings that the stage's session needs for the pipeline's sinks."""
    return {key: value for sink in sinks_of(spec).values() for key, value in sink.spark_session_conf.items()}


def any_spark_session_conf() -> dict[str, str]:
    """The static Spark settings of every sink type: a Spark Connect server that stages any pipeline needs them at
    its start, since a Connect session cannot set them later."""
    return {key: value for cls in SINK_TYPES.values() for key, value in cls.spark_session_conf.items()}


def driver_env() -> dict[str, str]:
    """The environment that a Spark driver of any pipeline needs for the sink types (resolved in the task)."""
    return {key: value for cls in SINK_TYPES.values() for key, value in cls.driver_env().items()}
