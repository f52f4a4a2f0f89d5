"""The registry schemas the ledger keeps per pipeline, by registry id, so a replay decodes as its batch did."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.orm import Session

from microbatch.ledger.models import RegistrySchema


def record_schemas(session: Session, pipeline_id: int, schemas: dict[int, str]) -> None:
    """Keep each schema's text by its registry id for the pipeline (once: a registry never changes an id's
    schema)."""
    if schemas:
        session.execute(insert(RegistrySchema).values(
            [{"pipeline_id": pipeline_id, "schema_id": schema_id, "schema": text_}
             for schema_id, text_ in sorted(schemas.items())]).on_conflict_do_nothing())


def kept_schemas(session: Session, pipeline_id: int, schema_ids: list[int]) -> dict[int, str]:
    """The schemas the ledger keeps for the pipeline among `schema_ids`, by id."""
    rows = session.execute(select(RegistrySchema.schema_id, RegistrySchema.schema).where(
        RegistrySchema.pipeline_id == pipeline_id, RegistrySchema.schema_id.in_(schema_ids)))
    return {int(schema_id): schema for schema_id, schema in rows}
