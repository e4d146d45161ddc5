"""Which planned times an owner owes (planner/materialize.py), pure: no etcd, a fake clock."""

from __future__ import annotations

from dataclasses import replace

import pytest

from scheduler.clock import FakeClock
from scheduler.model import Schedule, ScheduleState
from scheduler.planner.materialize import REPLAN_MARGIN_MS, Materializer
from scheduler.planner.settings import PlannerSettings
from scheduler.store.checkpoint import Checkpoint
from scheduler.store.codec import ScheduleMeta
from scheduler.store.schedules import StoredSchedule

S = PlannerSettings(lookahead_ms=2_000, late_grace_ms=5_000)
T = 1_800_000_000_000  # a whole second


def stored(activated: int, version: int, activated_rev: int = 0, state: ScheduleState = ScheduleState.ACTIVE,
           spec: str = "* * * * * *") -> StoredSchedule:
    s = Schedule(id="s", tenant="t", spec=spec, worker_pool="p", task_type="x", state=state, version=version)
    return StoredSchedule(s, activated, 0, ScheduleMeta(activated_rev=activated_rev))


def mat() -> Materializer:
    return Materializer(0, S, FakeClock(wall_ms=T + 30_000), set())


@pytest.mark.parametrize(("name", "st", "ck", "owed"), [
    ("known to the writer: from the watermark", stored(T - 60_000, 50), Checkpoint(0, T, 1, sched_rev=100), T),
    ("activated after the watermark", stored(T + 500, 150), Checkpoint(0, T, 1, sched_rev=100), T + 500),
    ("unknown to the writer: from the activation, though the watermark is past it",
     stored(T - 1_500, 150), Checkpoint(0, T, 1, sched_rev=100), T - 1_500),
    ("a label update later (same activation revision): still known", stored(T - 60_000, 150, activated_rev=50),
     Checkpoint(0, T, 1, sched_rev=100), T),
    ("unknown but far behind: clamped to the margin", stored(T - 600_000, 150), Checkpoint(0, T, 1, sched_rev=100),
     T - S.lookahead_ms - REPLAN_MARGIN_MS),
    ("a checkpoint from before sched_rev existed knows all", stored(T - 1_500, 150), Checkpoint(0, T, 1), T),
    ("never checkpointed: from the activation", stored(T - 1_500, 150), Checkpoint(0, 0, 0), T - 1_500),
])
def test_owed_from_checkpoint(name: str, st: StoredSchedule, ck: Checkpoint, owed: int) -> None:
    assert mat().owed_from_checkpoint(st, ck) == owed, name


def test_a_re_plan_makes_the_old_heap_entries_stale() -> None:
    m = mat()
    m.track(stored(T, 10), T)
    m.track(stored(T, 11), T)  # re-planned from the same instant: one entry per planned time, not two
    execs, skips, reached = m.plan_round(T + 2_000, T + 3_000)
    assert [e.planned_ms for e in execs] == [T + 1_000, T + 2_000, T + 3_000] and not skips and reached == T + 3_000


def test_a_paused_schedule_is_skipped_when_due_and_holds_the_watermark() -> None:
    m = mat()
    m.track(stored(T, 10, state=ScheduleState.PAUSED), T)
    execs, skips, reached = m.plan_round(T + 1_500, T + 3_500)
    assert not execs and [(r.after_ms, r.through_ms, r.reason.value) for _, r in skips] == [(T + 999, T + 1_000,
                                                                                              "paused")]
    assert reached == T + 1_999, "the next paused planned time is not passed before it is due"
    assert not m.more_due(T + 3_500), "a watermark held by a pause is no work left for the next round"


def test_more_due_only_when_the_limit_left_planned_times() -> None:
    m = mat()
    m.track(stored(T, 10), T)
    execs, _, reached = m.plan_round(T, T + 3_000, limit=2)
    assert len(execs) == 2 and reached == T + 2_999 and m.more_due(T + 3_000)
    execs, _, reached = m.plan_round(T, T + 3_000, limit=2)
    assert [e.planned_ms for e in execs] == [T + 3_000] and reached == T + 3_000 and not m.more_due(T + 3_000)


def test_a_held_schedule_whose_activation_a_pause_ends_records_its_held_times_paused() -> None:
    m = mat()
    m.track(stored(T, 10), T)
    m.blocked_pools = {"p"}
    assert m.plan_round(T + 500, T + 2_500) == ([], [], T + 2_500) and m.held == {"s": T + 999}
    m.track(replace(stored(T + 10_000, 11, state=ScheduleState.PAUSED)), T + 10_000)  # a pause at T + 10 s
    assert not m.held and m.take_hold_writes() == {"s": None}
    settled = sorted((r.after_ms, r.through_ms, r.reason.value) for _, r in m.settled)
    # a pause ends every held time, as it ends any run due and not started (docs/time.md; session 19: the
    # policy decided them before, `policy_skip` for times held for less than the late grace too)
    assert settled == [(T + 999, T + 10_000, "paused")]


def test_holds_made_in_a_round_are_released_when_the_pools_are_back_as_at_the_last_look() -> None:
    """`_release_held` looks at the held schedules again only when something it decides on changed; holds made
    since its last look are such a change. Without that, a pool blocked for one round only (the holds of that
    round made after the round's look, then the pool free again, as at the look before) kept its holds until
    something else changed: in bench_burst, 1,077 runs of a 100,000 burst started only at the planners'
    shutdown."""
    m = mat()
    t2 = T + 10_000
    for i, t in enumerate([T, T, t2, t2]):
        s = Schedule(id=f"b{i}", tenant="t", spec="* * * * * *", worker_pool="p", task_type="x", start_ms=t, end_ms=t)
        m.track(StoredSchedule(s, T - 10_000, 0), T - 5_000)

    def round_at(now: int, blocked: set[str]) -> list[str]:
        m.blocked_pools, m.starved_pools = set(blocked), set(blocked)
        execs, _, _ = m.plan_round(now, now + 1_000, 100)
        return sorted(e.schedule_id for e in execs)

    assert round_at(T - 1_000, {"p"}) == [] and sorted(m.held) == ["b0", "b1"]
    assert round_at(T + 1_000, set()) == ["b0", "b1"], "released: the last look saw no blocked pool"
    assert round_at(t2 - 1_000, {"p"}) == [] and sorted(m.held) == ["b2", "b3"], "blocked for this round only"
    assert round_at(t2, set()) == ["b2", "b3"], "free again, as at the last look: released all the same"
    assert not m.held
