"""The optional capabilities of a sink, as mixins beside the core `Sink` (`sinks/base.py`): `LakeTable`, a sink with
a lakehouse table that the stage writes itself, and `Publisher`, a sink that publishes its outbox rows to Kafka.

A sink type that has a capability subclasses its mixin as well as `Sink` (`LakehouseSink(Sink, LakeTable)`,
`KafkaTopic(Sink, Publisher)`) and answers every member; a sink without it has none of them, instead of no-ops.
Callers ask the capability, never the sink's type: `isinstance(sink, LakeTable)`, `registry.publishing(spec)`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, ClassVar

from sqlalchemy.orm import Session

from microbatch.config import PipelineSpec
from microbatch.sinks.base import CommitContext
from microbatch.sinks.contexts import Outbox, PublishRun, RelandContext, StageContext, TableView
from microbatch.types import TableWrite

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from microbatch.settings import KafkaSettings

__all__ = ["LakeTable", "Publisher"]


class LakeTable(ABC):
    """A sink whose lakehouse table, outside Postgres, the stage writes itself (one idempotent table commit per
    batch, `write_in_stage`, which `sinks/base.write_table` brackets with the ledger's checks) instead of a Postgres
    staging table; `microbatch migrate`, the plan check, verify, show, find and the maintenance DAG ask it for its
    table. `sinks/lakehouse.LakehouseSink` answers what Delta and Iceberg share."""

    writes_in_stage: ClassVar[bool] = True
    """Always true: the stage writes the table itself; `staging` then names only the columns it takes."""
    maintenance_summary: ClassVar[str]
    """What the `<pipeline>__maintenance` DAG does to this sink's table, for the DAG's description."""

    @property
    @abstractmethod
    def lake_location(self) -> str:
        """The folder or URI of the sink's lakehouse table."""

    @property
    @abstractmethod
    def maintenance_schedule(self) -> str | None:
        """The schedule of the `<pipeline>__maintenance` DAG that `maintain`s this sink; None: it needs none."""

    @abstractmethod
    def lake_refusal(self, ledger_url: str) -> str | None:
        """The first change of the lakehouse table that `migrate_lake` would refuse, as a sentence; checked before
        anything is migrated. `ledger_url`: the ledger's database, which may hold the table's catalog."""

    @abstractmethod
    def migrate_lake(self, ledger_url: str) -> list[str]:
        """Create the lakehouse table, or make its additive changes; what was done, one line each."""

    @abstractmethod
    def check_lake(self, spec: PipelineSpec, ledger_url: str) -> None:
        """Refuse (`SpecError`) a batch while the lakehouse table is missing or differs from the spec."""

    @abstractmethod
    def audit(self, session: Session, spec: PipelineSpec, pipeline_id: int, uid: str) -> tuple[list[str], list[str]]:
        """`microbatch verify`: the lakehouse table against the ledger: (summary lines, problems)."""

    @abstractmethod
    def lake_view(self, limit: int, group_by: str | None) -> TableView:
        """`microbatch show` of the lakehouse table (its newest rows, or row counts per `group_by` value)."""

    @abstractmethod
    def holding_text(self, location: str, version: int) -> str:
        """How `microbatch find` names the table version (at `location`) that the ledger recorded for a batch."""

    @abstractmethod
    def maintain(self, spark: SparkSession) -> None:
        """The maintenance DAG's job for this sink (compaction, clean-up), in a spark-submit."""

    @abstractmethod
    def write_in_stage(self, rows: DataFrame, ctx: StageContext) -> TableWrite:
        """Write the batch's `rows` into the table as one idempotent commit that names the batch, unless the table
        already holds the batch; return the version that holds it. Hit `BEFORE_LAKE_COMMIT` right before the
        table's commit and `AFTER_LAKE_COMMIT` right after it."""

    @abstractmethod
    def reland_table(self, rows: DataFrame, ctx: RelandContext) -> TableWrite:
        """`row_audit == "coordinates"` sinks: replace the rows of the batch's ranges by `rows` in one table
        commit, record the reland in the ledger (`ledger/rows.record_reland`); the version made."""


class Publisher(ABC):
    """A sink that publishes to Kafka: its commit writes outbox rows (`write_outbox`), which the publish task
    (`phases/publish.py`, after the commit) has it send (`publish`); its assets are the publish task's outlets."""

    publishes: ClassVar[bool] = True
    """Always true: the sink publishes to Kafka."""

    @property
    @abstractmethod
    def published_topic(self) -> str:
        """The Kafka topic the sink sends its outbox to (what `microbatch show` names)."""

    @abstractmethod
    def outbox_label(self, ctx: CommitContext) -> str:
        """What this sink's outbox rows of the batch are, for the commit's log line."""

    @abstractmethod
    def write_outbox(self, session: Session, ctx: CommitContext) -> tuple[int, int] | None:
        """Write this sink's outbox rows for the batch; (first, last) sequence written, None if none."""

    @abstractmethod
    def publish(self, outbox: Outbox, kafka: KafkaSettings) -> PublishRun:
        """In the publish phase (under its lock): send the rows of `outbox` that the topic does not hold yet,
        recording the progress after each send; what was sent."""
