"""The Spark Connect remote of a pipeline in `spark.mode: connect`: where it is, how it is shown in logs
(never with its token), and the one-sentence error when the server cannot be reached.

No pyspark here: the stage task checks the server before it opens a Connect session, because the
Connect client retries an unreachable server for about ten minutes before it gives up.
"""

from __future__ import annotations

import socket
from urllib.parse import urlsplit

from microbatch.errors import ConnectionSettingsError, TransientServiceError
from microbatch.settings import SPARK_CONNECT_DEFAULT_PORT, SPARK_REMOTE_ENV

START_HINT = ("Start it (`make connect`, or `python -m microbatch.dev.stack connect`; on a Spark host "
              "`start-connect-server.sh`)")


def host_port(remote: str) -> tuple[str, int]:
    """The host and port of an `sc://HOST[:PORT][/;params]` URL; raise ConnectionSettingsError otherwise."""
    try:
        parts = urlsplit(remote.strip())
        port = parts.port or SPARK_CONNECT_DEFAULT_PORT
    except ValueError:
        parts, port = None, 0
    if parts is None or parts.scheme != "sc" or not parts.hostname:
        raise ConnectionSettingsError(
            f"The Spark Connect remote '{display(remote)}' is not an sc:// URL.",
            fix=f"Set {SPARK_REMOTE_ENV} (or the spark_connect connection) to sc://HOST:PORT.",
        )
    return parts.hostname, port


def display(remote: str) -> str:
    """`sc://host:port` without the user id, token or any other parameter, for logs and errors."""
    try:
        parts = urlsplit(remote.strip())
        if parts.scheme == "sc" and parts.hostname:
            return f"sc://{parts.hostname}:{parts.port or SPARK_CONNECT_DEFAULT_PORT}"
    except ValueError:
        pass
    return "(unparseable)"


def unreachable(remote: str, reason: str, conn_id: str) -> TransientServiceError:
    """One sentence naming the remote and why it failed, and the fix: start the server or point at it."""
    return TransientServiceError(
        f"Cannot reach the Spark Connect server at {display(remote)}: {reason}.",
        fix=f"{START_HINT}, or point {SPARK_REMOTE_ENV} or the Airflow connection '{conn_id}' at a running one.",
    )


def check_reachable(remote: str, conn_id: str, timeout: float = 5.0) -> None:
    """Raise a retryable one-sentence error unless the server accepts TCP connections."""
    host, port = host_port(remote)
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return
    except OSError as exc:
        reason = exc.strerror or str(exc) or type(exc).__name__
        raise unreachable(remote, reason[:1].lower() + reason[1:], conn_id) from None


def is_unavailable(exc: BaseException) -> bool:
    """Whether a Connect client failure means the server went away (gRPC UNAVAILABLE after the retries)."""
    text = str(exc)
    return "StatusCode.UNAVAILABLE" in text or "failed to connect to all addresses" in text
