"""The Spark Connect remote: shown without secrets, parsed strictly, and an unreachable server is one
retryable sentence naming the remote and the fix."""

import math
import socket
import uuid
from dataclasses import asdict, replace

import pytest

from microbatch.errors import ConnectionSettingsError, TransientServiceError
from microbatch.spark_remote import (
    CONNECT_RETRY,
    SHARED_SESSION_SECONDS,
    bound_retries,
    check_reachable,
    connect_retry_policy,
    display,
    host_port,
    is_closed_session,
    is_unavailable,
    retry_wait_bound,
    shared_session_id,
    with_session_id,
)


def test_display_drops_user_token_and_parameters():
    assert display("sc://spark-connect:15002/;user_id=etl;token=s3cr3t-token") == "sc://spark-connect:15002"
    assert display("sc://host") == "sc://host:15002"
    assert display("http://host:1") == "(unparseable)"


def test_host_port_accepts_only_sc_urls():
    assert host_port("sc://127.0.0.1:15010/;use_ssl=true") == ("127.0.0.1", 15010)
    for bad in ("127.0.0.1:15002", "http://h:1", "sc://", "sc://h:notaport"):
        with pytest.raises(ConnectionSettingsError, match="MICROBATCH_SPARK_REMOTE"):
            host_port(bad)


def test_a_closed_port_is_one_retryable_sentence_naming_remote_and_fix():
    with socket.socket() as sock:  # a port that was just free and nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with pytest.raises(TransientServiceError) as error:
        check_reachable(f"sc://127.0.0.1:{port}/;token=s3cr3t-token", "spark_connect_default")
    message = str(error.value)
    assert error.value.retryable
    assert message.startswith(f"Cannot reach the Spark Connect server at sc://127.0.0.1:{port}: connection refused.")
    assert "python -m microbatch.dev.stack connect" in message and "spark_connect_default" in message
    assert "s3cr3t" not in message and "\n" not in message


def test_a_listening_port_passes():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        check_reachable(f"sc://127.0.0.1:{sock.getsockname()[1]}", "c")


def test_unavailable_is_recognised_by_the_grpc_status():
    assert is_unavailable(RuntimeError("<_MultiThreadedRendezvous ... status = StatusCode.UNAVAILABLE ...>"))
    assert not is_unavailable(RuntimeError("[TABLE_OR_VIEW_NOT_FOUND] ..."))


def test_shared_session_id_is_one_uuid_per_dag_settings_and_window():
    conf = {"spark.sql.shuffle.partitions": "4", "spark.sql.session.timeZone": "UTC"}
    start = 100 * SHARED_SESSION_SECONDS
    first = shared_session_id("ip_count", conf, start + 1)
    assert uuid.UUID(first).version == 4  # what the Connect client accepts as a session id
    assert shared_session_id("ip_count", dict(reversed(conf.items())), start + SHARED_SESSION_SECONDS - 1) == first
    assert shared_session_id("ip_count", conf, start + SHARED_SESSION_SECONDS) != first  # the next window
    assert shared_session_id("ip_count__backfill", conf, start + 1) != first  # another DAG
    assert shared_session_id("ip_count", {**conf, "spark.sql.shuffle.partitions": "8"}, start + 1) != first


def test_with_session_id_appends_to_any_remote_and_keeps_a_users_own():
    sid = "6f1c0f3e-1b2a-4c3d-8e4f-5a6b7c8d9e0f"
    assert with_session_id("sc://h:15002", sid) == f"sc://h:15002/;session_id={sid}"
    assert with_session_id("sc://h:15002/", sid) == f"sc://h:15002/;session_id={sid}"
    assert with_session_id("sc://h:1/;token=t;use_ssl=true", sid) == f"sc://h:1/;token=t;use_ssl=true;session_id={sid}"
    assert with_session_id("sc://h:1/;session_id=mine", sid) == "sc://h:1/;session_id=mine"
    assert host_port(with_session_id("sc://h:15002", sid)) == ("h", 15002)
    assert display(with_session_id("sc://h:1/;token=secret", sid)) == "sc://h:1"


def test_closed_session_is_recognised_by_the_error_class():
    assert is_closed_session(RuntimeError("(org.apache.spark.SparkSQLException) [INVALID_HANDLE.SESSION_CLOSED] "
                                          "The handle 1a2b is invalid. Session was closed."))
    assert not is_closed_session(RuntimeError("[TABLE_OR_VIEW_NOT_FOUND] t"))


def test_the_connect_retry_policy_waits_under_a_minute_where_pysparks_default_waits_ten():
    assert 0 < retry_wait_bound(CONNECT_RETRY) <= 60
    assert retry_wait_bound(CONNECT_RETRY) == 46.0  # waits of 5, 5, 5, 5, 8, 15 s, each + 0.5 s of jitter
    assert retry_wait_bound(replace(CONNECT_RETRY, recognize_server_retry_delay=False)) == 32.5
    pyspark_default = replace(CONNECT_RETRY, max_retries=15, initial_backoff=50, backoff_multiplier=4.0,
                              max_backoff=60_000, recognize_server_retry_delay=False)
    assert retry_wait_bound(pyspark_default) > 600
    assert retry_wait_bound(replace(CONNECT_RETRY, max_retries=None)) == math.inf


