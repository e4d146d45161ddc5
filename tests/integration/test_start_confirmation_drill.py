"""A planner frozen right after committing dispatches, as real processes (`schedctl planner`, effect-worker
processes, a real etcd): its dispatches are re-dispatched by the new owner within seconds (start
confirmation), results it held reach etcd through the other planner (result_ack_timeout), and after
SIGCONT nothing runs twice."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator

import pytest

from chaos.infra.etcd import EtcdCluster, free_port
from chaos.infra.planners import OwnersView, all_owned_by
from scheduler.execution import ExecState, Execution
from scheduler.ids import execution_id
from scheduler.model import Policies, RetryPolicy
from scheduler.store.etcd import EtcdClient
from tests.integration.engine import Engine, connected, lines, next_second_ms, once, wait_until

pytestmark = pytest.mark.etcd

N = 8
POLICIES = Policies(execution_timeout_ms=300_000,  # the old wait: the attempt's deadline, 5 min 30 s
                    retry=RetryPolicy(max_attempts=1))


@pytest.fixture
async def engine(etcd_server: EtcdCluster, tmp_path: os.PathLike[str], key_prefix: str) -> AsyncIterator[Engine]:
    async with EtcdClient(etcd_server.config(timeout=2.0)) as kv:
        eng = Engine(etcd_server, tmp_path, kv, prefix=key_prefix.rstrip("/"))  # type: ignore[arg-type]
        eng.planner_settings["start_timeout_ms"] = "1000"
        try:
            yield eng
        finally:
            eng.close()


async def test_a_planner_frozen_after_its_dispatch_commit_delays_them_seconds_and_nothing_runs_twice(
    engine: Engine,
) -> None:
    eng = engine
    eng.start_planner("p1")
    async with OwnersView(eng.kv, eng.ks) as view:
        await view.wait_for(all_owned_by(eng.partitions, ["p1"]), 30, "p1 to own every partition")
    port2 = free_port()  # p2 starts only once p1 is frozen; the worker dials it from the start
    eng.start_worker("w1", planners=[eng.addresses[0], f"127.0.0.1:{port2}"])
    await connected(eng, "w1")
    t = next_second_ms(3)
    sids = [f"frozen{i}" for i in range(N)]
    await eng.create(*(once(sid, t, {}, POLICIES) for sid in sids))

    async def records() -> list[Execution | None]:
        return list(await asyncio.gather(*(eng.record(sid, t) for sid in sids)))

    async def dispatched() -> bool:
        return any(e is not None and e.state is not ExecState.SCHEDULED for e in await records())

    await wait_until(dispatched, 30, "p1 to commit the dispatches", every=0.005)
    eng.planners["p1"].pause()  # SIGSTOP right after the commit: the assignments may or may not be out
    frozen_at = time.monotonic()
    try:
        # On the address the worker already dials: a fixed port (chaos/infra/ports.py), retried should
        # another process hold it for a moment.
        await eng.planners.serve("p2", settings={"api_port": str(port2)})

        async def all_done() -> bool:
            return all(e is not None and e.state is ExecState.SUCCEEDED for e in await records())

        await wait_until(all_done, 30, f"all {N} to succeed while p1 is frozen")
        recovered = time.monotonic() - frozen_at
        during = await records()
        await asyncio.sleep(max(0.0, 8 - recovered))  # p1 stays frozen 8 s, four lease TTLs
    finally:
        eng.planners["p1"].resume()
    await asyncio.sleep(5)  # p1 wakes up: its queued assignments, held results and stale state play out
    after = await records()
    effects = [ln[0] for ln in lines(eng.effects)]
    ids = [execution_id(sid, t) for sid in sids]
    assert sorted(effects) == sorted(ids), f"each execution id must have run exactly once: {effects}\n{eng.logs()}"
    assert recovered < 15, f"{recovered:.1f} s to recover: the new owner must not wait for the deadlines"
    assert after == during, "nothing changed after p1 came back"
    again = [e for e in during if e is not None and e.attempt > 1]
    for e in during:
        assert e is not None
        started = [a for a in e.attempts if a.started_ms]
        assert len(started) == 1 and started[0].succeeded, e.attempts  # one ran; the others never started
        assert all(a.never_started for a in e.attempts if a is not started[0]), e
    print(f"recovered {recovered:.1f} s after the SIGSTOP; {len(again)}/{N} re-dispatched (never-started attempts)")
