"""`microbatch new`: a pipeline that runs as generated.

`microbatch new NAME --topic T --format F` writes four files under the repository root (`naming.py`): the spec
(`include/pipelines/NAME.yaml`, one `postgres_append` sink named NAME), the transform (`spark_jobs/NAME.py`, the
contract of `microbatch.transform`), its unit test and the thin DAG file (`templates.py`, `write.py`).
`microbatch new NAME --from-topic TOPIC` writes a YAML-only pipeline instead (the spec, a unit test of the spec
without Spark, and the DAG file), inferred from up to 100 records of the live topic by asking each format whether
the sample looks like it (`from_topic.py`, `formats/inference.py`), written as YAML by `yaml_spec.py`.
The names below stay importable from `microbatch.scaffold`.
"""

from microbatch.formats.inference import INFER_RESERVED, quote_sql, snake_case
from microbatch.formats.json_types import (
    EPOCH_AHEAD,
    EPOCH_SINCE,
    NULL,
    Epoch,
    JsonType,
    epoch_unit,
    merge,
    merged,
    observe,
)
from microbatch.scaffold.from_topic import Inference, Side, SinkColumn, infer_pipeline, infer_side
from microbatch.scaffold.naming import ROOT, check_new_name, parse_columns, paths
from microbatch.scaffold.templates import DEFAULT_JSON_COLUMNS, SPARK_TYPES
from microbatch.scaffold.write import FORMATS, SAMPLED_FILES, new_pipeline, new_pipeline_from_sample
from microbatch.scaffold.yaml_spec import spec_yaml

__all__ = [
    "DEFAULT_JSON_COLUMNS", "EPOCH_AHEAD", "EPOCH_SINCE", "FORMATS", "INFER_RESERVED", "NULL", "ROOT",
    "SAMPLED_FILES", "SPARK_TYPES", "Epoch", "Inference", "JsonType", "Side", "SinkColumn", "check_new_name",
    "epoch_unit", "infer_pipeline", "infer_side", "merge", "merged", "new_pipeline", "new_pipeline_from_sample",
    "observe", "parse_columns", "paths", "quote_sql", "snake_case", "spec_yaml",
]
