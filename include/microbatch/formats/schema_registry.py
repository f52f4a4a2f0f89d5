"""Reading a schema registry's Confluent-compatible API (Confluent's Schema Registry, Apicurio's `ccompat`, Karapace)
through confluent-kafka's `SchemaRegistryClient`: the reader schema of a subject's version, and the schemas of all
its versions by id. Nothing here writes to the registry.

A registry that does not answer is a `TransientServiceError` (the task's retries ask again, then it fails with
that sentence); a subject or version it does not have is a `SpecError` (terminal). The URL may carry a password as
user info: messages show it through `settings.redact_url`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from microbatch.errors import SpecError, TransientServiceError
from microbatch.settings import redact_url

log = logging.getLogger(__name__)

TIMEOUT_SECONDS = 10
"""How long one request may take before the registry counts as not answering."""
_NOT_FOUND = (40401, 40402, 40403)
"""The registry's error codes of a subject, a version or a schema it does not have."""


@dataclass(frozen=True)
class RegisteredSchema:
    subject: str
    version: int
    schema_id: int
    schema: str


class Registry:
    """The registry at `url` (as `settings.schema_registry_url` gives it)."""

    def __init__(self, url: str) -> None:
        from confluent_kafka.schema_registry import SchemaRegistryClient

        self.url = url
        self._client = SchemaRegistryClient({"url": url, "timeout": TIMEOUT_SECONDS, "max.retries": 2,
                                             "retries.wait.ms": 500})

    def version(self, subject: str, version: int | str) -> RegisteredSchema:
        """`version` of `subject` (a number, or "latest")."""
        found = self._call(lambda: self._client.get_latest_version(subject) if version == "latest"
                           else self._client.get_version(subject, int(version)), subject, version)
        return RegisteredSchema(subject, int(found.version), int(found.schema_id), found.schema.schema_str)

    def subject_schemas(self, subject: str) -> dict[int, str]:
        """Every version's schema of `subject`, by registry id."""
        versions = self._call(lambda: self._client.get_versions(subject), subject, "any")
        return {each.schema_id: each.schema for each in (self.version(subject, v) for v in versions)}

    def _call(self, request: Any, subject: str, version: int | str) -> Any:
        from confluent_kafka.schema_registry.error import SchemaRegistryError

        where = redact_url(self.url)
        try:
            return request()
        except SchemaRegistryError as exc:
            if exc.error_code in _NOT_FOUND or exc.http_status_code == 404:
                what = f"subject '{subject}'" if version in ("any", "latest") else \
                    f"version {version} of subject '{subject}'"
                raise SpecError(f"The schema registry at {where} has no {what}, so no batch was planned.",
                                fix="Register the schema (a producer's serializer does it), or name the subject "
                                "with `subject:` and an existing version with `version:`.") from None
            if exc.http_status_code in (401, 403):
                raise SpecError(f"The schema registry at {where} refused the request ({exc.http_status_code}).",
                                fix="Give the connection schema_registry_default a login that may read the "
                                "subject.") from None
            raise TransientServiceError(f"The schema registry at {where} answered {exc.http_status_code} for "
                                        f"subject '{subject}'.", fix="Check the registry's own log.") from None
        except (OSError, ConnectionError) as exc:
            raise _unreachable(where, exc) from None
        except Exception as exc:  # httpx's transport errors are not OSErrors
            if type(exc).__module__.startswith(("httpx", "httpcore")):
                raise _unreachable(where, exc) from None
            raise


def _unreachable(where: str, exc: BaseException) -> TransientServiceError:
    return TransientServiceError(
        f"The schema registry at {where} could not be reached ({type(exc).__name__}).",
        fix="Start it (`make registry` runs the local one), or point MICROBATCH_SCHEMA_REGISTRY_URL or the "
        "connection schema_registry_default at the running registry.")
