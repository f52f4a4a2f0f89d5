"""Event time for the shipped jobs: the platform's helpers (`microbatch/event_time.py`), which read the spec's
declared `event_time` (its `window` and `allowed_lateness` reach a job's options as `window_seconds` and
`allowed_lateness_seconds`): tumbling windows, and a watermark that is pipeline state, committed with the ledger. A
window whose end is at or before the watermark is final; a valid record whose window was final when its batch began
is late."""

from microbatch.event_time import MICROS, lateness_us, watermark_after, watermark_metrics, with_late

__all__ = ["MICROS", "lateness_us", "watermark_after", "watermark_metrics", "with_late"]
