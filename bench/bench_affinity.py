"""Worker affinity's cost at dispatch: the gate's decision against the same dispatch path without it.

Two measurements, each against a baseline run interleaved in the same process:
  decision  the per-item predicate the pump hands the queue for one stream (scheduler/dispatch/service.py):
            `runs(t) and gate.allows(region, pool, t)` against `runs(t)` alone (no gate) and against
            `runs(t) and <a trivial check>`; per call, local and remote streams, each mode;
  pump      Dispatcher._pump() sending N queued executions to one stream with N credits (assignment
            protos, liveness holds, the fair queue: the whole path), with the real gate against a stub
            gate that allows everything without a look (no gate) and one whose check is a constant
            (trivial check); per assignment.
A remote `strict` stream is refused before the queue is looked at, so it has no per-assignment cost:
its line is the time of a pump that sends nothing, per queued item.

Prints microseconds and ratios (gate / baseline); absolute numbers vary with the machine's load, the
ratios are what to compare.

    python bench/bench_affinity.py            # full: 5,000 items per pump, 7 rounds; 200,000 decisions
    python bench/bench_affinity.py --quick    # smoke: 500 items, 2 rounds; 20,000 decisions
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections.abc import Callable, Iterable

from scheduler.clock import FakeClock
from scheduler.dispatch.affinity import AffinityGate
from scheduler.dispatch.conn import Conn
from scheduler.dispatch.service import Dispatcher, _Item
from scheduler.execution import Trigger, dispatch, new_execution
from scheduler.ids import FencingToken
from scheduler.model import RetryPolicy
from scheduler.region.affinity import Affinity, AffinityPolicy, Mode
from scheduler.region.policy import RegionPolicy
from scheduler.store.keyspace import Keyspace
from scheduler.store.ledger import Ledger
from scheduler.store.memory.client import MemoryKV

HOME, ABROAD, POOL, TYPE = "a", "b", "p", "x"
TOKEN = FencingToken(0, 1)


class NoGate(AffinityGate):
    """Baseline: every stream may take everything; the pump takes its no-gate path (rule `any`)."""

    def rule(self, pool: str) -> tuple[Mode, float]:
        return Mode.ANY, 0.0

    def local_credit(self, pool: str, task_types: Iterable[str] = ()) -> None:
        pass


class TrivialGate(NoGate):
    """Baseline: the pump's per-item path (rule `prefer`) with a constant for the decision."""

    def rule(self, pool: str) -> tuple[Mode, float]:
        return Mode.PREFER, 0.0

    def wait_left(self, pool: str, task_type: str) -> float:
        return 0.0


def _policy(mode: Mode) -> RegionPolicy:
    return RegionPolicy(HOME, (ABROAD,), affinity=AffinityPolicy(default=Affinity(mode, 2000)))


def _median(fn: Callable[[], float], rounds: int) -> float:
    return statistics.median(fn() for _ in range(rounds))


# ---- decision ----------------------------------------------------------------------------------------


def _decision(mode: Mode, region: str, n: int) -> tuple[float, float, float]:
    """Seconds per predicate call: (gate, no gate, trivial check)."""
    clk = FakeClock()
    gate = AffinityGate(HOME, clk.monotonic)
    gate.configure(HOME, _policy(mode).affinity)
    clk.advance(10)  # prefer: past the wait (the remote stream is allowed, the cost is the full check)
    c = Conn("w", POOL, region, frozenset({TYPE}), asyncio.Queue())
    types = [TYPE] * n

    def timed(pred: Callable[[str], bool]) -> float:
        t0 = time.perf_counter()
        for t in types:
            pred(t)
        return (time.perf_counter() - t0) / n

    with_gate = timed(lambda t: c.runs(t) and gate.allows(c.region, c.pool, t))
    no_gate = timed(c.runs)
    trivial = timed(lambda t: c.runs(t) and c.region is not None)
    return with_gate, no_gate, trivial


# ---- pump ----------------------------------------------------------------------------------------------


