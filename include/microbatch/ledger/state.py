"""A pipeline's state on the record: what it holds now (the watermark, the job's own values), which committed batch
last changed each value, and the operators' resets of it (`state_resets`), for `microbatch state` and
`microbatch reset --watermark`."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from microbatch.errors import MicrobatchError
from microbatch.ledger.models import OPEN_STATES, Batch, BatchKind, BatchState, Pipeline, StateReset


@dataclass(frozen=True)
class Change:
    batch_id: int
    committed_at: datetime | None


@dataclass(frozen=True)
class ResetRow:
    old_state: dict[str, Any]
    new_state: dict[str, Any]
    target: str
    operator: str | None
    created_at: datetime


@dataclass
class StateView:
    state: dict[str, Any]
    changed_by: dict[str, Change] = field(default_factory=dict)
    """Per key of the state, the committed scheduled batch that last changed it."""
    resets: list[ResetRow] = field(default_factory=list)
    """The operators' resets, newest first."""


def state_view(session: Session, pipeline_id: int, resets: int = 10) -> StateView:
    """The pipeline's state, who changed each value last, and its newest `resets`."""
    pipeline = session.get(Pipeline, pipeline_id)
    assert pipeline is not None, "the caller found the pipeline"
    view = StateView(dict(pipeline.state or {}))
    rows = session.execute(select(Batch.id, Batch.committed_at, Batch.state_before, Batch.state_after).where(
        Batch.pipeline_id == pipeline_id, Batch.kind == BatchKind.SCHEDULED.value,
        Batch.state == BatchState.COMMITTED.value).order_by(Batch.id.desc()))
    missing = set(view.state)
    for batch_id, committed_at, before, after in rows:
        for key in [k for k in missing if (after or {}).get(k) != (before or {}).get(k)]:
            view.changed_by[key] = Change(batch_id, committed_at)
            missing.discard(key)
        if not missing:
            break
    view.resets = [ResetRow(r.old_state, r.new_state, r.target, r.operator, r.created_at) for r in session.scalars(
        select(StateReset).where(StateReset.pipeline_id == pipeline_id).order_by(StateReset.id.desc()).limit(resets))]
    return view


def reset_state(session: Session, pipeline_id: int, expected: dict[str, Any], new_state: dict[str, Any], *,
                target: str, operator: str) -> None:
    """Set the pipeline's state to `new_state`, by compare-and-set from the `expected` state the operator saw,
    with an audit row; refused while a batch is open (it was planned from the state being replaced)."""
    pipeline = session.get(Pipeline, pipeline_id, with_for_update=True)
    assert pipeline is not None, "the caller found the pipeline"
    open_batch = session.scalars(select(Batch.id).where(
        Batch.pipeline_id == pipeline_id, Batch.state.in_(OPEN_STATES)).order_by(Batch.id).limit(1)).first()
    if open_batch is not None:
        raise MicrobatchError(
            f"reset: batch {open_batch} of the pipeline is open, and was planned from the state this reset replaces; "
            "nothing changed.",
            fix=f"Let it commit, or `microbatch abandon PIPELINE {open_batch}`, then reset again.")
    if dict(pipeline.state or {}) != expected:
        raise MicrobatchError("reset: the pipeline's state changed since it was shown; nothing changed.",
                              fix="Run the reset again.")
    session.add(StateReset(pipeline_id=pipeline_id, old_state=dict(pipeline.state or {}), new_state=new_state,
                           target=target, operator=operator))
    pipeline.state = new_state
