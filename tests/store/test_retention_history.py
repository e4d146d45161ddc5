"""Retention sweeps that list only the schedules that need it (planner/retention.py, `History`), on a real etcd.

The reference is the full listing (`history=None`), which every sweep made before: on the same stored
state, a targeted sweep must ask for exactly the same deletes, through random histories (counts around
the limit, records past the period, unfinished and protected ones, records made by another that the
owner heard of twice, records deleted behind its back), and a sweep with nothing due must not touch etcd.
"""

from __future__ import annotations

import random
from collections.abc import AsyncIterator, Sequence
from dataclasses import replace
from typing import Any

import pytest

from chaos.infra.etcd import EtcdCluster
from scheduler.execution import ExecState, Execution, Trigger
from scheduler.ids import execution_id
from scheduler.model import RetryPolicy
from scheduler.planner.retention import FULL_EVERY, History, retention_deletes
from scheduler.planner.settings import PlannerSettings
from scheduler.store.codec import encode_execution
from scheduler.store.etcd import EtcdClient
from scheduler.store.etcd.ops import DeleteOp, Op, TxnOp, delete, put
from scheduler.store.keyspace import Keyspace
from scheduler.store.ledger import Ledger
from scheduler.timeplan import SkipReason
from scheduler.timeplan.missed import SkipRange

DAY = 86_400_000
P = 0
STATES = [ExecState.SUCCEEDED, ExecState.FAILED, ExecState.SKIPPED, ExecState.CANCELLED, ExecState.DEAD_LETTER,
          ExecState.SCHEDULED, ExecState.RUNNING, ExecState.RETRY_WAIT]


@pytest.fixture
async def kv(etcd_server: EtcdCluster) -> AsyncIterator[EtcdClient]:
    async with EtcdClient(etcd_server.config(timeout=2.0)) as c:
        yield c


def record(sid: str, t: int, state: ExecState) -> Execution:
    return replace(Execution(id=execution_id(sid, t), schedule_id=sid, tenant="t", pool="p", task_type="x",
                             planned_ms=t, due_ms=t, trigger=Trigger.SCHEDULED, retry=RetryPolicy(),
                             timeout_ms=60_000), state=state)


def deleted_keys(ops: Sequence[Op]) -> set[bytes]:
    out: set[bytes] = set()
    for op in ops:
        inner = op.success if isinstance(op, TxnOp) else (op,)
        out |= {o.key for o in inner if isinstance(o, DeleteOp)}
    return out


