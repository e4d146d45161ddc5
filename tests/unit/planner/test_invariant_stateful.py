"""The product's one promise under random operations and faults, judged from recorded history.

A hypothesis state machine drives the real planner (PlannerNode routing and result bookkeeping, one
PartitionPlanner per planner process, rounds run with `step(now)` at chosen fake times) on the
in-memory etcd twin: operators create, update, pause, resume and delete schedules, trigger, backfill,
rerun, cancel and replay executions; fake workers complete, fail, run long, crash, never receive a
dispatch or lose their result's acknowledgement; planner processes are killed, frozen past their lease
and resumed, or hand over gracefully. After every step and at the end, tests/invariant.py checks the
ledger against the operation log and the workers' effects (see its docstring for the rules).

SCHED_FULL=1 runs many more and longer examples. SCHED_START_TIMEOUT_CHECK=0 leaves out undelivered
dispatches and the rule that they are retried within seconds (issue 9, item 4), for a build without a
start timeout; SCHED_CONFIRM_STARTS=1 makes the fake workers confirm each start (needed once a start
timeout exists). SCHED_IGNORE=<tags> (the [tag] of a violation) and SCHED_RULES_OFF=<rules> explore one
kind of trouble at a time. A failure prints the steps, the violations and the operation trace;
hypothesis prints a blob to reproduce it with @reproduce_failure.

The test_item* functions at the end are the issue's cases as fixed scenarios (shrunk counterexamples).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import sys
from collections.abc import Coroutine
from dataclasses import replace
from pathlib import Path
from typing import Any, TypeVar

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from scheduler.clock import FakeClock
from scheduler.execution import ExecState, Execution
from scheduler.ids import execution_id
from scheduler.planner.settings import PlannerSettings
from scheduler.store.etcd.ops import Compare, delete, put
from scheduler.store.keyspace import Keyspace
from scheduler.store.memory import MemoryKV
from scheduler.timeplan import MissedRuns, Overlap
from tests.invariant import (
    PARTITION,
    POOLS,
    SETTINGS,
    START_TIMEOUT_CHECK,
    T0,
    Behaviour,
    World,
    catch_up_after_a_pause_and_a_kill,
    default_policies,
    describe,
)

T = TypeVar("T")

FULL = os.environ.get("SCHED_FULL") == "1"
# Rules left out, for exploring one kind of trouble at a time (e.g. SCHED_RULES_OFF=kill_planner,freeze_planner).
OFF = frozenset(x.strip() for x in os.environ.get("SCHED_RULES_OFF", "").split(",") if x.strip())


def on(rule_name: str) -> bool:
    return rule_name not in OFF
MAX_SCHEDULES = 5

BEHAVIOURS: list[Behaviour] = ["ok", "fail_transient", "fail_permanent", "slow", "crash", "lost_ack"]
if START_TIMEOUT_CHECK:
    BEHAVIOURS.append("lost")
DURATION = {"ok": (100, 900), "fail_transient": (100, 500), "fail_permanent": (100, 500), "slow": (2_000, 12_000),
            "crash": (200, 2_000), "lost": (0, 0), "lost_ack": (100, 500)}

OPERATIONS = ["trigger", "backfill", "rerun", "cancel", "cancel_and_rerun", "replay"]
PICKABLE = {
    "rerun": frozenset({ExecState.SUCCEEDED, ExecState.CANCELLED, ExecState.SKIPPED, ExecState.FAILED}),
    "cancel": frozenset({ExecState.SCHEDULED, ExecState.DISPATCHED, ExecState.RUNNING, ExecState.RETRY_WAIT}),
    "cancel_and_rerun": frozenset({ExecState.DISPATCHED, ExecState.RUNNING}),
    "replay": frozenset({ExecState.DEAD_LETTER}),
}
FAULTS = ["kill_planner", "freeze_planner", "thaw_planner", "handover", "die_after_claim"]

periods = st.sampled_from([1, 2, 5])
missed_runs = st.sampled_from(list(MissedRuns))
overlaps = st.sampled_from([Overlap.SKIP, *Overlap])  # skip (the default) twice as often
pools = st.sampled_from(list(POOLS))
then = st.integers(0, 3_000) | st.just(0)  # time passing before an action


class PlannerInvariant(RuleBasedStateMachine):
    planner_settings = SETTINGS

    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.clock = FakeClock(wall_ms=T0)
        self.kv = MemoryKV(self.clock.monotonic)
        self.world = World(self.kv, self.clock, Keyspace("/inv"), current_revision=self.kv.current_revision,
                           settings=self.planner_settings)
        self.run(self.world.start())

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return self.loop.run_until_complete(coro)

    def pass_time(self, ms: int) -> None:
        """Time passes between operator actions too (most trouble needs it)."""
        if ms:
            self.run(self.world.advance(ms))

    def check(self, final: bool = False) -> None:
        bad = self.run(self.world.check(final=final))
        if bad:
            shown = "\n  ".join(bad[:15])
            more = f"\n  ... and {len(bad) - 15} more" if len(bad) > 15 else ""
            raise AssertionError(f"the invariant broke at t={self.clock.wall_ms() - T0} ms:\n  {shown}{more}\n"
                                 f"operations:\n{describe(self.world.log)}")

    # ---- schedules -------------------------------------------------------------------------------------

    @initialize(first=st.lists(st.tuples(periods, st.booleans(), pools, missed_runs, st.integers(1, 4),
                                         st.sampled_from([3, 8, 30, 3600]), overlaps), min_size=1, max_size=3),
                settle_ms=st.integers(0, 3_000))
    def some_schedules(self, first: list[tuple[int, bool, str, MissedRuns, int, int, Overlap]], settle_ms: int) -> None:
        """Every example starts with work to do (and a planner that has run for a while)."""
        self.run(self.world.advance(settle_ms))
        for period, every, pool, missed, cap, window_s, overlap in first:
            self.run(self.world.create(period, every, pool, default_policies(missed, cap, window_s, overlap)))

    @precondition(lambda self: on("create") and len(self.world.alive()) < MAX_SCHEDULES)
    @rule(then_ms=then, period=periods, every=st.booleans(), pool=pools, missed=missed_runs, cap=st.integers(1, 4),
          window_s=st.sampled_from([3, 8, 30, 3600]), overlap=overlaps)
    def create(self, then_ms: int, period: int, every: bool, pool: str, missed: MissedRuns, cap: int, window_s: int,
               overlap: Overlap) -> None:
        self.pass_time(then_ms)
        self.run(self.world.create(period, every, pool, default_policies(missed, cap, window_s, overlap)))

    @precondition(lambda self: on("recreate") and bool(self.world.deleted())
                  and len(self.world.alive()) < MAX_SCHEDULES)
    @rule(then_ms=then, data=st.data(), period=periods, every=st.booleans(), pool=pools, missed=missed_runs,
          cap=st.integers(1, 4), window_s=st.sampled_from([3, 8, 30, 3600]), overlap=overlaps)
    def recreate(self, then_ms: int, data: st.DataObject, period: int, every: bool, pool: str, missed: MissedRuns,
                 cap: int, window_s: int, overlap: Overlap) -> None:
        self.pass_time(then_ms)
        sid = data.draw(st.sampled_from(self.world.deleted()), label="schedule")
        self.run(self.world.recreate(sid, period, every, pool, default_policies(missed, cap, window_s, overlap)))

    @precondition(lambda self: on("update") and bool(self.world.alive()))
    @rule(then_ms=then, data=st.data(), period=st.none() | periods, pool=st.none() | pools,
          overlap=st.none() | overlaps, missed=st.none() | missed_runs)
    def update(self, then_ms: int, data: st.DataObject, period: int | None, pool: str | None, overlap: Overlap | None,
               missed: MissedRuns | None) -> None:
        self.pass_time(then_ms)
        sid = data.draw(st.sampled_from(self.world.alive()), label="schedule")
        self.run(self.world.update(sid, period_s=period, pool=pool, overlap=overlap, missed=missed))

    @precondition(lambda self: on("pause") and bool(self.world.alive()))
    @rule(then_ms=then, data=st.data())
    def pause(self, then_ms: int, data: st.DataObject) -> None:
        self.pass_time(then_ms)
        self.run(self.world.pause(data.draw(st.sampled_from(self.world.alive()), label="schedule")))

    @precondition(lambda self: on("resume") and bool(self.world.alive()))
    @rule(then_ms=then, data=st.data())
    def resume(self, then_ms: int, data: st.DataObject) -> None:
        self.pass_time(then_ms)
        self.run(self.world.resume(data.draw(st.sampled_from(self.world.alive()), label="schedule")))

    @precondition(lambda self: on("delete") and bool(self.world.alive()))
    @rule(then_ms=then, data=st.data(), cancel_running=st.booleans())
    def delete(self, then_ms: int, data: st.DataObject, cancel_running: bool) -> None:
        self.pass_time(then_ms)
        sid = data.draw(st.sampled_from(self.world.alive()), label="schedule")
        self.run(self.world.delete(sid, cancel_running))

    # ---- operator operations on executions (one rule, so that time passing stays a large share of steps) ----

    @precondition(lambda self: any(on(k) for k in OPERATIONS))
    @rule(then_ms=then, data=st.data(), kind=st.sampled_from(OPERATIONS), back_s=st.integers(1, 20))
    def operator(self, then_ms: int, data: st.DataObject, kind: str, back_s: int) -> None:
        """trigger, backfill, rerun, cancel, replay; and cancel_and_rerun, what an operator does to restart
        a run: cancel it, then rerun it at once."""
        self.pass_time(then_ms)
        if not on(kind):
            return
        alive = self.world.alive()
        if kind in ("trigger", "backfill"):
            if alive:
                sid = data.draw(st.sampled_from(alive), label="schedule")
                self.run(self.world.operate(kind, lambda es: None, sid=sid, back_s=back_s))
            return
        picked: list[Execution] = []

        def pick(es: list[Execution]) -> Execution | None:
            cands = [e for e in es if e.state in PICKABLE[kind]]
            if not cands:
                if isinstance(data, _Recorded):
                    data.nothing_to_pick()
                return None
            picked.append(data.draw(st.sampled_from(cands), label="execution"))
            return picked[-1]

        self.run(self.world.operate("cancel" if kind == "cancel_and_rerun" else kind, pick))
        if kind == "cancel_and_rerun" and picked and (first := picked[0]) is not None:  # None: a replay's pick gone
            self.run(self.world.operate("rerun", lambda es: next((e for e in es if e.id == first.id), None)))

    # ---- time and workers ----------------------------------------------------------------------------

    # Most trouble needs time to pass: three rules (of eleven) move the clock.
    @precondition(lambda self: on("advance"))
    @rule(ms=st.integers(100, 10_000))
    def advance(self, ms: int) -> None:
        self.run(self.world.advance(ms))

    @precondition(lambda self: on("advance"))
    @rule(ms=st.integers(100, 1_500))
    def tick(self, ms: int) -> None:
        self.run(self.world.advance(ms))

    @precondition(lambda self: on("advance"))
    @rule(ms=st.integers(1_000, 4_000))
    def wait(self, ms: int) -> None:
        self.run(self.world.advance(ms))

    @precondition(lambda self: on("workers_will"))
    @rule(then_ms=then, plan=st.lists(st.tuples(st.sampled_from(BEHAVIOURS), st.floats(0, 1)), min_size=1, max_size=4))
    def workers_will(self, then_ms: int, plan: list[tuple[Behaviour, float]]) -> None:
        """How the workers treat the next dispatches (default: complete in 300 ms)."""
        self.pass_time(then_ms)
        for b, frac in plan:
            lo, hi = DURATION[b]
            self.world.workers.plan.append((b, int(lo + (hi - lo) * frac)))
        self.world.log.ops.append(f"t={self.clock.wall_ms() - T0}: workers will {plan}")

    # ---- planner processes --------------------------------------------------------------------------

    @precondition(lambda self: any(on(k) for k in FAULTS))
    @rule(then_ms=then, kind=st.sampled_from(FAULTS), restart_after_ms=st.integers(0, 8_000))
    def planner_fault(self, then_ms: int, kind: str, restart_after_ms: int) -> None:
        """kill_planner (a standby claims once the lease expires, plus `restart_after_ms`), freeze_planner
        (SIGSTOP: its lease expires, a standby takes over), thaw_planner (SIGCONT: it resumes where it was
        and tries to write), handover (a graceful move to another planner), die_after_claim (the next
        standby to claim dies right after its claim's first write, before its first round)."""
        self.pass_time(then_ms)
        w, now = self.world, self.clock.wall_ms() - T0
        if not on(kind):
            return
        if kind == "kill_planner" and w.live is not None:
            w.log.ops.append(f"t={now}: kill planner (standby claims {restart_after_ms} ms after the lease expires)")
            self.run(w.kill(restart_after_ms))
        elif kind == "freeze_planner" and w.live is not None and not w.frozen:
            w.log.ops.append(f"t={now}: SIGSTOP planner")
            self.run(w.freeze())
        elif kind == "thaw_planner" and w.frozen:
            w.log.ops.append(f"t={now}: SIGCONT the frozen planner")
            self.run(w.thaw())
        elif kind == "die_after_claim" and w.die_after_claim is None:
            w.log.ops.append(f"t={now}: the next planner to claim dies after its claim's first write")
            w.die_after_claim = restart_after_ms
        elif kind == "handover" and w.live is not None:
            w.log.ops.append(f"t={now}: graceful handover to another planner")
            self.run(w.handover())

    # ---- checks --------------------------------------------------------------------------------------

    @invariant()
    def invariant_holds(self) -> None:
        self.check()

    def teardown(self) -> None:
        if os.environ.get("SCHED_DEBUG"):  # how much each example did
            print(f"ops={len(self.world.log.ops)} effects={len(self.world.log.effects)} "
                  f"t={self.clock.wall_ms() - T0} {[o.split(':')[1][:12] for o in self.world.log.ops]}",
                  file=sys.stderr)
        try:
            # Let everything settle (runs finish, outages end, retries happen), then judge once more.
            self.run(self.world.advance(15_000))
            self.world.log.ops.append(f"t={self.clock.wall_ms() - T0}: (end: 15 s later)")
            self.check(final=True)
        finally:
            self.run(self._close())
            self.loop.close()

    async def _close(self) -> None:
        await self.world.close()
        await self.kv.close()
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


PlannerInvariant.TestCase.settings = settings(
    max_examples=400 if FULL else 40,
    stateful_step_count=80 if FULL else 30,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

# The random machine runs in the full mode (SCHED_FULL=1): it keeps finding cases, each fixed (with
# its shrunk counterexample kept below as a fixed scenario) or, where the checker's model of timing was
# too strict, answered in the checker. Issue 9's session-4 note lists the ones still open, so that CI
# stays a verdict on what is fixed; the fixed scenarios below, one or more per finding, always run.
# 400 machines of 80 steps take longer than the suite's 300 s per-test timeout on this machine (measured:
# the timeout cut a full-mode run mid-search, and Hypothesis then reported it as a flaky strategy).
TestPlannerInvariant = pytest.mark.timeout(1800)(pytest.mark.slow(PlannerInvariant.TestCase))


class PlannerInvariantAhead(PlannerInvariant):
    """The same machine with start ahead on (runs handed to workers up to 1 s before their due time)."""

    planner_settings = replace(SETTINGS, start_ahead_ms=1_000)


PlannerInvariantAhead.TestCase.settings = PlannerInvariant.TestCase.settings
TestPlannerInvariantAhead = pytest.mark.timeout(1800)(pytest.mark.slow(PlannerInvariantAhead.TestCase))


# ---- the cases as fixed scenarios (the shrunk counterexamples, kept so they are always run) ----

async def _world(settings: PlannerSettings = SETTINGS) -> tuple[World, MemoryKV]:
    clock = FakeClock(wall_ms=T0)
    kv = MemoryKV(clock.monotonic)
    w = World(kv, clock, Keyspace("/scn"), current_revision=kv.current_revision, settings=settings)
    await w.start()
    return w, kv


async def _judge(w: World, kv: MemoryKV) -> None:
    try:
        await w.advance(15_000)
        bad = await w.check(final=True)
        assert not bad, "\n".join(bad[:15]) + "\noperations:\n" + describe(w.log)
    finally:
        await w.close()
        await kv.close()


SKIP_1S = default_policies(MissedRuns.SKIP, 1, 3, Overlap.SKIP)


async def test_item1_delete_with_runs_written_ahead_does_not_wedge_the_partition() -> None:
    w, kv = await _world()
    await w.create(1, False, "a", SKIP_1S)
    await w.create(2, False, "b", SKIP_1S)
    await w.advance(777)
    await w.delete("s1", False)
    await w.advance(3_000)
    await _judge(w, kv)


async def test_item1_pausing_a_schedule_with_a_backlog_does_not_wedge_the_partition() -> None:
    w, kv = await _world()
    await w.create(1, False, "nobody", SKIP_1S)  # the issue's `nowork`
    await w.create(2, False, "a", SKIP_1S)
    await w.advance(5_000)
    await w.pause("s1")
    await w.advance(5_000)
    await _judge(w, kv)


async def test_item2_planned_times_within_lookahead_after_create_run() -> None:
    w, kv = await _world()
    await w.advance(100)
    await w.create(1, False, "a", SKIP_1S)
    await w.advance(3_777)
    await _judge(w, kv)


async def test_item3_catch_up_after_a_takeover_runs_the_cap_without_overlap_skips() -> None:
    w, kv = await _world()
    await w.create(1, False, "a", default_policies(MissedRuns.ALL, 3, 30, Overlap.SKIP))
    await w.advance(2_000)
    await w.kill(restart_after_ms=5_000)  # 8 s without an owner: beyond the late grace
    await w.advance(10_000)
    await _judge(w, kv)


async def test_item4_an_undelivered_dispatch_is_retried_within_seconds() -> None:
    if not START_TIMEOUT_CHECK:
        return
    w, kv = await _world()
    w.workers.plan.append(("lost", 0))
    await w.create(5, False, "a", SKIP_1S)
    await w.advance(12_000)
    await _judge(w, kv)


async def test_item8_a_pool_without_workers_does_not_stop_the_other_pools() -> None:
    w, kv = await _world()
    await w.create(1, False, "nobody", default_policies(MissedRuns.SKIP, 1, 3, Overlap.ALLOW_ALL))
    await w.create(2, False, "a", SKIP_1S)
    await w.advance(30_000)
    await _judge(w, kv)


async def test_item8_runs_written_under_a_wrong_pool_follow_the_fix() -> None:
    w, kv = await _world()
    await w.create(2, False, "a", SKIP_1S)
    await w.advance(1_000)
    await w.update("s1", pool="nobody")
    await w.advance(4_000)
    await w.update("s1", pool="a")
    await w.advance(10_000)
    await _judge(w, kv)


async def test_runs_written_under_a_wrong_pool_follow_the_fix_across_a_handover() -> None:
    """The full-mode machine's counterexample (session 17), shrunk by hand: a spec change moves the schedule
    from `nobody` to pool b; the runs already written ahead in `nobody` were retargeted in the owner's memory
    only, and after two handovers the new owner read them in `nobody`, where nobody took them."""
    w, kv = await _world()
    await w.create(1, True, "a", SKIP_1S)
    await w.create(1, True, "a", SKIP_1S)
    await w.advance(6_800)
    await w.update("s1", period_s=1, pool="nobody", missed=MissedRuns.SKIP)
    await w.advance(400)
    await w.update("s2", period_s=1, pool="a", missed=MissedRuns.SKIP)
    await w.advance(700)
    await w.update("s2", pool="b")
    await w.advance(560)
    await w.update("s1", period_s=2, pool="nobody", overlap=Overlap.ALLOW_ALL)
    await w.update("s1", pool="b", overlap=Overlap.SKIP, missed=MissedRuns.ALL)
    await w.advance(1_200)
    await w.handover()
    await w.advance(1_200)
    await w.handover()
    await w.advance(10_000)
    await _judge(w, kv)


async def test_a_spec_change_that_fixes_the_pool_moves_the_runs_written_ahead() -> None:
    """The full-mode machine (session 17), no handover at all: the new activation planned 00:00:04 again,
    the create found the record written ahead in `nobody` and read it back over the retargeted one."""
    w, kv = await _world()
    await w.advance(406)
    await w.create(1, False, "a", SKIP_1S)
    await w.create(1, False, "a", SKIP_1S)
    await w.advance(1_556)
    await w.update("s1", period_s=1, pool="nobody", missed=MissedRuns.SKIP)
    await w.advance(1_526)
    await w.update("s1", period_s=2, pool="a")
    await w.advance(10_000)
    await _judge(w, kv)


async def test_item9_a_cancelled_run_is_not_started_again_before_it_stopped() -> None:
    w, kv = await _world()
    w.workers.plan.append(("slow", 10_000))
    await w.create(5, False, "a", SKIP_1S)
    await w.advance(5_500)
    running = [e for e in await w.executions() if e.state in (ExecState.DISPATCHED, ExecState.RUNNING)]
    assert running, "the first run is out"
    await w.operate("cancel", lambda es: next(e for e in es if e.id == running[0].id))
    await w.operate("rerun", lambda es: next(e for e in es if e.id == running[0].id))
    await w.advance(2_000)
    await _judge(w, kv)


async def test_item9_cancel_other_starts_the_next_run_only_once_the_old_one_stopped() -> None:
    w, kv = await _world()
    w.workers.plan.extend([("slow", 12_000)] * 3)
    await w.create(2, False, "a", default_policies(MissedRuns.SKIP, 1, 3, Overlap.CANCEL_OTHER))
    await w.advance(6_000)
    await _judge(w, kv)


async def test_item10_a_spec_update_withdraws_the_old_specs_runs() -> None:
    w, kv = await _world()
    await w.create(1, False, "a", SKIP_1S)
    await w.advance(3_000)
    await w.update("s1", period_s=5)
    await w.advance(6_000)
    await _judge(w, kv)


async def test_item11_a_graceful_handover_loses_no_run() -> None:
    w, kv = await _world()
    await w.create(1, False, "a", SKIP_1S)
    await w.create(1, True, "b", SKIP_1S)
    await w.advance(1_000)  # the runs of :01 are out
    await w.handover()  # their results come through the next owner, after the workers reconnect
    await w.advance(5_000)
    await _judge(w, kv)


async def test_a_pause_and_resume_at_the_same_instant_lose_no_run() -> None:
    """Found by the machine: the runs written ahead were withdrawn as paused though they are owed after
    the resume."""
    w, kv = await _world()
    for _ in range(3):
        await w.create(1, False, "a", SKIP_1S)
    await w.advance(3_701)
    await w.pause("s1")
    await w.resume("s1")
    await w.advance(5_000)
    await _judge(w, kv)


@pytest.mark.parametrize("gap_ms", [0, 300])
async def test_a_schedule_deleted_and_created_again_owes_its_own_planned_times(gap_ms: int) -> None:
    """An audit, then the machine: the new schedule's first planned times were skipped as `schedule_deleted`,
    the deleted one's runs written ahead under the same ids (withdrawn before the create: revived; withdrawn
    after it, in the same round: the withdrawal took them)."""
    w, kv = await _world()
    for _ in range(3):
        await w.create(1, False, "a", SKIP_1S)
    await w.advance(1_300)
    await w.delete("s1", False)
    await w.advance(gap_ms)
    await w.recreate("s1", 1, False, "a", SKIP_1S)
    await w.advance(3_000)
    await _judge(w, kv)


async def test_a_delete_a_create_and_a_delete_of_one_id_while_nobody_owns_the_partition_lose_no_time() -> None:
    """Found by the machine: the second delete's tombstone overwrote the first's, whose planned time at the
    first delete's instant was then recorded by nobody."""
    w, kv = await _world()
    await w.advance(777)
    for _ in range(3):
        await w.create(1, False, "a", SKIP_1S)
    await w.advance(100)
    await w.delete("s1", False)
    w.log.ops.append(f"t={w.clock.wall_ms() - T0}: kill planner (standby claims 0 ms after the lease expires)")
    await w.kill(0)
    await w.recreate("s1", 1, False, "a", SKIP_1S)
    await w.delete("s1", False)
    await w.advance(3_000)
    await _judge(w, kv)


async def test_a_run_owed_again_by_a_schedule_created_again_and_deleted_before_it_came_back_stays_withdrawn(
        ) -> None:
    """Found by the machine: the new schedule (its pool without workers) owed a time the deleted one had written
    ahead, and was deleted before that record was revived: the delete's withdrawal had passed it (still
    skipped), then the revive made it scheduled for a schedule that no longer existed, for good."""
    w, kv = await _world()
    for _ in range(3):
        await w.create(1, False, "a", SKIP_1S)
    await w.advance(441)
    await w.delete("s2", False)
    await w.advance(819)
    await w.recreate("s2", 1, False, "nobody", SKIP_1S)
    await w.advance(1)
    await w.delete("s1", False)
    await w.advance(300)
    await w.delete("s2", False)
    await w.advance(3_317)
    await _judge(w, kv)


async def test_runs_of_a_deleted_schedule_moved_to_a_new_schedules_idle_pool_are_withdrawn_at_the_claim() -> None:
    """Found by the machine: deleted while its owner was dead and created again (every 5 s, into a pool without
    workers) before the next claim, the old schedule's run written ahead followed the new pool, where no
    dispatch round ever saw it due, and stayed scheduled for good."""
    w, kv = await _world()
    for _ in range(3):
        await w.create(1, False, "a", SKIP_1S)
    await w.advance(2_300)
    w.log.ops.append(f"t={w.clock.wall_ms() - T0}: kill planner (standby claims 3000 ms after the lease expires)")
    await w.kill(3_000)
    await w.delete("s2", False)
    await w.advance(1_292)
    await w.recreate("s2", 5, False, "nobody", default_policies(MissedRuns.ALL, 4, 8, Overlap.SKIP))
    await w.advance(12_000)
    await _judge(w, kv)


async def test_several_changes_while_the_partition_has_no_owner_lose_no_planned_time() -> None:
    """Found by the machine: with one previous activation kept, the planned times of the activations in
    between (here every 2 s, then paused) were neither run nor recorded."""
    w, kv = await _world()
    await w.create(1, False, "a", SKIP_1S)
    await w.advance(2_000)
    await w.kill(restart_after_ms=12_000)
    await w.advance(1_500)
    await w.update("s1", period_s=2)
    await w.advance(3_000)
    await w.pause("s1")
    await w.advance(3_000)
    await w.resume("s1")
    await w.advance(2_000)
    await w.update("s1", period_s=3)
    await w.advance(10_000)
    await _judge(w, kv)


async def test_a_claim_that_dies_after_its_first_write_loses_no_planned_time() -> None:
    """A full game day's silent miss, on the twin: the owner dies; a pause lands while nobody owns the
    partition; the next owner owes the activation the dead one knew, up to the pause, and dies right after
    its claim's first write, which moved the checkpoint. Those planned times must be in that write: the
    owner after it owes nothing before the pause (fails when the claim leaves them for its first round)."""
    w, kv = await _world()
    await w.create(1, False, "a", SKIP_1S)
    await w.advance(2_000)
    await w.kill(restart_after_ms=8_000)  # the next claim comes when the pause is older than the late grace
    await w.advance(6_000)  # past the dead owner's watermark (lookahead 2 s): times it never wrote
    await w.pause("s1")
    w.die_after_claim = 2_000
    await w.advance(20_000)
    await _judge(w, kv)


async def test_a_backlog_buffered_behind_a_slow_run_does_not_stop_its_pools_other_schedules() -> None:
    """Found by the machine: the runs buffered behind a slow one were the oldest ready work of their pool
    (capacity 2), taken and put back every round, so another schedule of that pool never ran."""
    w, kv = await _world()
    w.workers.plan.append(("slow", 12_000))
    await w.create(1, False, "b", default_policies(MissedRuns.SKIP, 1, 3, Overlap.BUFFER_ALL))
    await w.advance(4_000)  # the slow run holds one worker of two; its later runs queue behind it
    await w.create(1, False, "b", SKIP_1S)
    await w.advance(6_000)  # judged while the slow run still holds its worker
    bad = await w.check()
    assert not bad, "\n".join(bad[:15])
    await _judge(w, kv)


async def test_runs_waiting_for_a_cancelled_run_to_stop_do_not_stop_their_pools_other_schedules() -> None:
    """Found by the machine: under cancel_other, the runs waiting for a cancelled run to confirm its stop
    (up to the worker's cancel grace) were the oldest ready work of their pool, taken and put back every
    round, so another schedule of that pool (and the schedule's own retry) waited as long."""
    w, kv = await _world()
    w.workers.plan.append(("slow", 12_000))
    await w.create(1, False, "b", default_policies(MissedRuns.SKIP, 1, 3, Overlap.CANCEL_OTHER))
    await w.advance(1_500)  # the slow run is out; the next one cancels it and waits for the stop
    await w.create(1, False, "b", SKIP_1S)  # one worker of pool b is free all along
    await w.advance(5_200)  # judged while the cancelled run is still stopping (until 7.5 s)
    bad = await w.check()
    assert not bad, "\n".join(bad[:15])
    await _judge(w, kv)


async def test_schedules_deleted_while_the_partition_has_no_owner_leave_no_planned_time_unrecorded() -> None:
    """Found by the machine ([gap] on a pool-`nobody` schedule deleted during a planner kill): the planned
    times between the dead owner's checkpoint (or the schedule's hold) and the delete had no record at all.
    The next owner records them from the tombstone as `schedule_deleted`, up to the delete's instant the
    tombstone carries, but the store's delete left that instant at 0 unless told (the API tells it, the
    World did not), and a tombstone at 0 recorded nothing."""
    w, kv = await _world()
    await w.create(1, False, "nobody", SKIP_1S)  # held since its backlog outgrew backlog_ms
    await w.create(1, False, "a", SKIP_1S)
    await w.advance(6_000)
    await w.kill(restart_after_ms=3_000)  # no owner from t=6 s to t=12 s
    await w.advance(4_000)  # past the runs the dead owner wrote ahead
    await w.delete("s1", False)
    await w.delete("s2", False)
    await w.advance(6_000)
    await _judge(w, kv)


async def test_a_tombstone_that_does_not_say_when_still_records_the_planned_times_up_to_the_delete() -> None:
    """A tombstone without its delete's instant (a writer that left it out) is read as a delete no later
    than the takeover: the planned times from the checkpoint on are recorded, not lost."""
    w, kv = await _world()
    await w.create(1, False, "a", SKIP_1S)
    await w.advance(3_000)
    await w.kill(restart_after_ms=3_000)
    await w.advance(4_000)
    st = await w.node.store.get("s1")
    key = w.ks.schedule(PARTITION, "s1")
    cur = await kv.get(key)
    assert cur is not None
    stone = json.dumps({"rev": cur.mod_revision, "schedule": json.loads(cur.value)}).encode()  # no deleted_ms
    await kv.txn([Compare.mod_revision(key, "==", st.schedule.version)],
                 [delete(key), put(w.ks.tombstone(PARTITION, "s1"), stone)])
    w._version("s1", "deleted", None, w.clock.wall_ms())
    await w.settle()
    await w.advance(6_000)
    await _judge(w, kv)


async def test_a_run_due_before_a_pause_undone_at_once_is_withdrawn_as_paused() -> None:
    """Found by the machine, a checker fix: the run due at 3 s had not started when the pause came at 3.1 s;
    the pause withdraws it (overdue runs too), and the owner, seeing the pause and the resume in one round,
    writes that skip after the resume. The checker asked for the schedule to be paused when the skip was
    written or at the planned time, neither of which holds; paused in between is what justifies it."""
    w, kv = await _world()
    await w.advance(434)
    await w.create(1, False, "a", SKIP_1S)
    await w.advance(2_544)  # t=2978, wall 3.101 s: the run of 3 s waits for the next round
    await w.pause("s1")
    await w.resume("s1")
    await w.advance(3_000)
    await _judge(w, kv)


async def test_runs_written_ahead_of_a_delete_wait_for_the_next_owner_to_withdraw_them() -> None:
    """Found by the machine, a checker fix: a schedule deleted just before its planner was killed keeps its
    runs written ahead as `scheduled` while the partition has no owner (nobody may write then); the checker
    judged them [not-withdrawn] during the outage. The next owner withdraws them at its claim."""
    w, kv = await _world()
    await w.create(1, True, "a", SKIP_1S)
    await w.advance(5_000)
    await w.delete("s1", False)
    await w.kill(restart_after_ms=5_000)  # before the owner's next round: nobody withdrew s1's runs
    await w.advance(4_000)  # judged while the partition has no owner
    bad = await w.check()
    assert not bad, "\n".join(bad[:15])
    await w.advance(6_000)  # the next owner has claimed
    await _judge(w, kv)


async def test_a_create_the_dead_owners_checkpoint_did_not_see_is_caught_up_from_its_instant() -> None:
    """Found by the machine, a checker fix: the owner's round at t=0 checkpointed up to 2 s ahead (its
    lookahead); s1 was created just after that round and the planner killed before the next. The next owner
    owes s1's planned times from its create, not from the watermark (its writer never saw the create), and
    records the one at 1 s, behind the late grace at its claim, as `policy_skip`. The checker counted the
    catch-up from the watermark for every activation, so it expected nothing there."""
    w, kv = await _world()
    await w.advance(0)  # a round: the checkpoint goes to t=2 s
    await w.create(1, False, "a", SKIP_1S)
    await w.kill(restart_after_ms=3_313)  # claimed at t=6.3 s: the planned time at 1 s is past the late grace
    await w.advance(6_500)
    bad = await w.check()
    assert not bad, "\n".join(bad[:15])
    await _judge(w, kv)


async def test_an_operators_rerun_of_a_time_skipped_as_paused_is_not_a_run_left_unwithdrawn() -> None:
    """Found by the machine, a checker fix: a rerun makes a planned time the pause skipped `scheduled` again
    (trigger rerun), and the check right after it called that a pre-written run not withdrawn."""
    w, kv = await _world()
    await w.create(1, False, "a", SKIP_1S)
    await w.advance(2_000)
    await w.pause("s1")
    await w.advance(3_000)
    await w.resume("s1")
    await w.advance(3_000)
    skipped = next(e for e in await w.executions() if e.state is ExecState.SKIPPED and e.skip_reason == "paused"
                   and e.planned_ms < w.clock.wall_ms() - 4_000)
    await w.operate("rerun", lambda es: next(e for e in es if e.id == skipped.id))
    bad = await w.check()
    assert not bad, "\n".join(bad[:15])
    await _judge(w, kv)


async def test_runs_parked_behind_a_run_in_flight_are_decided_again_when_the_overlap_policy_changes() -> None:
    """The game day: a skip schedule of 3.5 s runs every 2 s had a run parked behind the one in flight when an
    update made it allow_all; the later runs started at once, one always in flight, and the parked run waited
    for a moment with nothing in flight that never came: unstarted at the end, 72 s after its time."""
    w, kv = await _world()
    w.workers.plan.extend([("slow", 1_600)] * 40)
    await w.create(1, False, "a", default_policies(MissedRuns.SKIP, 1, 3, Overlap.BUFFER_ALL))
    await w.advance(3_500)  # runs queue behind the slow one
    await w.update("s1", overlap=Overlap.ALLOW_ALL)
    await w.advance(12_000)  # every run 1.6 s, one a second: always one in flight
    bad = await w.check()
    assert not bad, "\n".join(bad[:15]) + "\noperations:\n" + describe(w.log)
    await _judge(w, kv)


async def test_a_takeover_catch_up_does_not_skip_a_time_that_already_ran() -> None:
    """Found by the machine (full mode): two skip schedules, one paused, the planner killed; the next owner's
    catch-up wrote a `policy_skip` range over a planned time of the other schedule that had already run."""
    w, kv = await _world()
    await catch_up_after_a_pause_and_a_kill(w)
    await _judge(w, kv)


async def test_a_pause_at_a_kill_with_claims_dying_after_their_first_write_withdraws_the_runs_ahead() -> None:
    """Found by the machine (full mode): a pause at the instant the owner is killed, and the next two owners
    each die right after their claim's first write; a run written ahead of the pause stayed `scheduled`."""
    w, kv = await _world()
    await w.create(1, False, "a", SKIP_1S)
    await w.advance(2_641)
    await w.pause("s1")
    await w.kill(restart_after_ms=0)
    w.die_after_claim = 0
    await w.advance(3_237)
    bad = await w.check()
    assert not bad, "\n".join(bad[:15]) + "\noperations:\n" + describe(w.log)
    await _judge(w, kv)


@pytest.mark.parametrize("overlap", [Overlap.SKIP, Overlap.BUFFER_ONE, Overlap.BUFFER_ALL])
async def test_a_run_waiting_for_its_retry_holds_the_runs_due_while_its_attempt_ran(overlap: Overlap) -> None:
    """Two game days (gd-s17a/b): a run's attempt failed (or its worker was lost) and went to retry_wait; the run
    buffered behind it was released at once and ran beside the retry. A run on its retry is the same run."""
    w, kv = await _world()
    w.workers.plan.extend([("fail_transient", 1_800), ("ok", 900), ("ok", 300)])
    await w.create(1, False, "a", default_policies(MissedRuns.SKIP, 1, 3, overlap))
    await w.advance(6_000)
    bad = await w.check()
    assert not bad, "\n".join(bad[:15]) + "\noperations:\n" + describe(w.log)
    await _judge(w, kv)


@pytest.mark.parametrize("between_ms", [0, 250])
async def test_a_pause_a_spec_change_and_a_resume_withdraw_the_old_specs_runs(between_ms: int) -> None:
    """Found by the machine (full mode): pause, change the spec to every 2 s and resume, all before the owner's
    next round; the run written ahead for 1 s, which the new spec does not plan, ran. (Also with a round
    between the operations.)"""
    w, kv = await _world()
    await w.create(1, False, "a", SKIP_1S)
    await w.advance(300)
    await w.pause("s1")
    await w.advance(between_ms)
    await w.update("s1", period_s=2)
    await w.advance(between_ms)
    await w.resume("s1")
    await w.advance(700)
    bad = await w.check()
    assert not bad, "\n".join(bad[:15]) + "\noperations:\n" + describe(w.log)
    await _judge(w, kv)


async def test_a_backfills_buffered_runs_do_not_hold_the_pools_free_slot() -> None:
    """Found by the machine (full mode), kept as found: a backfill's runs (buffer_all, all due at once) came
    before every other run of their pool; with one slot free (a slow run in the other), each round took one of
    them, put it behind the backfill run in flight, and stopped there: the pool's other schedules waited 16
    rounds and more."""
    w, kv = await _world()
    await w.advance(406)
    await w.create(1, False, "a", SKIP_1S)
    await w.create(1, False, "a", SKIP_1S)
    await w.advance(1_558)
    await w.pause("s2")
    await w.create(1, True, "a", default_policies(MissedRuns.ALL, 2, 3600, Overlap.CANCEL_OTHER))
    await w.advance(1_053)
    await w.pause("s1")
    await w.advance(185)
    await w.operate("cancel", lambda es: next((e for e in es if e.id == "s1@2026-01-01T00:00:03.000Z"), None))
    await w.advance(1_396)
    w.workers.plan.extend([("slow", 4_623), ("ok", 368)])
    await w.advance(2_673)
    await w.freeze()
    await w.resume("s2")
    await w.advance(3_085)
    await w.operate("backfill", lambda es: None, sid="s3", back_s=16)
    await w.advance(260)
    await w.delete("s1", False)
    await w.advance(775)
    await w.update("s3", period_s=2, pool="a", overlap=Overlap.ALLOW_ALL)
    await w.advance(2_758)
    await w.handover()
    await w.advance(2_378)
    bad = await w.check()
    assert not bad, "\n".join(bad[:15]) + "\noperations:\n" + describe(w.log)
    await _judge(w, kv)


async def test_runs_due_while_a_lost_dispatch_waits_for_its_retry_are_decided() -> None:
    """Found by the machine (full mode) on the retry-holds change: a dispatch no worker received timed out into
    retry_wait; the skip schedule's runs due while it was out waited for a confirming read of it, which only
    ever confirmed runs in flight, so they were taken, put back and asked about every round, in front of their
    pool's other schedules, which stopped running for good."""
    w, kv = await _world()
    await w.create(2, True, "a", default_policies(MissedRuns.ALL, 4, 3, Overlap.BUFFER_ALL))
    await w.create(1, False, "a", SKIP_1S)
    await w.advance(100)
    await w.create(1, False, "a", SKIP_1S)
    await w.operate("backfill", lambda es: None, sid="s1", back_s=8)
    await w.advance(3_937)
    w.workers.plan.extend([("lost", 0), ("fail_permanent", 144), ("fail_transient", 196)])
    await w.advance(692)
    await w.pause("s1")
    await w.advance(2_739)
    await w.freeze()
    await w.create(2, True, "a", default_policies(MissedRuns.ALL, 2, 30, Overlap.ALLOW_ALL))
    await w.advance(148)
    await w.delete("s1", True)
    await w.advance(5_811)
    bad = await w.check()
    assert not bad, "\n".join(bad[:15]) + "\noperations:\n" + describe(w.log)
    await _judge(w, kv)


async def test_a_lost_dispatch_is_given_up_by_the_first_owner_to_have_a_round() -> None:
    """Found by the machine (full mode), a checker fix: a dispatch no worker received, then the planner killed
    and the next claim dying after its first write; the start timeout passed while no owner had a round, and
    the owner after gave the attempt up at its claim. The checker counted the timeout from the dispatch alone."""
    w, kv = await _world()
    await w.create(1, False, "a", SKIP_1S)
    await w.advance(1_958)
    w.workers.plan.append(("lost", 0))
    await w.advance(100)
    await w.create(1, False, "a", SKIP_1S)
    await w.advance(1_438)
    await w.pause("s1")
    await w.kill(restart_after_ms=0)
    await w.advance(620)
    w.die_after_claim = 0
    await w.advance(1_611)
    await w.update("s1", period_s=1)
    await w.advance(2_274)
    bad = await w.check()
    assert not bad, "\n".join(bad[:15]) + "\noperations:\n" + describe(w.log)
    await _judge(w, kv)


# ---- counterexamples the machine could not shrink, replayed step for step from their printout ----------------

CASES = Path(__file__).parent / "cases"


class _Recorded:
    """`data.draw` answered from the recorded draws (a schedule id, or the id of the execution picked)."""

    def __init__(self, draws: list[tuple[str, Any]]) -> None:
        self.draws = draws

    def draw(self, strategy: Any, label: str | None = None) -> Any:
        if label == "execution" and (not self.draws or self.draws[0][0] != "execution"):
            return None  # nothing was pickable in the recorded run; something is now (the planner changed since)
        kind, value = self.draws.pop(0)
        if kind == "execution":
            # None (nothing picked) when the planner has changed since and that run is not pickable now.
            return next((e for e in strategy.elements if e.id == value), None)
        return value

    def nothing_to_pick(self) -> None:
        """Nothing is pickable now: the pick the recorded run made is dropped, not taken by the next draw."""
        if self.draws and self.draws[0][0] == "execution":
            self.draws.pop(0)


def _replay(case: str) -> None:
    """Run a recorded failing example (Hypothesis's printout of the steps, kept in `cases/`) on the machine."""
    recorded = json.loads((CASES / case).read_text())
    data = _Recorded([tuple(d) for d in recorded["draws"]])
    machine = PlannerInvariant()
    names = {"state": machine, "data": lambda: data, "MissedRuns": MissedRuns, "Overlap": Overlap}
    try:
        for step in recorded["steps"]:
            step = re.sub(r"<(MissedRuns|Overlap)\.(\w+): '\w+'>", r"\1.\2", step).replace("data(...)", "data()")
            eval(step, {"__builtins__": {}}, names)  # our own recorded steps (cases/), not input
    except BaseException:
        with contextlib.suppress(Exception):
            machine.run(machine._close())
        machine.loop.close()
        raise
    machine.teardown()


def test_a_hold_of_a_deleted_schedule_is_not_applied_to_the_one_created_again() -> None:
    """Found by the machine (session 27, 124 steps): s6 (`*/5`, pool without workers) was held, then deleted and
    created again (every second, a served pool) with a graceful handover at that instant. The claim took the old
    schedule's hold for the new one's and caught up its held times under the new policies: s6@37 and s6@38,
    before the new schedule's creation, were written as runs of it. A hold from before a schedule's creation is
    now left to the deleted one's tombstone."""
    _replay("hold_of_a_deleted_schedule_at_a_handover.json")


def test_a_cancel_by_a_delete_the_id_was_created_again_after_is_the_deletes() -> None:
    """Found by the machine (session 27): a delete with cancel_running, and a create of the same id at that
    instant; the cancel was written after the create, and the checker took it for nobody's (a checker fix:
    a delete between the planned time and the write accounts for it, as a pause does)."""
    _replay("cancel_at_a_delete_and_create_of_one_id.json")


def test_a_run_owed_again_is_revived_before_a_pause_seen_since_is_applied() -> None:
    """Found by the machine (session 27): a schedule deleted and created again several times; the new one owed a
    time the old one had written ahead and the delete had withdrawn. The revive was queued for the next dispatch
    pass, a pause and a resume were applied first (passing the record by while it was still skipped), and then
    the revive made s1@15 scheduled for a time the pause owned, for good. Revives are now committed in the round
    that finds them, so a later pause withdraws them as any waiting run."""
    _replay("revive_after_a_pause_of_a_recreated_schedule.json")


def test_a_lost_dispatch_timed_out_while_no_owner_lived_skips_nothing() -> None:
    """Found by the machine (full mode, session 23; 160 steps it could not shrink): s3 (`* * * * * *`, skip) had a
    dispatch no worker received; every owner for the next 23 s died before its first round (kills, claims dying
    after their first write), so the next that lived found the attempt past its deadline and timed it out as if
    it had run until then: s3@40..53 were skipped as overlapped by a run that never began. Now ended never-started
    (tests/store: test_a_dispatch_lost_while_no_owner_is_ended_never_started_and_skips_nothing)."""
    _replay("lost_dispatch_timed_out_while_no_owner.json")


def test_a_worker_crash_noticed_while_the_owner_was_frozen_is_reported_when_it_resumes() -> None:
    """Found by the machine (full mode, session 24; 160 steps): s8's attempt ran on a worker that crashed; its
    heartbeat timeout came while the owner was frozen (SIGSTOP, resumed within its lease). The twin delivered the
    loss into a node without the planner, where it was dropped, so the attempt stayed RUNNING until its deadline
    and s8@50..56 (`skip`) were skipped as overlapped by it. A real owner's watchdog is stopped with its process
    and fires when it resumes: the twin now reports such losses at the thaw (a checker fix, not the product's)."""
    _replay("worker_crash_noticed_while_the_owner_was_frozen.json")


def test_a_run_written_ahead_of_a_pause_the_dead_owner_knew_is_not_run_after_a_resume_and_a_change() -> None:
    """Found by the machine (full mode), 161 steps it could not shrink: the owner saw a pause of s3 and left the
    run it had written ahead for 38 s to its dispatch round, to skip once due; it was killed first, and a
    resume and a spec change landed while nobody owned the partition. The next owner withdrew only runs after
    the first change it had not seen (and only when that was behind the watermark), so s3@38, planned while
    paused, ran."""
    _replay("paused_run_after_takeover.json")


async def test_a_failed_attempt_whose_result_came_late_does_not_make_an_overlap_skip() -> None:
    """Found by the machine (full mode) on the retry-holds change: an attempt failed after 0.1 s while its owner
    was being killed; its result was recorded late, and the run, waiting for its retry, was taken as having
    run until then, so the run due in between was skipped as an overlap though nothing ran at its time."""
    w, kv = await _world()
    await w.create(1, False, "a", SKIP_1S)
    await w.advance(1_900)
    w.workers.plan.append(("fail_transient", 100))
    await w.advance(100)
    await w.kill(restart_after_ms=0)
    w.die_after_claim = 0
    await w.advance(6_000)
    bad = await w.check()
    assert not bad, "\n".join(bad[:15]) + "\noperations:\n" + describe(w.log)
    await _judge(w, kv)


def test_a_run_due_between_the_owners_last_round_and_its_freeze_is_the_next_owners_to_withdraw() -> None:
    """Found by the machine (full mode), 133 steps, a checker fix: a pause seen in a round at 26.75 s left the
    run written ahead for 26.88 s to be skipped once due; the owner was frozen at 26.97 s, before its next
    round, and the claims after it died before theirs. The checker judged withdrawals up to the freeze; the
    outage counts from the owner's last round."""
    _replay("pause_then_freeze_before_a_round.json")


def test_a_hold_read_at_a_claim_stays_until_the_first_round_has_planned_what_follows() -> None:
    """Found by the machine (full mode), 117 steps: pool b was blocked, so s4 was held from 34 s (a hold record)
    while the checkpoint moved on; at a handover the claim's write deleted the hold, and the planned time at
    34 s, too recent for the claim's catch-up, was left to the first round: between the two writes it had no
    record at all (an owner dying there lost it for good)."""
    _replay("hold_read_at_a_claim.json")


async def test_a_start_refused_because_the_run_was_cancelled_first_never_ran() -> None:
    """Found by the machine (full mode), a fix of the twin's workers: an operator cancelled a run at the instant
    it was dispatched, before its start was confirmed, then reran it; the twin's worker ran the first attempt
    anyway. A real worker runs the handler only once its start is acknowledged (scheduler/worker/starts.py),
    and this start is refused, the record having moved."""
    w, kv = await _world()
    await w.create(1, False, "a", SKIP_1S)
    await w.advance(300)
    await w.kill(restart_after_ms=0)
    w.die_after_claim = 0
    await w.advance(6_000)
    first = "s1@2026-01-01T00:00:01.000Z"
    await w.operate("cancel", lambda es: next((e for e in es if e.id == first), None))
    await w.operate("rerun", lambda es: next((e for e in es if e.id == first), None))
    await w.advance(250)
    bad = await w.check()
    assert not bad, "\n".join(bad[:15]) + "\noperations:\n" + describe(w.log)
    await _judge(w, kv)


def test_a_claim_records_again_the_catch_up_a_claim_dead_before_its_first_round_made() -> None:
    """Found by the machine (full mode), a checker fix: a claim decided a catch-up and died before its first
    round; its checkpoint kept its writer's sched_rev, so the next owner planned the activation again from the
    replan margin and wrote the same `policy_skip` again. The checker took only the later claim's decisions."""
    _replay("claims_deciding_again.json")


def test_held_times_ended_by_a_pause_are_decided_with_the_policies_at_the_takeover() -> None:
    """Found by the machine (full mode), a checker fix: held (pool `nobody`) under missed=all, then paused and
    changed to missed=skip while nobody owned the partition; the next owner decided the held times with the
    policies in force at the takeover (docs/time.md), which the checker did not accept."""
    _replay("held_then_paused_policy_changed.json")


def test_a_claims_rewrite_does_not_run_a_time_a_dead_claim_skipped() -> None:
    """Found by the machine (full mode), present before session 18 too: a claim that died after its first write
    had decided a catch-up (a `policy_skip` range); its checkpoint kept its writer's sched_rev, so the next claim
    planned the unseen activation again from the replan margin, and `Materializer.rewrite` created the run the
    range already covered: it ran and had a skip record. The claim reads the skip ranges after the replan margin
    and writes no run under them (`PartitionPlanner._one_record_per_time`)."""
    _replay("rewrite_over_a_dead_claims_skip.json")


def test_a_hold_of_a_busy_pool_is_not_decided_as_missed() -> None:
    """Found by the machine (full mode), and by session 11's note: pool `a` has workers, all busy (or with a
    dispatch no worker received outstanding) at the round's start: backpressure held s3 and s5 from 46 s, and
    on release decided the held times by the missed-run policy (`policy_skip`), as for a pool without workers.
    A pool was counted as saturated only from the runs a round could take, none when every slot was busy; now a
    served pool without capacity is saturated (`DispatchSink.served`), and its held times run late. (Before
    session 18 the same history also had a run with a skip record.)"""
    _replay("busy_pool_hold_decided_as_missed.json")


def test_cancel_other_cancels_an_older_run_waiting_for_its_retry() -> None:
    """Found by the machine (full mode), present before session 18 too: under cancel_other, an older run's
    attempt failed (transient) before the newer run came due; the newer one started, and the older one's retry
    started beside it. A newer run of a cancel_other schedule now cancels older runs waiting for a retry."""
    _replay("cancel_other_retry_beside_newer.json")


async def test_a_cancel_other_backlog_behind_a_stopping_run_is_won_by_its_newest_run_at_once() -> None:
    """Found from the machine's finding below: under cancel_other, the runs due while a cancelled run (its worker
    crashed) took 10 s to stop waited parked behind it or deferred for capacity, out of sight of the newest-wins
    rule; once it stopped they came back a pool's capacity at a time, and the oldest ones ran one after another
    (2 s and 3 s, then 9 s and 10 s, ...), each cancelled by the next: the run due on time started only 3 s
    later. Now every due run of the schedule counts, skips free no capacity, and the newest starts at once."""
    w, kv = await _world()
    w.workers.plan.append(("crash", 200))
    await w.create(1, False, "a", default_policies(MissedRuns.SKIP, 1, 3, Overlap.CANCEL_OTHER))
    await w.advance(16_000)
    xs = {x.planned_ms - T0 + 123: x for x in await w.executions()}  # T0 is 123 ms past a second
    first = xs[1_000].current
    assert first is not None and first.finished_ms is not None
    stopped = first.finished_ms - T0
    late = [p for p, x in xs.items() if 1_000 < p <= stopped and x.attempts]
    assert late == [max(p for p in xs if p <= stopped)], f"ran after the stop at {stopped} ms: {sorted(late)}"
    assert all(xs[p].skip_reason == "superseded" for p in xs if 1_000 < p < late[0])
    newest = xs[late[0]].current
    assert newest is not None and newest.dispatched_ms - T0 <= stopped + 250  # in the round that saw the stop
    await _judge(w, kv)


async def test_a_buffer_one_schedule_whose_worker_crashed_is_not_wedged_behind_its_own_retry() -> None:
    """Found by the machine (full mode, session 19), a wedge from session 18's retry-holds: a buffer_one run's
    worker crashed; the run buffered behind it stayed parked until the retry had run, and the runs after that
    one were handed back to the ready heap each round, in front of the retry (due later): with the pool's
    share of each pass taken by them, the retry never came up and the schedule never ran again."""
    w, kv = await _world()
    w.workers.plan.append(("crash", 700))
    await w.create(1, False, "a", default_policies(MissedRuns.SKIP, 1, 3, Overlap.BUFFER_ONE))
    await w.advance(30_000)
    bad = await w.check()
    assert not bad, "\n".join(bad[:15])
    first = next(x for x in await w.executions() if x.planned_ms - T0 + 123 == 1_000)
    assert first.state is ExecState.SUCCEEDED and len(first.attempts) == 2
    await _judge(w, kv)


def test_a_run_superseded_after_a_spec_change_is_judged_by_the_new_specs_next_time() -> None:
    """Found by the machine (full mode), a checker fix: a run of 7 s waiting for its retry was superseded when
    the spec became every 5 s under cancel_other and the run at 10 s came due; the checker took the next planned
    time to be 7 + 5 s."""
    _replay("superseded_after_a_spec_change.json")


def test_a_run_is_superseded_by_a_later_run_due_before_a_spec_change() -> None:
    """Found by the machine (full mode), a checker fix: every second, a worker crash, then the spec changed to
    every 5 s under cancel_other at 18.4 s; the run of 15 s, waiting behind the crashed one, was superseded at
    18.5 s by the run of 18 s (the old spec's, due before the change: owed, not withdrawn), which the checker
    did not count because the new spec's next time (20 s) was not due yet."""
    _replay("superseded_by_a_run_due_before_a_spec_change.json")


def test_a_claim_records_no_planned_time_a_dead_claims_skip_decided() -> None:
    """Found by the machine (full mode), 140 steps it could not shrink: pauses, resumes and spec changes around
    claims that died after their first write. One such claim recorded s1@20 as `policy_skip`; the next planned
    the resume its checkpoint's writer had not seen again from its instant, and recorded (18.9 s, 23 s] as
    `outside_catchup_window` over it: two records for one planned time. The claim's catch-up now goes around
    the skip ranges it read (it already went around the runs)."""
    _replay("catch_up_over_a_dying_claims_skip.json")


def test_a_catch_up_records_no_skip_over_a_run_written_ahead_that_a_spec_change_kept() -> None:
    """Found by the machine (full mode, session 19), 131 steps: s3 `@every 1s` on a workerless pool had its runs
    written ahead; its spec became every second (the same instants, so the run of 11 s was kept, not
    withdrawn), and once the schedule moved to a pool with workers, the hold's catch-up recorded (10.9 s, 11.2 s]
    as `outside_catchup_window` while the kept run of 11 s ran: two records for one planned time. A skip range
    now goes around every planned time the owner holds a record of."""
    _replay("ran_and_skipped_after_a_hold.json")


def test_cancel_other_starts_no_older_run_while_a_newer_one_waits_for_its_retry() -> None:
    """Found by the machine (full mode, session 19), 161 steps: under cancel_other, s8@52 started (the newest)
    and failed at once; the older s8@51, parked behind it, came back while s8@52 waited for its retry and was
    started, and the retry then began beside it (two at once). A run waiting for its retry counts as the newest
    run: the older one is superseded."""
    _replay("cancel_other_two_at_once.json")


def test_a_hold_ended_by_a_pause_records_the_times_held_within_the_late_grace_as_paused() -> None:
    """Found by the machine (full mode, session 19), 125 steps: a takeover found s1's pool changed to one without
    workers, so s1 was held; a pause 1.8 s later ended the hold and its three held times were decided by the
    missed-run policy (`policy_skip`), though they had been due for less than the late grace: late, not missed.
    They are recorded as `paused` now (a pause or a delete ends a hold's times all: docs/time.md)."""
    _replay("policy_skip_after_a_kill_and_a_pool_change.json")


def test_a_late_run_is_judged_as_if_on_time_by_its_first_attempt_not_its_retry() -> None:
    """Found by the machine (full mode, session 19), shrunk: a takeover found s1@1 and s1@2 late; s1@1's first
    attempt failed after 0.1 s and its retry ran 12 s. Judged on the retry's 12 s from its due time ("had it
    run on time"), s1@3, due before either began, was skipped as an overlap though nothing ran then. A late
    run is judged on its first attempt, as the checkers judge it."""
    _replay("late_run_judged_on_its_retry.json")


@pytest.mark.parametrize("case", ["cancel_other_older_started_beside_newer.json",
                                  "cancel_other_older_started_beside_newer_2.json"])
def test_cancel_other_never_runs_an_older_runs_retry_beside_a_newer_run(case: str) -> None:
    """Found by the machine twice (full mode, session 19): under cancel_other, a run failed and waited for its
    retry; the next run came due and, with nothing running at its time, started without an overlap decision,
    so the older run's retry was not cancelled and began beside it. A starting run now cancels older runs
    waiting for a retry whatever its overlap decision, and a retry a newer run supersedes is cancelled."""
    _replay(case)


@pytest.mark.parametrize("case", ["busy_pool_hold_at_a_kill.json", "busy_pool_hold_at_two_kills.json"])
def test_a_new_owner_runs_late_the_times_a_saturated_pool_held(case: str) -> None:
    """Found by the machine twice (full mode, session 19), shrunk: slow runs kept pool a's workers busy, so a new
    schedule of that pool was held (saturated, not workerless: its times run late, nothing is missed); the
    owner was killed, and the next claim read the hold and decided the held times by the missed-run policy
    (`policy_skip`). The hold record now says `late`, and a new owner runs those times late up to the
    watermark (the catch-up decides what follows, as after any outage)."""
    _replay(case)


def test_a_hold_ended_by_a_delete_records_its_times_once_as_deleted() -> None:
    """Found by the machine (full mode, session 19), 63 steps: s3 was held (its pool changed to one without
    workers), then deleted; the owner decided the held times by the missed-run policy (`policy_skip`) and then,
    the hold being gone, settled the deleted schedule's times again (`schedule_deleted` from its activation):
    two records for s3@10. A delete ends a hold's times once, all `schedule_deleted`, as a claim reading the
    tombstone does."""
    _replay("hold_ended_by_a_delete.json")


@pytest.mark.parametrize("case", ["hold_at_a_handover.json", "hold_at_claims_long.json"])
def test_a_claim_decides_the_times_a_hold_kept_behind_the_watermark(case: str) -> None:
    """Found by the machine twice (full mode, session 19), a checker fix: s3 was held (its pool without workers)
    from 9.876 s while the checkpoint moved on to 16 s; a graceful handover's claim decided the held time of
    9.877 s by the missed-run policy (`policy_skip`, 5 s late). A hold overrides the watermark for its schedule
    (docs/keyspace.md); the checker's model of a claim's catch-up took the watermark alone and said "not
    missed". It now reads the holds with the checkpoint, as the claim does."""
    _replay(case)


def test_cancel_other_a_retry_cancels_an_older_run_started_meanwhile() -> None:
    """Found by the machine (full mode, session 19), 161 steps: under cancel_other, the run of 36 s failed and
    waited for its retry; a backfill's run of 14 s (an operator's run, with its own policy) started meanwhile,
    and the retry began beside it (a retry always started: it is the same run). The newest wins for a retry too:
    it cancels the older runs in flight and starts once they have stopped."""
    _replay("cancel_other_beside_a_backfill_run.json")


def test_a_claim_and_a_delete_at_the_same_instant_are_judged_on_what_the_claim_listed() -> None:
    """Found by the machine (full mode, session 19), a checker fix: a graceful handover and a delete of the held
    s3 at the same fake instant; the claim listed s3 before the delete landed and decided its held time by the
    policy, while the checker's model of the claim saw the schedule deleted and expected nothing."""
    _replay("hold_at_a_handover_then_delete.json")


def test_a_run_withdrawn_by_a_spec_change_undone_before_it_came_due_stays_owed_under_a_hold() -> None:
    """s1 moved to a pool without workers (a hold), changed to every 2 s and back 94 ms later: s1@5, written
    ahead under the first spec, was withdrawn `schedule_changed` in the round between the two changes, and
    with the pool held the materializer never wrote it again to revive it: the spec in force at 5 s plans it.
    A spec change's withdrawal now judges a run written ahead once it is due (as a pause's does)."""
    _replay("a_spec_changed_and_restored_under_a_hold.json")


def test_two_spec_changes_before_a_round_withdraw_what_the_first_no_longer_plans() -> None:
    """*/5 changed to */2 at 4.85 s, then to every second at 4.92 s, both before the owner's next round: the
    second change's withdrawal replaced the first's, which only looked after 4.92 s, and s1@5 (4.88 s), not
    planned by the */2 spec in force at its time, stayed scheduled. Pending withdrawals are merged now
    (`activations.after_change`)."""
    _replay("two_changes_before_a_round_withdraw_by_the_first.json")


def test_a_run_a_spec_change_left_for_its_due_time_is_withdrawn_by_the_next_owner() -> None:
    """s1 every second changed to every 2 s at 0.70 s, its owner killed at 0.75 s: the run at 0.88 s, written
    ahead under the old spec, was left to be withdrawn once due (the deferral above) and ran under the next
    owner, whose claim took the change as handled by the writer that had seen it."""
    _replay("change_then_kill_before_the_withdrawal.json")


def test_a_run_triggered_as_its_pool_is_fixed_follows_the_new_pool() -> None:
    """s4 in a pool without workers, triggered and moved to pool b at the same instant: the owner applied the
    update (retargeting the runs it held) before the triggered run's record reached it, which then waited for
    the old pool for good ([stuck])."""
    _replay("trigger_then_pool_fix_at_one_instant.json")


def test_a_start_at_the_instant_of_an_update_to_cancel_other_is_judged_on_the_policy_before() -> None:
    """Checker: s7 allow_all, updated to cancel_other at 19.278 s, the very instant of the round that started
    s7@18 beside s7@17 under allow_all (the owner sees an update through its watch, after that round). Judged
    on the version at the start alone it was [two-at-once]; a start is now judged on the policy of the version
    in force at it and just before it, as a claim at the instant of a delete is."""
    _replay("cancel_other_at_the_instant_of_a_sigcont.json")


def test_a_saturated_pools_hold_ended_by_a_change_runs_its_times_late() -> None:
    """s3 held from 22.9 s because every worker of pool a was busy (slow workers), its owner frozen, then
    changed (to pool nobody, then every 5 s) while nobody owned the partition: the claim decided the held
    times as an ended activation's missed times and recorded s3@23 `outside_catchup_window`, though they were
    owed and only waiting for a worker. A saturated pool's held times run late when a change ends the hold,
    as they do when the pool frees up (a live owner's `settle_hold` did the same)."""
    _replay("catch_up_window_skip_of_a_held_schedule_after_a_freeze.json")


def test_a_hold_spanning_a_pause_and_a_resume_made_without_an_owner_is_settled_per_activation() -> None:
    """s1 held (pool nobody), paused at 8.0 s, resumed at 10.1 s and changed at 11.9 s while claims kept dying:
    the next claim settled the whole held stretch with the version in effect where the hold began (the pause)
    and recorded (8.0-11.9 s] `paused`, s1@11 included, though that time came after the resume."""
    _replay("held_paused_resumed_changed_without_an_owner.json")


def test_a_time_a_claim_held_for_a_workerless_pool_is_decided_by_its_policy_when_the_pool_is_fixed() -> None:
    """Checker: s2@3 owed through a frozen owner and two claims that died after their first write; the claim at
    7.9 s found s2's pool without workers (changed at 6.7 s) and held its times from its checkpoint, s2@3
    included; the pool fixed at 8.0 s, the held times were decided by the missed-run policy (`policy_skip`).
    The checker's hold rule took only times planned after the pool lost its workers as held."""
    _replay("policy_skip_after_two_dying_claims.json")


def test_a_cancel_other_run_cancels_an_older_run_started_after_it_came_due() -> None:
    """s11 cancel_other with a backfill's runs out: the retry of backfill run s11@25 began at 39.94 s, 70 ms
    after s11@40 came due; s11@40's overlap decision (on what ran at its due time) saw only s11@26 waiting for
    its retry, cancelled that, and started beside s11@25 ([two-at-once]). A starting cancel_other run now
    cancels the older runs in flight whatever their start, as it already did the older retries."""
    _replay("cancel_other_after_a_backfill_and_dying_claims.json")


def test_a_lost_dispatch_cancelled_and_rerun_while_its_pool_has_no_worker_waits_for_the_pool() -> None:
    """Found by the machine (full mode), a checker gap: s3@5's dispatch never reached a worker; its schedule
    moved to a pool without workers, the run was cancelled and rerun at 5.9 s and the pool fixed at 11.4 s;
    attempt 2 came at 11.5 s, as it should. The checker counted the rounds in which the pool the record ended
    with (`a`) had free workers, not the pool its schedule had then (`nobody`)."""
    _replay("start_timeout_rerun_across_a_pool_change.json")


def test_a_schedule_created_and_changed_at_one_instant_is_caught_up_by_the_spec_it_ended_with() -> None:
    """Found by the machine (full mode), a checker gap: s5 created `*/5` and changed to every second at the same
    instant (5.55 s, missed=all, window 3 s) while claims kept dying; the claim at 13.9 s recorded s5@6
    `outside_catchup_window`, as its policy says. The checker took the activation's times from the create's
    spec (no time of `*/5` between 5.55 and 8.9 s) and called the skip unjustified."""
    _replay("create_and_spec_change_at_one_instant.json")


def test_a_cancel_other_run_does_not_start_beside_a_replay_dispatched_in_the_same_round() -> None:
    """Found by the machine (full mode): s5 changed to cancel_other and a dead letter of it (s5@3) replayed at
    6.1 s, while s5@6 waited on the confirmation of s5@5's state; the round at 6.25 s dispatched the replay
    and then s5@6, whose cancel of older runs started since it came due looked only at runs already written
    in flight, not the replay dispatched just before it in the same round: the two ran at once. s5@6 now
    waits a round, and cancels the replay as any older run started after it came due."""
    _replay("cancel_other_replay_two_at_once.json")


def test_a_lost_dispatch_cancelled_then_rerun_later_is_judged_from_the_rerun() -> None:
    """Found by the machine (full mode), a checker gap: s4@11's dispatch was lost, cancel_other cancelled it
    (no retry owed), and an operator reran it at 18.05 s; attempt 2 came at 18.25 s. The checker counted the
    free rounds from the cancel, as if a retry had been owed since."""
    _replay("start_timeout_cancelled_then_rerun.json")


def test_a_cancel_other_retry_does_not_start_beside_a_rerun_dispatched_in_the_same_round() -> None:
    """Found by the machine (full mode), the same gap for a retry: an operator reran s4@2 at 17.4 s while s4@17
    waited for its retry; the round at 17.5 s dispatched the rerun, then the retry, which cancels older runs
    started meanwhile only once they are written in flight ([two-at-once]). The retry now waits a round too."""
    _replay("cancel_other_retry_beside_a_rerun.json")


def test_a_hold_whose_schedule_moves_to_a_busy_pool_runs_the_later_times_late() -> None:
    """Found by the machine (full mode, twice): s1 was held in a pool without workers, then moved at 6.8 s to pool
    a, whose workers were all busy; the hold went on as a workerless one, and when pool a freed up at 12.5 s the
    missed-run policy decided every held time, s1@7 (due after the move) included, `policy_skip`. The times held
    until the pool has workers are missed; from then on they wait as a saturated pool's, late, not missed."""
    _replay("hold_moved_to_a_saturated_pool.json")


def test_a_retry_after_a_pool_change_waits_in_the_schedules_new_pool() -> None:
    """Found by the machine (full mode): s4 moved to pool b while an attempt of s4@1 was out; it failed and came
    back to wait for its retry in the pool its record was written in (a, without capacity), for good ([stuck]).
    A run waiting for a worker waits in its schedule's pool, whatever its record says (PendingIndex.put)."""
    _replay("retry_after_a_pool_change_waits_in_the_new_pool.json")


@pytest.mark.parametrize("case", ["retry_beside_a_late_earlier_run.json",
                                  "retries_beside_runs_begun_before_buffer_all.json"])
def test_a_retry_does_not_start_beside_another_run_under_a_policy_that_holds(case: str) -> None:
    """Session 22, once runs due in a retry's backoff gap waited for it ([overlap-two-at-once], the twin's
    backoff-gap exemption gone): s7 (skip), after a takeover's backlog, had s7@58 dispatched (and failed into
    retry_wait) before the earlier s7@57 started, late, in the round s7@58's retry began; s5 made buffer_all
    from allow_all had the retries of s5@37 and @38 begin beside @39 and @40, started under allow_all. A retry
    under skip and the buffers waits for the runs in flight."""
    _replay(case)


def test_a_hold_ended_by_a_spec_change_is_decided_by_the_policies_it_ended_with() -> None:
    """Session 22 (a checker gap): s1 held from 2.8 s (pool without workers, missed=skip), made missed=all (cap 2)
    at 15.5 s, then a spec change to a served pool at 29.3 s: the owner ran the last two held times and
    recorded the earlier ones over_cap, by the policies the hold ended with; the checker took each time's own
    version (missed=skip for those planned before 15.5 s)."""
    _replay("hold_decided_by_the_policies_it_ended_with.json")


def test_a_retry_after_a_lost_dispatch_does_not_start_beside_a_later_run() -> None:
    """Session 22: s3 (skip) started s3@20 late, beside s3@22's start; found by the twin once its backoff-gap
    exemption was gone ([overlap-two-at-once] on the code before the retry holds)."""
    _replay("retry_beside_a_later_run_after_a_lost_dispatch.json")


def test_a_lost_dispatchs_retry_waits_for_runs_begun_under_allow_all_and_is_not_late() -> None:
    """Session 22 (a checker gap): s1@7's dispatch was lost under allow_all, s1@8-10 started beside it; s1 was
    made buffer_one at 10.5 s; the retry of s1@7 waited for those runs to end (a retry does not start beside
    another run under skip and the buffers), which the [start-timeout] rule counted as rounds it could start."""
    _replay("retry_waits_for_runs_begun_under_allow_all.json")


def test_parked_runs_do_not_take_a_pools_share_of_a_round() -> None:
    """Session 22 (present before it): a backfill's buffered runs of s2, parked behind the one running, kept
    coming back from heap entries their record's earlier puts had left, each taking a pass (of eight per round)
    only to be parked again; pool b's one free slot went unused round after round while s2@19 and @20 waited
    ([stuck], 14 rounds)."""
    _replay("parked_runs_stale_entries_take_the_passes.json")


def test_a_run_the_dead_writer_left_for_its_spec_change_is_withdrawn_after_a_change_back() -> None:
    """Session 22 (present before it; traced in /work/runs/s22o2-trace.md): s2@11 was written ahead under
    `* * * * * *`; the change to `*/5` at 9.9 s (in the checkpoint) leaves it to be withdrawn once due, but its
    writer was killed at 10.7 s, the next claim died before its first round, and a change back to
    `* * * * * *` was made at 16.4 s while nobody owned the partition. The claim after judged s2@11 by that
    spec, and it ran ([not-owed-ran]); the activation the writer knew counts now, paused or not."""
    _replay("spec_change_known_to_a_dead_writer_then_changed_back.json")


def test_a_delete_while_no_owner_records_the_times_of_a_change_the_dead_owner_never_saw() -> None:
    """Found by the machine (full mode, session 23): s4 ('*/5') was planned up to the watermark by an owner
    killed at 15 s; with no owner, its spec changed to every second at 16.3 s, then to '*/2' and it was deleted
    at 18 s. The next owner recorded the tombstone's owed times only after the watermark (17.1 s): the times
    of the change it never saw, before the watermark, had no record (s4@17 missed silently). Real etcd:
    tests/store/test_planner_invariants.py::test_a_delete_while_no_owner_records_the_times_of_a_change_the_dead_owner_never_saw."""
    _replay("tombstone_after_a_seen_and_an_unseen_activation.json")


def test_a_change_then_a_pause_and_a_delete_while_no_owner_lose_no_planned_time() -> None:
    """The same, shorter (twin, session 23): s4 '*/2' changed to every second as its owner was killed at 0.25 s,
    then paused and deleted at 1.3 s with no owner: s4@1, owed under the change, had no record."""
    _replay("tombstone_after_a_change_then_a_pause.json")


def test_a_backfill_runs_retry_waits_behind_the_schedules_runs_in_flight_by_its_own_policy() -> None:
    """Found by the machine (full mode, session 23), a checker finding: a backfill's run of allow_all s2 (its own
    policy buffer_all, docs/time.md) was dispatched to nobody; the start timeout gave it up on time, and its
    retry then waited 11 s behind the operator's rerun of s2@5 (whose worker had crashed) and replays, as a
    buffer_all retry must. The checker judged the wait by the schedule's allow_all and called it [start-timeout]."""
    _replay("backfill_retry_behind_an_operators_rerun.json")


def test_a_retry_held_behind_a_rerun_is_judged_by_the_policy_it_had_then_not_after_a_later_replay() -> None:
    """Found by the machine (full mode, session 23), a checker finding: s1 (overlap skip) lost a dispatch; the
    start timeout gave it up on time and its retry waited, as it must, behind the operator's rerun of another s1
    run in flight. A replay of it long after rewrote its record (allow_all), and the checker judged the earlier
    wait by that and called it [start-timeout]."""
    _replay("retry_behind_a_rerun_judged_after_a_replay.json")


def test_a_run_written_ahead_that_ran_is_not_also_skipped_when_its_hold_ends() -> None:
    """Found by the machine (full mode, session 25, 86 steps): s1 (`@every 1s`, missed=skip, cap 1, window 3 s)
    was resumed at 16.986 s; its owner was killed at 19.727 s after writing s1@20 and s1@21 ahead. The next owner
    held s1 (its pool blocked) from its first planned time not materialized by this owner, 19.876, though s1@20
    had a record; s1@20 ran and ended; a pause at 23.193 s ended the hold and recorded (19.876, 23.193] `paused`
    over it: two verdicts for one planned time. A hold's skip ranges now go around the records etcd holds
    (`Materializer.verify`, `PartitionPlanner._around_records`)."""
    _replay("ran_and_paused_after_a_kill.json")


def test_a_superseded_planner_may_hand_out_its_reservations_but_none_starts() -> None:
    """Found by the machine (session 28, reserved first attempts): a planner frozen and superseded hands out,
    when it resumes, the attempts it had reserved (nothing is written for a hand-out, so etcd's fence cannot
    refuse it); the workers' start CAS, fenced by the same owner key, refuses every one, so none runs. The
    checker judged the hand-out itself as a stale dispatch; it now judges whether any of them started."""
    _replay("stale_owner_hands_out_after_a_thaw.json")


def test_an_activation_the_checkpoint_does_not_cover_is_judged_once_planned() -> None:
    """Found by the machine (session 28): s3 created 35 ms before its owner froze, the owner thawed and frozen
    again with no round between. The checkpoint (watermark 5 s, written before the create) does not speak for
    s3's times; the checker judged them as missed at it. They are the owner's next round's, and it records
    them (the final judgement after 15 s)."""
    _replay("freeze_thaw_after_a_create_at_a_handover.json")


def test_a_lost_hand_out_ends_when_a_later_owner_moves_its_record() -> None:
    """Found by the machine (full mode, sessions 28-29, reserved first attempts): s3@1 (cancel_other) was handed out
    at 1 s and lost, and its owner killed; two claims died after their first write; the owner after them
    superseded s3@1 at 7.4 s, and an operator reran it at 11.8 s, whose dispatch retired the reserved number. The
    checker took the retirement (11.87 s) for the end of the lost attempt and called it [start-timeout]. A hand-out
    ends when its record first moves (its start CAS compares the creation revision), here at the supersede.
    (The recorded run's first rerun, at 0.7 s, had nothing to pick: a leading null draw stands for it.)"""
    _replay("lost_hand_out_superseded_then_rerun.json")


def test_a_hold_from_the_creation_instant_is_the_new_schedules() -> None:
    """Found by the machine (full mode, session 29, both dispatch modes): s7 (`@every 1s`, a pool without workers)
    created at x.999, so its first planned time held made the hold's `from` equal its creation instant; a kill and
    a claim later, the claim took that hold for an earlier schedule's of the same id (`from` not after the
    creation), owed s7 nothing from it, and its planned times 21-26 had no record at all. A hold from the creation
    on covers only the new schedule's times: it is the new schedule's."""
    _replay("hold_from_the_creation_instant.json")


def test_a_lost_hand_out_ends_when_another_owner_claims() -> None:
    """Found by the machine (full mode, session 29, reserved first attempts): s1@4 handed out at 4 s and lost, its
    owner killed 0.1 s later as an operator backfilled s1 (nine runs before 4 s, buffered, oldest first). The next
    owner, claiming at 7.1 s, found s1@4 as created, with no attempt, and dispatched it in its turn after the
    backfill's runs (11.35 s); the checker took that dispatch, which retired the reserved number, for the end of
    the lost attempt. A hand-out cannot start once another owner has claimed (its start CAS is fenced by the
    owner key of the planner that handed it out): the checker now ends it there, and the run's wait from then on
    is judged as any retry's (behind its schedule's runs in flight)."""
    _replay("lost_hand_out_behind_a_backfill.json")


def test_an_inherited_runs_skip_at_a_claim_a_pause_followed_in_the_same_instant() -> None:
    """Found by the machine (full mode, session 29, the claim's missed-run decision over inherited runs): s1 (every
    second, missed=skip) had runs written ahead when its owner was killed; the next owner claimed at 6.0 s and
    skipped s1@1 (`policy_skip`, 5 s late), and a pause landed at the same fake instant, after the claim's
    listing. The checker modelled the claim on the paused version and found nothing missed; a change at the
    start's instant is now judged by the version before it (a `paused` skip by its own rule)."""
    _replay("inherited_skip_at_a_pause_at_the_claim.json")


def test_a_stale_hand_out_is_not_a_run_before_its_start_is_refused() -> None:
    """Found by the machine (full mode, session 29, reserved first attempts; 158 steps, not shrunk): a planner
    frozen at 53.3 s and superseded was thawed at 63.6 s and handed out s1@54, reserved before the freeze, at
    the instant s1@56 ended. Its start is refused (the owner key changed), but the check at that instant came
    before the worker asked, and read the hand-out as a run beside s1@56. A stale hand-out is judged once its
    start has been asked for."""
    _replay("stale_hand_out_at_a_thaw_pending_start.json")


def test_a_claim_with_changes_at_its_instant_is_judged_whole_by_one_version() -> None:
    """Found by the machine (full mode, session 30, both dispatch modes): a graceful handover at 31.8 s, and at
    the same fake instant two updates of s1 (missed=all cap 2 in a pool without workers, then every 2 s with
    missed=skip). The claim had listed s1 before they landed: its catch-up ran s1@26 and, the cap counting that
    run, skipped the oldest inherited run s1@24 `over_cap`. The checker judged the catch-up by the version after
    the updates (missed=skip: nothing run) and the inherited runs by the one before, so the cap had room and
    s1@24 looked not missed. A claim is now judged whole by either version."""
    _replay("catch_up_and_inherited_runs_at_a_handover_with_changes_at_its_instant.json")


# ---- start ahead (docs/workers.md, "Start ahead"): runs handed to workers before their due time ----------

AHEAD = replace(SETTINGS, start_ahead_ms=1_000)


def _scheduled_effects(w: World, sid: str) -> list[Any]:
    return [f for f in w.log.effects if f.sid == sid and f.run_trigger == "scheduled"]


def _waiting_armed(w: World, sid: str) -> list[Any]:
    """The schedule's runs handed out ahead that have not reached their instant yet."""
    return [f for f in _scheduled_effects(w, sid) if f.armed_ms is not None and f.start_ms > w.clock.wall_ms()]


async def test_start_ahead_runs_start_at_their_due_time() -> None:
    w, kv = await _world(AHEAD)
    sid = await w.create(1, False, "a", SKIP_1S)
    await w.advance(6_000)
    ran = [f for f in _scheduled_effects(w, sid) if f.outcome != "lost"]
    armed = [f for f in ran if f.armed_ms is not None]
    assert len(armed) >= 3, [(f.planned_ms - T0, f.armed_ms, f.start_ms - T0) for f in ran]
    # Each armed run began at its own planned time, not when it was handed out (no jitter here).
    assert all(f.start_ms == f.planned_ms and f.armed_ms < f.planned_ms for f in armed)
    await _judge(w, kv)


async def test_start_ahead_a_pause_disarms_the_run_armed_for_after_it() -> None:
    w, kv = await _world(AHEAD)
    sid = await w.create(1, False, "a", SKIP_1S)
    await w.advance(3_500)  # the run of :04 is armed by now (handed out from :03)
    armed = _waiting_armed(w, sid)
    assert armed, "no run armed ahead of its time"
    await w.pause(sid)
    await w.advance(3_000)
    # The armed run never ran: disarmed, then recorded as paused once due.
    assert all(f.outcome == "lost" for f in armed), [(f.planned_ms - T0, f.outcome) for f in armed]
    es = {e.id: e for e in await w.executions()}
    assert all(es[f.eid].state is ExecState.SKIPPED and es[f.eid].skip_reason == "paused" for f in armed)
    await _judge(w, kv)


async def test_start_ahead_a_trigger_disarms_the_armed_run_of_a_skip_schedule() -> None:
    """A trigger comes up while the schedule's next run waits armed: under skip, the armed run must not start
    beside the triggered one (which runs long); it is disarmed and decided at its due time (an overlap skip)."""
    w, kv = await _world(AHEAD)
    sid = await w.create(1, False, "a", SKIP_1S)
    await w.advance(3_260)  # the run of :04 (3.877 s in) was armed at 3.25 s
    armed = _waiting_armed(w, sid)
    assert armed
    w.workers.plan.append(("slow", 3_000))
    await w.operate("trigger", lambda es: None, sid)
    await w.advance(6_000)
    (manual,) = [f for f in w.log.effects if f.sid == sid and f.run_trigger == "manual"]
    # The trigger started at once (once the armed run was disarmed), not behind the armed run: start ahead
    # changes nothing an operator's run sees. The armed run never ran then; at its due time the trigger was in
    # progress, so the skip policy skipped it.
    assert manual.start_ms < armed[0].planned_ms and armed[0].outcome == "lost", (manual, armed)
    es = {e.id: e for e in await w.executions()}
    assert es[armed[0].eid].state is ExecState.SKIPPED and es[armed[0].eid].skip_reason == "overlap_skip"
    await _judge(w, kv)


async def test_start_ahead_an_armed_run_of_a_frozen_owner_runs_after_a_pause_it_never_saw() -> None:
    """The owner freezes (SIGSTOP) with a run armed on a worker whose stream stays open; the schedule is paused
    before that run's due time. Nobody can disarm it: it runs, its start recorded before the pause (judged as
    started then), and nothing else of the paused schedule does."""
    w, kv = await _world(AHEAD)
    sid = await w.create(1, False, "a", SKIP_1S)
    await w.advance(3_500)
    await w.freeze()
    paused_at = w.clock.wall_ms()
    await w.pause(sid)
    await w.advance(8_000)
    await w.thaw()
    await w.advance(3_000)
    after = [f for f in _scheduled_effects(w, sid) if f.planned_ms > paused_at and f.outcome != "lost"]
    # The one run armed before the pause ran (the checker accepts it as started before the pause); no other.
    assert [(f.armed_ms is not None and f.armed_ms < paused_at, f.start_ms == f.planned_ms) for f in after] == [
        (True, True)], [(f.planned_ms - T0, f.armed_ms, f.outcome) for f in after]
    await _judge(w, kv)


async def test_start_ahead_a_killed_owners_armed_runs_do_not_start_and_run_late() -> None:
    """The owner is killed with runs armed: its stream is gone, so the worker does not start them and reports them
    not started; the next owner runs them (late), none lost, none twice."""
    w, kv = await _world(AHEAD)
    for _ in range(3):
        await w.create(1, False, "a", SKIP_1S)
    await w.advance(3_500)
    await w.kill(restart_after_ms=0)
    await w.advance(8_000)
    await _judge(w, kv)


async def test_start_ahead_a_spec_change_disarms_a_run_the_new_spec_does_not_plan_and_it_stays_unarmed() -> None:
    """Found by the machine: a change from every second to every 2 s disarmed the run of :03, armed for the old
    spec; back as a new run, it came up early again and was armed again, though the new spec does not plan it
    (its withdrawal waits for its due time). A schedule with a withdrawal pending arms nothing."""
    w, kv = await _world(AHEAD)
    sid = await w.create(1, False, "a", SKIP_1S)
    await w.advance(2_150)
    await w.update(sid, period_s=2)
    await w.advance(5_000)
    await _judge(w, kv)


async def test_start_ahead_a_rerun_under_cancel_other_does_not_start_beside_the_armed_run() -> None:
    """Found by the machine: an operator's rerun (allow_all: it runs beside anything) of s1@01 came up 0.1 s before
    the armed s1@18 was due under cancel_other; the armed run began beside it instead of cancelling it first."""
    w, kv = await _world(AHEAD)
    sid = await w.create(1, False, "a", default_policies(MissedRuns.SKIP, 1, 3, Overlap.CANCEL_OTHER))
    await w.advance(3_300)
    assert _waiting_armed(w, sid)
    w.workers.plan.append(("slow", 3_000))
    first = execution_id(sid, T0 - 123 + 1_000)
    await w.operate("rerun", lambda es: next((e for e in es if e.id == first), None))
    await w.advance(6_000)
    await _judge(w, kv)


async def test_start_ahead_a_delete_with_cancel_running_and_a_create_of_the_same_id_keep_the_armed_time_owed() -> None:
    """Found by the machine: s1@02 waited armed when s1 was deleted with cancel_running and created again at the
    same instant; the delete cancelled it (for good), though the new schedule owes that planned time. An armed run
    not due yet is left to its owner's disarm: withdrawn as deleted, then owed again by the new schedule."""
    w, kv = await _world(AHEAD)
    sid = await w.create(1, False, "a", default_policies(MissedRuns.SKIP, 1, 8, Overlap.SKIP))
    await w.advance(1_337)
    assert _waiting_armed(w, sid)
    await w.delete(sid, cancel_running=True)
    await w.recreate(sid, 1, False, "a", SKIP_1S)
    await w.advance(5_000)
    await _judge(w, kv)


async def test_start_ahead_a_run_armed_for_a_deleted_schedule_recreated_with_another_spec_stays_withdrawn() -> None:
    """Found by the machine: s1@01 waited armed when s1 was deleted and created again at once with a spec that does
    not plan it; disarmed, it came back after the delete's withdrawal had been applied and ran under the new spec.
    A withdrawal judges a run handed out early as the waiting run it was, and writes it once the run is back."""
    w, kv = await _world(AHEAD)
    sid = await w.create(1, False, "a", SKIP_1S)
    await w.advance(800)
    assert _waiting_armed(w, sid)
    await w.delete(sid, cancel_running=False)
    await w.recreate(sid, 2, False, "a", SKIP_1S)
    await w.advance(5_000)
    await _judge(w, kv)
