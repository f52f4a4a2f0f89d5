"""One root error for the platform; each error says whether a retry can help.

Airflow retries a task on any exception. Terminal errors are raised as
`AirflowFailException` by the DAG factory so Airflow does not waste retries on them.
Every message is one sentence on the cause and one on the fix, never a stack trace.
"""

from __future__ import annotations


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


class TransientServiceError(MicrobatchError):
    """Kafka or Postgres could not be reached; a retry may succeed."""

    retryable = True
