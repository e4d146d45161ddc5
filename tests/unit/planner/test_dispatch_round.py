"""The dispatch round's decisions as a table: a snapshot in, a DispatchPlan out (no etcd, no clock)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import pytest

from scheduler.execution import (
    ErrorClass,
    ExecState,
    Execution,
    Trigger,
    as_created,
    dispatch,
    reserve,
    result,
    skip,
)
from scheduler.ids import FencingToken, execution_id
from scheduler.model import RetryPolicy
from scheduler.planner.dispatch_round import DispatchPlan, RoundInput, ScheduleView, plan_dispatch
from scheduler.timeplan import Overlap

NOW = 100_000


def ex(t: int, *, sid: str = "s", pool: str = "p", state: ExecState = ExecState.SCHEDULED) -> Execution:
    return Execution(id=execution_id(sid, t), schedule_id=sid, tenant="t", pool=pool, task_type="x", planned_ms=t,
                     due_ms=t, trigger=Trigger.SCHEDULED, retry=RetryPolicy(), timeout_ms=10_000, state=state,
                     next_attempt_ms=t if state is ExecState.RETRY_WAIT else 0, mod_revision=t // 1000)


def running(t: int, started: int) -> Execution:
    """A run planned at t, dispatched at `started`."""
    return dispatch(ex(t), worker="w", planner="n", token=FencingToken(0, 1), now_ms=started)


def round_(due: Sequence[Execution], *, in_flight: Sequence[Execution] = (), policy: Overlap = Overlap.SKIP,
           budget: int = 10, catchup: frozenset[str] = frozenset(), confirmed_at: int | None = None,
           paused: bool = False, deleted: bool = False, parked: dict[str, bool] | None = None) -> DispatchPlan:
    confirmed = {r.id: (r.mod_revision, confirmed_at) for r in in_flight} if confirmed_at is not None else {}
    views = {} if deleted else {"s": ScheduleView(policy, paused)}
    return plan_dispatch(RoundInput(now_ms=NOW, due={"s": list(due)}, schedules=views, in_flight={"s": list(in_flight)},
                                    budget={"p": budget}, catchup=catchup, confirmed=confirmed, node_id="n",
                                    token=FencingToken(0, 7), behind={"s": parked} if parked else {}))


def states(plan: DispatchPlan) -> dict[int, str]:
    return {old.planned_ms: new.state.value + (f":{new.skip_reason}" if new.skip_reason else "")
            for old, new in plan.transitions.values()}


def behind(plan: DispatchPlan) -> list[tuple[int, bool]]:
    return [(b.x.planned_ms, b.by_policy) for b in plan.behind]


def test_buffered_runs_wait_behind_the_run_in_flight_out_of_the_heap() -> None:
    r = running(98_000, started=98_010)
    plan = round_([ex(99_000)], in_flight=[r], policy=Overlap.BUFFER_ALL, confirmed_at=NOW)
    assert states(plan) == {} and behind(plan) == [(99_000, True)] and not plan.defer


def test_a_skip_waiting_for_the_settle_time_waits_behind_until_then() -> None:
    r = running(98_000, started=98_010)
    x = ex(99_000)
    plan = plan_dispatch(RoundInput(now_ms=NOW, due={"s": [x]}, schedules={"s": ScheduleView(Overlap.SKIP, False)},
                                    in_flight={"s": [r]}, budget={"p": 1}, catchup=frozenset(), confirmed={},
                                    node_id="n", token=FencingToken(0, 7), overlap_settle_ms=4_000))
    assert states(plan) == {} and [(b.x.planned_ms, b.until_ms) for b in plan.behind] == [(99_000, 103_000)]
    assert plan.confirm == {r.id}


def test_buffer_one_counts_the_run_already_parked_behind() -> None:
    """The run buffered in an earlier round is parked out of `due`: BUFFER_ONE still sees it."""
    r = running(97_000, started=97_010)
    parked = {ex(98_000).id: True}
    plan = round_([ex(99_000)], in_flight=[r], policy=Overlap.BUFFER_ONE, confirmed_at=NOW, parked=parked)
    assert states(plan) == {99_000: "skipped:overlap_skip"}


def test_a_run_behind_parked_ones_waits_in_order() -> None:
    r = running(97_000, started=99_900)  # late: no overlap, but the later ones queue behind it
    plan = round_([ex(99_000)], in_flight=[r], confirmed_at=NOW, parked={ex(98_000).id: False})
    assert states(plan) == {} and behind(plan) == [(99_000, False)]


def test_nothing_in_flight_starts_it() -> None:
    plan = round_([ex(99_000)])
    assert states(plan) == {99_000: "dispatched"} and plan.started == {"p": 1}


def test_a_run_in_progress_at_the_due_time_and_confirmed_after_it_skips() -> None:
    r = running(98_000, started=98_010)
    plan = round_([ex(99_000)], in_flight=[r], confirmed_at=99_500)
    assert states(plan) == {99_000: "skipped:overlap_skip"}


def test_a_skip_waits_for_a_read_sent_after_the_due_time() -> None:
    r = running(98_000, started=98_010)
    for confirmed_at in (None, 98_500):  # never read, or read before x was due: the view may be stale
        plan = round_([ex(99_000)], in_flight=[r], confirmed_at=confirmed_at)
        assert states(plan) == {} and [x.planned_ms for x in plan.defer] == [99_000]
        assert plan.confirm == {r.id}


def test_a_run_that_started_after_the_due_time_is_no_overlap_the_next_waits_for_it() -> None:
    r = running(90_000, started=99_900)  # late: dispatched after x came due
    plan = round_([ex(99_000)], in_flight=[r], confirmed_at=NOW)
    assert states(plan) == {} and behind(plan) == [(99_000, False)] and not plan.defer and not plan.confirm


def test_a_catch_up_run_overlaps_a_run_that_comes_due_while_it_runs() -> None:
    """A catch-up run is late by design, but while it runs it is a real run in progress: the on-time run
    that comes due meanwhile is judged by its policy (skip here). Before, catch-ups never counted, and a
    drill's on-time runs queued behind them for ever when the work took longer than the period."""
    r = running(90_000, started=95_000)
    plan = round_([ex(99_000)], in_flight=[r], catchup=frozenset({r.id}), confirmed_at=NOW)
    assert states(plan) == {99_000: "skipped:overlap_skip"}


