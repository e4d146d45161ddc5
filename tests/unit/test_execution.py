"""The execution state machine: every transition, stale and duplicate results, retry classes."""

from __future__ import annotations

from dataclasses import replace

import pytest

from scheduler.execution import (
    RESERVED_MESSAGE,
    Disposition,
    ErrorClass,
    ExecState,
    Execution,
    TransitionError,
    Trigger,
    as_created,
    backoff_ms,
    cancel,
    discard,
    dispatch,
    hand_out,
    may_hand_out,
    replay,
    rerun,
    reserve,
    result,
    skip,
    started,
    timed_out,
    with_revision,
)
from scheduler.ids import FencingToken
from scheduler.model import RetryPolicy
from scheduler.store.codec import decode_execution, encode_execution
from scheduler.timeplan import Overlap

T0 = 1_767_225_600_000
E = Execution(
    id="s@2026-01-01T00:00:00.000Z", schedule_id="s", tenant="t", pool="p", task_type="x", planned_ms=T0,
    due_ms=T0 + 500, trigger=Trigger.SCHEDULED, retry=RetryPolicy(max_attempts=3, max_unknown_attempts=2),
    timeout_ms=10_000,
)


def go(e: Execution, now: int = T0 + 1000) -> Execution:
    return dispatch(e, worker="w1", planner="p1", token=FencingToken(3, 42), now_ms=now)


def test_not_dispatchable_before_due() -> None:
    with pytest.raises(TransitionError):
        dispatch(E, worker="w", planner="p", token=FencingToken(0, 1), now_ms=T0)


def test_success_path() -> None:
    e = go(E)
    assert (e.state, e.attempt, e.current and e.current.deadline_ms) == (ExecState.DISPATCHED, 1, T0 + 13_000)
    e = started(e, 1, T0 + 1100)
    e2, d = result(e, 1, succeeded=True, error_class=None, message="", now_ms=T0 + 2000)
    assert d is Disposition.RECORDED
    assert e2.state is ExecState.SUCCEEDED
    assert e2.terminal


def test_repeated_result_is_a_duplicate_and_changes_nothing() -> None:
    e, _ = result(go(E), 1, succeeded=True, error_class=None, message="", now_ms=T0 + 2000)
    e2, d = result(e, 1, succeeded=False, error_class=ErrorClass.PERMANENT, message="late", now_ms=T0 + 3000)
    assert d is Disposition.DUPLICATE
    assert e2 == e


def test_late_result_of_an_old_attempt_is_stale() -> None:
    e, _ = result(go(E), 1, succeeded=False, error_class=ErrorClass.TRANSIENT, message="", now_ms=T0 + 2000)
    assert e.state is ExecState.RETRY_WAIT
    e = go(e, now=e.next_attempt_ms)
    assert e.attempt == 2
    e2, d = result(e, 1, succeeded=True, error_class=None, message="", now_ms=T0 + 9000)
    assert d is Disposition.STALE
    assert e2.state is ExecState.DISPATCHED


def test_transient_retries_until_max_attempts_then_dead_letter() -> None:
    e = E
    for n in (1, 2, 3):
        e = go(e, now=max(e.next_attempt_ms, T0 + 1000))
        e, _ = result(e, n, succeeded=False, error_class=ErrorClass.TRANSIENT, message="503", now_ms=T0 + n * 10_000)
    assert e.state is ExecState.DEAD_LETTER
    assert [a.error_class for a in e.attempts] == [ErrorClass.TRANSIENT] * 3


def test_permanent_is_never_retried() -> None:
    e, _ = result(go(E), 1, succeeded=False, error_class=ErrorClass.PERMANENT, message="400", now_ms=T0 + 2000)
    assert e.state is ExecState.DEAD_LETTER


def test_unknown_errors_have_their_own_smaller_budget() -> None:
    e = replace(E, retry=RetryPolicy(max_attempts=10, max_unknown_attempts=2))
    e, _ = result(go(e), 1, succeeded=False, error_class=ErrorClass.UNKNOWN, message="?", now_ms=T0 + 2000)
    assert e.state is ExecState.RETRY_WAIT
    e = go(e, now=e.next_attempt_ms)
    e, _ = result(e, 2, succeeded=False, error_class=ErrorClass.UNKNOWN, message="?", now_ms=T0 + 3000)
    assert e.state is ExecState.DEAD_LETTER


