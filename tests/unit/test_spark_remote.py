"""The Spark Connect remote: shown without secrets, parsed strictly, and an unreachable server is one
retryable sentence naming the remote and the fix."""

import socket
import uuid

import pytest

from microbatch.errors import ConnectionSettingsError, TransientServiceError
from microbatch.spark_remote import (
    SHARED_SESSION_SECONDS,
    check_reachable,
    display,
    host_port,
    is_closed_session,
    is_unavailable,
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