def test_a_catch_up_run_does_not_overlap_the_missed_times_due_before_it_started() -> None:
    r = running(90_000, started=95_000)
    missed = ex(93_000)
    plan = round_([missed], in_flight=[r], catchup=frozenset({r.id, missed.id}), confirmed_at=NOW)
    assert states(plan) == {} and behind(plan) == [(93_000, False)]


def test_a_catch_up_backlog_runs_in_order_one_at_a_time() -> None:
    backlog = [ex(t) for t in (95_000, 96_000, 97_000)]
    plan = round_(backlog, catchup=frozenset(x.id for x in backlog))
    assert states(plan) == {95_000: "dispatched"}
    assert behind(plan) == [(96_000, False), (97_000, False)]  # behind the one just dispatched


@pytest.mark.parametrize(("policy", "expect"), [
    (Overlap.BUFFER_ONE, {99_500: "skipped:overlap_skip"}),
    (Overlap.BUFFER_ALL, {}),
    (Overlap.ALLOW_ALL, {99_000: "dispatched", 99_500: "dispatched"}),
])
def test_buffer_and_allow_policies(policy: Overlap, expect: dict[int, str]) -> None:
    r = running(98_000, started=98_010)
    plan = round_([ex(99_000), ex(99_500)], in_flight=[r], policy=policy, confirmed_at=NOW)
    assert states(plan) == expect


def test_cancel_other_records_the_cancel_and_stops_the_worker_only_through_the_plan() -> None:
    r = running(98_000, started=98_010)
    plan = round_([ex(99_000)], in_flight=[r], policy=Overlap.CANCEL_OTHER, confirmed_at=NOW)
    # Cancel is recorded before the work stops: the running one is CANCELLING, the new one waits for it.
    assert states(plan) == {98_000: "cancelling:overlap"} and behind(plan) == [(99_000, False)]
    assert [(x.id, why) for x, why in plan.stop] == [(r.id, "overlap")]
    stopping = round_([ex(99_000)], in_flight=[plan.transitions[r.id][1]], policy=Overlap.CANCEL_OTHER,
                      confirmed_at=NOW)
    assert states(stopping) == {} and not stopping.stop and behind(stopping) == [(99_000, False)]
    stopped = round_([ex(99_000)], in_flight=[], policy=Overlap.CANCEL_OTHER, confirmed_at=NOW)
    assert states(stopped) == {99_000: "dispatched"}
    unconfirmed = round_([ex(99_000)], in_flight=[r], policy=Overlap.CANCEL_OTHER)
    assert states(unconfirmed) == {} and not unconfirmed.stop and unconfirmed.confirm == {r.id}


def test_cancel_other_starts_only_the_newest_of_a_backlog() -> None:
    """The game day's slow-006 (every 2 s, cancel_other, stops taking 2.5-3.5 s to confirm): each run of a
    backlog was started, then cancelled by the next, and the backlog grew for ever. Now the runs a later due
    run supersedes are skipped as `superseded`, whether or not a run was in progress at their due time."""
    r = running(95_000, started=95_010)  # in progress at every later due time
    due = [ex(96_000), ex(97_000), ex(98_000), ex(99_000)]
    plan = round_(due, in_flight=[r], policy=Overlap.CANCEL_OTHER, confirmed_at=NOW)
    assert states(plan) == {96_000: "skipped:superseded", 97_000: "skipped:superseded",
                            98_000: "skipped:superseded", 95_000: "cancelling:overlap"}
    assert behind(plan) == [(99_000, False)] and [x.id for x, _ in plan.stop] == [r.id]
    # The newest's cancel still waits for a read after its due time; the superseded need none: the newer
    # run that makes them pointless is due, whatever is in flight.
    unconfirmed = round_(due, in_flight=[r], policy=Overlap.CANCEL_OTHER)
    assert {k: v for k, v in states(unconfirmed).items() if k != 99_000} == {
        96_000: "skipped:superseded", 97_000: "skipped:superseded", 98_000: "skipped:superseded"}
    assert not unconfirmed.stop
    # Nothing in progress at their due times (a run that started after them, late): still only the newest
    # may start. Queued in order behind the late run instead, the schedule stayed one run behind for good:
    # the half game day's slow-006, every run 2.2 s late after its faults.
    late = running(95_000, started=99_500)
    plan = round_(due, in_flight=[late], policy=Overlap.CANCEL_OTHER, confirmed_at=NOW)
    assert {k: v for k, v in states(plan).items() if k < 99_000} == {
        96_000: "skipped:superseded", 97_000: "skipped:superseded", 98_000: "skipped:superseded"}
    # A trigger's run with its own cancel_other supersedes nothing of a schedule whose policy is another.
    trig = replace(ex(99_000), overlap=Overlap.CANCEL_OTHER)
    assert not any("superseded" in v for v in states(round_([ex(96_000), trig], policy=Overlap.SKIP,
                                                             confirmed_at=NOW)).values())
    # Under cancel_other, an operator's manual run is neither superseded nor supersedes: the skip's audit rests
    # on a later planned time of the schedule being due, and somebody asked for that run.
    manual = replace(ex(97_000), trigger=Trigger.MANUAL)
    plan = round_([ex(96_000), manual], policy=Overlap.CANCEL_OTHER, confirmed_at=NOW)
    assert not any("superseded" in v for v in states(plan).values()), states(plan)
    plan = round_([manual, ex(98_000)], policy=Overlap.CANCEL_OTHER, confirmed_at=NOW)
    assert not any("superseded" in v for v in states(plan).values()), states(plan)


