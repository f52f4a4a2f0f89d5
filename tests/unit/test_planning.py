"""Pure planning logic: starts, the data-loss policy, the budget split and the ledger audit."""

import itertools

import pytest

from microbatch.config import OnDataLoss, SourceSpec, Startup
from microbatch.errors import DataLossError
from microbatch.planning import find_holes, find_overlaps, follow_on_plans, plan_batch, plan_ranges, split_budget
from microbatch.types import Gap, OffsetRange, TopicPartition

T0, T1, T2 = (TopicPartition("t", p) for p in range(3))


def source(**kwargs) -> SourceSpec:
    return SourceSpec(topics=["t"], **kwargs)


def test_new_partition_starts_at_earliest_and_is_reported():
    plan = plan_batch({T0: 5}, {T0: 0, T1: 3}, {T0: 10, T1: 8}, source())
    assert plan.ranges == (OffsetRange("t", 0, 5, 10), OffsetRange("t", 1, 3, 8))
    assert plan.new_partitions == (T1,)


def test_new_partition_at_latest_reads_nothing():
    plan = plan_batch({}, {T0: 0}, {T0: 10}, source(startup=Startup.LATEST))
    assert plan.ranges == ()
    assert plan.new_partitions == (T0,)


def test_nothing_new_gives_no_ranges():
    plan = plan_batch({T0: 10, T1: 4}, {T0: 0, T1: 0}, {T0: 10, T1: 4}, source())
    assert plan.ranges == () and plan.records == 0


def test_expired_position_fails_by_default_naming_the_range():
    with pytest.raises(DataLossError, match=r"t\[0\]: offsets \[5, 20\) were deleted"):
        plan_batch({T0: 5}, {T0: 20}, {T0: 30}, source())


def test_expired_position_under_skip_records_a_gap_and_starts_at_earliest():
    plan = plan_batch({T0: 5}, {T0: 20}, {T0: 30}, source(on_data_loss=OnDataLoss.SKIP))
    assert plan.gaps == (Gap("t", 0, 5, 20, "deleted by retention before it was read"),)
    assert plan.ranges == (OffsetRange("t", 0, 20, 30),)


def test_position_beyond_latest_is_refused():
    with pytest.raises(DataLossError, match="beyond the latest offset"):
        plan_batch({T0: 50}, {T0: 0}, {T0: 30}, source())


def test_budget_is_split_in_proportion_to_backlog_and_sums_to_the_limit():
    shares = split_budget({T0: 600, T1: 300, T2: 100}, 100)
    assert shares == {T0: 60, T1: 30, T2: 10}
    shares = split_budget({T0: 1, T1: 1, T2: 1}, 2)
    assert sum(shares.values()) == 2 and shares == {T0: 1, T1: 1, T2: 0}


def test_budget_larger_than_backlog_reads_everything():
    assert split_budget({T0: 3, T1: 0}, 100) == {T0: 3, T1: 0}


@pytest.mark.parametrize("limit", [1, 7, 99, 1000, 12345])
def test_split_is_exact_deterministic_and_capped(limit):
    backlog = {TopicPartition("t", p): (p * 7919) % 1000 + 1 for p in range(13)}
    first = split_budget(backlog, limit)
    assert first == split_budget(dict(reversed(list(backlog.items()))), limit)
    assert sum(first.values()) == min(limit, sum(backlog.values()))
    assert all(0 <= first[tp] <= backlog[tp] for tp in backlog)


def test_plan_ranges_respects_max_records_and_skips_empty_partitions():
    ranges, backlog = plan_ranges({T0: 0, T1: 10, T2: 5}, {T0: 100, T1: 10, T2: 105}, 50)
    assert backlog == {T0: 100, T1: 0, T2: 100}
    assert ranges == [OffsetRange("t", 0, 0, 25), OffsetRange("t", 2, 5, 30)]


def test_audit_finds_overlaps_and_holes():
    ranges = [OffsetRange("t", 0, 0, 10), OffsetRange("t", 0, 8, 20), OffsetRange("t", 1, 0, 5),
              OffsetRange("t", 1, 7, 9)]
    assert find_overlaps(ranges) == [(OffsetRange("t", 0, 0, 10), OffsetRange("t", 0, 8, 20))]
    holes = find_holes(ranges, [], {T0: 20, T1: 9})
    assert holes == ["t[1]: offsets [5, 7) are in no committed range and no gap"]


def test_audit_accepts_gaps_and_flags_position_mismatch():
    ranges = [OffsetRange("t", 0, 0, 10), OffsetRange("t", 0, 15, 20)]
    assert find_holes(ranges, [Gap("t", 0, 10, 15, "retention")], {T0: 20}) == []
    assert find_holes(ranges, [Gap("t", 0, 10, 15, "retention")], {T0: 25}) == [
        "t[0]: the position is 25 but the committed ranges end at 20"
    ]


def test_one_run_chains_batches_each_starting_where_the_last_ends_until_its_limit():
    spec = source(max_records_per_batch=10, max_batches_per_run=3)
    latest = {T0: 30, T1: 15}
    first = plan_batch({T0: 0, T1: 0}, {T0: 0, T1: 0}, latest, spec)
    rest = follow_on_plans(first, latest, spec)
    assert len(rest) == 2  # the run's limit, though 15 records are still behind
    chain = [first, *rest]
    for before, after in itertools.pairwise(chain):
        ends = {r.tp: r.end for r in before.ranges}
        assert all(r.start == ends.get(r.tp, before.starts[r.tp]) for r in after.ranges)
    assert [p.records for p in chain] == [10, 10, 10]
    read = {tp: sum(r.size for p in chain for r in p.ranges if r.tp == tp) for tp in latest}
    assert read == {T0: 20, T1: 10}  # shared by backlog, as every batch is
    assert all(not p.gaps and not p.new_partitions for p in rest)


def test_a_chain_stops_when_the_backlog_is_read_or_the_rest_would_wait():
    spec = source(max_records_per_batch=10, max_batches_per_run=5)
    first = plan_batch({T0: 0}, {T0: 0}, {T0: 25}, spec)
    assert [p.records for p in follow_on_plans(first, {T0: 25}, spec)] == [10, 5]
    waiting = source(max_records_per_batch=10, max_batches_per_run=5, min_records_per_batch=8)
    first = plan_batch({T0: 0}, {T0: 0}, {T0: 25}, waiting)
    assert [p.records for p in follow_on_plans(first, {T0: 25}, waiting)] == [10]  # 5 left: below 8, waits
    assert follow_on_plans(first, {T0: 25}, source(max_records_per_batch=10)) == []  # the default: one per run
