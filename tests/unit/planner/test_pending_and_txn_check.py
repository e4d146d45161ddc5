"""The pending index's per-pool ready heaps and the duplicate-write guard (pure, no etcd)."""

from __future__ import annotations

from dataclasses import replace

from scheduler.execution import (
    Attempt,
    ErrorClass,
    ExecState,
    Execution,
    Trigger,
    as_created,
    dispatch,
    hand_out,
    reserve,
    with_revision,
)
from scheduler.ids import FencingToken, execution_id
from scheduler.model import RetryPolicy
from scheduler.planner.pending import PendingIndex
from scheduler.store.etcd.ops import Compare, delete, get, put, txn
from scheduler.store.txn_check import duplicate_write


def ex(sid: str, t: int, pool: str = "a", state: ExecState = ExecState.SCHEDULED) -> Execution:
    return Execution(id=execution_id(sid, t), schedule_id=sid, tenant="t", pool=pool, task_type="x",
                     planned_ms=t, due_ms=t, trigger=Trigger.SCHEDULED, retry=RetryPolicy(), timeout_ms=1000,
                     state=state, next_attempt_ms=t if state is ExecState.RETRY_WAIT else 0)


def test_a_pool_without_capacity_never_stands_in_front_of_another_pool() -> None:
    idx = PendingIndex()
    for i in range(100):  # a large, older backlog in pool "dead"
        idx.put(ex(f"d{i}", 1_000 + i, pool="dead"))
    idx.put(ex("live", 5_000, pool="live"))
    got = idx.ready(10_000, {"live": 1})  # only the pool that can start something is asked
    assert [e.id for es in got.values() for e in es] == [execution_id("live", 5_000)]
    assert idx.oldest_ready("dead") == 1_000 and idx.oldest_ready() == 1_000
    assert idx.oldest_ready("live") is None


def test_limits_are_per_pool_and_a_moved_execution_follows_its_new_pool() -> None:
    idx = PendingIndex()
    for i in range(5):
        idx.put(ex("s", 1_000 * (i + 1), pool="a"))
    assert sum(len(v) for v in idx.ready(10_000, {"a": 2}).values()) == 2
    moved = replace(ex("s", 3_000), pool="b")  # an update fixed the schedule's pool
    idx.put(moved)
    got = idx.ready(10_000, {"a": 10})
    assert execution_id("s", 3_000) not in {e.id for es in got.values() for e in es}, "stale entry of the old pool"
    got = idx.ready(10_000, {"b": 10})
    assert [e.id for es in got.values() for e in es] == [moved.id]


def test_parked_executions_leave_the_heap_until_unparked() -> None:
    idx = PendingIndex()
    r = ex("s", 1_000, state=ExecState.RETRY_WAIT)
    idx.put(r)
    (x,) = idx.ready(2_000, {"a": 10})["s"]
    idx.park(x)
    assert idx.ready(2_000, {"a": 10}) == {} and not idx.has_ready(2_000)
    idx.unpark("s")
    assert [e.id for e in idx.ready(2_000, {"a": 10})["s"]] == [r.id]


def test_duplicate_write_finds_two_writes_of_one_key_in_nested_txns() -> None:
    k = b"/x/1"
    create = txn([Compare.create_revision(k, "==", 0)], [put(k, b"a")], [get(k)])
    cas = txn([Compare.mod_revision(k, "==", 3)], [put(k, b"b")])
    assert duplicate_write([create, put(b"/x/2", b"")]) is None
    assert duplicate_write([create, cas]) == k, "etcd refuses this txn: duplicate key given in txn request"
    assert duplicate_write([put(k, b""), delete(k)]) == k
    assert duplicate_write([get(k), get(k), put(k, b"")]) is None, "reads are not writes"