def test_no_capacity_defers_and_marks_the_pool_starved() -> None:
    plan = round_([ex(98_000, sid="s"), ex(99_000, sid="s")], budget=1, policy=Overlap.ALLOW_ALL)
    assert states(plan) == {98_000: "dispatched"} and [x.planned_ms for x in plan.defer] == [99_000]
    assert plan.starved_pools == {"p"}


def test_paused_and_deleted_schedules() -> None:
    due = [ex(98_000), ex(97_000, state=ExecState.RETRY_WAIT)]
    paused = round_(due, paused=True)
    assert states(paused) == {98_000: "skipped:paused"} and [x.planned_ms for x in paused.park] == [97_000]
    deleted = round_(due, deleted=True)
    assert states(deleted) == {98_000: "skipped:schedule_deleted", 97_000: "cancelled:schedule_deleted"}


def test_a_withdrawal_and_the_due_loop_never_make_two_transitions_of_one_record() -> None:
    x = ex(98_000)
    plan = plan_dispatch(RoundInput(now_ms=NOW, due={"s": [x]}, schedules={"s": ScheduleView(Overlap.SKIP, True)},
                                    in_flight={}, budget={"p": 5}, catchup=frozenset(), confirmed={}, node_id="n",
                                    token=FencingToken(0, 7), transitions={x.id: (x, skip(x, "paused"))}))
    assert len(plan.transitions) == 1


def test_a_run_with_its_own_policy_counts_every_run_in_flight() -> None:
    """A backfill asked with `skip` runs one of its range (Temporal's BackfillRequest), even though the
    run in flight started after the others came due."""
    first = replace(running(90_000, started=99_900), overlap=Overlap.SKIP)
    second = replace(ex(91_000), overlap=Overlap.SKIP)
    assert states(round_([second], in_flight=[first], confirmed_at=NOW)) == {91_000: "skipped:overlap_skip"}
    buffered = replace(ex(91_000), overlap=Overlap.BUFFER_ALL)
    plan = round_([buffered], in_flight=[first], confirmed_at=NOW)
    assert states(plan) == {} and behind(plan) == [(91_000, True)]


# ---- runs that left flight: judged on their final records (RoundInput.ended) -------------------------

SETTLE = 4_000


def landed(t: int, started: int, ran: int, recorded: int, *, ok: bool = True, not_started: bool = False) -> Execution:
    """A run planned at t, dispatched at `started`, whose handler ran `ran` ms by the worker's clock and
    whose result was recorded at `recorded` (later than started + ran when it was in transit)."""
    r, _ = result(running(t, started), 1, succeeded=ok, error_class=None if ok else ErrorClass.PERMANENT,
                  message="", now_ms=recorded, ran_ms=ran, not_started=not_started)
    return r


def after_landing(due: Sequence[Execution], ended: Sequence[Execution], *, in_flight: Sequence[Execution] = (),
                  policy: Overlap = Overlap.SKIP, catchup: frozenset[str] = frozenset(),
                  parked: dict[str, bool] | None = None, now: int = NOW) -> DispatchPlan:
    return plan_dispatch(RoundInput(now_ms=now, due={"s": list(due)}, schedules={"s": ScheduleView(policy, False)},
                                    in_flight={"s": list(in_flight)}, budget={"p": 10}, catchup=catchup,
                                    confirmed={}, node_id="n", token=FencingToken(0, 7), overlap_settle_ms=SETTLE,
                                    behind={"s": parked} if parked else {}, ended={"s": list(ended)}))


def test_runs_due_while_a_run_that_has_landed_was_in_progress_are_skipped_on_its_record() -> None:
    """docs/time.md's example: runs of 6 s, one a second. R0 (94 s .. 100 s) has landed; the runs due at
    95..99 s, released when it left flight, are skipped at once: no settle wait (its record is final),
    and no run left to start late and queue the next ones behind it."""
    r0 = landed(94_000, started=94_000, ran=6_000, recorded=100_050)
    plan = after_landing([ex(t) for t in range(95_000, 101_000, 1_000)], [r0], now=100_060)
    assert states(plan) == {**{t: "skipped:overlap_skip" for t in range(95_000, 100_000, 1_000)},
                            100_000: "dispatched"}  # due as R0 ended (94 s + 6 s): no overlap
    assert not plan.behind and not plan.defer and not plan.confirm


def test_without_the_landed_run_the_released_runs_queue_behind_a_late_start() -> None:
    """The bug this closes: the same round without `ended` starts 95 s late and queues 96..99 s behind it."""
    plan = after_landing([ex(t) for t in range(95_000, 100_000, 1_000)], [], now=100_060)
    assert states(plan) == {95_000: "dispatched"} and [b.x.planned_ms for b in plan.behind] == [96_000, 97_000,
                                                                                                   98_000, 99_000]


