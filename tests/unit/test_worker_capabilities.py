"""What a planner sends a stream by its worker's Hello.capabilities (docs/workers.md, "Capabilities"): a run
handed out before its due time goes only to a worker that honours start_in; one that does not gets it at its
due time, without start_in."""

from __future__ import annotations

import asyncio

from scheduler._gen.scheduler.v1 import worker_service_pb2 as wpb
from scheduler.clock import FakeClock
from scheduler.dispatch.conn import Conn
from scheduler.dispatch.service import Dispatcher
from scheduler.execution import Trigger, dispatch, new_execution
from scheduler.ids import FencingToken
from scheduler.model import RetryPolicy
from scheduler.store.keyspace import Keyspace
from scheduler.store.ledger import Ledger
from scheduler.store.memory.client import MemoryKV

NOW = 1_000_000


def _dispatcher(clk: FakeClock) -> Dispatcher:
    return Dispatcher(node_id="p1", region="a", kv=MemoryKV(), ledger=Ledger(Keyspace("/t"), 4), clock=clk,
                      planners=lambda: [])


def _conn(worker: str, *, start_in: bool) -> Conn:
    return Conn(worker, "p", "a", frozenset(), asyncio.Queue(), credits=4, start_in=start_in)


def _armed(d: Dispatcher, clk: FakeClock, due_ms: int) -> None:
    """A run handed out `due_ms - now` before its due time (start ahead)."""
    e = new_execution(id=f"s@{due_ms}", schedule_id="s", tenant="t", pool="p", task_type="x", planned_ms=due_ms,
                      due_ms=due_ms, trigger=Trigger.SCHEDULED, retry=RetryPolicy(), timeout_ms=10_000)
    e = dispatch(e, worker="", planner="p1", token=FencingToken(0, 1), now_ms=clk.wall_ms(), start_timeout_ms=3000,
                 ahead_ms=due_ms - clk.wall_ms())
    d.submit(e, b"", FencingToken(0, 1))


def _got(c: Conn) -> list[wpb.Assignment]:
    out: list[wpb.Assignment] = []
    while not c.out.empty():
        msg = c.out.get_nowait()
        assert msg is not None
        out += list(msg.assignments.assignments)
    return out


async def test_a_run_handed_out_early_waits_for_its_due_time_on_a_stream_without_start_in() -> None:
    clk = FakeClock(wall_ms=NOW)
    d = _dispatcher(clk)
    old = _conn("old", start_in=False)
    d.conns[0] = old
    d._no_start_in["p"] = 1  # as Connect counts it
    _armed(d, clk, NOW + 800)  # armed before this stream connected (or while a capable one was the only one)
    d._pump()
    assert _got(old) == [], "an old worker would have started it at once, 800 ms early"
    clk.advance(0.8)
    d._pump()  # the dispatcher pumps again at the due time (its retry timer)
    got = _got(old)
    assert [a.execution_id for a in got] == [f"s@{NOW + 800}"]
    assert not got[0].HasField("start_in"), "sent at its due time: nothing to wait for"


async def test_a_stream_with_start_in_takes_it_at_once_while_an_old_one_is_passed_over() -> None:
    clk = FakeClock(wall_ms=NOW)
    d = _dispatcher(clk)
    old, new = _conn("old", start_in=False), _conn("new", start_in=True)
    d.conns.update({0: old, 1: new})
    _armed(d, clk, NOW + 800)
    d._pump()
    got = _got(new)
    assert _got(old) == [] and len(got) == 1
    assert got[0].start_in.ToMilliseconds() == 800