def test_runs_waiting_behind_their_schedules_run_in_flight_leave_the_heap_until_it_lands() -> None:
    """A backlog buffered behind a slow run must not take its pool's places round after round (the
    random state machine found a pool of 2 whose other schedules never ran behind such a backlog)."""
    idx = PendingIndex()
    slow = replace(ex("buf", 500), state=ExecState.RUNNING)
    idx.put(slow)
    for i in range(10):
        idx.put(ex("buf", 1_000 + i))
    idx.put(ex("other", 5_000))
    first = idx.ready(10_000, {"a": 2})
    assert sum(len(v) for v in first.values()) == 2 and "other" not in first  # the backlog is older
    for e in [x for es in first.values() for x in es]:
        idx.wait_behind(e, True)
    for _ in range(5):  # the rest of the backlog gets parked too, and then the other schedule's turn comes
        got = idx.ready(10_000, {"a": 2})
        if "other" in got:
            break
        for e in [x for es in got.values() for x in es]:
            idx.wait_behind(e, True)
    assert "other" in got
    assert set(idx.behind("buf")) == {execution_id("buf", 1_000 + i) for i in range(10)}
    idx.put(replace(slow, state=ExecState.SUCCEEDED))  # it lands: the oldest of the backlog comes back
    assert len(idx.behind("buf")) == 9, "the rest wait behind it, in order: not back in front of the pool"
    back = idx.ready(10_000, {"a": 5})
    assert [e.planned_ms for e in back["buf"]] == [1_000]
    idx.put(replace(back["buf"][0], state=ExecState.SKIPPED))  # it ends (here: skipped): the next one comes back
    assert [e.planned_ms for e in idx.ready(10_000, {"a": 5})["buf"]] == [1_001]


def test_waiting_behind_with_nothing_in_flight_goes_straight_back() -> None:
    idx = PendingIndex()
    idx.put(ex("s", 1_000))
    idx.wait_behind(ex("s", 1_000), False)  # the run it waited for landed before the round applied
    assert idx.behind("s") == {} and idx.oldest_ready("a") == 1_000


def test_a_run_waiting_behind_with_a_deadline_comes_back_at_it_if_the_run_is_still_in_flight() -> None:
    """An overlap skip waits for the settle time: parked until the run it overlaps lands, or until then."""
    idx = PendingIndex()
    idx.put(replace(ex("s", 500), state=ExecState.RUNNING))
    x = ex("s", 1_000)
    idx.put(x)
    assert [e.id for es in idx.ready(1_000, {"a": 1}).values() for e in es] == [x.id]
    idx.wait_behind(x, False, until_ms=5_000)
    assert idx.oldest_ready("a") == 5_000, "the loop wakes for it (a wake-up is no stale entry)"
    assert idx.ready(4_999, {"a": 5}) == {}
    assert [e.id for es in idx.ready(5_000, {"a": 5}).values() for e in es] == [x.id]
    assert idx.behind("s") == {}, "decided again at its deadline: no longer waiting behind"


def _ran(e: Execution, dispatched: int, finished: int) -> Execution:
    cur = Attempt(1, "w", "n", FencingToken(0, 1), dispatched, dispatched + 60_000, finished_ms=finished,
                  succeeded=True, ran_ms=finished - dispatched)
    return replace(e, state=ExecState.SUCCEEDED, attempt=1, attempts=(cur,))


def test_a_run_that_leaves_flight_is_kept_only_while_a_run_it_may_have_overlapped_waits() -> None:
    """`ended` is what the round needs to skip runs due while a run that has since landed was in progress;
    it is kept no longer than one of those waits, so a million schedules whose runs end before the next is
    due keep nothing."""
    idx = PendingIndex()
    r0 = replace(ex("s", 0), state=ExecState.RUNNING)
    idx.put(r0)
    waiting = [ex("s", t) for t in (1_000, 2_000, 3_000)]
    for x in waiting:
        idx.put(x)
    assert [e.id for es in idx.ready(3_000, {"a": 5}).values() for e in es] == [x.id for x in waiting]
    for x in waiting:
        idx.wait_behind(x, False, until_ms=x.due_ms + 4_000, ordered=False)  # overlap skips waiting to settle
    done = _ran(r0, 0, 6_000)
    idx.put(done)  # it lands: they all come back, and its final record is kept for the round deciding them
    assert idx.behind("s") == {} and [e.id for e in idx.ended("s")] == [r0.id] and idx.ended_ids() == {r0.id}
    idx.put(replace(waiting[0], state=ExecState.SKIPPED))
    assert [e.id for e in idx.ended("s")] == [r0.id], "two of the runs it overlapped still wait"
    idx.put(replace(waiting[1], state=ExecState.SKIPPED))
    idx.put(replace(waiting[2], state=ExecState.DISPATCHED, attempt=1))  # decided: in flight, no longer waiting
    assert idx.ended("s") == [] and idx.ended_ids() == set()

    quick = PendingIndex()  # the common case: the run ends before the next is due
    quick.put(replace(ex("q", 0), state=ExecState.RUNNING))
    quick.put(ex("q", 1_000))
    quick.put(_ran(ex("q", 0), 0, 300))
    assert quick.ended("q") == [] and quick.ended_ids() == set()
    quick.clear()
    assert not quick.ended_ids()


