"""Pure schedule math: specs, DST policy, jitter, missed-run and overlap decisions.

Nothing in this package reads a clock or does I/O; `now` is always an argument.
"""

from scheduler.timeplan.hashing import jitter_ms, stable_u64
from scheduler.timeplan.plan import (
    CronPlan,
    EveryPlan,
    Plan,
    from_ms,
    parse_duration_ms,
    parse_spec,
    to_ms,
)
from scheduler.timeplan.policy import DstGap, DstOverlap, MissedRuns, Overlap, SkipReason

__all__ = [
    "CronPlan",
    "DstGap",
    "DstOverlap",
    "EveryPlan",
    "MissedRuns",
    "Overlap",
    "Plan",
    "SkipReason",
    "from_ms",
    "jitter_ms",
    "parse_duration_ms",
    "parse_spec",
    "stable_u64",
    "to_ms",
]
