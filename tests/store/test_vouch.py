"""A worker cut off from a partition's new owner only (its stream to the planner that dispatched its run
up) keeps that run: the old planner, hearing the worker list it, vouches for it to the new owner
(dispatch/vouch.py), which would otherwise give it up after the heartbeat timeout and dispatch it again
while it runs: a second effect. Real etcd, real gRPC, raw worker streams (the test decides exactly which
planner each worker reaches)."""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace

import pytest

from scheduler._gen.scheduler.v1 import worker_service_pb2 as wpb
from scheduler.clock import SYSTEM_CLOCK
from scheduler.execution import ExecState
from scheduler.model import Schedule
from scheduler.node import PlannerNode
from scheduler.store.etcd import EtcdClient
from scheduler.store.keyspace import partition_for
from tests.store.test_dispatch_liveness import COORD, FAST, LONG, Client, ok, planner, record

pytestmark = pytest.mark.etcd

TWO = replace(COORD, partitions=2, rebalance_holddown=0.5)
# Heartbeats come from this process's event loop, which the planners share: a timeout of a few stalls.
PATIENT = replace(FAST, heartbeat_timeout=1.5)


def ids_in_each_partition() -> list[str]:
    """One schedule id per partition of TWO."""
    by: dict[int, str] = {}
    for i in range(100):
        by.setdefault(partition_for(f"cut{i}", TWO.partitions), f"cut{i}")
    return [by[p] for p in range(TWO.partitions)]


async def owners(kv: EtcdClient, node: PlannerNode) -> dict[int, str]:
    out = {}
    for p in range(TWO.partitions):
        got = await kv.get(node.ks.owner(p))
        if got is not None:
            out[p] = str(json.loads(got.value)["node"])
    return out


async def test_a_run_whose_worker_cannot_reach_the_new_owner_is_kept_not_run_again(
        etcd_client: EtcdClient, key_prefix: str) -> None:
    kv = etcd_client
    prefix = key_prefix.rstrip("/")
    sids = ids_in_each_partition()
    async with planner(kv, prefix, "n1", settings=PATIENT, coord=TWO) as (n1, _d1, port1):
        planned = (SYSTEM_CLOCK.wall_ms() // 1000 + 3) * 1000
        for sid in sids:
            await n1.store.create(Schedule(id=sid, tenant="t", spec="* * * * * *", worker_pool="pool", task_type="x",
                                           start_ms=planned, end_ms=planned, policies=LONG), SYSTEM_CLOCK.wall_ms())
        w1 = Client(port1, "w1")  # reaches n1 only, from start to end
        w2: Client | None = None
        try:
            await w1.next("welcome")
            w1.send(credits=wpb.Credits(credits=len(sids)))
            got: list[wpb.Assignment] = []
            while len(got) < len(sids):
                got += (await w1.next("assignments")).assignments
            w1.send(started=wpb.Started(starts=[wpb.StartRequest(execution_id=a.execution_id, attempt=a.attempt,
                                                                 fencing_token=a.fencing_token) for a in got]))
            acks: list[wpb.StartAckEntry] = []
            while len(acks) < len(got):
                acks += (await w1.next("start_ack")).acks
            assert {a.disposition for a in acks} == {wpb.START_DISPOSITION_STARTED}
            # Its heartbeats list both runs as coming from this stream, as the SDK's do.
            w1.running = [wpb.RunningAttempt(execution_id=a.execution_id, attempt=a.attempt,
                                             fencing_token=a.fencing_token, origin=True) for a in got]
            async with planner(kv, prefix, "n2", settings=PATIENT, coord=TWO) as (_n2, d2, port2):
                w2 = Client(port2, "w2")  # reaches n2 only: a second run would come here
                await w2.next("welcome")
                w2.send(credits=wpb.Credits(credits=len(sids)))
                for _ in range(200):  # the rebalance hands one partition to n2
                    if "n2" in (await owners(kv, n1)).values():
                        break
                    await asyncio.sleep(0.1)
                moved = [p for p, n in (await owners(kv, n1)).items() if n == "n2"]
                assert len(moved) == 1, await owners(kv, n1)
                # n2 took the moved run up as an orphan at its claim: without a vouch it gives it up after
                # heartbeat_timeout + one interval (1.6 s) and sends attempt 2 to w2. Wait several of those.
                try:
                    extra = await w2.next("assignments", timeout=4 * PATIENT.heartbeat_timeout)
                except TimeoutError:
                    pass
                else:
                    pytest.fail(f"dispatched again while its worker runs it: {extra}")
                assert d2.liveness.attempts_lost == 0 and d2.liveness.orphans_vouched > 0
                for sid in sids:
                    e = await record(n1, kv, sid, planned)
                    assert e.state is ExecState.RUNNING and e.attempt == 1, e
                for a in got:  # the worker finishes, answering on the stream its runs came on
                    w1.send(results=ok(a))
                    assert (await w1.next("result_ack")).acks[0].disposition == wpb.RESULT_DISPOSITION_RECORDED
        finally:
            await w1.close()
            if w2 is not None:
                await w2.close()
        for sid in sids:
            e = await record(n1, kv, sid, planned)
            assert e.state is ExecState.SUCCEEDED and len(e.attempts) == 1 and e.attempts[0].worker == "w1", e
