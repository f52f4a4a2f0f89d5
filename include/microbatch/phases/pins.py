"""The schemas of a batch's registry formats (`Format.uses_registry`: `avro`), pinned when the batch is planned.

The plan asks the registry once per side: the reader schema (the subject's `latest` version, or the spec's pinned
one), whose fields must hold the declared ones with their types (else a `SpecError` before anything is written),
and every version of the subject, whose ids are the writer schemas the batch may meet: the records of its ranges
were produced, and their schemas registered, before the plan read the latest offsets. The pins (subject, reader
version and id, writer ids) go into the batch row, the schemas' texts into the ledger (`registry_schemas`), in the
plan's transaction. A replay copies the pins of the batch it replays (`repository.insert_backfill_batches`).

The stage reads the pins and the schemas from the ledger alone, so a retry and a replay decode the same bytes with
the same schemas, whatever the registry holds or whether it answers; the stage adds the writer ids its read met
(`met`). A registry that does not answer fails the plan as a `TransientServiceError` (Airflow retries the task);
a subject or version it does not have as a `SpecError`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from sqlalchemy.orm import Session

from microbatch.config import PipelineSpec
from microbatch.errors import MicrobatchError, SpecError
from microbatch.formats.base import Format, RegistrySchemas
from microbatch.formats.schema_registry import Registry
from microbatch.ledger import repository as repo
from microbatch.settings import Lookup, schema_registry_url

log = logging.getLogger(__name__)
SIDES = ("key", "value")


def configured_registry(lookup: Lookup | None = None) -> Registry:
    """The registry the settings name (`MICROBATCH_SCHEMA_REGISTRY_URL`, else with `lookup` the Airflow connection
    `schema_registry_default`)."""
    return Registry(schema_registry_url(lookup))


def registry_sides(spec: PipelineSpec) -> list[tuple[str, Format[Any]]]:
    """The sides of the record whose format reads a schema registry, with their formats."""
    formats = (spec.source.key_format, spec.source.value_format)
    return [(side, fmt) for side, fmt in zip(SIDES, formats, strict=True) if fmt.uses_registry]


@dataclass(frozen=True)
class PlannedPins:
    formats: dict[str, dict[str, Any]]
    """Per side, what the batch row keeps (`RegistrySchemas.pins` and the writer ids)."""
    schemas: dict[int, str]
    """Every schema the pins name, by registry id, for the ledger."""


def plan_pins(spec: PipelineSpec, registry: Callable[[], Registry]) -> PlannedPins:
    """Ask the registry for each registry side's reader schema and writer schemas, and check the declared fields
    against the reader; nothing is written here."""
    formats: dict[str, dict[str, Any]] = {}
    schemas: dict[int, str] = {}
    for side, fmt in registry_sides(spec):
        subject = fmt.subject(side, spec.source.topics or [])
        assert subject is not None  # the spec refuses a registry side whose subject cannot be told
        client = registry()
        reader = client.version(subject, getattr(fmt.spec, "version", "latest"))
        problem = fmt.reader_problem(reader.schema, side, subject, reader.version)
        if problem is not None:
            raise SpecError(f"source.{problem}; no batch was planned.")
        writers = client.subject_schemas(subject)
        writers[reader.schema_id] = reader.schema
        pinned = RegistrySchemas(subject, reader.version, reader.schema_id, reader.schema, writers)
        formats[side] = {**pinned.pins(), "writers": sorted(writers)}
        schemas.update(writers)
        log.info("%s: subject '%s', reader schema version %s (id %s), %s writer schema(s) %s", side, subject,
                 reader.version, reader.schema_id, len(writers), sorted(writers))
    return PlannedPins(formats, schemas)


def bound_formats(session: Session, spec: PipelineSpec, batch_id: int, pipeline_id: int,
                  pins: Mapping[str, Any]) -> tuple[Format[Any], Format[Any]]:
    """The key's and the value's formats as the batch decodes them: each registry format bound to the schemas its
    pins name, read from the ledger (the writers the first read met, when the batch was staged before; else every
    writer the plan pinned)."""
    formats = {"key": spec.source.key_format, "value": spec.source.value_format}
    for side, fmt in registry_sides(spec):
        pinned = pins.get(side)
        if pinned is None:
            raise MicrobatchError(
                f"Batch {batch_id} was planned before the spec read its {side} through a schema registry, so it "
                "pins no schema to decode it with.",
                fix="Abandon the open batch (`microbatch reset`) or stage it with the spec it was planned with.")
        writers = [int(i) for i in pinned.get("met") or pinned.get("writers") or []]
        reader_id = int(pinned["reader_id"])
        kept = repo.kept_schemas(session, pipeline_id, sorted({*writers, reader_id}))
        missing = sorted({*writers, reader_id} - set(kept))
        if missing:
            raise MicrobatchError(f"The ledger keeps no schema of id(s) {missing} that batch {batch_id} pins.",
                                  fix="Run `microbatch verify`; the ledger's registry_schemas table lost rows.")
        problem = fmt.reader_problem(kept[reader_id], side, pinned["subject"], int(pinned["version"]))
        if problem is not None:  # the spec's fields changed since the batch was planned (a replay after an edit)
            raise SpecError(f"source.{problem}; batch {batch_id} decodes with the reader schema it was planned with, "
                            "so it was not staged.")
        formats[side] = fmt.bound(RegistrySchemas(pinned["subject"], int(pinned["version"]), reader_id,
                                                  kept[reader_id], {i: kept[i] for i in writers}))
    return formats["key"], formats["value"]


def staged_pins(pins: Mapping[str, Any], decode: Mapping[str, Any]) -> dict[str, Any]:
    """The batch's pins with the writer ids its read met (`met`), from the stage's decode report."""
    formats = decode.get("formats", {})
    return {side: {**pinned, "met": formats.get(side, {}).get("writers", [])} for side, pinned in pins.items()}