def test_a_result_in_transit_never_costs_a_run() -> None:
    """The worker finished at 95 s (ran 1 s) but its result reached a planner only at 100 s (a reconnect, a
    resend through another planner). Its recorded end proves nothing: only what the worker measured, or the
    record having stayed in flight the settle time past a due time (as the in-flight rule would skip)."""
    r0 = landed(94_000, started=94_000, ran=1_000, recorded=100_000)
    plan = after_landing([ex(t) for t in range(95_000, 100_000, 1_000)], [r0], now=100_010)
    # 95 s: the record was still in flight at 95 + 4 s (a read then would have skipped it, as the in-flight
    # rule does); 96..99 s: nothing proves a run was in progress, so they run, in order.
    assert states(plan) == {95_000: "skipped:overlap_skip", 96_000: "dispatched"}
    assert [b.x.planned_ms for b in plan.behind] == [97_000, 98_000, 99_000]
    unmeasured = landed(94_000, started=94_000, ran=0, recorded=100_000)  # an older worker: no duration
    plan = after_landing([ex(t) for t in range(95_000, 98_000, 1_000)], [unmeasured], now=100_010)
    assert states(plan) == {95_000: "skipped:overlap_skip", 96_000: "dispatched"}


def test_a_landed_run_counts_only_if_it_started_by_the_due_time() -> None:
    late = landed(90_000, started=95_500, ran=4_000, recorded=99_600)  # dispatched after 95 s came due
    plan = after_landing([ex(95_000), ex(97_000)], [late])
    assert states(plan) == {95_000: "dispatched", 97_000: "skipped:overlap_skip"}
    # A catch-up run counts too, by when it ran: 95 s and 96 s came due while it was running.
    catch_up = landed(90_000, started=94_000, ran=6_000, recorded=100_000)
    plan = after_landing([ex(95_000), ex(96_000)], [catch_up], catchup=frozenset({catch_up.id}))
    assert states(plan) == {95_000: "skipped:overlap_skip", 96_000: "skipped:overlap_skip"}
    # ... but not for a missed time of its own catch-up, due before it began: that one queues, in order.
    missed = ex(93_000)
    plan = after_landing([missed], [catch_up], catchup=frozenset({catch_up.id, missed.id}))
    assert states(plan) == {93_000: "dispatched"}
    never_ran = landed(94_000, started=94_000, ran=0, recorded=100_000, not_started=True)
    assert states(after_landing([ex(95_000)], [never_ran])) == {95_000: "dispatched"}


def test_a_run_with_its_own_policy_ignores_landed_runs() -> None:
    r0 = landed(94_000, started=94_000, ran=6_000, recorded=100_000)
    assert states(after_landing([replace(ex(95_000), overlap=Overlap.SKIP)], [r0])) == {95_000: "dispatched"}


def test_buffer_one_after_landing_starts_the_first_and_skips_the_others() -> None:
    """Buffer one: the run buffered behind R0 (parked by the policy, released as R0 landed) starts; the
    others came due while R0 ran and one already waited: skipped."""
    r0 = landed(94_000, started=94_000, ran=6_000, recorded=100_000)
    plan = after_landing([ex(t) for t in range(95_000, 99_000, 1_000)], [r0], policy=Overlap.BUFFER_ONE)
    assert states(plan) == {95_000: "dispatched", **{t: "skipped:overlap_skip" for t in (96_000, 97_000, 98_000)}}
    # One still parked by the policy (behind another run in flight): it waited when 97 s came due.
    other = running(93_500, started=96_500)
    plan = after_landing([ex(97_000)], [r0], in_flight=[other], policy=Overlap.BUFFER_ONE,
                         parked={ex(96_000).id: True})
    assert states(plan) == {97_000: "skipped:overlap_skip"}
    # 95 s came due while R0 ran and `other` (due 93.5 s, dispatched only at 96.5 s) was still waiting: the
    # one place was taken then, so it is skipped too, although `other` has started since.
    plan = after_landing([ex(95_000)], [r0], in_flight=[other], policy=Overlap.BUFFER_ONE,
                         parked={ex(96_000).id: True})
    assert states(plan) == {95_000: "skipped:overlap_skip"}
    # With nothing waiting at its due time (the other run had been dispatched and runs still), it is the
    # one run buffered behind it.
    early = running(93_500, started=94_500)
    plan = after_landing([ex(95_000)], [r0], in_flight=[early], policy=Overlap.BUFFER_ONE)
    assert states(plan) == {} and behind(plan) == [(95_000, True)]


def test_buffer_one_skips_what_came_due_while_an_earlier_run_waited_even_once_that_one_started() -> None:
    """Found by the smoke drill (2.6 s runs every second, buffer_one): R (6.2-8.8 s) ran while the run due
    at 3.8 s waited; 7.8 s and 8.8 s came due then, and were decided only after R landed and 3.8 s had
    started (dispatched at 8.84 s). They were queued behind it instead of skipped, each dispatched later
    than the last: 7 s behind and growing."""
    r = landed(1_800, started=6_210, ran=2_600, recorded=8_830)
    started_late = running(3_800, started=8_840)
    plan = after_landing([ex(7_800), ex(8_800)], [r], in_flight=[started_late], policy=Overlap.BUFFER_ONE,
                         now=11_900)
    assert states(plan) == {7_800: "skipped:overlap_skip", 8_800: "skipped:overlap_skip"}