def _items(n: int) -> list[_Item]:
    out = []
    for i in range(n):
        e = new_execution(id=f"s{i}@0", schedule_id=f"s{i}", tenant=f"t{i % 8}", pool=POOL, task_type=TYPE,
                          planned_ms=0, due_ms=0, trigger=Trigger.SCHEDULED, retry=RetryPolicy(), timeout_ms=10_000)
        out.append(_Item(dispatch(e, worker="", planner="p1", token=TOKEN, now_ms=0), b"{}", TOKEN))
    return out


def _pump_once(gate: Callable[[FakeClock], AffinityGate] | None, mode: Mode, region: str,
               items: list[_Item]) -> float:
    """Seconds per queued item for one pump that empties the queue onto one stream (or refuses it)."""
    clk = FakeClock()
    d = Dispatcher(node_id="p1", region=HOME, kv=MemoryKV(), ledger=Ledger(Keyspace("/b"), 4), clock=clk,
                   planners=lambda: [])
    if gate is not None:
        d.affinity = gate(clk)
    d.set_region_policy(_policy(mode))
    clk.advance(10)  # prefer: past the wait
    c = Conn("w", POOL, region, frozenset({TYPE}), asyncio.Queue(), credits=len(items))
    d.conns[0] = c
    for it in items:
        d.queue.put(POOL, it.e.tenant, TYPE, it)
    t0 = time.perf_counter()
    d._pump()
    took = time.perf_counter() - t0
    sent = len(items) - len(d.queue)
    assert sent == (0 if mode is Mode.STRICT and region != HOME and gate is None else len(items)), sent
    return took / len(items)


def _pump(mode: Mode, region: str, items: list[_Item], rounds: int) -> tuple[float, float, float]:
    def real() -> float:
        return _pump_once(None, mode, region, items)

    def none() -> float:
        return _pump_once(lambda clk: NoGate(HOME, clk.monotonic), mode, region, items)

    def trivial() -> float:
        return _pump_once(lambda clk: TrivialGate(HOME, clk.monotonic), mode, region, items)

    samples = [(real(), none(), trivial()) for _ in range(rounds)]  # interleaved: the load hits all three
    return tuple(statistics.median(s[i] for s in samples) for i in range(3))  # type: ignore[return-value]


CASES = [(Mode.PREFER, HOME, "local (any mode)"), (Mode.ANY, ABROAD, "remote any"),
         (Mode.PREFER, ABROAD, "remote prefer, wait over"), (Mode.STRICT, ABROAD, "remote strict (refused)")]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    n_items, rounds, n_calls = (500, 2, 20_000) if args.quick else (5_000, 7, 200_000)

    print(f"[decision] per predicate call, median of {rounds} rounds of {n_calls:,}")
    print(f"  {'stream':<28} {'gate ns':>8} {'no gate ns':>11} {'trivial ns':>11} {'/no gate':>9} {'/trivial':>9}")
    for mode, region, label in CASES:
        s = [_decision(mode, region, n_calls) for _ in range(rounds)]
        g, ng, tr = (statistics.median(x[i] for x in s) * 1e9 for i in range(3))
        print(f"  {label:<28} {g:8.0f} {ng:11.0f} {tr:11.0f} {g / ng:8.2f}x {g / tr:8.2f}x")

    items = _items(n_items)
    print(f"\n[pump] Dispatcher._pump() of {n_items:,} queued items onto one stream, µs per item, "
          f"median of {rounds} rounds")
    print(f"  {'stream':<28} {'gate µs':>8} {'no gate µs':>11} {'trivial µs':>11} {'/no gate':>9} {'/trivial':>9}")
    for mode, region, label in CASES:
        g, ng, tr = (x * 1e6 for x in _pump(mode, region, items, rounds))
        note = "  (sends nothing: a refusal, per queued item)" if mode is Mode.STRICT and region != HOME else ""
        print(f"  {label:<28} {g:8.2f} {ng:11.2f} {tr:11.2f} {g / ng:8.2f}x {g / tr:8.2f}x{note}")


if __name__ == "__main__":
    main()
