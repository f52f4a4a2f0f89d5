"""The plan phase: read the ledger and the broker, decide the next batch, insert it.

The decision itself is the pure `planning.plan_batch`; this module only does the I/O
around it. The pipeline row is locked FOR UPDATE, so two planners never race, and an open
batch is always reused: a retry never plans new ranges while an earlier batch is open.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from microbatch.config import PipelineSpec
from microbatch.kafka_offsets import discover_partitions, offset_bounds, offsets_client
from microbatch.ledger import repository as repo
from microbatch.ledger.database import transaction
from microbatch.planning import OffsetRange, Plan, TopicPartition, plan_batch

log = logging.getLogger(__name__)


@dataclass
class PlanOutcome:
    batch_id: int | None
    reused: bool
    ranges: list[OffsetRange]
    plan: Plan | None
    latest: dict[TopicPartition, int]
    seconds: float

    @property
    def records(self) -> int:
        return sum(r.size for r in self.ranges)


def plan_next_batch(
    spec: PipelineSpec, ledger_url: str, bootstrap_servers: str, airflow_run_id: str | None = None
) -> PlanOutcome:
    """Reuse the open batch, or plan and insert a new one; batch_id is None when there is nothing to read."""
    started = time.monotonic()
    with offsets_client(bootstrap_servers, spec.source.isolation_level) as consumer:
        partitions = discover_partitions(consumer, spec.source.topics)
        earliest, latest = offset_bounds(consumer, partitions)
    with transaction(ledger_url) as session:
        pipeline = repo.ensure_pipeline(session, spec, lock=True)
        open_batch = repo.find_open_batch(session, pipeline.id)
        if open_batch is not None:
            ranges = repo.batch_ranges(session, open_batch.id)
            return PlanOutcome(open_batch.id, True, ranges, None, latest, time.monotonic() - started)
        positions = repo.read_positions(session, pipeline.id)
        plan = plan_batch(positions, earliest, latest, spec.source)
        if not plan.ranges and not plan.gaps:
            return PlanOutcome(None, False, [], plan, latest, time.monotonic() - started)
        batch = repo.insert_batch(session, pipeline, plan, airflow_run_id=airflow_run_id)
        batch.timings = {"plan_s": round(time.monotonic() - started, 3)}
        return PlanOutcome(batch.id, False, list(plan.ranges), plan, latest, time.monotonic() - started)