@pytest.mark.parametrize("policy", [Overlap.BUFFER_ALL, Overlap.CANCEL_OTHER, Overlap.ALLOW_ALL])
def test_other_policies_run_what_waited_behind_a_landed_run(policy: Overlap) -> None:
    r0 = landed(94_000, started=94_000, ran=6_000, recorded=100_000)
    plan = after_landing([ex(95_000), ex(96_000)], [r0], policy=policy)
    if policy is Overlap.ALLOW_ALL:
        assert states(plan) == {95_000: "dispatched", 96_000: "dispatched"}
    elif policy is Overlap.CANCEL_OTHER:  # newest wins: 95_000 would only be cancelled by 96_000, due too
        assert states(plan) == {95_000: "skipped:superseded", 96_000: "dispatched"} and not plan.stop
    else:  # in order, one after the other; nothing to cancel: the run they would cancel has ended
        assert states(plan) == {95_000: "dispatched"} and behind(plan) == [(96_000, False)] and not plan.stop


def test_a_landed_run_and_a_run_still_in_flight_together() -> None:
    """A failed attempt that landed and its retry now in flight: the attempt that ran at the due time counts."""
    failed = landed(94_000, started=94_000, ran=3_000, recorded=97_000, ok=False)
    retry = dispatch(replace(failed, state=ExecState.RETRY_WAIT), worker="w", planner="n", token=FencingToken(0, 1),
                     now_ms=98_000)
    plan = after_landing([ex(95_000), ex(99_000)], [failed], in_flight=[retry])
    assert states(plan)[95_000] == "skipped:overlap_skip"  # 99 s: the retry is in flight, settle not passed
    assert [(b.x.planned_ms, b.until_ms) for b in plan.behind] == [(99_000, 103_000)]


def test_a_late_run_is_judged_as_if_it_had_run_on_time() -> None:
    """Found by the smoke drill (F3): the run of 95 s went out only at 99.5 s (its owner was cut off) and
    ran 2.5 s. On time it would have run 95..97.5 s: the runs due at 96 and 97 s would have come due while it
    ran, and are skipped; 98 s starts; 99 s waits behind it. Before, all of them queued behind the late run,
    one after the other: with work longer than the period the schedule stayed 6 s behind after the heal."""
    late = landed(95_000, started=99_500, ran=2_500, recorded=102_000)
    due = [ex(t) for t in range(96_000, 100_000, 1_000)]
    plan = after_landing(due, [late], now=102_010)
    assert states(plan) == {96_000: "skipped:overlap_skip", 97_000: "skipped:overlap_skip", 98_000: "dispatched"}
    assert behind(plan) == [(99_000, False)]
    # buffer_one: the first of them is the one that waits (and starts now), the next is skipped.
    plan = after_landing(due, [late], now=102_010, policy=Overlap.BUFFER_ONE)
    assert states(plan) == {96_000: "dispatched", 97_000: "skipped:overlap_skip"}
    assert behind(plan) == [(98_000, False), (99_000, False)]
    # The queueing policies run them all, in order; and without the worker's measure nothing is skipped.
    plan = after_landing(due, [late], now=102_010, policy=Overlap.BUFFER_ALL)
    assert states(plan) == {96_000: "dispatched"}
    unmeasured = landed(95_000, started=99_500, ran=0, recorded=102_000)
    assert states(after_landing(due, [unmeasured], now=102_010)) == {96_000: "dispatched"}


def test_a_manual_trigger_is_not_judged_as_a_late_run() -> None:
    """Game day gd-s17a (slow-003: buffer_one, 3.6 s runs every 2 s): the run of 30 s went out at 35.5 s after
    a takeover; a manual trigger made at 33.879 s (no overlap of its own) waited behind it, in order, and ran
    39.3..42.9 s. Judged as if it had started at its request it "overlapped" the run due at 34 s, and with the
    run of 30 s counted as waiting then, 34 s was skipped though nothing was in progress at 34 s (the checker's
    "manufactured overlap"). 34 s is the first run waiting in order: it starts; 36 s (buffered behind the run of
    30 s, really in progress at 36 s) keeps its place; 40 and 42 s came due while the trigger really ran."""
    r30 = landed(30_000, started=35_507, ran=3_629, recorded=39_282)
    manual = replace(landed(33_879, started=39_286, ran=3_575, recorded=42_880), trigger=Trigger.MANUAL)
    plan = after_landing([ex(34_000), ex(40_000), ex(42_000)], [r30, manual], policy=Overlap.BUFFER_ONE,
                         parked={execution_id("s", 36_000): True}, now=42_886)
    assert states(plan) == {34_000: "dispatched", 40_000: "skipped:overlap_skip", 42_000: "skipped:overlap_skip"}
    # The same run scheduled (not an operator's) is still judged as if it had run on time.
    scheduled = replace(manual, trigger=Trigger.SCHEDULED)
    plan = after_landing([ex(34_000)], [scheduled], policy=Overlap.SKIP, now=42_886)
    assert states(plan) == {34_000: "skipped:overlap_skip"}


