"""Overlap and missed-run policies not covered by test_planner_loop.py, against a real etcd with the
real planner loop (one process, a fake dispatcher that completes or holds executions through the real
result path): buffer_all, allow_all, missed-run `latest` and `all` under the cap, each checked from the
ledger, with every owed planned time accounted for (an execution or a skip range with its reason);
and a dead letter made by the planner's own timeout (the worker died on the last attempt) keeps the payload.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import pytest

from chaos.infra.etcd import EtcdCluster
from scheduler.clock import SYSTEM_CLOCK
from scheduler.execution import IN_FLIGHT, ErrorClass, ExecState, Execution
from scheduler.model import Policies, RetryPolicy
from scheduler.node import PlannerNode
from scheduler.store.etcd import EtcdClient
from scheduler.store.keyspace import Keyspace
from scheduler.timeplan import MissedRuns, Overlap, parse_spec
from tests.store.test_planner_loop import COORD, FAST, FakeDispatcher, executions, run_node, sched

pytestmark = pytest.mark.etcd


@pytest.fixture
async def kv(etcd_server: EtcdCluster) -> AsyncIterator[EtcdClient]:
    async with EtcdClient(etcd_server.config(timeout=0.5)) as c:
        yield c


async def skip_ranges(kv: EtcdClient, ks: Keyspace, sid: str) -> list[tuple[int, int, str]]:
    out = []
    for p in range(COORD.partitions):
        for x in (await kv.range(ks.skips(p, sid), prefix=True)).kvs:
            after, through = (int(v) for v in x.key.decode().rsplit("/", 1)[1].split("-"))
            out.append((after, through, x.value.decode()))
    return out


def unaccounted(spec: str, after_ms: int, through_ms: int, es: list[Execution],
                skips: list[tuple[int, int, str]]) -> list[int]:
    """Planned times in (after, through] with neither an execution record nor a skip range."""
    have = {e.planned_ms for e in es}
    return [t for t in parse_spec(spec).between_ms(after_ms, through_ms)
            if t not in have and not any(a < t <= b for a, b, _ in skips)]


class Releasable(FakeDispatcher):
    """Holds every execution until `finish_held()`; from then on completes them at once."""

    def __init__(self, kv: EtcdClient, node: PlannerNode) -> None:
        super().__init__(kv, node, outcome="hold")

    async def finish_held(self) -> None:
        self.outcome = "ok"
        await asyncio.gather(*(self._finish(e) for e in list(self.submitted)))


async def test_buffer_all_runs_every_buffered_one_in_order_after_the_running_one(
        kv: EtcdClient, key_prefix: str) -> None:
    ks = Keyspace(key_prefix.rstrip("/"))
    node = PlannerNode(kv, ks, COORD, SYSTEM_CLOCK, planner=FAST)
    disp = Releasable(kv, node)
    node.dispatcher = disp
    await node.store.create(sched(1, policies=Policies(overlap=Overlap.BUFFER_ALL)), SYSTEM_CLOCK.wall_ms())
    task = asyncio.create_task(node.run())
    try:
        await asyncio.sleep(3.5)
        assert len(disp.submitted) == 1, "nothing starts while the first run is going"
        es = await executions(node, kv)
        held_back = [e for e in es if e.state is ExecState.SCHEDULED and e.due_ms <= SYSTEM_CLOCK.wall_ms() - 300]
        assert len(held_back) >= 2, f"every due run waits behind the running one: {len(held_back)}"
        assert not [e for e in es if e.state is ExecState.SKIPPED], "buffer_all skips nothing"
        await disp.finish_held()
        await asyncio.sleep(1.5)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    order = [e.planned_ms for e in disp.submitted]
    assert order == sorted(order) and len(set(order)) == len(order), "oldest first, each once"
    assert {e.id for e in held_back} <= {e.id for e in disp.submitted}, "every buffered run ran"
    es = await executions(node, kv)
    assert not [e for e in es if e.state is ExecState.SKIPPED]
    assert sum(1 for e in es if e.state in IN_FLIGHT) <= 1, "one at a time"


async def test_allow_all_runs_them_side_by_side(kv: EtcdClient, key_prefix: str) -> None:
    ks = Keyspace(key_prefix.rstrip("/"))
    node = PlannerNode(kv, ks, COORD, SYSTEM_CLOCK, planner=FAST)
    disp = FakeDispatcher(kv, node, outcome="hold")  # nothing ever finishes
    node.dispatcher = disp
    await node.store.create(sched(1, policies=Policies(overlap=Overlap.ALLOW_ALL)), SYSTEM_CLOCK.wall_ms())
    await run_node(node, 3.5)
    es = await executions(node, kv)
    running = [e for e in es if e.state in IN_FLIGHT]
    assert len(running) >= 3 and len(disp.submitted) == len(running), f"{len(running)} running at once"
    assert not [e for e in es if e.state is ExecState.SKIPPED]
    assert len({e.id for e in disp.submitted}) == len(disp.submitted)


async def test_missed_runs_latest_and_all_under_the_cap(kv: EtcdClient, key_prefix: str) -> None:
    ks = Keyspace(key_prefix.rstrip("/"))
    node = PlannerNode(kv, ks, COORD, SYSTEM_CLOCK, planner=FAST)
    disp = FakeDispatcher(kv, node)
    node.dispatcher = disp
    now = SYSTEM_CLOCK.wall_ms()
    spec = "*/2 * * * * *"
    latest = Policies(missed_runs=MissedRuns.LATEST, catchup_window_ms=30_000, overlap=Overlap.ALLOW_ALL)
    every = Policies(missed_runs=MissedRuns.ALL, catchup_window_ms=60_000, catchup_cap=100,
                     overlap=Overlap.ALLOW_ALL)
    await node.store.create(sched(1, spec=spec, policies=latest), now - 60_000)  # nobody planned for a minute
    await node.store.create(sched(2, spec=spec, policies=every), now - 20_000)
    started = SYSTEM_CLOCK.wall_ms()
    await run_node(node, 2.0)
    es = await executions(node, kv)
    horizon = started - FAST.late_grace_ms  # planned times older than this were "missed"
    late = {sid: sorted(e.planned_ms for e in es if e.schedule_id == sid and e.due_ms - e.planned_ms > 900)
            for sid in ("s1", "s2")}
    # The catch-up horizon is the claim time minus the grace: at least `horizon`, a little later if the
    # claim took a while; the times up to it are exactly the ones caught up (due now, not at their time).
    plan = parse_spec(spec)
    assert len(late["s1"]) == 1 and late["s1"][0] >= list(plan.between_ms(now - 60_000, horizon))[-1], \
        f"latest: only the most recent missed time runs: {late['s1']}"
    reasons = {json.loads(r)["reason"] for _, _, r in await skip_ranges(kv, ks, "s1")}
    assert reasons == {"outside_catchup_window", "policy_skip"}
    assert late["s2"] == list(plan.between_ms(now - 20_000, late["s2"][-1])), "all, under the cap: every one"
    assert set(plan.between_ms(now - 20_000, horizon)) <= set(late["s2"]) and len(late["s2"]) >= 7
    assert await skip_ranges(kv, ks, "s2") == []
    done_through = SYSTEM_CLOCK.wall_ms() - 1_000
    for sid, created in (("s1", now - 60_000), ("s2", now - 20_000)):
        mine = [e for e in es if e.schedule_id == sid]
        gaps = unaccounted(spec, created, done_through, mine, await skip_ranges(kv, ks, sid))
        assert not gaps, f"{sid}: planned times neither run nor skipped: {gaps}"


async def test_a_dead_letter_from_a_timeout_keeps_the_payload(kv: EtcdClient, key_prefix: str) -> None:
    """The last attempt's worker died (no result): the planner's own timeout dead-letters the execution,
    and the dead letter must keep the payload for a replay, as one recorded from a worker's result does."""
    ks = Keyspace(key_prefix.rstrip("/"))
    node = PlannerNode(kv, ks, COORD, SYSTEM_CLOCK, planner=FAST)
    disp = FakeDispatcher(kv, node, outcome="hold")  # the worker takes it and is never heard of again
    node.dispatcher = disp
    pol = Policies(execution_timeout_ms=500, retry=RetryPolicy(max_attempts=1))
    start = SYSTEM_CLOCK.wall_ms() // 1000 * 1000 + 2000
    await node.store.create(sched(1, payload=b"replay me", start_ms=start, end_ms=start, policies=pol),
                            SYSTEM_CLOCK.wall_ms())
    await run_node(node, 6.0)  # due in <= 2 s, deadline 0.5 s + 2 s slack later
    e = await node.ledger.get(kv, "s1", start)
    assert e is not None and e.state is ExecState.DEAD_LETTER, e
    assert e.attempts[0].error_class is ErrorClass.TIMEOUT
    got = await kv.get(ks.dead_letter(node.store.partition("s1"), "s1", start))
    assert got is not None, "no dead-letter index entry"
    assert bytes.fromhex(json.loads(got.value)["payload"]) == b"replay me"