class World:
    """One partition's history in etcd, with the owner's `History` kept as the planner keeps it."""

    def __init__(self, kv: EtcdClient, prefix: str, rng: random.Random) -> None:
        self.kv, self.ks, self.rng = kv, Keyspace(prefix), rng
        self.ledger = Ledger(self.ks, 1)
        self.history = History()
        self.unfinished: set[str] = set()
        self.protected: dict[str, int] = {}
        self.settings = PlannerSettings(retention_count=rng.randint(1, 6), retention_ms=rng.choice([DAY, 7 * DAY]))

    async def make(self, now: int, n: int, *, told: bool = True) -> None:
        """n records of random schedules, planned around `now`; `told`: the owner hears of them (its
        own creates, or a notice), sometimes twice."""
        ops: list[Op] = []
        for _ in range(n):
            sid = f"s{self.rng.randint(0, 5)}"
            # Mostly inside the period, so that the count decides as often as the age does.
            t = now - self.rng.randint(0, self.settings.retention_ms // 2 if self.rng.random() < 0.8 else 10 * DAY)
            state = self.rng.choice(STATES)
            e = record(sid, t, state)
            if state not in (ExecState.SUCCEEDED, ExecState.FAILED, ExecState.SKIPPED, ExecState.CANCELLED) \
                    and self.rng.random() < 0.7:
                self.unfinished.add(e.id)
            ops.append(put(self.ledger.key(e), encode_execution(e)))
            if told:
                for _ in range(1 + (self.rng.random() < 0.2)):
                    self.history.created(sid, t)
        for i in range(0, len(ops), 100):
            await self.kv.txn([], ops[i:i + 100])

    async def skip(self, sid: str, through: int) -> None:
        await self.kv.txn([], [self.ledger.skip_op(P, sid, SkipRange(SkipReason.PAUSED, through - 1000, through))])
        self.history.skipped(through)

    async def sweep(self, now: int, history: History | None) -> set[bytes]:
        def keep_after(sid: str) -> int | None:
            return self.protected.get(sid)
        ops = await retention_deletes(self.kv, self.ks, P, now, self.settings, keep_after=keep_after,
                                      unfinished=lambda eid: eid in self.unfinished, timeout=2.0, history=history)
        return deleted_keys(ops)

    async def commit(self, keys: set[bytes]) -> None:
        if keys:
            await self.kv.txn([], [delete(k) for k in keys])


@pytest.mark.parametrize("seed", range(12))
async def test_a_targeted_sweep_deletes_what_a_full_listing_does(kv: EtcdClient, key_prefix: str, seed: int) -> None:
    rng = random.Random(seed)
    w = World(kv, key_prefix, rng)
    now = 100 * DAY
    await w.make(now, rng.randint(0, 40))
    first = await w.sweep(now, w.history)
    assert first == await w.sweep(now, None) and w.history.full_listings == 1
    await w.commit(first)
    for step in range(8):
        now += rng.choice([1000, DAY // 2, 2 * DAY])
        await w.make(now, rng.randint(0, 8))
        if rng.random() < 0.3:  # deleted behind the owner's back: its counts run high, never low
            listing = await kv.range(w.ks.executions(P), prefix=True, keys_only=True)
            if listing.kvs:
                await kv.txn([], [delete(rng.choice(listing.kvs).key)])
        if rng.random() < 0.3:
            w.protected[f"s{rng.randint(0, 5)}"] = now - rng.randint(0, 3 * DAY)
        if rng.random() < 0.2 and w.unfinished:
            w.unfinished.discard(rng.choice(sorted(w.unfinished)))  # it finished
        want = await w.sweep(now, None)
        listed = w.history.keys_listed
        got = await w.sweep(now, w.history)
        assert got == want, f"seed {seed} step {step}: targeted sweep {sorted(got)} != full listing {sorted(want)}"
        assert w.history.full_listings == 1, "every sweep after the first one is targeted here"
        total = len((await kv.range(w.ks.executions(P), prefix=True, keys_only=True)).kvs)
        assert w.history.keys_listed - listed <= total
        await w.commit(got)


async def test_a_sweep_with_nothing_due_reads_nothing(kv: EtcdClient, key_prefix: str) -> None:
    w = World(kv, key_prefix, random.Random(7))
    w.settings = PlannerSettings(retention_count=1000, retention_ms=7 * DAY)
    now = t0 = 100 * DAY
    sizes = {"s0": 12, "s1": 5, "s2": 5, "s3": 5}
    for sid, n in sizes.items():
        for i in range(n):
            await kv.put(w.ledger.key(record(sid, now - i, ExecState.SUCCEEDED)),
                         encode_execution(record(sid, now - i, ExecState.SUCCEEDED)))
            w.history.created(sid, now - i)
    await w.skip("s1", now)
    await w.sweep(now, w.history)  # the first sweep lists everything
    listed = w.history.keys_listed
    assert listed == sum(sizes.values())

    calls: list[str] = []

    class Counting:
        def __getattr__(self, name: str) -> Any:
            calls.append(name)
            return getattr(kv, name)

    for _ in range(3):
        now += 1000
        assert await retention_deletes(Counting(), w.ks, P, now, w.settings,
                                       keep_after=lambda _: None, unfinished=lambda _: False, timeout=2.0,
                                       history=w.history) == []
    assert calls == [], f"a sweep with no schedule over its count or period read etcd: {calls}"
    # One schedule over the count: only its records are listed.
    w.settings = PlannerSettings(retention_count=10, retention_ms=7 * DAY)
    doomed = await w.sweep(now, w.history)
    assert w.history.keys_listed - listed == 12, "only s0, the one over the count, is listed"
    assert doomed == {w.ledger.key(record("s0", t0 - i, ExecState.SUCCEEDED)) for i in (10, 11)}
    await w.commit(doomed)
    assert w.history.count("s0") == 10
    # The skip record passes the period: the skips are listed, and it goes.
    doomed = await w.sweep(now + 7 * DAY + 1, w.history)
    assert w.ks.skip(P, "s1", t0 - 1000, t0) in doomed
    assert w.history.full_listings == 1


async def test_every_full_every_th_sweep_lists_everything(kv: EtcdClient, key_prefix: str) -> None:
    """A record made by a path that never told the owner is found by the next full listing."""
    w = World(kv, key_prefix, random.Random(3))
    w.settings = PlannerSettings(retention_count=2, retention_ms=7 * DAY)
    now = 100 * DAY
    await w.sweep(now, w.history)
    for i in range(4):
        await kv.put(w.ledger.key(record("s9", now - i, ExecState.SUCCEEDED)),
                     encode_execution(record("s9", now - i, ExecState.SUCCEEDED)))
    for _ in range(FULL_EVERY - 1):
        assert await w.sweep(now, w.history) == set()
    assert len(await w.sweep(now, w.history)) == 2 and w.history.full_listings == 2