def test_catch_up_runs_are_not_judged_as_late_runs() -> None:
    """The missed-run policy chose them (missed_runs=all, cap 3): they run one after the other even when
    each takes longer than the period (docs/time.md)."""
    c1 = landed(90_000, started=99_000, ran=2_500, recorded=101_600)
    c2, c3 = ex(91_000), ex(92_000)
    plan = after_landing([c2, c3], [c1], now=101_610, catchup=frozenset({c1.id, c2.id, c3.id}))
    assert states(plan) == {91_000: "dispatched"} and behind(plan) == [(92_000, False)]
    # An on-time run due while a catch-up waited is not judged by the catch-up's planned time either.
    on_time = ex(100_000)
    plan = after_landing([on_time], [landed(99_000, started=100_500, ran=800, recorded=101_400)], now=101_410,
                         catchup=frozenset({execution_id("s", 99_000)}))
    assert states(plan) == {100_000: "dispatched"}


def test_a_late_run_counts_from_its_start_not_its_dispatch() -> None:
    """The smoke drill: the run of 48.7 s was dispatched at 49.25 s but started only at 49.74 s (a slow
    commit), just after 49.7 s came due: not in progress then (the overlap rule counts starts), but late,
    and on time it would have run until 52 s, so 49.7 s is skipped under skip."""
    r, _ = result(replace(running(48_700, 49_250), state=ExecState.RUNNING,
                          attempts=(replace(running(48_700, 49_250).attempts[0], started_ms=49_740),)),
                  1, succeeded=True, error_class=None, message="", now_ms=53_170, ran_ms=3_300)
    plan = after_landing([ex(49_700)], [r], now=53_200)
    assert states(plan) == {49_700: "skipped:overlap_skip"}


def retried(t: int, first: int, timed_out: int, again: int) -> Execution:
    """A run planned at t whose first attempt (dispatched at `first`) timed out at `timed_out` (its worker
    was killed) and was dispatched again at `again`."""
    r, _ = result(running(t, first), 1, succeeded=False, error_class=ErrorClass.TIMEOUT, message="lost",
                  now_ms=timed_out)
    assert r.state is ExecState.RETRY_WAIT
    r = replace(r, next_attempt_ms=again)
    return dispatch(r, worker="w2", planner="n", token=FencingToken(0, 1), now_ms=again)


def test_a_run_due_during_an_earlier_attempt_overlaps_the_retry() -> None:
    """smoke11: the skip schedule's run due while the first attempt (on a killed worker) still held it must
    not start next to the retry."""
    r = retried(90_000, first=90_010, timed_out=99_500, again=99_700)
    assert r.state is ExecState.DISPATCHED and r.attempt == 2
    plan = round_([ex(99_000)], in_flight=[r], confirmed_at=NOW)
    assert states(plan) == {99_000: "skipped:overlap_skip"}
    # Due after the first attempt had ended and before the retry began: nothing ran then.
    plan = round_([ex(99_600)], in_flight=[r], confirmed_at=NOW)
    assert states(plan) != {99_600: "skipped:overlap_skip"}


def _timed_out(t: int, started: int, retry_at: int) -> Execution:
    """A run planned at t whose attempt 1 (started at `started`) was timed out: waiting for its retry."""
    r = dispatch(ex(t), worker="w", planner="n", token=FencingToken(0, 1), now_ms=started)
    r, _ = result(r, 1, succeeded=False, error_class=ErrorClass.TIMEOUT, message="timed out", now_ms=retry_at - 10)
    assert r.state is ExecState.RETRY_WAIT
    return replace(r, next_attempt_ms=retry_at)


@pytest.mark.parametrize("policy", [Overlap.BUFFER_ALL, Overlap.BUFFER_ONE])
def test_a_run_waiting_for_its_retry_holds_a_buffered_run(policy: Overlap) -> None:
    """A run on its retry is the same run (docs/time.md): a buffered run due while its first attempt was out
    waits for the retry to end, not only for the attempt (game day gd-s17a ran them side by side)."""
    r = _timed_out(95_000, started=95_010, retry_at=NOW + 10)
    plan = round_([ex(98_000)], in_flight=[r], policy=policy, confirmed_at=NOW)
    assert states(plan) == {} and behind(plan) == [(98_000, True)]


def test_cancel_other_cancels_a_run_waiting_for_its_retry() -> None:
    r = _timed_out(95_000, started=95_010, retry_at=NOW + 10)
    plan = round_([ex(98_000)], in_flight=[r], policy=Overlap.CANCEL_OTHER, confirmed_at=NOW)
    assert states(plan) == {95_000: "cancelled:overlap", 98_000: "dispatched"} and plan.stop == []


def test_a_retry_dispatched_in_the_round_replaces_its_waiting_record() -> None:
    r = _timed_out(95_000, started=95_010, retry_at=NOW)
    plan = round_([r, ex(98_000)], in_flight=[r], policy=Overlap.BUFFER_ALL, confirmed_at=NOW)
    assert states(plan) == {95_000: "dispatched"} and behind(plan) == [(98_000, True)]


@pytest.mark.parametrize("policy", [Overlap.BUFFER_ALL, Overlap.BUFFER_ONE, Overlap.SKIP])
def test_a_run_due_in_a_retrys_backoff_gap_waits_for_the_retry_and_is_not_skipped(policy: Overlap) -> None:
    """Nothing of the run was out at 98 s (attempt 1 ended at 96 s): not overlapped, so never skipped for it;
    but started now, it would have the retry start beside it (game day gd-s21b): it waits, in order, after
    the retry, and so does the run after it."""
    r = _timed_out(95_000, started=95_010, retry_at=96_010)
    plan = round_([ex(98_000), ex(99_000)], in_flight=[replace(r, next_attempt_ms=NOW + 5_000)], policy=policy,
                  confirmed_at=NOW)
    assert states(plan) == {} and behind(plan) == [(98_000, False), (99_000, False)]
    assert all(b.after_retry and b.ordered for b in plan.behind)


