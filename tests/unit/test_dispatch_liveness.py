"""The dispatcher's liveness bookkeeping with a fake clock: silent streams are ended, orphaned attempts are
given up after the heartbeat timeout unless re-attached (Hello or a heartbeat of an owned partition), and a
result's worker id is written into its attempt."""

from __future__ import annotations

import asyncio
from typing import Any, cast

from scheduler._gen.scheduler.v1 import worker_service_pb2 as wpb
from scheduler.clock import FakeClock
from scheduler.dispatch.service import Dispatcher, _Conn
from scheduler.execution import ErrorClass, Execution, Trigger, dispatch, new_execution, result
from scheduler.ids import FencingToken
from scheduler.model import RetryPolicy

EID = "s1@2026-01-01T00:00:00.000Z"


def make(lookup: dict[str, Execution] | None = None) -> tuple[Dispatcher, FakeClock, list[list[tuple[str, int]]]]:
    clock = FakeClock()
    lost: list[list[tuple[str, int]]] = []
    d = Dispatcher(node_id="n1", region="r", kv=cast(Any, None), ledger=cast(Any, None), clock=clock,
                   record=cast(Any, None), planners=lambda: [], lookup=(lookup or {}).get,
                   on_lost_attempts=lost.append, heartbeat_interval=0.1, heartbeat_timeout=1.0)
    return d, clock, lost


def conn(d: Dispatcher, clock: FakeClock, worker: str = "w1") -> _Conn:
    c = _Conn(worker, "pool", "r", frozenset(), asyncio.Queue(), last_seen=clock.monotonic())
    d.conns[len(d.conns)] = c
    return c


def in_flight() -> Execution:
    e = new_execution(id=EID, schedule_id="s1", tenant="t", pool="pool", task_type="x", planned_ms=0, due_ms=0,
                      trigger=Trigger.SCHEDULED, retry=RetryPolicy(), timeout_ms=3_600_000)
    return dispatch(e, worker="", planner="n1", token=FencingToken(0, 1), now_ms=0)


def test_a_silent_stream_is_ended_once_and_only_after_the_timeout() -> None:
    d, clock, _ = make()
    c = conn(d, clock)
    clock.advance(0.9)
    d.check_liveness(clock.monotonic())
    assert c.out.empty() and not c.dead
    clock.advance(0.2)
    d.check_liveness(clock.monotonic())
    assert c.dead and c.out.get_nowait() is None, "the stream is told to end"
    d.check_liveness(clock.monotonic() + 5)
    assert c.out.empty() and d.streams_declared_dead == 1, "declared dead once"


def test_orphans_are_given_up_after_the_timeout_unless_reattached() -> None:
    d, clock, lost = make()
    c = conn(d, clock)
    c.running = {(EID, 1): "x", ("other@2026-01-01T00:00:01.000Z", 1): "x"}
    d._orphan(c)
    assert set(d.orphans) == {(EID, 1), ("other@2026-01-01T00:00:01.000Z", 1)} and not c.running
    clock.advance(0.5)
    d.check_liveness(clock.monotonic())
    assert lost == []
    d.orphans.pop((EID, 1))  # what an accepted re-attach does
    clock.advance(0.6)
    d.check_liveness(clock.monotonic())
    assert lost == [[("other@2026-01-01T00:00:01.000Z", 1)]] and not d.orphans and d.attempts_lost == 1


def test_a_heartbeat_reattaches_owned_in_flight_attempts_only() -> None:
    owned = in_flight()
    d, clock, lost = make({EID: owned})
    d.orphans[(EID, 1)] = clock.monotonic() + 1.0
    c = conn(d, clock, "w2")
    running = [wpb.RunningAttempt(execution_id=EID, attempt=1),
               wpb.RunningAttempt(execution_id=EID, attempt=0),  # not the current attempt: not answered
               wpb.RunningAttempt(execution_id="notmine@2026-01-01T00:00:00.000Z", attempt=1)]  # other partition
    d._adopt(c, running)
    msg = c.out.get_nowait()
    assert msg is not None and [(r.execution_id, r.attempt) for r in msg.reattached.accepted] == [(EID, 1)]
    assert not msg.reattached.rejected and (EID, 1) in c.running and not d.orphans
    d._adopt(c, running)
    assert c.out.empty(), "an attempt already tracked on the stream is not answered again"
    clock.advance(5)
    d.check_liveness(clock.monotonic() - 4.5)
    assert lost == []


def test_a_result_records_the_worker_that_ran_it() -> None:
    e = in_flight()
    assert e.current is not None and e.current.worker == ""
    done, _ = result(e, 1, succeeded=True, error_class=None, message="", now_ms=5, worker="w7")
    assert done.current is not None and done.current.worker == "w7"
    timed, _ = result(e, 1, succeeded=False, error_class=ErrorClass.TIMEOUT, message="lost", now_ms=5)
    assert timed.attempts[0].worker == "", "a planner-side timeout knows no worker: left as dispatched"


def test_an_attempt_another_stream_already_reattached_is_not_orphaned() -> None:
    d, clock, _ = make()
    old, new = conn(d, clock), conn(d, clock)
    old.running = {(EID, 1): "x"}
    new.running = {(EID, 1): "x"}  # the worker's new stream re-attached it before the old one ended
    del d.conns[0]
    d._orphan(old)
    assert not d.orphans