def test_a_run_that_never_started_is_not_kept() -> None:
    idx = PendingIndex()
    r0 = replace(ex("s", 0), state=ExecState.DISPATCHED)
    idx.put(r0)
    idx.put(ex("s", 1_000))
    gone = _ran(r0, 0, 6_000)
    idx.put(replace(gone, state=ExecState.CANCELLED, attempts=(replace(gone.attempts[0], never_started=True),)))
    assert idx.ended("s") == []


def test_an_expired_attempt_is_returned_once_however_often_its_record_was_put() -> None:
    """DISPATCHED then RUNNING (same attempt, same deadline) leaves two deadline entries; a timeout txn that
    held the record twice was refused by etcd as malformed (found by the smoke drill)."""
    idx = PendingIndex()
    d = dispatch(ex("s", 1_000), worker="w", planner="n", token=FencingToken(0, 1), now_ms=1_000,
                 start_timeout_ms=500)
    idx.put(d)
    idx.put(replace(d, mod_revision=d.mod_revision + 1))  # the same attempt, recorded again
    assert [e.id for e in idx.unstarted(10_000)] == [d.id]
    assert [e.id for e in idx.expired(10_000_000)] == [d.id]


def test_awaiting_start_sees_only_dispatches_whose_start_by_has_not_passed() -> None:
    idx = PendingIndex()
    d = dispatch(ex("s", 1_000), worker="w", planner="n", token=FencingToken(0, 1), now_ms=1_000,
                 start_timeout_ms=500)
    assert not idx.awaiting_start(1_100)
    idx.put(d)
    assert idx.awaiting_start(1_100) and not idx.awaiting_start(1_500)  # start-by 1.5 s: past it, nothing waits
    idx.put(replace(d, state=ExecState.RUNNING))
    assert not idx.awaiting_start(1_100)


def test_a_run_buffered_behind_a_run_stays_behind_while_that_run_waits_for_its_retry() -> None:
    """Game day gd-s17a (every3-010, buffer_all): the run it waited behind was timed out into retry_wait
    (its worker killed), and it came back and started in the same round, beside the retry 10 ms later. A
    run on its retry is the same run: a run behind it waits until it has really ended."""
    idx = PendingIndex()
    r = replace(dispatch(ex("s", 1_000), worker="w", planner="n", token=FencingToken(0, 1), now_ms=1_000),
                state=ExecState.RUNNING)
    idx.put(r)
    x = ex("s", 2_000)
    idx.put(x)
    assert [e.id for es in idx.ready(2_000, {"a": 1}).values() for e in es] == [x.id]
    idx.wait_behind(x, True)
    timed_out = replace(r.attempts[0], finished_ms=8_990, error_class=ErrorClass.TIMEOUT)
    idx.put(replace(r, state=ExecState.RETRY_WAIT, next_attempt_ms=9_000, attempts=(timed_out,)))  # retried at 9 s
    assert idx.behind("s") == {x.id: True}, "the run is not over: it waits for its retry"
    assert [e.id for es in idx.ready(9_000, {"a": 5}).values() for e in es] == [r.id], "only the retry is ready"
    idx.put(replace(r, state=ExecState.DISPATCHED, next_attempt_ms=0))
    assert idx.behind("s") == {x.id: True}
    idx.put(replace(r, state=ExecState.SUCCEEDED))  # the retry lands: now it comes back
    assert idx.behind("s") == {} and [e.id for es in idx.ready(9_500, {"a": 5}).values() for e in es] == [x.id]


