"""Source semantics on the real broker and the real ledger: startup modes, discovery, limits, data loss,
transactional input, the consumer-group mirror and lag. Planning is called directly (no Airflow); batches
are committed through the real commit path with an empty stage. Spark is used only where the read matters
(splits, failOnDataLoss, read_committed counts)."""

from __future__ import annotations

import logging
import time
import uuid

import pytest
import yaml
from kafka import KafkaAdminClient, KafkaProducer, OffsetAndMetadata
from kafka import TopicPartition as KTP
from kafka.errors import CoordinatorNotAvailableError
from sqlalchemy import text

from microbatch.config import PIPELINES_DIR, PipelineSpec
from microbatch.dev.kafka import create_topic
from microbatch.errors import DataLossError, SpecError
from microbatch.kafka.offsets import discover_source, mirror_group_offsets, offsets_client
from microbatch.ledger import repository as repo
from microbatch.ledger.database import Ledger, transaction
from microbatch.phases.commit import commit_batch
from microbatch.phases.plan import PlanOutcome, plan_next_batch
from microbatch.phases.reporting import log_plan_summary
from microbatch.planning import find_holes, spark_splits
from microbatch.settings import KafkaSettings
from microbatch.types import OffsetRange, TopicPartition
from tests.e2e.helpers import read_topic

pytestmark = pytest.mark.integration


def make_spec(**source) -> PipelineSpec:
    data = yaml.safe_load((PIPELINES_DIR / "ip_count.yaml").read_text())
    data["source"] = {k: v for k, v in data["source"].items() if k != "topics"} | source
    return PipelineSpec.model_validate(data)


def produce(bootstrap: str, topic: str, per_partition: dict[int, int], timestamps: list[int] | None = None) -> None:
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all")
    try:
        for partition, count in per_partition.items():
            for i in range(count):
                ts = timestamps[i] if timestamps else None
                producer.send(topic, value=f"{partition}-{i}".encode(), partition=partition, timestamp_ms=ts)
        producer.flush()
    finally:
        producer.close()


def admin(bootstrap: str) -> KafkaAdminClient:
    return KafkaAdminClient(bootstrap_servers=bootstrap)


def set_group_offsets(bootstrap: str, group: str, offsets: dict[KTP, int]) -> None:
    """Commit a group's offsets as an existing consumer would have; the first group on a fresh broker waits
    for `__consumer_offsets` to come up."""
    deadline = time.monotonic() + 60
    while True:
        client = admin(bootstrap)
        try:
            client.alter_group_offsets(group, {tp: OffsetAndMetadata(o, "", -1) for tp, o in offsets.items()})
            return
        except CoordinatorNotAvailableError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)
        finally:
            client.close()


def commit_empty(url: str, spec: PipelineSpec, batch_id: int) -> None:
    """The real commit path, with a stage that produced no rows (no Spark needed to move the ledger)."""
    with transaction(url) as session:
        attempt = repo.begin_attempt(session, batch_id)
    with transaction(url) as session:
        repo.record_staged(session, batch_id, attempt, {"records": 0, "rows_by_sink": {}}, {}, {})
    with transaction(url) as session:
        commit_batch(session, spec, batch_id)


def plan_and_commit(url: str, spec: PipelineSpec, bootstrap: str) -> PlanOutcome:
    outcome = plan_next_batch(spec, Ledger(url), KafkaSettings(bootstrap))
    if outcome.batch_id is not None:
        commit_empty(url, spec, outcome.batch_id)
    return outcome


def ranges_of(outcome: PlanOutcome) -> dict[int, tuple[int, int]]:
    return {r.partition: (r.start, r.end) for r in outcome.ranges}


def positions(url: str) -> dict[tuple[str, int], int]:
    with transaction(url) as session:
        return dict(((t, p), o) for t, p, o in session.execute(
            text("SELECT topic, partition, next_offset FROM positions")).all())


# --- startup modes -------------------------------------------------------------------------------------------