def test_retry_after_is_honoured() -> None:
    e, _ = result(go(E), 1, succeeded=False, error_class=ErrorClass.TRANSIENT, message="429", now_ms=T0,
                  retry_after_ms=120_000)
    assert e.next_attempt_ms >= T0 + 120_000


def test_backoff_is_full_jitter_and_deterministic() -> None:
    e = replace(E, retry=RetryPolicy(initial_backoff_ms=1000, max_backoff_ms=8000, multiplier=2.0))
    for attempt, cap in [(1, 1000), (2, 2000), (3, 4000), (4, 8000), (9, 8000)]:
        b = backoff_ms(e, attempt)
        assert 0 <= b <= cap
        assert b == backoff_ms(e, attempt)


def test_timeout_detection() -> None:
    e = go(E)
    assert not timed_out(e, T0 + 12_999), "the worker's own timeout (10 s from receipt) comes first"
    assert timed_out(e, T0 + 13_000)


def test_cancel_skip_replay_discard() -> None:
    assert cancel(go(E), "requested").state is ExecState.CANCELLED
    assert skip(E, "paused").state is ExecState.SKIPPED
    with pytest.raises(TransitionError):
        skip(go(E), "paused")
    dead, _ = result(go(E), 1, succeeded=False, error_class=ErrorClass.PERMANENT, message="", now_ms=T0 + 2000)
    r = replay(dead, T0 + 5000)
    assert (r.state, r.trigger, r.current_trigger) == (ExecState.SCHEDULED, Trigger.SCHEDULED, Trigger.REPLAY)
    r = go(r, now=T0 + 5000)
    assert [a.trigger for a in r.attempts] == [None, Trigger.REPLAY], "each attempt names its run"
    assert r.attempt == 2
    assert r.id == E.id, "a replay keeps the execution id (the idempotency key)"
    assert discard(dead).state is ExecState.FAILED
    with pytest.raises(TransitionError):
        replay(E, T0)


def test_cancelled_execution_ignores_late_results() -> None:
    e = cancel(go(E), "overlap")
    e2, d = result(e, 1, succeeded=True, error_class=None, message="", now_ms=T0 + 2000)
    assert d is Disposition.STALE
    assert e2.state is ExecState.CANCELLED


def test_record_round_trips_through_its_stored_form() -> None:
    e, _ = result(go(E), 1, succeeded=False, error_class=ErrorClass.TRANSIENT, message="boom", now_ms=T0 + 2000)
    assert decode_execution(encode_execution(e)) == e


def fail(e: Execution, n: int, ec: ErrorClass = ErrorClass.TRANSIENT) -> Execution:
    e2, d = result(e, n, succeeded=False, error_class=ec, message="boom", now_ms=T0 + 2000 * n)
    assert d is Disposition.RECORDED
    return e2


def exhaust(e: Execution) -> Execution:
    """Dispatch and fail until the retry budget is spent; returns the dead letter."""
    while e.state is not ExecState.DEAD_LETTER:
        e = go(e, now=max(e.next_attempt_ms, e.due_ms, T0 + 1000))
        e = fail(e, e.attempt)
    return e


def test_replay_gets_a_fresh_retry_budget_each_time() -> None:
    dead = exhaust(E)
    assert dead.attempt == 3, "max_attempts=3"
    r = replay(dead, T0 + 60_000, payload=b"kept")
    assert (r.attempt_base, r.payload, r.overlap) == (3, b"kept", Overlap.ALLOW_ALL)
    assert r.retry == dead.retry, "the policy is not inflated: the budget counts from attempt_base"
    dead2 = exhaust(r)
    assert dead2.attempt == 6, "three more attempts after the replay, numbered on"
    dead3 = exhaust(replay(dead2, T0 + 90_000))
    assert dead3.attempt == 9
    assert dead3.payload == b"kept", "a second replay keeps the payload of the first"


