"""The start window (dispatch/start_window.py): hand-outs waiting for their start are bounded per pool so that
each is answered before its start-by, and the Dispatcher offers partition loops only the room it has."""

from __future__ import annotations

import asyncio

from scheduler._gen.scheduler.v1 import worker_service_pb2 as wpb
from scheduler.clock import FakeClock
from scheduler.dispatch.conn import Conn
from scheduler.dispatch.service import Dispatcher
from scheduler.dispatch.start_window import FLOOR, INITIAL, StartWindow
from scheduler.execution import Trigger, dispatch, new_execution
from scheduler.ids import FencingToken
from scheduler.model import RetryPolicy
from scheduler.store.keyspace import Keyspace
from scheduler.store.ledger import Ledger
from scheduler.store.memory.client import MemoryKV

LEFT = 3.0  # seconds from the submit to the start-by (start_timeout_ms 3000)


def _fill(w: StartWindow, n: int, first: int = 0, *, pool: str = "p", send: bool = True) -> list[tuple[str, int]]:
    keys = [(f"{pool}{i}", 1) for i in range(first, first + n)]
    for k in keys:
        w.add(k, pool, LEFT)
        if send:
            w.sent(k)
    return keys


def test_room_is_the_size_less_what_waits_for_its_start() -> None:
    w = StartWindow(FakeClock())
    assert w.room("p") == INITIAL
    keys = _fill(w, 100)
    assert w.room("p") == INITIAL - 100
    w.answered(keys[:40])
    w.drop(keys[40:50])
    assert w.room("p") == INITIAL - 50


def test_quick_answers_widen_a_busy_window_by_one_each() -> None:
    clk = FakeClock()
    w = StartWindow(clk)
    keys = _fill(w, INITIAL)
    clk.advance(LEFT / 8)
    w.answered(keys[:100])  # at least half the window still waits: it was the limit, and answers are quick
    assert w.pool("p").size == INITIAL + 100


def test_quick_answers_leave_a_window_alone_that_was_not_the_limit() -> None:
    clk = FakeClock()
    w = StartWindow(clk)
    keys = _fill(w, 10)
    clk.advance(LEFT / 8)
    w.answered(keys)
    assert w.pool("p").size == INITIAL


def test_a_late_answer_halves_it_once_per_round_trip() -> None:
    clk = FakeClock()
    w = StartWindow(clk)
    keys = _fill(w, 1000)
    clk.advance(LEFT * 0.6)  # past half of the time it had: the tail of this hand-out risks its start-by
    w.answered(keys[:500])
    assert w.pool("p").size == INITIAL / 2 and w.pool("p").cuts == 1
    w.answered(keys[500:])  # the rest of the same round trip: as late, no second cut
    assert w.pool("p").size == INITIAL / 2
    more = _fill(w, 10, first=1000)
    clk.advance(LEFT * 0.6)
    w.answered(more)
    assert w.pool("p").size == INITIAL / 4 and w.pool("p").cuts == 2


def test_it_never_falls_below_the_floor() -> None:
    clk = FakeClock()
    w = StartWindow(clk)
    for i in range(20):
        ks = _fill(w, 1, first=i)
        clk.advance(LEFT * 0.6)
        w.answered(ks)
    assert w.pool("p").size == FLOOR


def test_a_hand_out_past_its_start_by_leaves_the_window_and_halves_it() -> None:
    clk = FakeClock()
    w = StartWindow(clk)
    _fill(w, 100)
    clk.advance(LEFT + 0.01)
    assert w.room("p") == INITIAL // 2  # all 100 expired (no answer will count now), and the window halved
    assert w.pool("p").expired == 100 and w.pool("p").cuts == 1 and len(w) == 0


