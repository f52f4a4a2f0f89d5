"""The job of a stage: the transform a spec names (`load_job`), and the rows each sink takes from the job's outputs
(`job_outputs`, `sink_output`), which the stage and a reland both hand to their sinks."""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from microbatch.config import PipelineSpec
from microbatch.errors import SpecError
from microbatch.sinks.base import Sink
from microbatch.transform import ERROR_COLUMN, LATE_COLUMN, SparkJob


def load_job(spec: PipelineSpec) -> SparkJob:
    """Import the job object named by `job.transform` ('module:attribute'); a SQL pipeline's is its queries."""
    if spec.job is None:
        from microbatch.sql_job import SqlJob

        return SqlJob(spec)
    module_name, _, attribute = spec.job.transform.partition(":")
    try:
        return getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError) as exc:
        raise SpecError(
            f"{spec.name}.yaml: field 'job.transform' names '{spec.job.transform}', which cannot be imported ({exc}).",
            fix="Point it at an object in a module that spark-submit can import.",
        ) from None


def takes_late_records(sink: Sink) -> bool:
    """Whether a sink takes the late records as well (a row sink with `include_late`, e.g. a raw landing
    table); an aggregate never does, so its windows that may be published stay final."""
    return sink.include_late


def job_outputs(
    job: SparkJob, observed: DataFrame, options: Mapping[str, Any], state: Mapping[str, Any], sinks: list[Sink]
) -> dict[str, Mapping[str, DataFrame]]:
    """The job's outputs that each sink stages from, by sink name.

    Late records (valid, but for a window already final when the batch began) still go to `late_records`,
    as before. A sink that takes late records too gets its output from a second call of `job.outputs` over
    every valid row (the `late` column tells them apart); every other sink from the call over the good,
    on-time rows. So the job contract stays as it was: `outputs` returns each sink's rows from the rows it
    is given, and a job needs no change to feed a raw landing table. Both calls build plans over the same
    read (cached when several sinks share it), so Kafka is still read once."""
    valid = observed.where(F.col(ERROR_COLUMN).isNull())
    on_time = job.outputs(valid.where(~F.col(LATE_COLUMN)), options, state)
    with_late = job.outputs(valid, options, state) if any(takes_late_records(s) for s in sinks) else on_time
    return {sink.name: with_late if takes_late_records(sink) else on_time for sink in sinks}


def sink_rows(spec: PipelineSpec, sink: Sink, outputs: Mapping[str, DataFrame]) -> DataFrame:
    """The job's output for `sink`, checked for the columns its staging table needs."""
    assert sink.staging is not None
    if sink.name not in outputs:
        raise SpecError(f"{spec.name}: the job produced no output for sink '{sink.name}'.")
    missing = [c for c in sink.staging.columns if c not in outputs[sink.name].columns]
    if missing:
        raise SpecError(
            f"{spec.name}: the job's output for sink '{sink.name}' lacks the column(s) {', '.join(missing)}.",
            fix=sink.staging.fix,
        )
    return sink.staged_rows(outputs[sink.name])


def sink_output(
    spec: PipelineSpec, sink: Sink, outputs: Mapping[str, Mapping[str, DataFrame]], tombstones: DataFrame | None
) -> DataFrame:
    """The rows `sink` takes from the job's `outputs` (`job_outputs`), in its staging table's columns, with the
    batch's `tombstones` (None: none held back) when the sink takes them."""
    assert sink.staging is not None
    rows = sink_rows(spec, sink, outputs[sink.name]).select(*sink.staging.columns)
    if tombstones is not None and sink.takes_tombstones:
        rows = rows.unionByName(sink.tombstone_rows(tombstones, rows))
    return rows
