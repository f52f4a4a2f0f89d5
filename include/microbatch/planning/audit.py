"""Pure audit of the ledger's committed ranges: ranges of one partition that overlap, and offsets below a position that
neither a committed range nor a recorded gap covers (`microbatch audit`)."""

from __future__ import annotations

from collections.abc import Mapping
from itertools import pairwise

from microbatch.types import Gap, OffsetRange, TopicPartition


def find_overlaps(ranges: list[OffsetRange]) -> list[tuple[OffsetRange, OffsetRange]]:
    """Pairs of ranges of the same partition that share an offset."""
    overlaps = []
    ordered = sorted(ranges)
    for before, after in pairwise(ordered):
        if before.tp == after.tp and after.start < before.end:
            overlaps.append((before, after))
    return overlaps


def find_holes(ranges: list[OffsetRange], gaps: list[Gap], positions: Mapping[TopicPartition, int]) -> list[str]:
    """Offsets below each position that neither a committed range nor a gap covers."""
    covered: dict[TopicPartition, list[tuple[int, int]]] = {}
    for r in ranges:
        covered.setdefault(r.tp, []).append((r.start, r.end))
    for g in gaps:
        covered.setdefault(TopicPartition(g.topic, g.partition), []).append((g.start, g.end))
    problems = []
    for tp, spans in sorted(covered.items()):
        spans.sort()
        cursor = spans[0][0]
        for start, end in spans:
            if start > cursor:
                problems.append(f"{tp}: offsets [{cursor}, {start}) are in no committed range and no gap")
            cursor = max(cursor, end)
        position = positions.get(tp)
        if position is not None and position != cursor:
            problems.append(f"{tp}: the position is {position} but the committed ranges end at {cursor}")
    return problems
