"""One root error for the platform; each error says whether a retry can help.

Airflow retries a task on any exception. Terminal errors are raised as
`AirflowFailException` by the DAG factory so Airflow does not waste retries on them.
Every message is one sentence on the cause and one on the fix, never a stack trace.
"""

from __future__ import annotations

from typing import Any


class MicrobatchError(Exception):
    """Root of every error the platform raises on purpose."""

    retryable: bool = False

    def __init__(self, message: str, *, fix: str | None = None) -> None:
        self.message = message
        self.fix = fix
        super().__init__(f"{message} {fix}" if fix else message)


class SpecError(MicrobatchError):
    """A pipeline spec, a parameter or a setting is invalid. Nothing was written."""


class ConnectionSettingsError(MicrobatchError):
    """A connection (Kafka, ledger database, Spark) is missing or malformed."""


class DataLossError(MicrobatchError):
    """Offsets the ledger still needs were deleted from Kafka (retention) or the topic was reset."""


class ZombieAttemptError(MicrobatchError):
    """An attempt that is no longer the batch's current one tried to stage or commit."""


class ConcurrentCommitError(MicrobatchError):
    """A compare-and-set on a position, or the overlap constraint, refused the commit."""

    retryable = True


class SetupError(MicrobatchError):
    """The machine lacks something the platform installs or builds (pyspark, a jar, a JDK); nothing ran."""


class RowCountError(MicrobatchError):
    """A sink's table would hold other rows than the stage handed it (an attempt's files, a merge); nothing of the
    attempt was committed, and a retry writes it again."""

    retryable = True


class TransientServiceError(MicrobatchError):
    """Kafka or Postgres could not be reached; a retry may succeed."""

    retryable = True


def first_validation_error(exc: Any) -> tuple[str, str]:
    """The field and the message of a pydantic ValidationError's first error, for a one-sentence report.
    A model-level check names its field itself, as `field: message`."""
    first = exc.errors()[0]
    field = ".".join(str(p) for p in first["loc"])
    message = first["msg"].removeprefix("Value error, ")
    if not field:
        field, _, message = message.partition(": ")
    return field, message


def error_summary(exc: BaseException) -> str:
    """One line for an unexpected error: its type and first message line; for a Py4J error from Spark,
    the Java exception and its message rather than the Py4J call that carried it."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    java = next((line.removeprefix(":").strip() for line in lines if line.startswith(": ")), None)
    text = java or (lines[0] if lines else "no message")
    return f"{type(exc).__name__}: {text}"[:500]


class StageFailedError(MicrobatchError):
    """The stage's Spark job failed for a reason the platform does not name (a Spark error, a bug in a job).
    Nothing was committed, so a retry re-reads the same ranges."""

    retryable = True

    @classmethod
    def from_exception(cls, exc: BaseException) -> StageFailedError:
        return cls(f"The stage failed: {error_summary(exc)}.",
                   fix="Nothing was committed and the batch keeps its planned ranges, so the retry re-reads exactly "
                       "them; if every retry fails the same way, report the trace logged above.")