def test_unknown_errors_are_counted_per_run() -> None:
    e = replace(E, retry=RetryPolicy(max_attempts=5, max_unknown_attempts=1))
    dead = fail(go(e), 1, ErrorClass.UNKNOWN)
    assert dead.state is ExecState.DEAD_LETTER
    r = go(replay(dead, T0 + 5000), now=T0 + 5000)
    assert fail(r, 2, ErrorClass.TRANSIENT).state is ExecState.RETRY_WAIT
    assert fail(r, 2, ErrorClass.UNKNOWN).state is ExecState.DEAD_LETTER, "one unknown per run"


@pytest.mark.parametrize("state", ["succeeded", "skipped", "cancelled", "failed"])
def test_rerun_of_a_finished_execution(state: str) -> None:
    done, _ = result(go(E), 1, succeeded=True, error_class=None, message="", now_ms=T0 + 2000)
    base = {"succeeded": done, "skipped": skip(E, "paused"), "cancelled": cancel(go(E), "op"),
            "failed": discard(exhaust(E))}[state]
    new_retry = RetryPolicy(max_attempts=2, max_unknown_attempts=1)
    r = rerun(base, T0 + 100_000, retry=new_retry, timeout_ms=20_000)
    assert (r.state, r.trigger, r.run_trigger, r.id, r.skip_reason) == (
        ExecState.SCHEDULED, Trigger.SCHEDULED, Trigger.RERUN, E.id, ""), "how it was created never changes"
    assert (r.attempt_base, r.retry, r.timeout_ms) == (base.attempt, new_retry, 20_000)
    assert r.due_ms <= T0 + 100_000
    g = go(r, now=T0 + 100_000)
    assert g.attempt == base.attempt + 1, "the rerun is the next attempt under the same id"
    assert g.current is not None and g.current.trigger is Trigger.RERUN
    assert decode_execution(encode_execution(g)) == g
    assert exhaust(r).attempt == base.attempt + 2, "the rerun's own budget"


@pytest.mark.parametrize("make", [lambda: E, lambda: go(E), lambda: exhaust(E)])
def test_rerun_refuses_unfinished_executions_and_dead_letters(make: object) -> None:
    with pytest.raises(TransitionError):
        rerun(make(), T0, retry=E.retry, timeout_ms=E.timeout_ms)  # type: ignore[operator]


def test_discard_only_dead_letters() -> None:
    with pytest.raises(TransitionError):
        discard(go(E))
    assert discard(exhaust(E)).terminal


def test_operator_overrides_round_trip_and_old_records_still_decode() -> None:
    r = replay(exhaust(E), T0 + 60_000, payload=b"\x00bin")
    assert decode_execution(encode_execution(r)) == r
    assert decode_execution(encode_execution(replace(r, payload=b""))).payload == b"", "empty is not None"
    old = encode_execution(E)
    for k in (b'"ov"', b'"pay"', b'"base"', b'"rtr"'):
        assert k not in old, "plain records keep their size"
    d = decode_execution(old)
    assert (d.overlap, d.payload, d.attempt_base, d.run_trigger) == (None, None, 0, None)
    assert b'"tr":"s' in encode_execution(go(E)) and encode_execution(go(E)).count(b'"tr"') == 1, \
        "a first run's attempts carry no trigger of their own"


def test_dead_reason_is_recorded_by_the_transition_and_counts_only_the_run_that_died() -> None:
    """Issue 9: the reason is written when the record enters DEAD_LETTER, with the replay's attempt base."""
    dead = exhaust(E)
    assert dead.dead_reason == "retries exhausted (3 attempts)"
    r = replay(dead, T0 + 60_000)
    assert r.dead_reason == "", "a replay clears it: the new run has not died"
    dead2 = exhaust(r)
    assert (dead2.attempt, dead2.dead_reason) == (6, "retries exhausted (3 attempts)"), \
        "attempts 4-6 belong to the replay; the first run's three are not counted"
    assert discard(dead2).dead_reason == dead2.dead_reason, "kept on the FAILED record"
    assert decode_execution(encode_execution(dead2)).dead_reason == dead2.dead_reason
    perm = fail(go(E), 1, ErrorClass.PERMANENT)
    assert perm.dead_reason == "permanent error"
    e = replace(E, retry=RetryPolicy(max_attempts=5, max_unknown_attempts=1))
    assert fail(go(e), 1, ErrorClass.UNKNOWN).dead_reason == "unknown-error limit (1 unknown error)"


