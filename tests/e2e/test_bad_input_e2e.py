"""A bad-input corpus through the real pipeline: every kind reaches the dead letters (with its source
offset and a reason) or is counted correctly, and the batch goes on. While spark-submit runs, no
process's arguments carry the ledger password, and the task logs never show it."""

from __future__ import annotations

import random
from collections import Counter
from datetime import UTC, datetime, timedelta

import pytest
from kafka import KafkaProducer
from sqlalchemy import make_url, text

from microbatch.dev.datagen import format_line
from microbatch.ledger.database import transaction
from tests.e2e.helpers import (
    dead_letter_coordinates,
    positions,
    run_watching_arguments,
    sink_counts,
    verify_ledger,
    write_test_spec,
)

pytestmark = pytest.mark.e2e
T0 = datetime(2026, 11, 22, 14, 0, 0, tzinfo=UTC)


def corpus(rng: random.Random) -> list[tuple[bytes | None, bytes | None, str]]:
    """(key, value, expected outcome): 'dead', or the IP the record must be counted for."""
    good = [(b"k", format_line(f"10.1.0.{i % 7}", T0 + timedelta(seconds=i % 20)), f"10.1.0.{i % 7}")
            for i in range(200)]
    padded = format_line("10.1.0.200", T0).decode().replace('"microbatch-datagen/1.0"', '"' + "a" * 900_000 + '"')
    bad = [
        (b"k", None, "dead"),                                              # a null value (tombstone)
        (b"k", b"", "dead"),                                               # an empty value
        (b"k", bytes(rng.getrandbits(8) for _ in range(300)), "dead"),     # binary garbage
        (b"k", b"\xff\xfe\xfd not utf-8 at all \xc3\x28", "dead"),         # invalid UTF-8, no log line in it
        (b"k", format_line("10.1.0.9", T0).replace(b"GET /index", b"GET /\xff\xfeindex"), "10.1.0.9"),
        (b"k", padded.encode(), "10.1.0.200"),                             # ~900 KB, under the 1 MB limit
        (b"k", format_line("10.1.0.50", datetime(1971, 1, 1, tzinfo=UTC)), "10.1.0.50"),  # far past, first batch
        (b"k", format_line("10.1.0.51", datetime(2999, 1, 1, tzinfo=UTC)), "dead"),       # far future clock
        (b"k", format_line("2001:db8::1", T0), "2001:db8::1"),             # IPv6
        (None, format_line("10.1.0.60", T0), "10.1.0.60"),                 # a null key
        (b"k", b"1.2.3 - - [22/Nov/2026:14:00:00 +0000] \"GET / HTTP/1.1\" 200 1", "dead"),  # not an IP address
    ]
    records = good + bad
    rng.shuffle(records)
    return records


def test_bad_input_corpus_and_no_secret_in_process_arguments(service_env, topic, kafka, ledger_url, tmp_path):
    specs = write_test_spec(tmp_path / "pipelines", topic, max_records=100_000, bootstrap=kafka.bootstrap_servers,
                            spark_mode="submit")
    env = {**service_env, "MICROBATCH_PIPELINES_DIR": str(specs)}
    records = corpus(random.Random(5))
    producer = KafkaProducer(bootstrap_servers=kafka.bootstrap_servers, acks="all", max_request_size=1_048_576)
    futures = [producer.send(topic, key=key, value=value, partition=i % 4)
               for i, (key, value, _) in enumerate(records)]
    producer.flush()
    coords = [(m.partition, m.offset) for m in (f.get(timeout=30) for f in futures)]
    producer.close()

    password = make_url(ledger_url).password
    assert password
    run = run_watching_arguments(env, [password], tmp_path / "run.log")
    assert run.returncode == 0, run.log[-3000:]
    assert run.spark_seen, "spark-submit was never seen running"
    assert not run.leaked, f"the ledger password is in a process's arguments: {run.leaked}"
    assert password not in run.log
    # The stage's spark-submit output is in the log, without the Kafka source's ten-line warning on the pooled
    # consumers' group id (stage.quiet_pooled_group_warning).
    assert "Spark application id" in run.log
    assert "has been set on this query" not in run.log

    expected_dead = sorted(c for c, (_, _, outcome) in zip(coords, records, strict=True) if outcome == "dead")
    assert dead_letter_coordinates(ledger_url) == expected_dead
    with transaction(ledger_url) as session:
        reasons = dict(session.execute(text('SELECT partition || \':\' || "offset", error FROM dead_letters')).all())
    assert all(reason for reason in reasons.values())
    with transaction(ledger_url) as session:
        raws = {(p, o): raw for p, o, raw in session.execute(text('SELECT partition, "offset", raw FROM dead_letters'))}
    for c, (_, value, outcome) in zip(coords, records, strict=True):
        if outcome == "dead":  # each dead letter keeps its exact source bytes
            assert (None if raws[c] is None else bytes(raws[c])) == value, c
    future = next(c for c, (_, v, _) in zip(coords, records, strict=True) if v and b"/2999:" in v)
    assert "ahead of the record's Kafka timestamp" in reasons[f"{future[0]}:{future[1]}"]

    counted = Counter(outcome for _, _, outcome in records if outcome != "dead")
    by_ip = Counter()
    for (_, ip), n in sink_counts(ledger_url).items():
        by_ip[ip] += n
    assert by_ip == counted
    ends = {p: o + 1 for p, o in sorted(coords)}
    assert positions(ledger_url) == ends
    audit = verify_ledger(env)
    assert audit["ok"], audit["problems"]