def test_group_offsets_take_over_from_an_existing_consumer(kafka, topic, ledger_url):
    bootstrap = kafka.bootstrap_servers
    produce(bootstrap, topic, {p: 10 for p in range(4)})
    group = f"legacy-{uuid.uuid4().hex[:6]}"
    set_group_offsets(bootstrap, group, {KTP(topic, 0): 3, KTP(topic, 1): 7})
    spec = make_spec(topics=[topic], startup={"mode": "group_offsets", "group_id": group, "reset": "latest"})
    outcome = plan_next_batch(spec, Ledger(ledger_url), KafkaSettings(bootstrap))
    assert ranges_of(outcome) == {0: (3, 10), 1: (7, 10)}  # 2 and 3 have no group offset: reset to latest
    assert outcome.plan.startup[TopicPartition(topic, 2)] == "latest (no committed group offset)"
    # The starts are pinned: later records of partitions 2 and 3 are read from offset 10, not from a new latest.
    commit_empty(ledger_url, spec, outcome.batch_id)
    produce(bootstrap, topic, {2: 5})
    assert ranges_of(plan_next_batch(spec, Ledger(ledger_url), KafkaSettings(bootstrap))) == {2: (10, 15)}


def test_timestamp_between_two_known_records(kafka, topic, ledger_url):
    bootstrap = kafka.bootstrap_servers
    base = 1_767_225_600_000
    produce(bootstrap, topic, {0: 6}, timestamps=[base + i * 1000 for i in range(6)])
    produce(bootstrap, topic, {1: 3}, timestamps=[base - 10_000 + i for i in range(3)])
    spec = make_spec(topics=[topic], startup={"mode": "timestamp", "timestamp": base + 2500})
    outcome = plan_next_batch(spec, Ledger(ledger_url), KafkaSettings(bootstrap))
    # Offset 3 is the first record at or after the time; partition 1 has none, so it starts at latest (3).
    assert ranges_of(outcome) == {0: (3, 6)}
    assert outcome.plan.starts[TopicPartition(topic, 1)] == 3


def test_specific_offsets_with_one_partition_missing(kafka, topic, ledger_url):
    bootstrap = kafka.bootstrap_servers
    produce(bootstrap, topic, {p: 10 for p in range(4)})
    group = f"legacy-{uuid.uuid4().hex[:6]}"
    set_group_offsets(bootstrap, group, {KTP(topic, 2): 8})
    spec = make_spec(topics=[topic], startup={"mode": "specific_offsets", "group_id": group,
                                             "offsets": {f"{topic}:0": 4, f"{topic}:1": 6}})
    outcome = plan_next_batch(spec, Ledger(ledger_url), KafkaSettings(bootstrap))
    # 0 and 1 as listed, 2 from the group (Flink's fallback), 3 has neither: reset earliest.
    assert ranges_of(outcome) == {0: (4, 10), 1: (6, 10), 2: (8, 10), 3: (0, 10)}

    bad = make_spec(topics=[topic], startup={"mode": "specific_offsets", "offsets": {f"{topic}:9": 1}})
    other_ledger = ledger_url  # refused before anything is written
    with pytest.raises(SpecError, match=rf"names partition {topic}:9, but topic '{topic}' has partitions 0..3"):
        plan_next_batch(bad.model_copy(update={"name": "other"}), Ledger(other_ledger), KafkaSettings(bootstrap))
    beyond = make_spec(topics=[topic], startup={"mode": "specific_offsets", "offsets": {f"{topic}:0": 99}})
    with pytest.raises(SpecError, match=r"specific offset 99 lies outside the partition's offsets \[0, 10\]"):
        plan_next_batch(beyond.model_copy(update={"name": "beyond"}), Ledger(ledger_url), KafkaSettings(bootstrap))


# --- discovery -----------------------------------------------------------------------------------------------

def test_partitions_added_between_batches_start_at_their_first_record(kafka, ledger_url, caplog):
    bootstrap = kafka.bootstrap_servers
    name = f"grow_{uuid.uuid4().hex[:8]}"
    create_topic(bootstrap, name, 2)
    produce(bootstrap, name, {0: 5, 1: 5})
    spec = make_spec(topics=[name], startup="latest")  # latest applies to the first plan only
    first = plan_and_commit(ledger_url, spec, bootstrap)
    assert first.batch_id is None and positions(ledger_url) == {(name, 0): 5, (name, 1): 5}

    client = admin(bootstrap)
    client.create_partitions({name: 4})
    client.close()
    create_topic(bootstrap, name, 4)  # waits for the new leaders
    produce(bootstrap, name, {0: 1, 2: 3, 3: 2})
    with caplog.at_level(logging.INFO):
        outcome = plan_next_batch(spec, Ledger(ledger_url), KafkaSettings(bootstrap))
        log_plan_summary(logging.getLogger("test"), spec.name, outcome)
    # New partitions found later start at earliest, whatever the startup mode (Flink's rule).
    assert outcome.plan.new_partitions == (TopicPartition(name, 2), TopicPartition(name, 3))
    assert ranges_of(outcome) == {0: (5, 6), 2: (0, 3), 3: (0, 2)}
    assert f"new partition {name}[2]: starts at 0 (earliest: found after the pipeline started)" in caplog.text


