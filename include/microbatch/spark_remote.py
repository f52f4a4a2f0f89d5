"""The Spark Connect remote of a pipeline in `spark.mode: connect`: where it is, how it is shown in logs
(never with its token), the one-sentence error when the server cannot be reached, and which server-side
session a stage task reattaches to.

No pyspark here: the stage task checks the server before it opens a Connect session, because the
Connect client retries an unreachable server for about ten minutes before it gives up.
"""

from __future__ import annotations

import hashlib
import json
import socket
import uuid
from collections.abc import Mapping
from urllib.parse import urlsplit

from microbatch.errors import ConnectionSettingsError, TransientServiceError
from microbatch.settings import SPARK_CONNECT_DEFAULT_PORT, SPARK_REMOTE_ENV

START_HINT = ("Start it (`make connect`, or `python -m microbatch.dev.stack connect`; on a Spark host "
              "`start-connect-server.sh`)")


SHARED_SESSION_SECONDS = 1800
"""How long the stage tasks of one DAG reattach to one server-side session before they take the next. The server
closes a session after it has been idle for `spark.connect.session.manager.defaultSessionTimeout` (60 min by
default) and then refuses its id for good; a session id that is never used longer than 30 min is never asked for
after it was closed that way."""


def shared_session_id(key: str, conf: Mapping[str, str], now: float) -> str:
    """The Spark Connect session id that every stage task of one DAG (`key`) with the same session settings uses
    within one `SHARED_SESSION_SECONDS` window, so that each batch runs in a warm server-side session instead of a
    new one (a new session made every 1M-record job about 1 s slower: docs/performance.md). A change of `conf`
    gives a new session, so no setting the spec dropped lingers."""
    window = int(now // SHARED_SESSION_SECONDS)
    digest = hashlib.sha256(json.dumps([key, sorted(conf.items()), window]).encode()).digest()
    return str(uuid.UUID(bytes=digest[:16], version=4))


def with_session_id(remote: str, session_id: str) -> str:
    """`remote` naming the session `session_id`, unless it names a session already (then it is left as it is)."""
    if "session_id=" in remote:
        return remote
    base = remote.strip()
    return f"{base};session_id={session_id}" if "/;" in base else f"{base.rstrip('/')}/;session_id={session_id}"


def is_closed_session(exc: BaseException) -> bool:
    """Whether a Connect client failure means the server closed (or replaced) the session it named."""
    return "INVALID_HANDLE.SESSION_CLOSED" in str(exc) or "INVALID_HANDLE.SESSION_CHANGED" in str(exc)


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
