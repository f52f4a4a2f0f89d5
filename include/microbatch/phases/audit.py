"""`microbatch verify`, the rows: each sink's table against the rows the ledger committed, batch by batch.

The offsets' audit (no hole, no overlap) proves what was read; this one proves what landed. Per sink, by what the
sink is (`Sink.row_audit`):
- an append sink (a Postgres or lakehouse append table): the rows whose source coordinates fall in a committed
  batch's ranges must be the rows the stage handed the sink for that batch (`counts.rows_by_sink`);
- an upsert or aggregate sink: the versions or contributions the commit kept for the batch (`counts.kept_by_sink`)
  must still be there.
A batch replayed in part is audited through its replay; a batch committed before the ledger recorded its rows is
counted apart, audited by its offsets only."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from sqlalchemy.orm import Session

from microbatch.errors import MicrobatchError, error_summary
from microbatch.ledger import rows as ledger_rows
from microbatch.sinks.base import Sink


@dataclass
class RowAudit:
    lines: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    lost: dict[str, list[int]] = field(default_factory=dict)
    """Per append sink, the committed batches whose rows it no longer holds in full (what `reland` lands again)."""


def mismatch(pipeline: str, sink: Sink, batch_id: int, committed: int, held: int) -> str:
    """The one sentence of a batch whose rows a sink does not hold as committed."""
    what = "rows" if sink.row_audit == "coordinates" else "kept rows (versions or contributions)"
    fix = (f"`microbatch reland {pipeline} {sink.name}` lands the batch again" if sink.row_audit == "coordinates"
           else f"`microbatch backfill {pipeline} --mode replay` over its ranges rebuilds them")
    return (f"rows: pipeline {pipeline}, sink {sink.name}, batch {batch_id}: the ledger committed {committed} {what}, "
            f"the table holds {held}; {fix}")


def audit_rows(session: Session, pipeline: str, pipeline_id: int, sinks: Mapping[str, Sink]) -> RowAudit:
    """The rows of every audited sink of the pipeline against the ledger (see the module's docstring)."""
    result = RowAudit()
    audited = [s for s in sinks.values() if s.row_audit is not None]
    if not audited:
        return result
    batches = ledger_rows.committed_batches(session, pipeline_id)
    whole = [b for b in batches if b.whole]
    for sink in audited:
        key = ledger_rows.ROWS if sink.row_audit == "coordinates" else ledger_rows.KEPT
        expected = {b.batch_id: n for b in whole if (n := b.recorded(key, sink.name)) is not None}
        unrecorded = len(whole) - len(expected)
        try:
            live = sink.live_rows(session, pipeline_id, {b.batch_id: b.ranges for b in whole
                                                         if b.batch_id in expected}) if expected else {}
        except MicrobatchError as exc:
            result.problems.append(f"rows: sink {sink.name}: {exc}")
            continue
        except Exception as exc:  # a table that cannot be read is a finding, not a traceback
            result.problems.append(f"rows: sink {sink.name}: its table cannot be read ({error_summary(exc)})")
            continue
        wrong = [(b, n, live.get(b, 0)) for b, n in sorted(expected.items()) if live.get(b, 0) != n]
        result.problems += [mismatch(pipeline, sink, b, n, held) for b, n, held in wrong]
        if wrong and sink.row_audit == "coordinates":
            result.lost[sink.name] = [b for b, _, _ in wrong]
        apart = [f"{unrecorded} committed before the ledger recorded rows" if unrecorded else "",
                 f"{len(batches) - len(whole)} replayed in part (audited through their replay)"
                 if len(batches) > len(whole) else ""]
        result.lines.append(
            f"{sink.type} {sink.name}: {sum(expected.values())} rows of {len(expected)} committed batches, as the "
            f"ledger recorded them{''.join(f'; {a}' for a in apart if a)}" if not wrong else
            f"{sink.type} {sink.name}: {len(wrong)} of {len(expected)} committed batches differ from the ledger")
    return result