def test_topic_pattern_discovers_new_topics_and_reports_disappeared_ones(kafka, ledger_url, caplog):
    bootstrap = kafka.bootstrap_servers
    prefix = f"pat_{uuid.uuid4().hex[:6]}"
    create_topic(bootstrap, f"{prefix}.a", 1)
    create_topic(bootstrap, f"other_{prefix}.a", 1)
    produce(bootstrap, f"{prefix}.a", {0: 4})
    produce(bootstrap, f"other_{prefix}.a", {0: 4})
    spec = make_spec(topic_pattern=rf"{prefix}\..*")
    first = plan_and_commit(ledger_url, spec, bootstrap)
    assert [str(r) for r in first.ranges] == [f"{prefix}.a[0] [0, 4)"]

    create_topic(bootstrap, f"{prefix}.b", 2)
    produce(bootstrap, f"{prefix}.b", {0: 3, 1: 1})
    second = plan_and_commit(ledger_url, spec, bootstrap)
    assert [str(r) for r in second.ranges] == [f"{prefix}.b[0] [0, 3)", f"{prefix}.b[1] [0, 1)"]

    client = admin(bootstrap)
    client.delete_topics([f"{prefix}.a"])
    client.close()
    produce(bootstrap, f"{prefix}.b", {0: 1})
    with caplog.at_level(logging.INFO):
        third = plan_next_batch(spec, Ledger(ledger_url), KafkaSettings(bootstrap))
        log_plan_summary(logging.getLogger("test"), spec.name, third)
    assert third.plan.disappeared_topics == (f"{prefix}.a",)
    assert f"topic {prefix}.a has disappeared" in caplog.text
    assert positions(ledger_url)[(f"{prefix}.a", 0)] == 4  # kept, never deleted


# --- rate limits ---------------------------------------------------------------------------------------------

def test_rate_limits_give_the_expected_batches(kafka, topic, ledger_url):
    bootstrap = kafka.bootstrap_servers
    produce(bootstrap, topic, {0: 100, 1: 200, 2: 300, 3: 400})
    spec = make_spec(topics=[topic], max_records_per_batch=300, max_records_per_partition=120)
    batches = []
    while (outcome := plan_and_commit(ledger_url, spec, bootstrap)).batch_id is not None:
        batches.append([(r.partition, r.size) for r in outcome.ranges])
    # 300 per batch, shared by backlog (capped at 120 per partition); once 0 and 1 run dry the cap binds.
    assert batches == [[(0, 65), (1, 79), (2, 78), (3, 78)], [(0, 27), (1, 91), (2, 91), (3, 91)],
                       [(0, 8), (1, 30), (2, 120), (3, 120)], [(2, 11), (3, 111)]]
    assert positions(ledger_url) == {(topic, p): n for p, n in enumerate([100, 200, 300, 400])}


def test_min_records_per_batch_waits_then_runs(kafka, topic, ledger_url):
    bootstrap = kafka.bootstrap_servers
    produce(bootstrap, topic, {0: 5})
    spec = make_spec(topics=[topic], min_records_per_batch=20, max_wait_seconds=3600)
    outcome = plan_next_batch(spec, Ledger(ledger_url), KafkaSettings(bootstrap))
    assert outcome.batch_id is None and "below min_records_per_batch 20" in outcome.plan.deferred
    produce(bootstrap, topic, {1: 15})
    assert plan_next_batch(spec, Ledger(ledger_url), KafkaSettings(bootstrap)).records == 20


# --- data loss -----------------------------------------------------------------------------------------------

