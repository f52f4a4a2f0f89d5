"""The pipeline's row in the ledger: created on first use, found by name, its state and its identity (`uid`)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.orm import Session

from microbatch.config import PipelineSpec
from microbatch.ledger.models import Pipeline


def ensure_pipeline(session: Session, spec: PipelineSpec, *, lock: bool = False) -> Pipeline:
    """The pipeline's row, created on first use; `lock` takes it FOR UPDATE to serialize planning."""
    session.execute(
        insert(Pipeline)
        .values(name=spec.name, spec_hash=spec.spec_hash(), state={})
        .on_conflict_do_update(index_elements=[Pipeline.name], set_={"spec_hash": spec.spec_hash()})
    )
    query = select(Pipeline).where(Pipeline.name == spec.name)
    if lock:
        query = query.with_for_update()
    return session.scalars(query).one()


def pipeline_state(session: Session, pipeline_id: int) -> dict[str, Any]:
    """The pipeline state as of its last committed batch ({} for a pipeline the ledger does not hold)."""
    pipeline = session.get(Pipeline, pipeline_id)
    return dict(pipeline.state or {}) if pipeline is not None else {}


def get_pipeline(session: Session, name: str, *, lock: bool = False) -> Pipeline | None:
    query = select(Pipeline).where(Pipeline.name == name)
    if lock:
        query = query.with_for_update()
    return session.scalars(query).one_or_none()


def pipeline_uid(session: Session, pipeline_id: int) -> str:
    """The ledger's identity of a pipeline, which its lakehouse commits carry."""
    return session.execute(select(Pipeline.uid).where(Pipeline.id == pipeline_id)).scalar_one()
