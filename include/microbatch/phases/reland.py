"""`microbatch reland`: land committed batches again into ONE append sink whose table lost their rows.

`microbatch verify` names each committed batch whose rows an append sink no longer holds (a table emptied by a bug,
rows deleted behind the ledger's back). A reland reads exactly the batch's committed ranges again, decodes them
with the formats the batch was decoded with and applies the job from the state the batch started from, as the
stage did, and replaces the rows of those ranges in that one sink, in one table commit: a Postgres table by one
transaction (delete the ranges' rows, insert the batch's), a lakehouse table by one table commit of its own
(`LakeTable.reland_table`). The ledger records each
reland on the batch (`counts.relands`); the batch's offsets, its other sinks, the pipeline's state and its dead
letters stay as they are. The rows handed to the sink must equal the rows the ledger committed for it, or nothing
is written."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from microbatch.config import PipelineSpec
from microbatch.errors import RowCountError, SpecError
from microbatch.ledger import queries
from microbatch.ledger import repository as repo
from microbatch.ledger import rows as ledger_rows
from microbatch.ledger.database import Ledger
from microbatch.phases.pins import bound_formats, registry_sides
from microbatch.phases.stage_job import job_outputs, load_job, sink_output
from microbatch.phases.stage_read import Attempt, read_attempt
from microbatch.phases.stage_records import jdbc_options, write_staging
from microbatch.settings import KafkaSettings
from microbatch.sinks.base import RelandContext, Sink
from microbatch.sinks.capabilities import LakeTable
from microbatch.sinks.registry import sinks_of

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Relanded:
    batch_id: int
    rows: int
    version: int | None
    seconds: float


def relandable(spec: PipelineSpec, sink_name: str) -> Sink:
    """The sink to reland into, or one sentence why not."""
    sinks = sinks_of(spec)
    if sink_name not in sinks:
        raise SpecError(f"Pipeline '{spec.name}' has no sink '{sink_name}'.", fix=f"Use one of: {', '.join(sinks)}.")
    sink = sinks[sink_name]
    if sink.row_audit != "coordinates":
        raise SpecError(f"Sink '{sink_name}' is a {sink.type} sink, which `microbatch reland` cannot land again (only "
                        "append sinks: a Postgres or lakehouse append table).",
                        fix=f"Replay its ranges instead: `microbatch backfill {spec.name} --mode replay ...`.")
    return sink


def reland_batches(spark: SparkSession, spec: PipelineSpec, sink: Sink, batch_ids: Sequence[int], ledger: Ledger,
                   kafka: KafkaSettings) -> list[Relanded]:
    """Land each committed batch of `batch_ids` again into `sink` (see the module's docstring)."""
    done = []
    for batch_id in batch_ids:
        done.append(reland_batch(spark, spec, sink, batch_id, ledger, kafka))
    return done


def reland_batch(spark: SparkSession, spec: PipelineSpec, sink: Sink, batch_id: int, ledger: Ledger,
                 kafka: KafkaSettings) -> Relanded:
    started = time.monotonic()
    with ledger.transaction() as session:
        pipeline_id = queries.pipeline_id(session, spec.name)
        if pipeline_id is None:
            raise SpecError(f"The ledger has no pipeline '{spec.name}' yet: it has never run.",
                            fix=f"Run it first: microbatch run {spec.name}.")
        whole = next((b for b in ledger_rows.committed_batches(session, pipeline_id) if b.batch_id == batch_id), None)
        if whole is None:
            raise SpecError(f"Batch {batch_id} is not a committed batch of pipeline '{spec.name}'.",
                            fix=f"`microbatch verify {spec.name}` names the batches whose rows a sink lost.")
        if not whole.whole:
            raise SpecError(f"Batch {batch_id} was replayed in part, so its ranges belong to the replay.",
                            fix="Reland the replay batch instead.")
        expected = whole.recorded(ledger_rows.ROWS, sink.name)
        if expected is None:
            raise SpecError(f"Batch {batch_id} records no rows for sink '{sink.name}' (committed before the sink "
                            "was added).", fix="Choose a batch that `microbatch verify` names.")
        formats = (spec.source.key_format, spec.source.value_format)
        if registry_sides(spec):
            formats = bound_formats(session, spec, batch_id, pipeline_id, whole.formats)
        current = Attempt(batch_id, whole.attempt, whole.ranges, dict(whole.state_before), False, pipeline_id,
                          repo.pipeline_uid(session, pipeline_id), formats, whole.planned_us)
        number = ledger_rows.reland_count(session, batch_id, sink.name) + 1
    log.info("reland of batch %s into %s (the %s): reading %s range(s), %s rows committed", batch_id, sink.name,
             f"#{number}", len(current.ranges), expected)
    job = load_job(spec)
    _, read = read_attempt(spark, spec, current, kafka)
    parsed = job.parse(read.for_job, current.parse_options(spec), current.state_before)
    outputs = job_outputs(job, parsed, spec.job_options, current.state_before, [sink])
    rows = sink_output(spec, sink, outputs, read.tombstones).persist()
    handed = rows.count()
    if handed != expected:
        rows.unpersist()
        raise RowCountError(f"Batch {batch_id}: read again, it gives sink {sink.name} {handed} rows but the ledger "
                            f"committed {expected}; nothing was written.",
                            fix="Reland with the transform and spec the batch ran with.")
    ctx = RelandContext(spec.name, pipeline_id, current.pipeline_uid, batch_id, whole.attempt, current.ranges, ledger,
                        number=number, rows=expected)
    if isinstance(sink, LakeTable):
        written = sink.reland_table(rows, ctx)
        version: int | None = written.version
        landed = written.rows
    else:
        assert sink.staging is not None
        tag = [F.lit(batch_id).cast("bigint").alias("batch_id"), F.lit(-number).cast("int").alias("attempt")]
        with ledger.transaction() as session:
            sink.clear_reland(session, ctx)
        write_staging(rows.select(*tag, *sink.staging.columns), sink.staging.table, jdbc_options(ledger))
        with ledger.transaction() as session:
            landed = sink.reland_staged(session, ctx)
            if landed != expected:
                raise RowCountError(f"Batch {batch_id}: the reland merged {landed} rows into sink {sink.name} but "
                                    f"the ledger committed {expected}; nothing was written.",
                                    fix="Run `microbatch reland` again.")
            ledger_rows.record_reland(session, batch_id, sink.name, None, landed)
        version = None
    rows.unpersist()
    read.release()
    seconds = time.monotonic() - started
    log.info("reland of batch %s into %s: %s rows landed%s (%.1fs)", batch_id, sink.name, landed,
             f" as version {version}" if version is not None else "", seconds)
    return Relanded(batch_id, landed, version, seconds)