def test_retention_deleting_unread_offsets_fails_or_records_a_gap(kafka, topic, ledger_url):
    bootstrap = kafka.bootstrap_servers
    produce(bootstrap, topic, {0: 100})
    fail = make_spec(topics=[topic], max_records_per_batch=30)
    assert ranges_of(plan_and_commit(ledger_url, fail, bootstrap)) == {0: (0, 30)}
    client = admin(bootstrap)
    client.delete_records({KTP(topic, 0): 60})
    client.close()
    with pytest.raises(DataLossError) as error:
        plan_next_batch(fail, Ledger(ledger_url), KafkaSettings(bootstrap))
    assert str(error.value).startswith(f"{topic}[0]: offsets [30, 60) were deleted by retention before they were read.")
    assert "on_data_loss: skip" in str(error.value)

    skip = fail.model_copy(update={"source": fail.source.model_copy(update={"on_data_loss": "skip"})})
    outcome = plan_and_commit(ledger_url, skip, bootstrap)
    assert outcome.plan.gaps[0].start == 30 and outcome.plan.gaps[0].end == 60
    assert ranges_of(outcome) == {0: (60, 90)}
    with transaction(ledger_url) as session:
        pipeline = repo.get_pipeline(session, "ip_count")
        gaps = repo.committed_gaps(session, pipeline.id)
        committed = repo.committed_ranges(session, pipeline.id)
        now = repo.read_positions(session, pipeline.id)
    assert [(g.start, g.end) for g in gaps] == [(30, 60)]
    assert find_holes(committed, gaps, now) == []  # the audit counts the gap as accounted for


def test_retention_between_plan_and_stage(kafka, topic, ledger_url):
    bootstrap = kafka.bootstrap_servers
    produce(bootstrap, topic, {0: 50})
    spec = make_spec(topics=[topic])
    planned = plan_next_batch(spec, Ledger(ledger_url), KafkaSettings(bootstrap))
    client = admin(bootstrap)
    client.delete_records({KTP(topic, 0): 20})
    client.close()
    with pytest.raises(DataLossError, match=rf"Batch {planned.batch_id}: offsets {topic}\[0\] \[0, 20\) were deleted"):
        plan_next_batch(spec, Ledger(ledger_url), KafkaSettings(bootstrap))
    skip = spec.model_copy(update={"source": spec.source.model_copy(update={"on_data_loss": "skip"})})
    replanned = plan_next_batch(skip, Ledger(ledger_url), KafkaSettings(bootstrap))
    assert replanned.batch_id != planned.batch_id and ranges_of(replanned) == {0: (20, 50)}
    assert [(g.start, g.end) for g in replanned.plan.gaps] == [(0, 20)]
    with transaction(ledger_url) as session:
        assert repo.get_batch(session, planned.batch_id).state == "abandoned"


# --- group offsets mirror and lag ----------------------------------------------------------------------------

def test_group_offsets_mirror_the_ledger_after_commit(kafka, topic, ledger_url):
    bootstrap = kafka.bootstrap_servers
    produce(bootstrap, topic, {0: 7, 1: 3, 3: 9})
    spec = make_spec(topics=[topic], commit_group_offsets={"enabled": True, "group_id": f"mirror-{topic}"})
    plan_and_commit(ledger_url, spec, bootstrap)
    ledger = {TopicPartition(t, p): o for (t, p), o in positions(ledger_url).items()}
    # Best effort, as in the product (the next commit mirrors again): a fresh group's coordinator may still be
    # loading on a busy machine, so the mirror is given a few tries, each a full call.
    assert any(mirror_group_offsets(KafkaSettings(bootstrap), spec.group_id, ledger) or time.sleep(1)
               for _ in range(5))
    client = admin(bootstrap)
    offsets = client.list_group_offsets({spec.group_id: None})[spec.group_id]
    client.close()
    assert {(tp.topic, tp.partition): meta.offset for tp, meta in offsets.items()} == positions(ledger_url)
    assert positions(ledger_url) == {(topic, 0): 7, (topic, 1): 3, (topic, 2): 0, (topic, 3): 9}