def test_a_run_due_in_a_retrys_backoff_gap_waits_for_the_retry_only_when_the_round_says_so() -> None:
    """Nothing of the run was out at its due time. Parked by a policy that runs two at once (a cancel_other
    start waiting for a stop), it goes straight back, no spin. Parked in order behind the earlier run's retry
    (skip and the buffers, docs/time.md), it stays until that retry has ended, and the run after it too."""
    idx = PendingIndex()
    r = dispatch(ex("s", 1_000), worker="w", planner="n", token=FencingToken(0, 1), now_ms=1_000)
    timed_out = replace(r.attempts[0], finished_ms=1_500, error_class=ErrorClass.TIMEOUT)
    waiting = replace(r, state=ExecState.RETRY_WAIT, next_attempt_ms=9_000, attempts=(timed_out,))
    idx.put(waiting)
    x, y = ex("s", 2_000), ex("s", 3_000)
    idx.put(x)
    idx.put(y)
    idx.wait_behind(x, False, ordered=False)
    assert idx.behind("s") == {}
    assert sorted(e.id for es in idx.ready(3_000, {"a": 5}).values() for e in es) == [x.id, y.id]
    idx.wait_behind(x, False, after_retry=True)
    idx.wait_behind(y, False, after_retry=True)
    assert idx.behind("s") == {x.id: False, y.id: False}
    assert [e.id for es in idx.ready(9_000, {"a": 5}).values() for e in es] == [r.id], "only the retry is ready"
    retried = dispatch(waiting, worker="w", planner="n", token=FencingToken(0, 1), now_ms=9_000)
    idx.put(retried)
    assert idx.behind("s") == {x.id: False, y.id: False}
    idx.put(replace(retried, state=ExecState.SUCCEEDED))  # the retry has ended: the first in order comes back
    assert idx.behind("s") == {y.id: False}
    assert [e.id for es in idx.ready(9_500, {"a": 5}).values() for e in es] == [x.id]


def test_a_retry_parked_behind_a_run_comes_back_first_when_it_ends() -> None:
    """A retry waits behind a later run in flight (a policy that holds); the run due after both waits behind the
    retry. The run ends: the retry comes back, not the later run, whose due time the retry's first attempt
    spanned (that hold must not keep the retry itself parked: it would wait for itself for good)."""
    idx = PendingIndex()
    r = dispatch(ex("s", 1_000), worker="w", planner="n", token=FencingToken(0, 1), now_ms=1_000)
    spans = replace(r.attempts[0], finished_ms=3_500, error_class=ErrorClass.TIMEOUT)  # out at 3 s
    waiting = replace(r, state=ExecState.RETRY_WAIT, next_attempt_ms=2_500, attempts=(spans,))
    other = dispatch(ex("s", 2_000), worker="w", planner="n", token=FencingToken(0, 1), now_ms=2_000)
    later = ex("s", 3_000)
    for e in (waiting, other, later):
        idx.put(e)
    assert sorted(e.id for es in idx.ready(3_000, {"a": 5}).values() for e in es) == [waiting.id, later.id]
    idx.wait_behind(waiting, False)
    idx.wait_behind(later, True)
    assert idx.behind("s") == {waiting.id: False, later.id: True}
    idx.put(replace(other, state=ExecState.SUCCEEDED))
    assert idx.behind("s") == {later.id: True}
    assert [e.id for es in idx.ready(4_000, {"a": 5}).values() for e in es] == [waiting.id]