@pytest.mark.parametrize("policy", [Overlap.ALLOW_ALL, Overlap.CANCEL_OTHER])
def test_a_run_due_in_a_retrys_backoff_gap_starts_under_the_policies_that_run_two_at_once(policy: Overlap) -> None:
    r = _timed_out(95_000, started=95_010, retry_at=96_010)
    plan = round_([ex(98_000)], in_flight=[replace(r, next_attempt_ms=NOW + 5_000)], policy=policy,
                  confirmed_at=NOW)
    assert states(plan)[98_000] == "dispatched" and behind(plan) == []


@pytest.mark.parametrize("policy", [Overlap.SKIP, Overlap.BUFFER_ONE, Overlap.BUFFER_ALL])
def test_a_retry_waits_for_a_run_of_its_schedule_in_flight_under_a_policy_that_holds(policy: Overlap) -> None:
    """A later run began while s@95 waited for its retry (under allow_all before a change, say): the retry, due
    now, waits for it in order (never skipped), and so does the run due after it; in the same round, a run
    dispatched before the retry holds it too."""
    r = replace(_timed_out(95_000, started=95_010, retry_at=96_010), next_attempt_ms=NOW - 100)
    plan = round_([r, ex(99_000)], in_flight=[r, running(98_000, started=99_500)], policy=policy, confirmed_at=NOW)
    assert states(plan) == {} and [b.x.planned_ms for b in plan.behind] == [95_000, 99_000]
    assert plan.behind[0].ordered and not plan.behind[0].by_policy
    late = ex(94_000)  # an earlier run, late, that starts in this round first
    plan = round_([late, r], in_flight=[r], policy=policy, confirmed_at=NOW)
    assert states(plan) == {94_000: "dispatched"} and [b.x.planned_ms for b in plan.behind] == [95_000]


def test_a_retry_starts_beside_a_run_in_flight_under_allow_all() -> None:
    """A retry is the same run: under allow_all it starts whatever runs."""
    r = _timed_out(95_000, started=95_010, retry_at=NOW - 100)
    plan = round_([r], in_flight=[r, running(98_000, started=98_010)], policy=Overlap.ALLOW_ALL, confirmed_at=NOW)
    assert states(plan) == {95_000: "dispatched"}


def test_runs_of_a_deleted_schedule_of_the_same_id_are_withdrawn_not_run() -> None:
    """The schedule was deleted and created again at 98.5 s: its own runs planned at or before that instant
    (written ahead by the deleted one, or left by an owner that died before the delete was applied) are not the
    new schedule's, whose times start after its creation; an operator's trigger is left to run."""
    trig = replace(ex(97_500), trigger=Trigger.MANUAL)
    retry = ex(98_000, state=ExecState.RETRY_WAIT)
    plan = plan_dispatch(RoundInput(now_ms=NOW, due={"s": [ex(97_000), trig, retry, ex(98_500), ex(99_000)]},
                                    schedules={"s": ScheduleView(Overlap.ALLOW_ALL, False, created_ms=98_500)},
                                    in_flight={"s": []}, budget={"p": 10}, catchup=frozenset(), confirmed={},
                                    node_id="n", token=FencingToken(0, 7)))
    assert states(plan) == {97_000: "skipped:schedule_deleted", 98_000: "cancelled:schedule_deleted",
                            98_500: "skipped:schedule_deleted", 97_500: "dispatched", 99_000: "dispatched"}


def test_the_owners_reserved_attempt_is_handed_out_and_anyone_elses_is_retired() -> None:
    """docs/keyspace.md, "Reserved first attempt": the round hands out this owner's reservation on the record
    as created (the partition writes nothing for it); a reservation of another owner's token (a previous
    claim) is retired by a written dispatch of the next number."""
    mine = as_created(reserve(ex(99_000), FencingToken(0, 7)), 99)
    old = as_created(reserve(ex(99_000, sid="o"), FencingToken(0, 3)), 98)
    plan = plan_dispatch(RoundInput(now_ms=NOW, due={"s": [mine], "o": [old]},
                                    schedules={"s": ScheduleView(Overlap.SKIP, False),
                                               "o": ScheduleView(Overlap.SKIP, False)},
                                    in_flight={}, budget={"p": 10}, catchup=frozenset(), confirmed={}, node_id="n",
                                    token=FencingToken(0, 7)))
    _, handed = plan.transitions[mine.id]
    _, written = plan.transitions[old.id]
    assert (handed.attempt, handed.mod_revision, handed.reserved, handed.state) == (1, 99, None, ExecState.DISPATCHED)
    assert [a.attempt for a in written.attempts] == [1, 2] and written.attempts[0].never_started


# ---- start ahead (docs/workers.md, "Start ahead") ----------------------------------------------------

AHEAD = 1_000


def ahead_round(due: Sequence[Execution], *, in_flight: Sequence[Execution] = (), armable: frozenset[str] | None = None,
                policy: Overlap = Overlap.SKIP, paused: bool = False, budget: int = 10) -> DispatchPlan:
    return plan_dispatch(RoundInput(
        now_ms=NOW, due={"s": list(due)}, schedules={"s": ScheduleView(policy, paused)},
        in_flight={"s": list(in_flight)}, budget={"p": budget}, catchup=frozenset(), confirmed={}, node_id="n",
        token=FencingToken(0, 7), start_timeout_ms=3_000, ahead_ms=AHEAD,
        armable=frozenset(x.id for x in due) if armable is None else armable))