def test_lag_is_recorded_per_partition_and_logged(kafka, topic, ledger_url, caplog):
    bootstrap = kafka.bootstrap_servers
    produce(bootstrap, topic, {0: 40, 2: 10})
    spec = make_spec(topics=[topic], max_records_per_batch=20)
    with caplog.at_level(logging.INFO):
        outcome = plan_next_batch(spec, Ledger(ledger_url), KafkaSettings(bootstrap))
        log_plan_summary(logging.getLogger("test"), spec.name, outcome)
    with transaction(ledger_url) as session:
        pipeline = repo.get_pipeline(session, "ip_count")
        lag = {(s.partition): (s.latest_offset, s.lag, s.lag_after) for s in repo.latest_lag(session, pipeline.id)}
    assert lag == {0: (40, 40, 24), 1: (0, 0, 0), 2: (10, 10, 6), 3: (0, 0, 0)}
    assert f"lag {topic}[0]: 24 behind latest offset 40" in caplog.text
    assert "lag total: 30 offset(s) over 4 partition(s)" in caplog.text


def test_old_lag_snapshots_are_pruned_but_each_partitions_newest_is_kept(kafka, topic, ledger_url):
    bootstrap = kafka.bootstrap_servers
    produce(bootstrap, topic, {0: 10})
    spec = make_spec(topics=[topic], max_records_per_batch=4)
    for _ in range(3):
        plan_and_commit(ledger_url, spec, bootstrap)
    with transaction(ledger_url) as session:
        pipeline = repo.get_pipeline(session, "ip_count")
        session.execute(text("UPDATE lag_snapshots SET planned_at = now() - interval '10 days'"))
        before = session.execute(text("SELECT count(*) FROM lag_snapshots")).scalar_one()
        latest = {(s.topic, s.partition): s.id for s in repo.latest_lag(session, pipeline.id)}
        pruned = repo.prune_lag_snapshots(session, pipeline.id)
        rows = session.execute(text("SELECT topic, partition, id FROM lag_snapshots")).all()
    kept = {(t, p): i for t, p, i in rows}
    assert before == 12 and pruned == 8 and len(rows) == 4
    assert kept == latest  # one row per partition, its newest, although all are older than the retention


# --- Spark reads: splits, transactional input, failOnDataLoss -----------------------------------------------

def read(spark, ranges: list[OffsetRange], bootstrap: str, min_partitions: int = 0, isolation="read_committed"):
    """The stage's read: its options, through the V2 scan it sets up."""
    from microbatch.phases.stage import kafka_read_options, read_kafka_through_v2

    read_kafka_through_v2(spark)
    return spark.read.format("kafka").options(
        **kafka_read_options(ranges, KafkaSettings(bootstrap), isolation, min_partitions)).load()


def test_min_spark_partitions_splits_deterministically_with_equal_results(spark, kafka, topic):
    bootstrap = kafka.bootstrap_servers
    produce(bootstrap, topic, {1: 1000})
    ranges = [OffsetRange(topic, 1, 0, 1000)]
    plain, split = read(spark, ranges, bootstrap), read(spark, ranges, bootstrap, min_partitions=4)
    assert plain.rdd.getNumPartitions() == 1
    assert split.rdd.getNumPartitions() == len(spark_splits(ranges, 4)) == 4
    rows = sorted(tuple(r) for r in split.select("partition", "offset", "value").collect())
    assert rows == sorted(tuple(r) for r in plain.select("partition", "offset", "value").collect())
    assert len(rows) == 1000


def test_the_stage_reads_kafka_through_the_v2_scan_and_keeps_a_users_other_v1_sources(spark, kafka, topic):
    from microbatch.phases.stage import V1_SOURCE_LIST

    bootstrap = kafka.bootstrap_servers
    produce(bootstrap, topic, {0: 7, 2: 5})
    ranges = [OffsetRange(topic, 0, 2, 7), OffsetRange(topic, 2, 0, 5)]
    spark.conf.unset(V1_SOURCE_LIST)
    assert "kafka" in spark.conf.get(V1_SOURCE_LIST).split(",")  # Spark's default reads Kafka through V1
    spark.conf.set(V1_SOURCE_LIST, "csv,Kafka,json")
    try:
        records = read(spark, ranges, bootstrap)
        assert spark.conf.get(V1_SOURCE_LIST) == "csv,json"
        plan = records._jdf.queryExecution().executedPlan().toString()
        assert "KafkaScan" in plan and "KafkaRelation" not in plan, plan
        rows = sorted((r.partition, r.offset) for r in records.select("partition", "offset").collect())
        assert rows == [(0, o) for o in range(2, 7)] + [(2, o) for o in range(5)]
    finally:
        spark.conf.unset(V1_SOURCE_LIST)


