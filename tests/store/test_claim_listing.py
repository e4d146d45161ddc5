"""`Ledger.list_for_claim` on a real etcd: the planned times after the replan margin that have a record are
listed per schedule, from the keys alone and whatever the record's state, so that a claim's catch-up goes
around runs its predecessor wrote ahead of the watermark (planner/partition.py, `start`)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import replace

import pytest

from chaos.infra.etcd import EtcdCluster
from scheduler.execution import ExecState, Trigger, new_execution
from scheduler.ids import execution_id
from scheduler.model import RetryPolicy
from scheduler.store.etcd import EtcdClient
from scheduler.store.keyspace import Keyspace, partition_for
from scheduler.store.ledger import Ledger

pytestmark = pytest.mark.etcd

T0 = 1_767_225_600_000
PARTITIONS = 4


@pytest.fixture
async def kv(etcd_server: EtcdCluster) -> AsyncIterator[EtcdClient]:
    async with EtcdClient(etcd_server.config(timeout=5.0)) as c:
        yield c


async def test_the_claim_listing_names_the_planned_times_recorded_after_the_margin(
        kv: EtcdClient, key_prefix: str) -> None:
    ks = Keyspace(key_prefix.rstrip("/"))
    ledger = Ledger(ks, PARTITIONS)
    p = partition_for("a", PARTITIONS)
    sids = [s for s in ("a", "b", "c", "d", "e", "f", "g", "h") if partition_for(s, PARTITIONS) == p][:2]
    execs = []
    for sid in sids:
        for k in range(1, 6):
            e = new_execution(id=execution_id(sid, T0 + k * 1000), schedule_id=sid, tenant="t", pool="a",
                              task_type="x", planned_ms=T0 + k * 1000, due_ms=T0 + k * 1000,
                              trigger=Trigger.SCHEDULED, retry=RetryPolicy(), timeout_ms=1000)
            execs.append(replace(e, state=ExecState.SUCCEEDED) if k == 4 else e)  # any state counts
    await kv.txn([], ledger.create_ops(execs))
    listing = await ledger.list_for_claim(kv, p, recorded_after=T0 + 2_500)
    assert listing.recorded == {sid: [T0 + 3000, T0 + 4000, T0 + 5000] for sid in sids}
    assert (await ledger.list_for_claim(kv, p)).recorded == {}


async def test_planned_in_names_the_recorded_times_of_each_span(kv: EtcdClient, key_prefix: str) -> None:
    """`Ledger.planned_in`: what a hold's skip ranges go around (planner/partition.py, `_around_records`): the
    planned times in (after, through] with a record of the schedule, whatever its state, and no other
    schedule's (a schedule id that is a prefix of another's: "a" and "ab"), in batches over 100 spans."""
    ks = Keyspace(key_prefix.rstrip("/"))
    ledger = Ledger(ks, PARTITIONS)
    p = partition_for("a", PARTITIONS)
    other = next(s for s in (f"a{i}" for i in range(100)) if partition_for(s, PARTITIONS) == p)
    execs = []
    for sid in ("a", other):
        for k in range(1, 6):
            e = new_execution(id=execution_id(sid, T0 + k * 1000), schedule_id=sid, tenant="t", pool="a",
                              task_type="x", planned_ms=T0 + k * 1000, due_ms=T0 + k * 1000,
                              trigger=Trigger.SCHEDULED, retry=RetryPolicy(), timeout_ms=1000)
            execs.append(replace(e, state=ExecState.SUCCEEDED) if k == 2 else e)
    await kv.txn([], ledger.create_ops(execs))
    spans = [("a", T0 + 1000, T0 + 4000), ("a", T0, T0 + 999), ("a", T0 + 4999, T0 + 9000),
             (other, T0, T0 + 2000)] * 30
    found = await ledger.planned_in(kv, p, spans)
    assert found == [[T0 + 2000, T0 + 3000, T0 + 4000], [], [T0 + 5000], [T0 + 1000, T0 + 2000]] * 30
