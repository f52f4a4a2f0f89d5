"""The Spark Connect remote of a pipeline in `spark.mode: connect`: where it is, how it is shown in logs
(never with its token), the one-sentence error when the server cannot be reached, and which server-side
session a stage task reattaches to, and how long its client retries a server that went away.

No pyspark at import (only `connect_retry_policy` imports it): the stage task checks the server before it opens a
Connect session, because even the bounded retries (`CONNECT_RETRY`) wait up to a minute for an unreachable server.
"""

from __future__ import annotations

import hashlib
import json
import math
import socket
import uuid
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Protocol
from urllib.parse import urlsplit

from microbatch.errors import ConnectionSettingsError, TransientServiceError
from microbatch.settings import SPARK_CONNECT_DEFAULT_PORT, SPARK_REMOTE_ENV

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.connect.client.retries import RetryPolicy

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


class RetryParameters(Protocol):
    """The parameters of a Connect client retry policy, named as pyspark's `RetryPolicy` names them (times in ms)."""

    @property
    def max_retries(self) -> int | None: ...
    @property
    def initial_backoff(self) -> int: ...
    @property
    def max_backoff(self) -> int | None: ...
    @property
    def backoff_multiplier(self) -> float: ...
    @property
    def jitter(self) -> int: ...
    @property
    def min_jitter_threshold(self) -> int: ...
    @property
    def recognize_server_retry_delay(self) -> bool: ...
    @property
    def max_server_retry_delay(self) -> int | None: ...


@dataclass(frozen=True)
class ConnectRetry:
    """How every Connect session microbatch opens retries a failed call, in the terms (and milliseconds) of
    pyspark's `DefaultPolicy`, which keeps choosing what to retry (UNAVAILABLE, a preempted cursor, a server's
    RetryInfo). pyspark's own defaults (15 retries, backoff up to 60 s, a server may ask for 10 min) kept a stage
    whose server had died silent for about ten minutes; these give up after at most `retry_wait_bound` = 46 s of
    backoff (32.5 s when the server is simply gone), and a server's RetryInfo can ask for at most 5 s a retry."""

    max_retries: int = 6
    initial_backoff: int = 500
    max_backoff: int = 15_000
    backoff_multiplier: float = 2.0
    jitter: int = 500
    min_jitter_threshold: int = 2_000
    recognize_server_retry_delay: bool = True
    max_server_retry_delay: int = 5_000


CONNECT_RETRY = ConnectRetry()


def retry_wait_bound(policy: RetryParameters) -> float:
    """The most seconds a call retried under `policy` sleeps before it gives up: pyspark's backoff (the first
    wait is `initial_backoff` even above `max_backoff`), each wait raised to the longest delay a server may ask
    for, plus the whole jitter on every wait from `min_jitter_threshold` on. Infinite if nothing bounds it."""
    if policy.max_retries is None or (policy.recognize_server_retry_delay and policy.max_server_retry_delay is None):
        return math.inf
    total, wait = 0.0, float(policy.initial_backoff)
    for _ in range(policy.max_retries):
        this = wait
        if policy.max_backoff is not None:
            wait = min(float(policy.max_backoff), wait * policy.backoff_multiplier)
        if policy.recognize_server_retry_delay and policy.max_server_retry_delay is not None:
            this = max(this, float(policy.max_server_retry_delay))
        if this >= policy.min_jitter_threshold:
            this += policy.jitter
        total += this
    return total / 1000


def connect_retry_policy(params: ConnectRetry = CONNECT_RETRY) -> RetryPolicy:
    """pyspark's `DefaultPolicy` with `params`, which stops retrying a lost server once one call gave up on it
    (imports pyspark).

    pyspark swallows some failed calls and goes on to the next (the plan-compression settings that the first plan
    of a session asks for: a failure means "no compression"), so without this a stage whose server died waited
    the whole bound twice (64 s, measured), and a client closing after it a third time. One exhausted call on
    UNAVAILABLE means the server is gone for this client: every later call of it fails at once, which the stage
    reports in its one sentence; the task's retry opens a new session with a new policy, which retries again."""
    import grpc
    from pyspark.sql.connect.client.retries import DefaultPolicy, RetryPolicyState

    def lost(exc: BaseException) -> bool:
        code = getattr(exc, "code", None)
        return (isinstance(exc, grpc.RpcError) and callable(code) and code() == grpc.StatusCode.UNAVAILABLE) \
            or is_unavailable(exc)

    class GivesUpOnceState(RetryPolicyState):
        def next_attempt(self, exception: BaseException | None = None) -> int | None:
            wait = super().next_attempt(exception)
            if wait is None and exception is not None and lost(exception):
                policy.server_gone = True
            return wait

    class GivesUpOncePolicy(DefaultPolicy):  # type: ignore[misc]
        server_gone = False

        def can_retry(self, exception: BaseException) -> bool:
            if self.server_gone and lost(exception):
                return False
            return bool(super().can_retry(exception))

        def to_state(self) -> RetryPolicyState:
            return GivesUpOnceState(self)

    policy = GivesUpOncePolicy(**asdict(params))
    return policy


def bound_retries(spark: SparkSession) -> None:
    """Make the Connect client of `spark` retry under `CONNECT_RETRY`. Call it right after `builder.create()`:
    create() sends no call (the gRPC channel connects on the first one), so every call of the session, up to the
    ReleaseSession of its `stop()`, retries under this policy."""
    spark.client.set_retry_policies([connect_retry_policy()])