@pytest.mark.parametrize("min_partitions", [0, 80])
def test_observed_records_per_partition_are_exact_over_many_partitions_and_topics(spark, kafka, min_partitions):
    """The stage's observed records per source partition (read_metrics): 40 partitions over two topics, uneven and
    some empty, read whole or split into several Spark tasks per partition (whose partial counts then merge),
    against the counts produced. Spark's histogram_numeric, tried for these counts, failed this: a split read
    merged two partitions' bins into one."""
    from pyspark.sql import Observation

    from microbatch.phases.stage import read_metrics
    from microbatch.phases.stage_records import planned_by_partition, records_by_partition, records_read
    from spark_jobs.ip_count import transform

    bootstrap = kafka.bootstrap_servers
    topics = [f"many_a_{uuid.uuid4().hex[:8]}", f"many_b_{uuid.uuid4().hex[:8]}"]
    produced = {}
    for n, topic in enumerate(topics):
        create_topic(bootstrap, topic, 20)
        per_partition = {p: (7 * p + 3 * n) % 23 for p in range(20)}  # 0..22 records, several partitions empty
        produce(bootstrap, topic, {p: c for p, c in per_partition.items() if c})
        produced.update({(topic, p): c for p, c in per_partition.items()})
    ranges = [OffsetRange(t, p, 0, c) for (t, p), c in sorted(produced.items()) if c]
    keys = sorted(produced)  # the empty partitions too: a batch may plan a range that holds only markers
    observation = Observation(f"many_{min_partitions}")
    parsed = transform.parse(read(spark, ranges, bootstrap, min_partitions=min_partitions), {}, {})
    metrics = read_metrics(transform, {}, keys, count_partitions=True)
    parsed.observe(observation, *[e.alias(k) for k, e in metrics.items()]).count()
    counted = records_by_partition(observation.get, keys)
    assert counted == {f"{t}[{p}]": c for (t, p), c in sorted(produced.items())}
    assert observation.get["records"] == sum(counted.values()) == sum(produced.values())
    # Without counters, the dense ranges' total alone gives the same exact counts.
    assert records_read(observation.get["records"], planned_by_partition(ranges), None) == {
        f"{t}[{p}]": c for (t, p), c in sorted(produced.items()) if c}


def test_transactional_input_counts_only_committed_records(spark, kafka, topic, ledger_url):
    bootstrap = kafka.bootstrap_servers
    producer = KafkaProducer(bootstrap_servers=bootstrap, transactional_id=f"src-{topic}", acks="all")
    producer.init_transactions()
    for count, commit in ((10, True), (5, False), (7, True)):
        producer.begin_transaction()
        for i in range(count):
            producer.send(topic, value=f"{commit}-{i}".encode(), partition=0)
        producer.flush()
        producer.commit_transaction() if commit else producer.abort_transaction()
    producer.begin_transaction()  # left open: its records lie beyond the last stable offset
    for i in range(4):
        producer.send(topic, value=f"open-{i}".encode(), partition=0)
    producer.flush()
    try:
        outcome = plan_next_batch(make_spec(topics=[topic]), Ledger(ledger_url), KafkaSettings(bootstrap))
        (planned,) = outcome.ranges
        assert planned.end == 25  # 22 records + 3 markers; the open transaction is beyond the LSO
        values = [r.value.decode() for r in read(spark, [planned], bootstrap).collect()]
        assert len(values) == 17 < planned.size  # fewer records than offsets is not an error
        assert not any(v.startswith(("False", "open")) for v in values)
    finally:
        producer.abort_transaction()
        producer.close()


