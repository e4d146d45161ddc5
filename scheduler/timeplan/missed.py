"""Which missed planned times to run after an outage or a takeover, and which to record as skipped.

A pure function of (plan, last handled instant, now, policy, catch-up window, cap), in the spirit of the
Kubernetes CronJob controller's `mostRecentScheduleTime`: the answer is a value with a three-valued
kind (none, few, too many) that tests assert on.

Skips are written as ranges, `SkipRange(reason, after, through)` meaning "every planned instant of this
plan in (after, through] was not run, for this reason", so a week of per-second misses is one record and
an auditor can still expand it with the same plan. Only ranges that contain a planned instant are
returned.

The work is O(cap) plan queries whatever the length of the outage: times are never enumerated beyond
what is run.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum

from scheduler.errors import InvalidArgument
from scheduler.timeplan.plan import Plan
from scheduler.timeplan.policy import MissedRuns, SkipReason


class MissedKind(StrEnum):
    NONE = "none"  # nothing was missed
    FEW = "few"  # everything missed inside the catch-up window fits under the cap
    TOO_MANY = "too_many"  # more than `cap` were missed inside the window: some are skipped as over_cap


@dataclass(frozen=True)
class PlannedBy:
    """What a skip range's planned instants are expanded with: the spec, zone and DST policies of the
    activation that planned them (`schedctl skips` after a spec change: the current spec listed instants
    that were never planned and left out real ones). Stored with the range (Ledger.skip_op)."""

    spec: str
    tz: str = "UTC"
    dst_gap: str = ""  # "" : the default policy
    dst_overlap: str = ""


@dataclass(frozen=True)
class SkipRange:
    reason: SkipReason
    after_ms: int  # exclusive
    through_ms: int  # inclusive
    # The plan that made it (None: not known, e.g. a record written by an older build). Not part of equality:
    # two ranges of the same times and reason are one record.
    by: PlannedBy | None = field(default=None, compare=False)


@dataclass(frozen=True)
class MissedDecision:
    kind: MissedKind
    run: tuple[int, ...]  # planned instants to materialize now, ascending
    skipped: tuple[SkipRange, ...]
    next_wakeup_ms: int | None  # first planned instant after `now`


def decide_missed(
    plan: Plan,
    last_ms: int,
    now_ms: int,
    policy: MissedRuns,
    catchup_window_ms: int | None = None,
    cap: int = 1,
) -> MissedDecision:
    """Planned instants in (last_ms, now_ms] are overdue; decide their fate.

    `last_ms` is the last instant already handled (the schedule's last planned time or the partition's
    checkpoint watermark). `catchup_window_ms=None` means no window: any age may be caught up.
    `cap` bounds how many are run under `all` (the most recent ones are kept: they are the least
    stale, and running them bounds the lag).
    """
    if cap < 1:
        raise InvalidArgument("catchup_cap", f"{cap} must be at least 1")
    if catchup_window_ms is not None and catchup_window_ms < 0:
        raise InvalidArgument("catchup_window", "must not be negative")
    next_wakeup = plan.next_after_ms(max(now_ms, last_ms))
    if now_ms <= last_ms or not plan.any_between_ms(last_ms, now_ms):
        return MissedDecision(MissedKind.NONE, (), (), next_wakeup)

    skipped: list[SkipRange] = []

    def skip(reason: SkipReason, after: int, through: int) -> None:
        if after < through and plan.any_between_ms(after, through):
            skipped.append(SkipRange(reason, after, through))

    window_lo = last_ms
    if catchup_window_ms is not None and now_ms - catchup_window_ms > last_ms:
        window_lo = now_ms - catchup_window_ms
        skip(SkipReason.OUTSIDE_CATCHUP_WINDOW, last_ms, window_lo)

    run: list[int] = []
    kind = MissedKind.FEW
    if policy is MissedRuns.SKIP:
        skip(SkipReason.POLICY_SKIP, window_lo, now_ms)
    else:
        want = 1 if policy is MissedRuns.LATEST else cap
        t = now_ms + 1
        while len(run) < want:
            p = plan.prev_before_ms(t)
            if p is None or p <= window_lo:
                break
            run.append(p)
            t = p
        if run:
            oldest = run[-1]
            if policy is MissedRuns.LATEST:
                skip(SkipReason.POLICY_SKIP, window_lo, oldest - 1)
            else:
                before = plan.prev_before_ms(oldest)
                if before is not None and before > window_lo:
                    kind = MissedKind.TOO_MANY
                    skip(SkipReason.OVER_CAP, window_lo, oldest - 1)
        run.reverse()
    if not run and not skipped:
        kind = MissedKind.NONE
    return MissedDecision(kind, tuple(run), tuple(skipped), next_wakeup)


def decide_inherited(
    inherited: Sequence[int],
    catch_up_runs: int,
    now_ms: int,
    policy: MissedRuns,
    catchup_window_ms: int | None = None,
    cap: int = 1,
) -> dict[int, SkipReason]:
    """Which of a schedule's inherited runs a claim skips: planned instants (any order) whose records a dead owner
    wrote ahead and never handed out, all due at or before `now_ms` (the catch-up horizon), so as missed as the
    planned times after its watermark that `decide_missed` decided, of which `catch_up_runs` run. The policy is
    applied to both together, oldest first: `skip` runs none; `latest` only the newest of them all (an inherited
    one only if the catch-up runs none); `all` the newest `cap` (the catch-up's runs, all newer, count first).
    Older than the window counts back from `now_ms`: `outside_catchup_window`, as in `decide_missed`. Returns the
    skipped instants with their reason; the others run, late, as their records stand."""
    if cap < 1:
        raise InvalidArgument("catchup_cap", f"{cap} must be at least 1")
    out: dict[int, SkipReason] = {}
    inside: list[int] = []
    for t in sorted(inherited):
        if catchup_window_ms is not None and t <= now_ms - catchup_window_ms:
            out[t] = SkipReason.OUTSIDE_CATCHUP_WINDOW
        else:
            inside.append(t)
    if policy is MissedRuns.SKIP:
        keep = 0
    elif policy is MissedRuns.LATEST:
        keep = 0 if catch_up_runs else 1
    else:
        keep = max(0, cap - catch_up_runs)
    why = SkipReason.OVER_CAP if policy is MissedRuns.ALL else SkipReason.POLICY_SKIP
    for t in inside[: max(0, len(inside) - keep)]:
        out[t] = why
    return out


def split_around(r: SkipRange, recorded: Sequence[int]) -> list[SkipRange]:
    """`r` without the planned instants in `recorded` (ascending), which have a record of their own: a skip
    range must never cover a planned time that ran or will run (a planned time has one record, either an
    execution or a skip). The pieces between them keep the reason; empty pieces are dropped."""
    out: list[SkipRange] = []
    lo = r.after_ms
    for t in recorded:
        if t <= lo:
            continue
        if t > r.through_ms:
            break
        if t - 1 > lo:
            out.append(replace(r, after_ms=lo, through_ms=t - 1))
        lo = t
    if r.through_ms > lo:
        out.append(replace(r, after_ms=lo))
    return out


def cut_out(r: SkipRange, covered: Sequence[tuple[int, int]]) -> list[SkipRange]:
    """`r` without the ranges in `covered` ((after, through] each, any order), which are skip records of their
    own: a planned time has one record, and one decided already (by an owner that died after writing it)
    stands. The pieces left keep the reason; empty pieces are dropped."""
    out = [r]
    for a, b in covered:
        nxt: list[SkipRange] = []
        for p in out:
            if b <= p.after_ms or a >= p.through_ms:  # disjoint: (a, b] and (after, through]
                nxt.append(p)
                continue
            if a > p.after_ms:
                nxt.append(replace(p, through_ms=a))
            if b < p.through_ms:
                nxt.append(replace(p, after_ms=b))
        out = nxt
    return [p for p in out if p.through_ms > p.after_ms]