def test_a_parked_run_is_not_handed_out_again_by_an_older_heap_entry() -> None:
    """Each put of a waiting record pushes a heap entry; parked behind a run in flight (or until a resume), the
    run's older entries are not its turn: handed out, they took the pool's share and the run was parked again."""
    idx = PendingIndex()
    r = dispatch(ex("s", 1_000), worker="w", planner="n", token=FencingToken(0, 1), now_ms=1_000)
    x = ex("s", 2_000)
    for e in (r, x, x, ex("t", 2_500)):  # x put twice: two entries
        idx.put(e)
    assert {e.id for es in idx.ready(3_000, {"a": 1}).values() for e in es} == {x.id}
    idx.wait_behind(x, True)
    assert [e.id for es in idx.ready(3_000, {"a": 1}).values() for e in es] == [execution_id("t", 2_500)]
    idx.put(replace(r, state=ExecState.SUCCEEDED))
    assert [e.id for es in idx.ready(3_000, {"a": 1}).values() for e in es] == [x.id]


def test_a_read_of_a_record_handed_out_unwritten_does_not_take_the_hand_out_back() -> None:
    """The owner's snapshot holds its unwritten hand-out DISPATCHED at the creation revision; a read of the
    unchanged record (a confirmation read, a notice) is older news. Taken in, the run would be dispatched a
    second time. A record that moved (a cancel) is taken in as always."""
    idx = PendingIndex()
    e = as_created(reserve(ex("s", 1_000), FencingToken(0, 5)), 50)
    handed = hand_out(e, worker="", planner="n", token=FencingToken(0, 5), now_ms=1_000, start_timeout_ms=3_000)
    idx.put(handed)
    idx.put(with_revision(replace(e, create_revision=0), 50))  # as a read decodes it
    assert idx.get(e.id) is handed and not idx.ready(2_000, {"a": 10})
    idx.put(with_revision(replace(e, create_revision=0), 51))
    assert idx.get(e.id).state is ExecState.SCHEDULED  # type: ignore[union-attr]


# ---- start ahead ------------------------------------------------------------------------------------

def test_start_ahead_new_runs_come_up_early_retries_and_operators_runs_at_their_time() -> None:
    idx = PendingIndex(ahead_ms=1_000)
    own = ex("s", 10_000)
    retry = ex("r", 10_000, state=ExecState.RETRY_WAIT)
    trig = replace(ex("m", 10_000), trigger=Trigger.MANUAL)
    for e in (own, retry, trig):
        idx.put(e)
    got = idx.ready(9_000, {"a": 10})
    assert [e.id for es in got.values() for e in es] == [own.id]
    assert sorted(e.id for es in idx.ready(10_000, {"a": 10}).values() for e in es) == sorted([retry.id, trig.id])


def test_start_ahead_may_arm_only_the_first_unfinished_run_of_a_schedule() -> None:
    idx = PendingIndex(ahead_ms=1_000)
    a, b = ex("s", 10_000), ex("s", 11_000)
    idx.put(a)
    idx.put(b)
    assert idx.may_arm(a) and not idx.may_arm(b), "b waits behind a, due before it"
    out = dispatch(a, worker="w", planner="n", token=FencingToken(0, 1), now_ms=9_500, ahead_ms=1_000)
    idx.put(out)
    assert not idx.may_arm(b), "a run in flight could overlap it"


def test_start_ahead_a_run_sent_back_comes_up_again_when_its_schedule_moves() -> None:
    """Not armable while the run before it is in flight: it waits for its due time, unless the run before it ends
    first, which offers it again at once (its early ready time)."""
    idx = PendingIndex(ahead_ms=1_000)
    a = dispatch(ex("s", 9_000), worker="w", planner="n", token=FencingToken(0, 1), now_ms=9_000)
    b = ex("s", 10_000)
    idx.put(a)
    idx.put(b)
    (got,) = idx.ready(9_100, {"a": 10}).values()
    assert got == [b] and not idx.may_arm(b)
    idx.not_before(b, b.due_ms)
    assert not idx.ready(9_200, {"a": 10}), "sent back until its due time"
    idx.remove(a.id)  # the run before it ended
    assert [e.id for es in idx.ready(9_300, {"a": 10}).values() for e in es] == [b.id] and idx.may_arm(b)
