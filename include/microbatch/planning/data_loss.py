"""Pure: the offsets of planned ranges that retention deleted before they were read, and the one-sentence error that
names them under the pipeline's `on_data_loss` policy."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from microbatch.config import OnDataLoss
from microbatch.errors import DataLossError
from microbatch.types import OffsetRange, TopicPartition


def lost_ranges(ranges: Iterable[OffsetRange], earliest: Mapping[TopicPartition, int]) -> list[OffsetRange]:
    """The parts of planned ranges that retention has deleted since they were planned (start below earliest)."""
    return [
        OffsetRange(r.topic, r.partition, r.start, min(r.end, earliest[r.tp]))
        for r in sorted(ranges)
        if r.tp in earliest and r.start < earliest[r.tp]
    ]


def data_loss_at_read(batch_id: int, lost: list[OffsetRange], on_data_loss: OnDataLoss) -> DataLossError:
    """The one-sentence error for offsets of an open batch that were deleted between plan and stage."""
    names = ", ".join(f"{r.topic}[{r.partition}] [{r.start}, {r.end})" for r in lost)
    how = (
        "The next plan abandons this batch and records the lost offsets as a gap (on_data_loss: skip)."
        if on_data_loss is OnDataLoss.SKIP
        else "Restore the offsets, or set source.on_data_loss: skip so the next plan abandons this batch "
        "and records them as a gap."
    )
    return DataLossError(
        f"Batch {batch_id}: offsets {names} were deleted by retention after the batch was planned and before "
        "they were read.",
        fix=how,
    )
