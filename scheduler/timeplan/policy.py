"""Policy vocabularies shared by the time engine, the model and the API."""

from __future__ import annotations

from enum import StrEnum


class DstGap(StrEnum):
    """A local time that does not exist (spring forward)."""

    SHIFT = "shift"  # run at the first instant after the gap
    SKIP = "skip"  # do not run


class DstOverlap(StrEnum):
    """A local time that happens twice (fall back)."""

    FIRST = "first"
    LAST = "last"
    BOTH = "both"


class MissedRuns(StrEnum):
    SKIP = "skip"  # missed planned times are recorded as skipped
    LATEST = "latest"  # run the most recent missed time once
    ALL = "all"  # run every missed time, bounded by the catch-up window and cap


class Overlap(StrEnum):
    """What to do when a run is still going as the next is due (Temporal's vocabulary)."""

    SKIP = "skip"
    BUFFER_ONE = "buffer_one"
    BUFFER_ALL = "buffer_all"
    CANCEL_OTHER = "cancel_other"
    ALLOW_ALL = "allow_all"


class SkipReason(StrEnum):
    POLICY_SKIP = "policy_skip"
    OUTSIDE_CATCHUP_WINDOW = "outside_catchup_window"
    OVER_CAP = "over_cap"
    OVERLAP_SKIP = "overlap_skip"
    # cancel_other: a newer run of the schedule was due too (a backlog); only the newest starts.
    SUPERSEDED = "superseded"
    PAUSED = "paused"
    # Withdrawn pre-written runs: the schedule was deleted, or its spec changed and no longer plans them.
    SCHEDULE_DELETED = "schedule_deleted"
    SCHEDULE_CHANGED = "schedule_changed"