def test_a_batch_without_good_records_stages_its_dead_letters_and_commits(spark, kafka, topic, ledger_url):
    """Regression (chaos harness): a batch of only transaction markers and malformed records leaves the
    aggregation nothing to read; adaptive execution then dropped the read's observed metrics with the
    empty plan, and every retry of the batch failed on the Observation. It stages zero rows, keeps its
    dead letters with their source offsets, and commits."""
    from microbatch.phases.stage import stage_batch

    bootstrap = kafka.bootstrap_servers
    producer = KafkaProducer(bootstrap_servers=bootstrap, transactional_id=f"aborted-{topic}", acks="all")
    producer.init_transactions()
    producer.begin_transaction()
    for _ in range(3):
        producer.send(topic, value=b"never visible", partition=0)
    producer.flush()
    producer.abort_transaction()
    producer.close()
    produce(bootstrap, topic, {1: 4})  # "1-0".."1-3": not access-log lines
    spec = make_spec(topics=[topic])
    outcome = plan_next_batch(spec, Ledger(ledger_url), KafkaSettings(bootstrap))
    assert ranges_of(outcome) == {0: (0, 4), 1: (0, 4)}  # 3 aborted records and their marker; 4 records

    result = stage_batch(spark, spec, outcome.batch_id, Ledger(ledger_url), KafkaSettings(bootstrap))
    assert result is not None
    assert result.records_by_partition == {f"{topic}[0]": 0, f"{topic}[1]": 4}
    assert (result.dead_letters, result.rows_by_sink["ip_counts"]) == (4, 0)
    with transaction(ledger_url) as session:
        commit_batch(session, spec, outcome.batch_id)
    with transaction(ledger_url) as session:
        dead = sorted(session.execute(text('SELECT partition, "offset" FROM dead_letters WHERE topic = :t'),
                                      {"t": topic}).all())
    assert dead == [(1, offset) for offset in range(4)]
    ends = positions(ledger_url)
    assert (ends[(topic, 0)], ends[(topic, 1)]) == (4, 4)


def test_records_per_partition_stay_exact_as_holes_come_and_go(spark, kafka, topic, ledger_url, caplog):
    """Dense ranges take their counts per partition from the total read, with no counter; the first batch with
    holes (an aborted transaction and its marker) counts them in a second read of its ranges; the next batch of
    that pipeline counts per partition in its one pass. Every batch's counts are the records produced."""
    from microbatch.phases.stage import stage_batch

    bootstrap = kafka.bootstrap_servers
    spec = make_spec(topics=[topic])

    def batch() -> tuple[dict[str, int], str]:
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="microbatch.phases.stage"):
            outcome = plan_next_batch(spec, Ledger(ledger_url), KafkaSettings(bootstrap))
            result = stage_batch(spark, spec, outcome.batch_id, Ledger(ledger_url), KafkaSettings(bootstrap))
        assert result is not None
        with transaction(ledger_url) as session:
            commit_batch(session, spec, outcome.batch_id)
        return result.records_by_partition, caplog.text

    def aborted(partition: int, count: int) -> None:
        producer = KafkaProducer(bootstrap_servers=bootstrap, transactional_id=f"holes-{uuid.uuid4().hex[:8]}",
                                 acks="all")
        producer.init_transactions()
        producer.begin_transaction()
        for _ in range(count):
            producer.send(topic, value=b"never visible", partition=partition)
        producer.flush()
        producer.abort_transaction()
        producer.close()

    produce(bootstrap, topic, {0: 6, 1: 3})
    counts, logged = batch()
    assert counts == {f"{topic}[0]": 6, f"{topic}[1]": 3}
    assert "second read" not in logged

    aborted(0, 5)  # offsets 6-11 hold 5 aborted records and their marker
    produce(bootstrap, topic, {0: 2, 1: 4})
    counts, logged = batch()
    assert counts == {f"{topic}[0]": 2, f"{topic}[1]": 4}
    assert "counted per partition in a second read" in logged

    aborted(1, 2)
    produce(bootstrap, topic, {0: 1, 1: 5})
    counts, logged = batch()
    assert counts == {f"{topic}[0]": 1, f"{topic}[1]": 5}
    assert "second read" not in logged  # the last read had holes: this one counted per partition as it read


def test_spark_refuses_offsets_deleted_after_planning(spark, kafka, topic):
    from microbatch.phases.stage import is_data_loss

    bootstrap = kafka.bootstrap_servers
    produce(bootstrap, topic, {3: 30})
    client = admin(bootstrap)
    client.delete_records({KTP(topic, 3): 10})
    client.close()
    with pytest.raises(Exception) as error:  # Spark raises a Py4J/captured error
        read(spark, [OffsetRange(topic, 3, 0, 30)], bootstrap).count()
    assert is_data_loss(error.value), str(error.value)[:2000]


