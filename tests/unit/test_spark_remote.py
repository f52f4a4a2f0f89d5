"""The Spark Connect remote: shown without secrets, parsed strictly, and an unreachable server is one
retryable sentence naming the remote and the fix."""

import socket

import pytest

from microbatch.errors import ConnectionSettingsError, TransientServiceError
from microbatch.spark_remote import check_reachable, display, host_port, is_unavailable


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
