"""Pipeline specs (`include/pipelines/<name>.yaml`), validated by pydantic.

Unknown keys are rejected. A bad spec raises `SpecError` with one sentence that names the
file and the field. Connections and secrets never live in a spec: a spec names an Airflow
connection id, and the connection (or an environment variable) holds the address.

The models live in this package's modules; every name is handed on here, as `microbatch.config.<name>`.
"""

from microbatch.column_types import POSTGRES_FOR_SPARK, TIME_TYPES, ColumnType
from microbatch.config.columns import (
    KEYS_FROM,
    SOURCE_COORDINATES,
    OutputTopic,
    SinkModel,
)
from microbatch.config.loading import (
    PIPELINES_DIR,
    PIPELINES_DIR_ENV,
    decode_spec,
    encode_spec,
    find_spec,
    load_spec,
    pipelines_dir,
    spec_paths,
)
from microbatch.config.pipeline import PipelineSpec
from microbatch.config.run import (
    EVENT_TIME_OPTIONS,
    EVENT_TIME_TYPES,
    SPARK_CONNECTION_DEFAULTS,
    EventTimeSpec,
    JobSpec,
    RetrySpec,
    SparkSpec,
    event_time_type_problem,
)
from microbatch.config.sinks import (
    SINK_MODELS,
    SINK_TAGS,
    DeltaSink,
    IcebergSink,
    KafkaSink,
    LakeMaintenance,
    PostgresAggregateSink,
    PostgresAppendSink,
    PostgresUpsertSink,
    SinkSpec,
    WindowSpec,
)
from microbatch.config.source import (
    JOB_COLUMN_NAMES,
    CommitGroupOffsets,
    OffsetReset,
    OnDataLoss,
    SourceSpec,
    Startup,
    StartupSpec,
)

__all__ = [
    "EVENT_TIME_OPTIONS", "EVENT_TIME_TYPES", "JOB_COLUMN_NAMES", "KEYS_FROM", "PIPELINES_DIR", "PIPELINES_DIR_ENV",
    "POSTGRES_FOR_SPARK", "SINK_MODELS", "SINK_TAGS", "SOURCE_COORDINATES", "SPARK_CONNECTION_DEFAULTS", "TIME_TYPES",
    "ColumnType", "CommitGroupOffsets", "DeltaSink", "EventTimeSpec", "IcebergSink", "JobSpec", "KafkaSink",
    "LakeMaintenance", "OffsetReset", "OnDataLoss", "OutputTopic", "PipelineSpec", "PostgresAggregateSink",
    "PostgresAppendSink", "PostgresUpsertSink", "RetrySpec", "SinkModel", "SinkSpec", "SourceSpec", "SparkSpec",
    "Startup", "StartupSpec", "WindowSpec", "decode_spec", "encode_spec", "event_time_type_problem", "find_spec",
    "load_spec", "pipelines_dir", "spec_paths",
]
