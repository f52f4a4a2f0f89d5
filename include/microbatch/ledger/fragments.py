"""The two SQL fragments of the ledger that a sink's own statements embed, written once.

- `staged_rows`: a staging table's rows of the batch's current attempt. The stage tags every staged row with
  (batch_id, attempt), and only the attempt the ledger holds current may be committed (invariant 6).
- `superseded_ranges`: the ledger's committed ranges that a replay batch superseded, whose contributions the
  sinks retract.

Both select by bound parameters (`:batch_id`, `:attempt`), which every caller passes (`CommitContext.staged`).
"""

from __future__ import annotations

from microbatch.ledger.models import Range

RANGES = Range.__tablename__


def staged_rows(table: str, alias: str = "") -> str:
    """`<table> [alias] WHERE batch_id = :batch_id AND attempt = :attempt`: the rows of `table` (an SQL name, quoted
    by the caller) that the batch's attempt staged, to follow FROM or USING; a caller may go on with `AND ...`."""
    prefix = f"{alias}." if alias else ""
    return f"{table}{f' {alias}' if alias else ''} WHERE {prefix}batch_id = :batch_id AND {prefix}attempt = :attempt"


def superseded_ranges(alias: str = "", join_on: str = "") -> str:
    """`ranges [alias] [ON join_on] WHERE superseded_by = :batch_id`: the ledger's ranges that the replay batch
    :batch_id superseded, to follow FROM, JOIN (with `join_on`) or USING; a caller may go on with `AND ...`."""
    prefix = f"{alias}." if alias else ""
    return f"{RANGES}{f' {alias}' if alias else ''}{f' ON {join_on}' if join_on else ''} " \
           f"WHERE {prefix}superseded_by = :batch_id"