def test_an_armable_run_is_handed_out_before_it_is_due_with_its_deadline_from_then() -> None:
    x = ex(NOW + 600)
    plan = ahead_round([x])
    ((_old, new),) = plan.transitions.values()
    cur = new.current
    assert new.state is ExecState.DISPATCHED and cur is not None and cur.dispatched_ms == NOW
    assert cur.deadline_ms > NOW + 600 + x.timeout_ms, "the deadline counts from the due time, not the hand-out"
    assert plan.started == {"p": 1} and not plan.not_yet


def test_a_run_that_may_not_be_armed_waits_for_its_due_time() -> None:
    x = ex(NOW + 600)
    plan = ahead_round([x], armable=frozenset())
    assert not plan.transitions and plan.not_yet == [x]
    assert not ahead_round([x], budget=0).transitions, "no free slot: not yet either"


def test_an_early_run_of_a_paused_schedule_is_not_skipped_before_its_due_time() -> None:
    """A pause records a planned time as paused once it is due: a resume before then runs it."""
    x, y = ex(NOW - 10), ex(NOW + 600)
    plan = ahead_round([x, y], paused=True)
    assert states(plan) == {NOW - 10: "skipped:paused"} and plan.not_yet == [y]


@pytest.mark.parametrize("policy", [Overlap.SKIP, Overlap.BUFFER_ONE, Overlap.BUFFER_ALL, Overlap.CANCEL_OTHER])
def test_a_run_that_comes_up_while_a_later_one_waits_armed_disarms_it_and_waits(policy: Overlap) -> None:
    """A trigger (or a retry) comes up while the schedule's next run waits armed on a worker: started now, the two
    could run at once where the policy allows one; the armed one is disarmed and this one waits until it is."""
    armed = dispatch(ex(NOW + 500), worker="w", planner="n", token=FencingToken(0, 7), now_ms=NOW - 300,
                     ahead_ms=AHEAD)
    trig = replace(ex(NOW - 5), id=execution_id("s", NOW - 5), trigger=Trigger.MANUAL)
    plan = ahead_round([trig], in_flight=[armed], policy=policy)
    assert not plan.transitions and plan.disarm == [armed]
    assert [(b.x.id, b.ordered) for b in plan.behind] == [(trig.id, False)]


def test_under_allow_all_a_run_that_comes_up_starts_beside_an_armed_one() -> None:
    armed = dispatch(ex(NOW + 500), worker="w", planner="n", token=FencingToken(0, 7), now_ms=NOW - 300,
                     ahead_ms=AHEAD)
    trig = replace(ex(NOW - 5), trigger=Trigger.MANUAL)
    plan = ahead_round([trig], in_flight=[armed], policy=Overlap.ALLOW_ALL)
    assert states(plan) == {NOW - 5: "dispatched"} and not plan.disarm


def test_a_disarmed_run_is_a_new_run_again_due_at_its_own_time() -> None:
    """Its not-started report makes it SCHEDULED (not a retry due at once): it never runs before its due time."""
    armed = dispatch(ex(NOW + 500), worker="w", planner="n", token=FencingToken(0, 7), now_ms=NOW - 300,
                     ahead_ms=AHEAD)
    back, _ = result(armed, 1, succeeded=False, error_class=ErrorClass.TRANSIENT, message="not started: disarmed",
                     now_ms=NOW, not_started=True)
    assert back.state is ExecState.SCHEDULED and back.due_ms == NOW + 500
    # A run dispatched at its time that never started is a retry at once, as before.
    late = dispatch(ex(NOW - 500), worker="w", planner="n", token=FencingToken(0, 7), now_ms=NOW - 300)
    again, _ = result(late, 1, succeeded=False, error_class=ErrorClass.TRANSIENT, message="not started",
                      now_ms=NOW, not_started=True)
    assert again.state is ExecState.RETRY_WAIT and again.next_attempt_ms == NOW


def test_a_start_recorded_ahead_says_the_run_began_at_its_due_time() -> None:
    from scheduler.execution import started

    armed = dispatch(ex(NOW + 500), worker="w", planner="n", token=FencingToken(0, 7), now_ms=NOW - 300,
                     ahead_ms=AHEAD)
    cur = started(armed, 1, NOW - 290, "w").current
    assert cur is not None and cur.started_ms == NOW + 500
    on_time = dispatch(ex(NOW - 500), worker="w", planner="n", token=FencingToken(0, 7), now_ms=NOW - 300)
    cur = started(on_time, 1, NOW - 290, "w").current
    assert cur is not None and cur.started_ms == NOW - 290


def test_a_rerun_under_a_cancel_other_schedule_waits_for_the_disarm_of_its_armed_run() -> None:
    """The stateful twin: a rerun (its own policy allow_all: it runs beside anything) came up while the schedule's
    next run waited armed; the armed run's own policy (cancel_other) is judged at its due time against what runs
    then, so it is disarmed first, and the rerun waits for that."""
    armed = dispatch(ex(NOW + 500), worker="w", planner="n", token=FencingToken(0, 7), now_ms=NOW - 300,
                     ahead_ms=AHEAD)
    rerun = replace(ex(NOW - 50_000), overlap=Overlap.ALLOW_ALL, run_trigger=Trigger.RERUN, due_ms=NOW - 5)
    plan = ahead_round([rerun], in_flight=[armed], policy=Overlap.CANCEL_OTHER)
    assert not plan.transitions and plan.disarm == [armed] and [b.x.id for b in plan.behind] == [rerun.id]
