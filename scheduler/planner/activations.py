"""Which earlier activations of a schedule a new owner still has to plan (docs/time.md, "Changes while
a partition has no owner").

A schedule keeps the activations before its current one that no checkpoint has covered yet
(`ScheduleMeta.history`, pruned at each update). When the checkpoint's writer never saw the current
activation, the owner resuming from that checkpoint finishes the activation the writer knew from the
watermark, and plans each later one, which nobody saw, from its own instant up to the next: every
planned time between the checkpoint and now was under exactly one of them.

Pure: no I/O, no clock.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from scheduler.model import Schedule, ScheduleState
from scheduler.store.checkpoint import Checkpoint
from scheduler.store.codec import with_plan_fields
from scheduler.store.schedules import StoredSchedule
from scheduler.timeplan import Plan, SkipReason


@dataclass(frozen=True)
class Segment:
    """An earlier activation: the schedule as it was, active for planned times in (after, until]."""

    schedule: Schedule
    after_ms: int  # its instant
    until_ms: int  # the next activation's instant

    @property
    def paused(self) -> bool:
        return self.schedule.state is ScheduleState.PAUSED


@dataclass(frozen=True)
class Owed:
    seen: Segment | None  # the earlier activation the checkpoint's writer knew: owed from the watermark
    unseen: tuple[Segment, ...]  # later earlier activations the writer never saw, oldest first

    @property
    def first_change_ms(self) -> int | None:
        """The instant of the first activation the writer never saw, if an earlier one (None: only the current)."""
        return self.unseen[0].after_ms if self.unseen else None


NOTHING = Owed(None, ())


def _segment(current: Schedule, fields: dict[str, Any], until_ms: int) -> Segment | None:
    with contextlib.suppress(Exception):  # a stored spec a newer engine refuses: nothing to plan
        s = with_plan_fields(current, fields)
        s.plan()
        return Segment(s, int(fields.get("activated", 0)), until_ms)
    return None


def owed_activations(st: StoredSchedule, ck: Checkpoint) -> Owed:
    """The earlier activations of `st` an owner resuming from `ck` has to plan. Nothing when the
    checkpoint's writer knew the current activation (it handled everything up to the watermark)."""
    fresh = not ck.watermark_ms  # no owner ever planned this partition: every activation is new
    if not st.meta.history or not (fresh or (ck.sched_rev and st.activation_rev > ck.sched_rev)):
        return NOTHING
    hist = st.meta.history
    ends = [int(h.get("activated", 0)) for h in hist[1:]] + [st.activated_ms]
    seen: Segment | None = None
    unseen: list[Segment] = []
    for h, until in zip(hist, ends, strict=True):
        seg = _segment(st.schedule, h, until)
        if not fresh and int(h.get("rev", 0)) <= ck.sched_rev:
            seen, unseen = seg, []  # the writer knew this one: anything before it, it handled
        elif seg is not None:
            unseen.append(seg)
    if fresh and unseen:  # nobody planned anything: the oldest is owed from its instant, like a seen one
        seen, unseen = unseen[0], unseen[1:]
    return Owed(seen, tuple(unseen))


def in_effect_at(st: StoredSchedule, t_ms: int) -> Schedule:
    """The schedule as it was planned at `t_ms` (its current form when no earlier activation covers it)."""
    hist = st.meta.history
    if not hist:
        return st.schedule
    ends = [int(h.get("activated", 0)) for h in hist[1:]] + [st.activated_ms]
    for h, until in zip(hist, ends, strict=True):
        if int(h.get("activated", 0)) <= t_ms < until:
            seg = _segment(st.schedule, h, until)
            if seg is not None:
                return seg.schedule
    return st.schedule


def segments_between(st: StoredSchedule, lo_ms: int, hi_ms: int) -> list[Segment]:
    """The activations of `st` in force over (lo, hi], oldest first, each cut to that span, from its history
    (hi: at most the current activation's instant). A stretch the history no longer covers is under the
    version in effect at `lo` (what a single `in_effect_at` gave before)."""
    hist = st.meta.history
    ends = [int(h.get("activated", 0)) for h in hist[1:]] + [st.activated_ms] if hist else []
    out: list[Segment] = []
    for h, until in zip(hist, ends, strict=True):
        a = int(h.get("activated", 0))
        if until <= lo_ms or a >= hi_ms:
            continue
        seg = _segment(st.schedule, h, until)
        if seg is not None:
            out.append(Segment(seg.schedule, max(lo_ms, a), min(hi_ms, until)))
    if not out or out[0].after_ms > lo_ms:
        first = Segment(in_effect_at(st, lo_ms), lo_ms, out[0].after_ms if out else hi_ms)
        out.insert(0, first)
    return out


