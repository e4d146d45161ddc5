"""`prefer` judges "a local worker had credit" for what the queued work needs: the pool AND its task type
(scheduler/dispatch/affinity.py). A local worker of the pool that does not run the execution's task type
can never take it, so its credit must not hold the work at home: before this, it did, forever."""

from __future__ import annotations

import asyncio

import pytest

from scheduler.clock import FakeClock
from scheduler.dispatch.affinity import AffinityGate
from scheduler.dispatch.conn import Conn
from scheduler.dispatch.service import Dispatcher
from scheduler.execution import Trigger, dispatch, new_execution
from scheduler.ids import FencingToken
from scheduler.model import RetryPolicy
from scheduler.region.affinity import Affinity, AffinityPolicy, Mode
from scheduler.region.policy import RegionPolicy
from scheduler.store.keyspace import Keyspace
from scheduler.store.ledger import Ledger
from scheduler.store.memory.client import MemoryKV

WAIT_S = 2.0
PREFER = AffinityPolicy(default=Affinity(Mode.PREFER, int(WAIT_S * 1000)))


def _gate() -> tuple[AffinityGate, FakeClock]:
    clk = FakeClock()
    g = AffinityGate("a", clk.monotonic)
    g.configure("a", PREFER)
    return g, clk


def test_a_local_worker_of_another_task_type_does_not_hold_the_work_home() -> None:
    g, clk = _gate()
    clk.advance(WAIT_S)
    for _ in range(5):  # a local worker that runs only "y" keeps having credit
        g.local_credit("p", frozenset({"y"}))
        clk.advance(1.0)
        assert g.allows("b", "p", "x"), "a local 'y' worker held 'x' work at home"
        assert not g.allows("b", "p", "y")  # its own type still stays home
    assert g.wait_left("p", "y") == pytest.approx(WAIT_S - 1.0)


def test_a_local_worker_of_every_type_holds_every_type_home() -> None:
    g, clk = _gate()
    clk.advance(WAIT_S)
    g.local_credit("p", frozenset())  # Hello listed no task types: it runs them all
    assert not g.allows("b", "p", "x") and not g.allows("b", "p", "anything")
    clk.advance(WAIT_S)
    assert g.allows("b", "p", "x")


def test_stream_wait_left_is_the_soonest_type_the_stream_runs() -> None:
    g, clk = _gate()
    clk.advance(WAIT_S)
    g.local_credit("p", frozenset({"x"}))
    clk.advance(0.5)
    assert g.stream_wait_left("p", frozenset({"x"})) == pytest.approx(WAIT_S - 0.5)
    assert g.stream_wait_left("p", frozenset({"x", "z"})) == 0.0  # no local worker runs z
    assert g.stream_wait_left("p", frozenset()) == 0.0  # nor does any local worker run every type


def _dispatcher(clk: FakeClock) -> Dispatcher:
    d = Dispatcher(node_id="p1", region="a", kv=MemoryKV(), ledger=Ledger(Keyspace("/t"), 4), clock=clk,
                   planners=lambda: [])
    d.set_region_policy(RegionPolicy("a", ("b",), affinity=PREFER))
    return d


def _conn(worker: str, region: str, types: set[str]) -> Conn:
    return Conn(worker, "p", region, frozenset(types), asyncio.Queue(), credits=1)


def _submit(d: Dispatcher, clk: FakeClock, task_type: str) -> None:
    e = new_execution(id=f"s@{task_type}", schedule_id="s", tenant="t", pool="p", task_type=task_type,
                      planned_ms=0, due_ms=0, trigger=Trigger.SCHEDULED, retry=RetryPolicy(), timeout_ms=10_000)
    e = dispatch(e, worker="", planner="p1", token=FencingToken(0, 1), now_ms=clk.wall_ms())
    d.submit(e, b"", FencingToken(0, 1))


def _got(c: Conn) -> list[str]:
    out: list[str] = []
    while not c.out.empty():
        msg = c.out.get_nowait()
        assert msg is not None
        out += [a.task_type for a in msg.assignments.assignments]
    return out


async def test_the_dispatcher_sends_work_abroad_when_no_local_worker_runs_its_type() -> None:
    clk = FakeClock()
    d = _dispatcher(clk)
    local, remote = _conn("wa", "a", {"y"}), _conn("wb", "b", {"x", "y"})
    d.conns.update({0: local, 1: remote})
    _submit(d, clk, "x")
    for _ in range(3):  # pumps (credit grants, results) keep seeing the idle local "y" worker with credit
        d._pump()
        assert _got(remote) == []  # the start's wait: local workers get prefer_wait to show up
        clk.advance(WAIT_S / 2 - 0.01)
    # 2.97 s since the start: past prefer_wait with no local "x" worker ever (the "y" one had credit 0.99 s ago)
    d._pump()
    assert _got(local) == [] and local.credits == 1
    assert _got(remote) == ["x"], "the 'x' execution was held at home with no local worker that runs it"
    assert d.cross_region == {"p": 1}


async def test_the_dispatcher_keeps_work_home_while_a_local_worker_of_its_type_has_credit() -> None:
    clk = FakeClock()
    d = _dispatcher(clk)
    busy, idle, remote = _conn("wa1", "a", {"x"}), _conn("wa2", "a", {"y"}), _conn("wb", "b", {"x"})
    busy.credits = 0
    d.conns.update({0: busy, 1: idle, 2: remote})
    clk.advance(WAIT_S)
    busy.credits = 1
    d._local_credit(busy)  # it had credit a moment ago (then took work, or drained)
    busy.credits = 0
    _submit(d, clk, "x")
    clk.advance(WAIT_S / 2)
    d._pump()
    assert _got(remote) == [], "went abroad while a local 'x' worker had credit within prefer_wait"
    assert d.capacity("p") == 0  # the idle "y" credit counts (local), minus the queued item
    clk.advance(WAIT_S / 2)
    d._pump()
    assert _got(remote) == ["x"]
