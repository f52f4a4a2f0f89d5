"""The audit of a pipeline (`microbatch verify`) as data: committed ranges and gaps cover every offset up to each
position with no overlap; each lakehouse table holds every committed batch in exactly one version, and no other
batch; and every sink holds the rows the ledger committed for each batch (`phases/audit.py`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from sqlalchemy.orm import Session

from microbatch.config import PipelineSpec
from microbatch.errors import MicrobatchError, error_summary
from microbatch.ledger import repository as repo
from microbatch.phases.audit import audit_rows
from microbatch.planning import find_holes, find_overlaps
from microbatch.sinks.capabilities import LakeTable
from microbatch.sinks.registry import sinks_of


@dataclass
class Verification:
    """What the audit counted and found: no problem is a whole ledger."""

    ranges: int
    gaps: int
    partitions: int
    tables: list[str] = field(default_factory=list)
    """One line per audited table (lakehouse versions, then rows)."""
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def verify_pipeline(session: Session, pipeline: str, pipeline_id: int, spec: PipelineSpec | None) -> Verification:
    """Audit the pipeline's offsets, and with its `spec` (None when the spec is gone: the ledger outlives it, and
    its offsets are still audited) its lakehouse tables and its sinks' rows."""
    ranges = repo.committed_ranges(session, pipeline_id)
    gaps = repo.committed_gaps(session, pipeline_id)
    positions = repo.read_positions(session, pipeline_id)
    lake_lines: list[str] = []
    lake_problems: list[str] = []
    sinks = sinks_of(spec) if spec is not None else {}
    for sink in sinks.values():
        if isinstance(sink, LakeTable):
            try:
                lines, found = sink.audit(session, spec, pipeline_id, repo.pipeline_uid(session, pipeline_id))
            except MicrobatchError as exc:
                lines, found = [], [f"{sink.type} {sink.name}: {exc}"]
            except Exception as exc:  # a table that cannot be read is a finding, not a traceback
                lines, found = [], [f"{sink.type} {sink.name}: its table cannot be read ({error_summary(exc)})"]
            lake_lines += lines
            lake_problems += found
    rows = audit_rows(session, pipeline, pipeline_id, sinks)
    problems = [f"overlap: {a} and {b}" for a, b in find_overlaps(ranges)] + find_holes(ranges, gaps, positions)
    problems += lake_problems + rows.problems
    return Verification(len(ranges), len(gaps), len(positions), lake_lines + rows.lines, problems)