def test_the_policy_is_pysparks_default_policy_with_the_shipped_parameters():
    retries = pytest.importorskip("pyspark.sql.connect.client.retries")
    policy = connect_retry_policy()
    assert isinstance(policy, retries.DefaultPolicy)  # so it retries what pyspark retries, only for less long
    assert {name: getattr(policy, name) for name in asdict(CONNECT_RETRY)} == asdict(CONNECT_RETRY)
    assert retry_wait_bound(policy) == retry_wait_bound(CONNECT_RETRY)
    assert retry_wait_bound(retries.DefaultPolicy()) > 600  # what a session without the policy waits


def _unavailable(retry_delay_seconds: int | None):
    """A gRPC UNAVAILABLE failure, asking for `retry_delay_seconds` before a retry (RetryInfo) if not None."""
    import grpc
    from google.protobuf import any_pb2
    from google.rpc import error_details_pb2, status_pb2

    class Unavailable(grpc.RpcError):
        def code(self):
            return grpc.StatusCode.UNAVAILABLE

        def details(self):
            return "failed to connect to all addresses"

        def trailing_metadata(self):
            if retry_delay_seconds is None:
                return ()
            info = error_details_pb2.RetryInfo()
            info.retry_delay.FromSeconds(retry_delay_seconds)
            detail = any_pb2.Any()
            detail.Pack(info)
            status = status_pb2.Status(code=grpc.StatusCode.UNAVAILABLE.value[0], message=self.details(),
                                       details=[detail])
            return (("grpc-status-details-bin", status.SerializeToString()),)

    return Unavailable()


@pytest.mark.parametrize(("retry_delay", "slept"), [(None, 32.5), (600, 46.0)])
def test_pysparks_own_retries_sleep_no_longer_than_the_bound(monkeypatch, retry_delay, slept):
    retries = pytest.importorskip("pyspark.sql.connect.client.retries")
    monkeypatch.setattr(retries.random, "uniform", lambda low, high: high)  # the most jitter every time
    error, sleeps, calls = _unavailable(retry_delay), [], 0
    with pytest.raises(type(error)), pytest.warns(UserWarning, match="RETRIES_EXCEEDED"):
        for attempt in retries.Retrying([connect_retry_policy()], sleep=sleeps.append):
            with attempt:
                calls += 1
                raise error
    assert calls == CONNECT_RETRY.max_retries + 1
    assert sum(sleeps) == pytest.approx(slept) and sum(sleeps) <= retry_wait_bound(CONNECT_RETRY)  # 600 s asked


def test_once_a_call_gave_up_on_a_lost_server_the_clients_next_calls_fail_at_once(monkeypatch):
    """pyspark swallows a failed call and makes the next one (the first plan's compression settings): the second
    call of a client whose server is gone fails without the bound's waits; a new client's policy retries again."""
    retries = pytest.importorskip("pyspark.sql.connect.client.retries")
    monkeypatch.setattr(retries.random, "uniform", lambda low, high: high)
    policy, error = connect_retry_policy(), _unavailable(None)
    rounds: list[list[float]] = []
    for warns in (True, False):
        sleeps: list[float] = []
        with pytest.raises(type(error)):
            with pytest.warns(UserWarning, match="RETRIES_EXCEEDED") if warns else _no_warning():
                for attempt in retries.Retrying([policy], sleep=sleeps.append):
                    with attempt:
                        raise error
        rounds.append(sleeps)
    assert sum(rounds[0]) == pytest.approx(32.5) and rounds[1] == []
    other: list[float] = []
    with pytest.raises(ValueError):  # what pyspark does not retry passes through, as before
        for attempt in retries.Retrying([policy], sleep=other.append):
            with attempt:
                raise ValueError("not a gRPC failure")
    fresh: list[float] = []
    with pytest.raises(type(error)), pytest.warns(UserWarning, match="RETRIES_EXCEEDED"):
        for attempt in retries.Retrying([connect_retry_policy()], sleep=fresh.append):
            with attempt:
                raise error
    assert other == [] and sum(fresh) == pytest.approx(32.5)


def _no_warning():
    import contextlib
    import warnings

    @contextlib.contextmanager
    def scope():
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            yield

    return scope()


def test_a_session_on_a_dead_server_opens_without_a_call_and_stops_within_the_bound(monkeypatch):
    retries = pytest.importorskip("pyspark.sql.connect.client.retries")
    from pyspark.sql import SparkSession

    # create() sets it in os.environ: setenv first, so that monkeypatch restores the variable's absence
    monkeypatch.setenv("SPARK_CONNECT_MODE_ENABLED", "")
    monkeypatch.delenv("SPARK_CONNECT_MODE_ENABLED")
    with socket.socket() as sock:  # a port that was just free and nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    spark = SparkSession.builder.remote(f"sc://127.0.0.1:{port}").create()  # no server, yet no error: no call
    bound_retries(spark)
    sleeps = []
    monkeypatch.setattr(spark.client, "_retrying", lambda: retries.Retrying(spark.client.get_retry_policies(),
                                                                            sleep=sleeps.append))
    with pytest.warns(UserWarning, match="RETRIES_EXCEEDED"):
        spark.stop()  # ReleaseSession, retried on UNAVAILABLE; stop() logs the failure and closes the client
    assert spark.is_stopped
    assert len(sleeps) == CONNECT_RETRY.max_retries
    assert 0 < sum(sleeps) <= retry_wait_bound(CONNECT_RETRY)