def withdrawal_rule(owed: Owed, current: Plan) -> Callable[[int], SkipReason | None]:
    """For a run written ahead by the checkpoint's writer under the activation it knew: None when the
    activation in effect at its planned time plans it too (the run stands: same id), else the reason it
    is withdrawn (paused, or schedule_changed). The activations are those the writer never saw, and the
    one it knew."""
    # The activation the writer knew is in it too. A pause: a run it wrote ahead before the pause, due after it,
    # was left for its dispatch round to skip once due, and the writer may have died first (the stateful twin:
    # that run ran after a resume and a spec change made while nobody owned the partition). A spec change alike:
    # its old spec's runs written ahead are withdrawn only once due (the stateful twin, session 22: s2@11,
    # written under `* * * * * *`, due under `*/5`; the writer killed first, the next claim dead before its
    # first round, and a change back to `* * * * * *` made meanwhile: judged by that spec, it ran).
    known = (owed.seen,) if owed.seen is not None else ()
    segs = [(s, s.schedule.plan()) for s in (*known, *owed.unseen)]

    def rule(planned_ms: int) -> SkipReason | None:
        for seg, plan in segs:
            if seg.after_ms < planned_ms <= seg.until_ms:
                if seg.paused:
                    return SkipReason.PAUSED
                return None if plan.next_after_ms(planned_ms - 1) == planned_ms else SkipReason.SCHEDULE_CHANGED
        return None if current.next_after_ms(planned_ms - 1) == planned_ms else SkipReason.SCHEDULE_CHANGED

    return rule


@dataclass(frozen=True)
class Withdrawal:
    """Pre-written runs of a schedule to withdraw (see `_withdrawals`): in the next round, or for a spec change
    and a pause, each once it is due."""

    reason: SkipReason  # paused, schedule_deleted, schedule_changed
    after_ms: int = 0  # schedule_changed: only runs planned after the change
    # paused: only runs planned up to this (None: up to now). schedule_deleted with `before_rev`: the instant a
    # schedule of the same id was created again; the deleted one's runs of its own planned times after it that
    # the new one plans too are owed again (same id), and kept.
    until_ms: int | None = None
    # schedule_deleted: a schedule of the same id was created again at this revision before the delete was
    # applied; only records written before it are the deleted one's (0: all of them are).
    before_rev: int = 0
    # schedule_changed after several changes nobody saw: the reason for a run at a planned time (None:
    # the activation in effect then plans it too). Without it, the current spec decides.
    rule: Callable[[int], SkipReason | None] | None = None
    # schedule_changed: the last planned time of a run written ahead when it was made. Such runs are judged
    # once due (`_withdrawals`); later ones were written under the current spec, which plans them.
    ahead_ms: int = 0


def after_change(prev: Withdrawal | None, before: Plan, current: Plan, at_ms: int, ahead_ms: int) -> Withdrawal:
    """The withdrawal a spec change at `at_ms` leaves while `prev` waits (not applied yet, or waiting for
    runs written ahead to come due): a run planned up to the change is judged as `prev` judges it, under
    the plan in force then (`before`); a later one by the new plan (`current`). Replacing `prev` lost its
    judgement (the stateful twin: */5 changed to */2 and, before the owner's next round, to every second;
    the */5 run at 5 s, which */2 did not plan at its time, stayed scheduled). `ahead_ms`: the last planned
    time of a run written ahead so far."""
    if prev is None:
        return Withdrawal(SkipReason.SCHEDULE_CHANGED, after_ms=at_ms, ahead_ms=ahead_ms)

    def earlier(planned_ms: int) -> SkipReason | None:
        if prev.reason is SkipReason.PAUSED:  # a resumed pause (`until_ms` set): paused up to the resume
            if prev.until_ms is None or planned_ms <= prev.until_ms:
                return SkipReason.PAUSED
        elif planned_ms <= prev.after_ms:
            return None  # planned before that change: it stands
        elif prev.rule is not None:
            return prev.rule(planned_ms)
        return None if before.next_after_ms(planned_ms - 1) == planned_ms else SkipReason.SCHEDULE_CHANGED

    def rule(planned_ms: int) -> SkipReason | None:
        if planned_ms <= at_ms:
            return earlier(planned_ms)
        return None if current.next_after_ms(planned_ms - 1) == planned_ms else SkipReason.SCHEDULE_CHANGED

    return Withdrawal(SkipReason.SCHEDULE_CHANGED, rule=rule, ahead_ms=max(ahead_ms, prev.ahead_ms))