def test_dead_reason_of_a_record_written_before_reasons_were_recorded() -> None:
    from scheduler.execution import dead_reason
    dead = exhaust(replay(exhaust(E), T0 + 60_000))
    legacy = replace(dead, dead_reason="")
    assert dead_reason(legacy) == "retries exhausted (3 attempts)", "the fallback respects attempt_base too"
    assert dead_reason(dead) == dead.dead_reason


# ---- the reserved first attempt (docs/keyspace.md, "Reserved first attempt") ------------------------------

MINE, OTHER = FencingToken(3, 42), FencingToken(3, 77)


def created(e: Execution, token: FencingToken = MINE, revision: int = 100) -> Execution:
    """The record as its owner's create wrote it, at `revision`."""
    return as_created(reserve(e, token), revision)


def test_a_reserved_record_round_trips_and_reads_back_not_handable() -> None:
    e = created(E)
    back = decode_execution(encode_execution(e), e.mod_revision)
    assert back == e and back.reserved == MINE
    # A read gives no create revision: only the owner's own create makes a record handable without a write.
    assert may_hand_out(e, MINE) and not may_hand_out(back, MINE)


def test_only_the_reserving_owner_hands_out_and_only_the_record_as_created() -> None:
    e = created(E)
    assert not may_hand_out(e, OTHER)
    assert not may_hand_out(as_created(E, 100), MINE)  # nothing reserved
    assert not may_hand_out(with_revision(e, 101), MINE)  # written since its create (a cancel, a rerun...)
    assert not may_hand_out(skip(e, "paused"), MINE)
    with pytest.raises(TransitionError):
        hand_out(e, worker="", planner="p1", token=OTHER, now_ms=T0 + 1000)


def test_a_hand_out_is_the_reserved_attempt_at_the_creation_revision() -> None:
    h = hand_out(created(E), worker="", planner="p1", token=MINE, now_ms=T0 + 1000, start_timeout_ms=3000)
    cur = h.current
    assert h.state is ExecState.DISPATCHED and h.attempt == 1 and cur is not None and cur.token == MINE
    assert h.reserved is None and h.mod_revision == h.create_revision == 100  # every CAS compares the create
    run = started(h, 1, T0 + 1100, "w1")
    assert run.state is ExecState.RUNNING and run.current is not None and run.current.worker == "w1"
    assert decode_execution(encode_execution(run)).reserved is None


def test_any_other_dispatch_retires_the_reserved_number_without_using_the_budget() -> None:
    # A new owner (or this one, after the record moved) sees the record as stored: attempt 1 is retired
    # never-started, and the dispatch is attempt 2, so attempt 1 can only ever be the handed-out copy.
    stored = decode_execution(encode_execution(created(E)), 100)
    d = dispatch(stored, worker="", planner="p2", token=OTHER, now_ms=T0 + 1000)
    one, two = d.attempts
    assert (one.attempt, one.token, one.never_started, one.message) == (1, MINE, True, RESERVED_MESSAGE)
    assert (two.attempt, two.token, d.attempt, d.reserved) == (2, OTHER, 2, None)
    # The retired attempt does not count: three more tries with max_attempts=3.
    for n in (2, 3, 4):
        d, _ = result(started(d, n, T0 + 1100, "w"), n, succeeded=False, error_class=ErrorClass.TRANSIENT,
                      message="x", now_ms=T0 + 1200)
        if n < 4:
            assert d.state is ExecState.RETRY_WAIT
            d = dispatch(d, worker="", planner="p2", token=OTHER, now_ms=d.next_attempt_ms)
    assert d.state is ExecState.DEAD_LETTER


