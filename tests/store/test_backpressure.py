"""Backpressure in the planner loop, against a real etcd: a partition stops materializing while nobody
can take its due work, and a pool without workers never holds back the schedules of other pools."""

from __future__ import annotations

from dataclasses import replace

import pytest

from scheduler.clock import SYSTEM_CLOCK
from scheduler.execution import ExecState
from scheduler.node import PlannerNode
from scheduler.store.etcd import EtcdClient
from scheduler.store.keyspace import Keyspace, partition_for
from tests.store.test_planner_loop import COORD, FAST, FakeDispatcher, executions, kv, run_node, sched

__all__ = ["kv"]  # the fixture, re-exported for pytest

pytestmark = pytest.mark.etcd

BP = replace(FAST, backlog_ms=500)


class PoolCapacity(FakeDispatcher):
    """Workers only for the pools named in `live`."""

    live: frozenset[str] = frozenset()

    def capacity(self, pool: str) -> int:
        return 1000 if pool in self.live else 0


def same_partition_ids(n: int) -> list[int]:
    first = partition_for("s0", COORD.partitions)
    return [i for i in range(200) if partition_for(f"s{i}", COORD.partitions) == first][:n]


async def test_no_workers_at_all_stops_materializing(kv: EtcdClient, key_prefix: str) -> None:
    node = PlannerNode(kv, Keyspace(key_prefix.rstrip("/")), COORD, SYSTEM_CLOCK, planner=BP)
    node.dispatcher = PoolCapacity(kv, node)  # live: none
    t0 = SYSTEM_CLOCK.wall_ms()
    await node.store.create(sched(0), t0)
    await run_node(node, 4.0)
    es = await executions(node, kv)
    assert all(e.state is ExecState.SCHEDULED for e in es)
    # Without backpressure every second of the run plus the lookahead would be written (~4.5); with
    # it, materialization stops once the oldest waiting one is backlog_ms late.
    assert 1 <= len(es) <= 3, f"{len(es)} records materialized for a pool nobody serves"
    assert node.restarts == 0


async def test_a_pool_without_workers_does_not_hold_back_other_pools(kv: EtcdClient, key_prefix: str) -> None:
    node = PlannerNode(kv, Keyspace(key_prefix.rstrip("/")), COORD, SYSTEM_CLOCK, planner=BP)
    disp = PoolCapacity(kv, node)
    disp.live = frozenset({"live"})
    node.dispatcher = disp
    a, b = same_partition_ids(2)
    t0 = SYSTEM_CLOCK.wall_ms()
    await node.store.create(sched(a, worker_pool="live"), t0)
    await node.store.create(sched(b, worker_pool="dead"), t0)
    await run_node(node, 4.0)
    t1 = SYSTEM_CLOCK.wall_ms()
    es = await executions(node, kv)
    live = [e for e in es if e.schedule_id == f"s{a}"]
    done = [e for e in live if e.state is ExecState.SUCCEEDED]
    assert len(done) >= 3, f"only {len(done)} runs of the served pool completed"
    assert max(e.planned_ms for e in live) >= t1 - 1_500, "the served pool's schedule stopped being planned"
