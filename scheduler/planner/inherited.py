"""A claim's missed-run decisions over the runs its predecessor wrote ahead and never handed out.

An owner writes each run up to `lookahead_ms` before it is due and moves its checkpoint past it: the
run's planned time is handled, its record stands. If the owner dies before the run is due, the next
owner finds the record waiting, and it is as late as the planned times after the checkpoint, which the
claim's catch-up decides by the schedule's missed-run policy (`Materializer.catch_up`). Left as they
stood, such runs started late at the takeover whatever the policy (an outside audit, session 28:
`missed=skip`, two runs written ahead ran 8.5 s late beside the catch-up's `policy_skip` records). Here
the policy is applied to them together with the catch-up (`decide_inherited`), and the ones it does not
run are skipped in their own records, with its reason, before the claim's first write.

Only a run that can have had no effect and that the policy owns: a schedule's own planned time (not an
operator's trigger, backfill, rerun or replay), never handed to a worker by a written dispatch (no
attempt; a hand-out of a reserved first attempt cannot start once the skip has moved the record), of
the activation the claim tracks, and due beyond the late grace. Schedules that the claim withdraws runs
of anyway (paused, changed, deleted, an earlier incarnation's runs) are left to that; so are schedules
held as a saturated pool's, whose runs the dead owner would have run late (docs/time.md, "Backpressure").
So is a run that may have waited by its schedule's overlap policy: its schedule has a run in flight (or
waiting for its retry), or one of its runs was out after the run came due. Such a run was not missed by
the outage but queued behind another (a region drill in CI: slow-001@52 waited behind a slow run 4 s
before the region died, and the standby's claim skipped it as `policy_skip`); the dispatch round decides
it as the dead owner would have.

A run written ahead past the watermark (an outside audit, session 36: a paused schedule holds its partition's
watermark before its next planned time while the others are written up to the lookahead) is one of the
catch-up's own times: the catch-up decided it and its skips go around the record. It follows that decision:
skipped for the reason of the catch-up's range over it, run if the catch-up runs it. Before, it ran late under
every policy (`missed=skip`: four runs 25 s late after an outage; `all`: seven against a cap of five).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence

from scheduler.execution import HOLDING, ExecState, Execution, Trigger, skip
from scheduler.model import ScheduleState
from scheduler.planner.materialize import Tracked
from scheduler.timeplan.missed import SkipRange, decide_inherited


def inherited_missed(
    waiting: Sequence[Execution],
    ended: Callable[[str], Sequence[Execution]],
    schedules: Mapping[str, Tracked],
    owed_from: Mapping[str, int],
    catch_up_runs: Iterable[Execution],
    horizon_ms: int,
    left_out: Collection[str],
    catch_up_skips: Iterable[tuple[str, SkipRange]] = (),
) -> list[tuple[Execution, Execution]]:
    """(record, its skip) for each inherited run the missed-run policy does not run.

    `owed_from`: per schedule, where the claim's catch-up began (what the checkpoint said was handled, or
    a hold's start); only runs planned at or before it are inherited. `catch_up_runs`: the runs the catch-up
    decided to make. `horizon_ms`: the catch-up horizon (now minus the late grace). `left_out`: schedule ids
    the claim handles otherwise. `ended`: the final records of a schedule's runs that left flight while a run
    of it waited (PendingIndex.ended). `catch_up_skips`: the catch-up's skip ranges, which decide the runs
    written ahead past `owed_from`."""
    busy = {x.schedule_id for x in waiting if x.state in HOLDING}
    by_schedule: dict[str, list[Execution]] = {}
    past: list[Execution] = []  # written ahead past where the catch-up began: the catch-up decided their times
    for x in waiting:
        sid = x.schedule_id
        if (x.state is not ExecState.SCHEDULED or x.trigger is not Trigger.SCHEDULED or x.run_trigger is not None
                or x.attempts or x.due_ms > horizon_ms or sid in left_out or sid in busy
                or any(a.dispatched_ms and a.finished_ms > x.due_ms for r in ended(sid) for a in r.attempts)):
            continue
        sch = schedules.get(sid)
        if sch is None or sch.stored.schedule.state is ScheduleState.PAUSED:
            continue
        if x.planned_ms <= sch.stored.activated_ms:
            continue
        if x.planned_ms <= owed_from.get(sid, -1):
            by_schedule.setdefault(sid, []).append(x)
        else:
            past.append(x)
    ranges: dict[str, list[SkipRange]] = {}
    for sid, rng in catch_up_skips:
        ranges.setdefault(sid, []).append(rng)
    out: list[tuple[Execution, Execution]] = []
    for x in past:
        over = next((r for r in ranges.get(x.schedule_id, ()) if r.after_ms < x.planned_ms <= r.through_ms), None)
        if over is not None:
            out.append((x, skip(x, over.reason.value)))
    runs = Counter(e.schedule_id for e in catch_up_runs)
    for sid, xs in by_schedule.items():
        p = schedules[sid].stored.schedule.policies
        why = decide_inherited([x.planned_ms for x in xs], runs[sid], horizon_ms, p.missed_runs,
                               p.catchup_window_ms, p.catchup_cap)
        out += [(x, skip(x, why[x.planned_ms].value)) for x in xs if x.planned_ms in why]
    return out