def test_compacted_topic_with_offset_holes(spark, kafka, ledger_url):
    """Compaction leaves holes in the offsets: the plan covers them, Spark reads the survivors, and the
    ledger moves past the holes as it does past transaction markers."""
    bootstrap = kafka.bootstrap_servers
    topic = f"compacted_{uuid.uuid4().hex[:8]}"
    create_topic(bootstrap, topic, 1, config={"cleanup.policy": "compact", "segment.ms": "100",
                                               "min.cleanable.dirty.ratio": "0.001", "delete.retention.ms": "100"})
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all")
    for i in range(200):
        key = f"unique{i}" if i % 3 == 0 else f"k{i % 10}"  # unique keys survive, spread over the log
        producer.send(topic, key=key.encode(), value=f"v{i}".encode(), partition=0)
    producer.flush()

    def survivors() -> list[int]:
        return [r.offset for r in read_topic(bootstrap, topic)]

    deadline = time.monotonic() + 120
    offsets = survivors()
    while len(offsets) >= 200 and time.monotonic() < deadline:
        time.sleep(1)  # a later record rolls the segment, so the cleaner can compact the earlier ones
        producer.send(topic, key=b"roll", value=b"roll", partition=0)
        producer.flush()
        offsets = survivors()
    producer.close()
    assert len(offsets) < 200, "the broker did not compact the topic in time"
    assert offsets != list(range(offsets[0], offsets[0] + len(offsets)))  # holes

    spec = make_spec(topics=[topic], max_records_per_batch=100_000)
    outcome = plan_next_batch(spec, Ledger(ledger_url), KafkaSettings(bootstrap))
    (planned,) = outcome.ranges
    assert (planned.start, planned.end) == (0, offsets[-1] + 1)
    read_offsets = sorted(r.offset for r in read(spark, [planned], bootstrap).select("offset").collect())
    assert read_offsets == offsets
    commit_empty(ledger_url, spec, outcome.batch_id)
    assert positions(ledger_url) == {(topic, 0): offsets[-1] + 1}


def test_group_offset_mirror_failure_is_a_warning(kafka, topic, ledger_url, caplog):
    """A group with an active member refuses offset commits from outside: the mirror logs a warning
    and returns; the ledger's commit stands."""
    from kafka import KafkaConsumer

    bootstrap = kafka.bootstrap_servers
    produce(bootstrap, topic, {0: 5, 1: 5})
    group = f"busy-{topic}"
    member = KafkaConsumer(topic, bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False,
                           session_timeout_ms=30_000)
    deadline = time.monotonic() + 60
    while not member.assignment() and time.monotonic() < deadline:
        member.poll(timeout_ms=500)
    assert member.assignment(), "the consumer never joined its group"
    try:
        spec = make_spec(topics=[topic], commit_group_offsets={"enabled": True, "group_id": group})
        plan_and_commit(ledger_url, spec, bootstrap)
        with caplog.at_level(logging.WARNING):
            mirrored = mirror_group_offsets(KafkaSettings(bootstrap), spec.group_id, {TopicPartition(t, p): o
                                                                        for (t, p), o in positions(ledger_url).items()})
        assert mirrored is False
        assert "the ledger is unaffected" in caplog.text
        assert positions(ledger_url)[(topic, 0)] == 5
    finally:
        member.close()


def test_the_planner_client_may_refresh_metadata_right_after_its_bootstrap(kafka, topic):
    # kafka-python counts its bootstrap as a metadata refresh to back off from (0.1 s before the first topic
    # lookup of every plan); the planner's client starts with no such backoff, and still finds the topic.
    with offsets_client(KafkaSettings(kafka.bootstrap_servers)) as consumer:
        cluster = consumer._cluster
        retry_age_ms = time.monotonic() * 1000 - cluster._last_refresh_ms
        assert cluster.config["retry_backoff_ms"] - retry_age_ms <= 0
        found, missing = discover_source(consumer, [topic])
    assert missing == [] and {tp.topic for tp in found} == {topic}