def test_time_waiting_for_a_worker_is_not_the_start_pipelines() -> None:
    """A hand-out queued for a worker's credit (or its affinity) before it was sent: its answer is timed from
    the send, and one that expires unsent leaves without a cut (a smaller window would not help it)."""
    clk = FakeClock()
    w = StartWindow(clk)
    queued = _fill(w, 2, send=False)
    clk.advance(LEFT * 0.6)
    w.sent(queued[0])
    clk.advance(LEFT * 0.1)
    w.answered(queued[:1])
    assert w.pool("p").cuts == 0
    clk.advance(LEFT)
    assert w.room("p") == INITIAL and w.pool("p").expired == 1 and w.pool("p").cuts == 0


def test_a_pool_whose_workers_answer_late_narrows_only_its_own_window() -> None:
    """The answer time includes the pool's workers (a worker whose loop is busy asks late): a slow pool must
    not hold back the others."""
    clk = FakeClock()
    w = StartWindow(clk)
    slow = _fill(w, 100, pool="slow")
    fast = _fill(w, 100, pool="fast")
    clk.advance(LEFT / 8)
    w.answered(fast)
    clk.advance(LEFT / 2)
    w.answered(slow)
    assert w.pool("slow").size == INITIAL / 2 and w.room("fast") == INITIAL


def test_a_fixed_window_keeps_its_size() -> None:
    clk = FakeClock()
    w = StartWindow(clk, fixed=10)
    keys = _fill(w, 10)
    assert w.room("p") == 0
    clk.advance(LEFT * 0.9)
    assert w.answered(keys[:3])  # it had no room and has now
    assert w.pool("p").size == 10 and w.room("p") == 3


# ---- through the Dispatcher ------------------------------------------------------------------------------


def _dispatcher(clk: FakeClock, window: int) -> Dispatcher:
    return Dispatcher(node_id="p1", region="a", kv=MemoryKV(), ledger=Ledger(Keyspace("/t"), 4), clock=clk,
                      planners=lambda: [], start_window=window)


def _submit(d: Dispatcher, clk: FakeClock, i: int, pool: str = "p") -> None:
    e = new_execution(id=f"s@{i}", schedule_id="s", tenant="t", pool=pool, task_type="x", planned_ms=i, due_ms=0,
                      trigger=Trigger.SCHEDULED, retry=RetryPolicy(), timeout_ms=10_000)
    e = dispatch(e, worker="", planner="p1", token=FencingToken(0, 1), now_ms=clk.wall_ms(), start_timeout_ms=3000)
    d.submit(e, b"", FencingToken(0, 1))


async def test_capacity_is_bounded_by_the_window_not_only_by_worker_credits() -> None:
    clk = FakeClock(wall_ms=1_000_000)
    woken: list[int] = []
    d = _dispatcher(clk, 5)
    d._on_capacity = lambda: woken.append(1)
    c = Conn("w", "p", "a", frozenset(), asyncio.Queue(), credits=100)
    d.conns[0] = c
    assert d.capacity("p") == 5  # 100 slots, 5 may wait for their start
    for i in range(5):
        _submit(d, clk, i)
    d._pump()
    assert c.credits == 95 and d.capacity("p") == 0, "a sixth hand-out would wait for its start past the window"
    d._start_acks(c, [wpb.StartAckEntry(execution_id="s@0", attempt=1, disposition=wpb.START_DISPOSITION_STARTED),
                      wpb.StartAckEntry(execution_id="s@1", attempt=1, disposition=wpb.START_DISPOSITION_REFUSED)])
    assert d.capacity("p") == 2 and woken == [1]  # answered: room again, and the loops are told
    d.cancel_attempt("s@2", 1, "requested")
    d._finished(c, [wpb.Result(execution_id="s@3", attempt=1, not_started=True)])
    assert d.capacity("p") == 4
    d.reserve("p", 3)  # a loop holds room for dispatches it is committing
    assert d.capacity("p") == 1
    other = Conn("w2", "q", "a", frozenset(), asyncio.Queue(), credits=100)
    d.conns[1] = other
    assert d.capacity("q") == 5, "each pool has its own window"