def test_a_rerun_after_a_cancel_of_a_reserved_record_never_reuses_its_number() -> None:
    gone = cancel(decode_execution(encode_execution(created(E)), 100), "operator", T0 + 900)
    again = with_revision(rerun(gone, T0 + 2000, retry=E.retry, timeout_ms=E.timeout_ms), 120)
    d = dispatch(again, worker="", planner="p1", token=MINE, now_ms=T0 + 2000)
    assert [a.attempt for a in d.attempts] == [1, 2] and d.attempts[0].never_started


def test_a_result_under_another_token_is_stale() -> None:
    h = started(hand_out(created(E), worker="", planner="p1", token=MINE, now_ms=T0 + 1000), 1, T0 + 1100, "w1")
    same, d = result(h, 1, succeeded=True, error_class=None, message="", now_ms=T0 + 2000, token=OTHER)
    assert d is Disposition.STALE and same is h
    done, d = result(h, 1, succeeded=True, error_class=None, message="", now_ms=T0 + 2000, token=MINE)
    assert d is Disposition.RECORDED and done.state is ExecState.SUCCEEDED


def test_not_started_from_another_worker_than_the_recorded_starter_is_stale() -> None:
    """Two copies of one (id, attempt): the one never run must not end the one running (session 16)."""
    h = started(hand_out(created(E), worker="", planner="p1", token=MINE, now_ms=T0 + 1000), 1, T0 + 1100, "w1")
    kw = dict(succeeded=False, error_class=ErrorClass.TRANSIENT, message="not started", now_ms=T0 + 1200,
              not_started=True)
    assert result(h, 1, worker="w2", **kw)[1] is Disposition.STALE  # type: ignore[arg-type]
    # The starter's own not-started report (its StartAck was lost) ends it as before.
    ended, d = result(h, 1, worker="w1", **kw)  # type: ignore[arg-type]
    assert d is Disposition.RECORDED and ended.state is ExecState.RETRY_WAIT


def test_a_reserved_attempt_reported_never_started_on_the_record_as_created_is_retired() -> None:
    """Game day, session 28: the owner handed attempt 1 out unwritten and lost its session as etcd lost its
    quorum; the worker's start CAS was still in flight when it gave up waiting and reported it not started.
    Read from etcd the record is as created (SCHEDULED, attempt 1 reserved): the report must move it, from
    the creation revision that start CAS compares, so that at most one of the two lands."""
    stored = decode_execution(encode_execution(created(E)), 100)
    kw = dict(succeeded=False, error_class=ErrorClass.TRANSIENT, message="not started: no start acknowledgement",
              now_ms=T0 + 4000, worker="w1", not_started=True)
    gone, d = result(stored, 1, token=MINE, **kw)  # type: ignore[arg-type]
    assert d is Disposition.RECORDED and gone.state is ExecState.SCHEDULED and gone.reserved is None
    one = gone.current
    assert one is not None and (one.attempt, one.token, one.worker, one.never_started) == (1, MINE, "w1", True)
    assert one.message.startswith("not started") and one.finished_ms == T0 + 4000
    # Dispatchable at once as attempt 2, with the retry budget untouched.
    two = dispatch(gone, worker="", planner="p2", token=OTHER, now_ms=T0 + 4100)
    assert [a.attempt for a in two.attempts] == [1, 2] and two.attempts[0].never_started
    # Only the reserved number, under its own token (or none given), and only not-started reports.
    assert result(stored, 2, token=MINE, **kw)[1] is Disposition.STALE  # type: ignore[arg-type]
    assert result(stored, 1, token=OTHER, **kw)[1] is Disposition.STALE  # type: ignore[arg-type]
    assert result(stored, 1, succeeded=True, error_class=None, message="", now_ms=T0 + 4000,
                  token=MINE)[1] is Disposition.STALE
    # Retired already (another dispatch, or this very report again): the report is stale.
    assert result(two, 1, token=MINE, **kw)[1] is Disposition.STALE  # type: ignore[arg-type]
    assert result(gone, 1, token=MINE, **kw)[1] is Disposition.DUPLICATE  # type: ignore[arg-type]
