"""OpenLineage: one COMPLETE run event per committed batch, sent through Airflow's OpenLineage provider.

- input: each Kafka topic the batch read (namespace `kafka://HOST:PORT`, as OpenLineage's naming spec says),
  with the facet `microbatch_offsetRanges`: the exact [start, end) of every partition, from the ledger;
- outputs: the sink tables (`postgres://HOST:PORT`, `DB.SCHEMA.TABLE`), Delta tables (their location) and the
  Kafka topics its outbox rows go to, each with `outputStatistics.rowCount`: the rows this batch put there;
- run: `microbatch_batch` names the batch, its kind and attempt, the Airflow runs that planned and committed
  it, and for a replay the batches (and ranges) it supersedes. The run id is derived from the ledger's
  identity and the batch id, so a re-sent event names the same run.

The commit task calls `emit_committed` after the batch's transaction is durable. The provider's own settings
decide where events go (`[openlineage] transport`, e.g. `AIRFLOW__OPENLINEAGE__TRANSPORT`); without any, the
provider is disabled and nothing is built. A failure here is one WARNING: lineage never fails a batch.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from functools import cache
from typing import Any, ClassVar

from sqlalchemy import make_url

from microbatch.config import PipelineSpec
from microbatch.ledger import repository as repo
from microbatch.ledger.database import transaction
from microbatch.phases.results import CommitResult
from microbatch.types import OffsetRange

log = logging.getLogger(__name__)
PRODUCER = "https://github.com/microbatch/microbatch"
OFFSET_FACET = "microbatch_offsetRanges"
BATCH_FACET = "microbatch_batch"
_SCHEMA = "https://github.com/microbatch/microbatch/blob/main/docs/operations.md#lineage-openlineage"


def enabled() -> bool:
    """Whether the provider would send anything (a transport, a config file or OPENLINEAGE_URL is set)."""
    try:
        from airflow.providers.openlineage import conf
    except ImportError:
        return False
    return not conf.is_disabled()


@cache
def facet_classes() -> tuple[type, type]:
    """(OffsetRangesInputFacet, BatchRunFacet), defined on first use: without a configured provider, the
    OpenLineage client is never imported."""
    import attr
    from openlineage.client.facet_v2 import InputDatasetFacet, RunFacet

    @attr.define
    class OffsetRangesInputFacet(InputDatasetFacet):
        """The offsets a batch read from one topic: one {partition, start, end} per partition, end exclusive."""

        ranges: list[dict[str, int]] = attr.field(factory=list)
        _additional_skip_redact: ClassVar[list[str]] = ["ranges"]

        @staticmethod
        def _get_schema() -> str:
            return _SCHEMA

    @attr.define
    class BatchRunFacet(RunFacet):
        """Which ledger batch the run is, and what a replay supersedes (OpenLineage facets are camelCase)."""

        pipeline: str
        batchId: int
        kind: str
        attempt: int
        plannedRunId: str | None = None
        committedRunId: str | None = None
        supersedes: list[int] = attr.field(factory=list)
        supersededRanges: list[dict[str, Any]] = attr.field(factory=list)
        _additional_skip_redact: ClassVar[list[str]] = ["pipeline", "kind", "supersedes", "supersededRanges"]

        @staticmethod
        def _get_schema() -> str:
            return _SCHEMA

    return OffsetRangesInputFacet, BatchRunFacet


def outputs_of(spec: PipelineSpec, result: CommitResult, ledger_url: str, kafka_namespace: str,
               staged: dict[str, int]) -> list[tuple[str, str, int]]:
    """(namespace, name, rows) of each dataset the batch wrote: Postgres tables (in the ledger's database),
    Delta tables and Kafka topics, as each sink names its own (`Sink.lineage_output`); no credentials in any of
    them."""
    from microbatch.sinks.base import LineagePlaces
    from microbatch.sinks.registry import sinks_of

    url = make_url(ledger_url)
    places = LineagePlaces(postgres=f"postgres://{url.host or '127.0.0.1'}:{url.port or 5432}",
                           database=str(url.database), kafka=kafka_namespace)
    outputs = [sink.lineage_output(places, result.rows_by_sink, result.outbox, staged)
               for sink in sinks_of(spec).values()]
    return [output for output in outputs if output is not None]


def batch_event(spec: PipelineSpec, namespace: str, batch: dict[str, Any], ranges: list[OffsetRange],
                kafka_namespace: str, outputs: list[tuple[str, str, int]], replaced: list[tuple[int, str]],
                event_time: datetime | None = None) -> Any:
    """The COMPLETE run event of one committed batch, in the job `microbatch.<pipeline>` of `namespace`."""
    from openlineage.client.event_v2 import InputDataset, Job, OutputDataset, Run, RunEvent, RunState
    from openlineage.client.facet_v2 import output_statistics_output_dataset

    offset_facet, batch_facet = facet_classes()
    by_topic: dict[str, list[dict[str, int]]] = {}
    for r in sorted(ranges, key=lambda r: (r.topic, r.partition)):
        by_topic.setdefault(r.topic, []).append({"partition": r.partition, "start": r.start, "end": r.end})
    run_facet = batch_facet(
        pipeline=spec.name, batchId=batch["id"], kind=batch["kind"], attempt=batch["attempt"],
        plannedRunId=batch["airflow_run_id"], committedRunId=batch["committed_run_id"],
        supersedes=sorted({b for b, _ in replaced}),
        supersededRanges=[{"batchId": b, "range": text} for b, text in replaced], producer=PRODUCER)
    return RunEvent(
        eventType=RunState.COMPLETE, eventTime=(event_time or datetime.now(tz=UTC)).isoformat(),
        run=Run(runId=str(uuid.uuid5(uuid.NAMESPACE_URL, f"microbatch://{batch['uid']}/batch/{batch['id']}")),
                facets={BATCH_FACET: run_facet}),
        job=Job(namespace=namespace, name=f"microbatch.{spec.name}"),
        inputs=[InputDataset(namespace=kafka_namespace, name=topic,
                             inputFacets={OFFSET_FACET: offset_facet(ranges=parts, producer=PRODUCER)})
                for topic, parts in by_topic.items()],
        outputs=[OutputDataset(namespace=namespace_, name=name, outputFacets={
            "outputStatistics": output_statistics_output_dataset.OutputStatisticsOutputDatasetFacet(
                rowCount=rows, producer=PRODUCER)}) for namespace_, name, rows in outputs],
        producer=PRODUCER,
    )


def emit_committed(spec: PipelineSpec, result: CommitResult, ledger_url: str,
                   bootstrap_servers: Callable[[], str]) -> None:
    """Send the OpenLineage event of a batch the commit task just committed (nothing when the provider is not
    configured or the batch was committed before); never raises. `bootstrap_servers` names the source's
    cluster (resolved only when an event is sent)."""
    if result.already_committed or not enabled():
        return
    try:
        from airflow.providers.openlineage import conf
        from airflow.providers.openlineage.plugins.adapter import OpenLineageAdapter

        with transaction(ledger_url) as session:
            ranges = repo.batch_ranges(session, result.batch_id)
            row = repo.get_batch(session, result.batch_id)
            batch = {"id": row.id, "kind": row.kind, "attempt": row.attempt, "airflow_run_id": row.airflow_run_id,
                     "committed_run_id": row.committed_run_id, "counts": row.counts,
                     "uid": repo.pipeline_uid(session, row.pipeline_id)}
        kafka_namespace = "kafka://" + bootstrap_servers().split(",", maxsplit=1)[0].strip()
        outputs = outputs_of(spec, result, ledger_url, kafka_namespace,
                             dict((batch["counts"] or {}).get("rows_by_sink") or {}))
        event = batch_event(spec, conf.namespace(), batch, ranges, kafka_namespace, outputs, result.replaced)
        OpenLineageAdapter().emit(event)
        log.info("lineage: sent the OpenLineage event of batch %s (%s range(s), %s output(s))", result.batch_id,
                 len(ranges), len(outputs))
    except Exception as exc:  # lineage must never fail a committed batch
        log.warning("lineage: the OpenLineage event of batch %s was not sent (%s: %s); the batch is committed",
                    result.batch_id, type(exc).__name__, exc)
