"""What to do with a newly due run while earlier runs of the same schedule are unfinished.

A pure function of the policy and the ledger's view of the schedule (running and buffered executions),
never of in-memory state alone: the planner builds the snapshot from the execution ledger, so a new
owner decides exactly as the old one would have.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from scheduler.timeplan.policy import Overlap


class OverlapAction(StrEnum):
    START = "start"  # dispatch now
    BUFFER = "buffer"  # keep it; start it when the running ones finish
    SKIP = "skip"  # record as skipped (overlap_skip)
    CANCEL_THEN_START = "cancel_then_start"  # cancel `cancel` first, then dispatch


@dataclass(frozen=True)
class OverlapDecision:
    action: OverlapAction
    cancel: tuple[str, ...] = ()  # execution ids to cancel (cancel_other)


def decide_overlap(policy: Overlap, running: tuple[str, ...], buffered: tuple[str, ...]) -> OverlapDecision:
    """`running`: non-terminal, started executions; `buffered`: due ones held back by this policy."""
    if not running and not buffered:
        return OverlapDecision(OverlapAction.START)
    match policy:
        case Overlap.ALLOW_ALL:
            return OverlapDecision(OverlapAction.START)
        case Overlap.SKIP:
            return OverlapDecision(OverlapAction.SKIP)
        case Overlap.BUFFER_ONE:
            # At most one waits behind the running one; a later one is skipped (Temporal's BUFFER_ONE).
            return OverlapDecision(OverlapAction.SKIP if buffered else OverlapAction.BUFFER)
        case Overlap.BUFFER_ALL:
            return OverlapDecision(OverlapAction.BUFFER)
        case Overlap.CANCEL_OTHER:
            return OverlapDecision(OverlapAction.CANCEL_THEN_START, cancel=running + buffered)
    raise AssertionError(f"unhandled overlap policy {policy}")  # pragma: no cover


def next_buffered(policy: Overlap, running: tuple[str, ...], buffered: tuple[str, ...]) -> str | None:
    """When a run finishes: the buffered execution (oldest first) to start now, if any."""
    if running or not buffered or policy not in (Overlap.BUFFER_ONE, Overlap.BUFFER_ALL):
        return None
    return buffered[0]
