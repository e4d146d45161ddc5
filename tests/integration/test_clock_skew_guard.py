"""The clock-skew guard with real processes (issue 11, "Clock-skew guard"; docs/time.md, "Clock skew"):
three planners on one etcd, one of them under libfaketime, 24 schedules firing every second on an effect
worker whose own (unskewed) clock logs when every run really started.

The skewed planner's wall clock jumps +30 s (in the second case -30 s) while it owns a third of the
partitions. It must lose them within a bounded time (measured: from the jump until etcd shows it
owning none, and until the other two own everything), never start a run more than `max_clock_skew`
(+ the probe's error) before its planned time, stay out while skewed, and come back (after the stable
period) once the skew is removed. Every planned time of the window runs exactly once, with no skip
record, none much late: the others keep every planned time.

`SCHED_SKEW_GUARD_OFF=1` runs the same scenario with `unsafe_disable_clock_guard` (test mode) to show
that the test catches the fault: the skewed planner then starts runs ~30 s early and keeps its partitions.
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import pytest

from chaos.clock import FaketimeMissing, SkewedClock
from chaos.infra.etcd import EtcdFactory
from chaos.infra.planners import OwnersView, balanced, none_owned_by
from scheduler._gen.scheduler.v1 import cluster_pb2 as cpb
from scheduler.client import SchedulerClient
from scheduler.clock import SYSTEM_CLOCK
from scheduler.execution import ExecState
from scheduler.ids import ExecutionId, execution_id
from scheduler.model import Policies, Schedule
from scheduler.store.etcd import EtcdClient
from scheduler.timeplan import MissedRuns, Overlap, parse_spec
from tests.integration.engine import Engine, effects_once, lines

pytestmark = pytest.mark.etcd

P = 12
SCHEDULES = 24
HOLD_S = 8.0  # how long the skew lasts after the guard tripped
MAX_CLOCK_SKEW = 1.0
EARLY_BOUND_S = MAX_CLOCK_SKEW + 0.25 + 0.25  # + Cristian's error (half the 0.5 s round-trip bound) + slack
DETECT_BOUND_S = 5.0  # probe interval (1 s) + round trip + the release of the in-flight batch, on 2 busy cores
LATE_BOUND_S = 6.0  # a handover's catch-up, as the drills allow during a fault
GUARD_OFF = os.environ.get("SCHED_SKEW_GUARD_OFF") == "1"


# Ahead is the dangerous direction (runs early) and stays in every CI run; behind in full mode (SCHED_FULL=1).
@pytest.mark.parametrize("skew_s", [30.0, pytest.param(-30.0, marks=pytest.mark.slow)], ids=["ahead", "behind"])
async def test_skewed_planner_stands_down_never_runs_early_and_comes_back(skew_s: float, etcd_factory: EtcdFactory,
                                                                           tmp_path: Path) -> None:
    try:
        clock = SkewedClock(tmp_path / "p3.offset")
    except FaketimeMissing as e:
        pytest.skip(f"libfaketime cannot be loaded here: {e}")
    etcd = etcd_factory()
    guard = {"max_clock_skew": str(MAX_CLOCK_SKEW)}
    test_env: dict[str, str] = {}
    if GUARD_OFF:
        guard["unsafe_disable_clock_guard"] = "true"
        test_env = {"SCHED_TEST_MODE": "1"}
    async with EtcdClient(etcd.config(timeout=2.0)) as kv:
        eng = Engine(etcd, tmp_path, kv, partitions=P, prefix="/skew")
        policies = Policies(missed_runs=MissedRuns.ALL, catchup_cap=1000, catchup_window_ms=600_000,
                            overlap=Overlap.ALLOW_ALL, execution_timeout_ms=20_000)
        await eng.create(*(Schedule(id=f"sec-{i:03d}", tenant="t", spec="* * * * * *", worker_pool="pool",
                                    task_type="effect", policies=policies) for i in range(SCHEDULES)))
        detect_s = takeover_s = recover_s = None
        p3_back_while_skewed = False
        try:
            for node in ("p1", "p2", "p3"):
                env = {**test_env, **(clock.env() if node == "p3" else {})}
                _, address = await eng.planners.serve(node, settings={**guard, "api_port": "0"}, env=env)
                eng.addresses.append(address)
            eng.start_worker("w1")
            async with OwnersView(kv, eng.ks) as view:
                await view.wait_for(balanced(P, ("p1", "p2", "p3")), 60, "a balanced start")
                await asyncio.sleep(3.0)  # steady state: the worker connected, every planner planning
                window_start = SYSTEM_CLOCK.wall_ms()

                clock.set_offset(skew_s)
                t_skew = time.monotonic()
                try:
                    t = await view.wait_for(none_owned_by("p3"), DETECT_BOUND_S * 3, "p3 to own nothing")
                    detect_s = t - t_skew
                    t = await view.wait_for(balanced(P, ("p1", "p2")), DETECT_BOUND_S * 3, "p1 and p2 to own all")
                    takeover_s = t - t_skew
                except AssertionError as e:
                    print(f"\nno stand-down: {e}")
                async with SchedulerClient(eng.addresses[0]) as client:  # `cluster status` as p1 answers it
                    status = {p.planner.node_id: p for p in (await client.cluster_status()).planners}
                try:
                    await view.wait_for(lambda o: "p3" in o.values(), HOLD_S, "p3 to own something while skewed")
                    p3_back_while_skewed = detect_s is not None
                except AssertionError:
                    pass  # what should happen: it stays out while its clock is off

                clock.clear()
                t_clear = time.monotonic()
                t = await view.wait_for(lambda o: "p3" in o.values(), 30, "p3 to own partitions again")
                recover_s = t - t_clear
                await view.wait_for(balanced(P, ("p1", "p2", "p3")), 30, "a balanced cluster again")
                await asyncio.sleep(3.0)
                window_end = SYSTEM_CLOCK.wall_ms() - 3_000
                await asyncio.sleep(4.0)  # the window's last runs finish
        finally:
            skew_events = eng.planners["p3"].events("clock_skew", "clock_skew_cleared")
            logs = eng.logs()
            eng.close()

        # --- when each run really started, by the worker's clock ---------------------------------------
        early: list[tuple[float, str]] = []
        late: list[tuple[float, str]] = []
        for eid, attempt, started_ms in lines(eng.times):
            if attempt != "1":
                continue
            planned = ExecutionId.parse(eid).planned_ms
            d = (int(started_ms) - planned) / 1000
            if d < 0:
                early.append((-d, eid))  # at any time: nothing may start (much) before its planned time
            elif window_start <= planned <= window_end:
                late.append((d, eid))  # the start-up's first runs wait for the worker: not the guard's window
        early.sort(reverse=True)
        late.sort(reverse=True)
        print(f"\nguard {'OFF' if GUARD_OFF else 'on'}: stand-down {detect_s}s after the jump, all owned by p1+p2 "
              f"{takeover_s}s, back {recover_s}s after the skew ended; runs started early: {len(early)} "
              f"(worst {early[0] if early else '-'}), worst late {late[0] if late else '-'}; p3 events "
              f"{[(e['event'], e.get('consensus_offset_ms')) for e in skew_events]}")
        too_early = [(d, eid) for d, eid in early if d > EARLY_BOUND_S]
        assert not too_early, (f"{len(too_early)} runs started more than {EARLY_BOUND_S:g}s before their planned "
                               f"time, e.g. {too_early[:5]}")

        # --- the guard itself ---------------------------------------------------------------------------
        assert detect_s is not None and detect_s <= DETECT_BOUND_S, \
            f"p3 still owned partitions {DETECT_BOUND_S:g}s after its clock jumped (stand-down: {detect_s})\n{logs}"
        assert takeover_s is not None and takeover_s <= DETECT_BOUND_S + 2
        assert not p3_back_while_skewed, "p3 claimed partitions again while its clock was still off"
        assert [e["event"] for e in skew_events][:2] == ["clock_skew", "clock_skew_cleared"], skew_events
        assert abs(skew_events[0]["consensus_offset_ms"] - skew_s * 1000) < 500, skew_events[0]
        # Back in bounds for 3 probe rounds (3 s at the default 1 s interval) before it is eligible again.
        assert recover_s is not None and 2.5 <= recover_s <= 15, recover_s

        p3 = status["p3"]
        assert p3.planner.liveness == cpb.PLANNER_LIVENESS_SUSPENDED and p3.partitions_owned == 0, p3
        assert abs(p3.clock_offset.ToMilliseconds() - skew_s * 1000) < 500, p3  # its clock minus p1's
        assert status["p2"].planner.liveness == cpb.PLANNER_LIVENESS_ALIVE

        # --- the others keep every planned time: each ran once, none skipped, none very late ----------------
        ids = effects_once(eng.effects)
        plan = parse_spec("* * * * * *")
        missing = []
        for i in range(SCHEDULES):
            sid = f"sec-{i:03d}"
            for t_ms in plan.between_ms(window_start, window_end):
                eid = execution_id(sid, t_ms)
                if ids.get(eid) != 1:
                    rec = await eng.record(sid, t_ms)
                    missing.append(f"{eid}: {rec.state.value if rec else 'no record'}")
        assert not missing, f"{len(missing)} planned times did not run exactly once: {missing[:10]}"
        skipped = [e.id for e in await eng.executions() if e.state is ExecState.SKIPPED]
        skips = 0
        for p in range(P):
            skips += len((await kv.range(eng.ks.skips(p), prefix=True)).kvs)
        assert not skipped and not skips, f"skip records: {skipped[:5]}, {skips} skip ranges"
        assert not late or late[0][0] <= LATE_BOUND_S, f"runs started late: {late[:5]}"
