"""Regions against a real etcd (in-process planners' ownership + region guard): only the policy's primary
region owns partitions, a policy change moves them, no policy keeps today's behaviour, a lost primary
region fails over after the grace, and two writers racing on the policy record: exactly one CAS wins.
The process-level proofs are in tests/integration/test_regions_drill.py."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace

import pytest

from scheduler.clock import SYSTEM_CLOCK
from scheduler.errors import InvalidArgument
from scheduler.planner.ownership import MemberInfo, Ownership
from scheduler.planner.region_guard import RegionGuard
from scheduler.region import policy as rp
from scheduler.region import store as rstore
from scheduler.region.affinity import Mode
from scheduler.region.policy import ChangeKind, RegionPolicy
from scheduler.store.etcd import EtcdClient
from scheduler.store.keyspace import Keyspace
from tests.store.test_coordination import FAST, Recorder, fast_client, wait_until

pytestmark = pytest.mark.etcd
__all__ = ["fast_client"]


@dataclass
class Planner:
    own: Ownership
    guard: RegionGuard
    task: asyncio.Task[None]

    async def stop(self) -> None:
        self.task.cancel()
        await asyncio.gather(self.task, return_exceptions=True)


def start(kv: EtcdClient, ks: Keyspace, node: str, region: str) -> Planner:
    holder: list[RegionGuard] = []
    own = Ownership(kv, ks, replace(FAST, node_id=node, region=region), SYSTEM_CLOCK, listener=Recorder(),
                    eligible=lambda m: holder[0].eligible(m))
    guard = RegionGuard(kv=kv, ks=ks, node_id=node, region=region, clock=SYSTEM_CLOCK, ownership=own,
                        rpc_timeout=FAST.rpc_timeout)
    holder.append(guard)

    async def both() -> None:
        g = asyncio.create_task(guard.run())
        try:
            await own.run()
        finally:
            g.cancel()
            await asyncio.gather(g, return_exceptions=True)
    return Planner(own, guard, asyncio.create_task(both(), name=f"planner-{node}"))


@pytest.fixture
async def planners(fast_client: EtcdClient, key_prefix: str) -> AsyncIterator[dict[str, Planner]]:
    out: dict[str, Planner] = {}
    yield out
    for p in out.values():
        await p.stop()


def owned(ps: dict[str, Planner], region: str) -> int:
    return sum(len(p.own.owned) for p in ps.values() if p.guard.region == region)


async def test_racing_writers_exactly_one_cas_wins(etcd_server: object, fast_client: EtcdClient,
                                                   key_prefix: str) -> None:
    ks = Keyspace(key_prefix.rstrip("/"))
    base = RegionPolicy("a", ("b", "c"), failover_grace_ms=1000)
    v = await rstore.cas(fast_client, ks, 0, base, timeout=2)
    with pytest.raises(rstore.Stale):  # a second "first write" loses too
        await rstore.cas(fast_client, ks, 0, base, timeout=2)
    async with EtcdClient(etcd_server.config(timeout=2.0)) as other:  # type: ignore[attr-defined]
        for round_ in range(10):
            cur = await rstore.read(fast_client, ks, timeout=2)
            assert cur.policy is not None and cur.version == v
            to_b = rp.moved(cur.policy, "b", ChangeKind.FAILOVER, by="b-p1", now_ms=round_)
            to_c = rp.moved(cur.policy, "c", ChangeKind.FAILOVER, by="c-p1", now_ms=round_)
            results = await asyncio.gather(rstore.cas(fast_client, ks, v, to_b, timeout=2),
                                           rstore.cas(other, ks, v, to_c, timeout=2), return_exceptions=True)
            wins = [r for r in results if isinstance(r, int)]
            assert len(wins) == 1, results
            assert sum(isinstance(r, rstore.Stale) for r in results) == 1
            after = await rstore.read(fast_client, ks, timeout=2)
            assert after.version == wins[0]
            assert after.policy == (to_b if isinstance(results[0], int) else to_c)
            # back to a for the next round (an operator's switchover)
            v = await rstore.cas(fast_client, ks, after.version, rp.moved(after.policy, "a", ChangeKind.SWITCHOVER,
                                                                          by="op", now_ms=round_), timeout=2)


async def test_bad_policy_is_refused_before_writing(fast_client: EtcdClient, key_prefix: str) -> None:
    ks = Keyspace(key_prefix.rstrip("/"))
    with pytest.raises(InvalidArgument, match="failover_grace"):
        await rstore.cas(fast_client, ks, 0, RegionPolicy("a", failover_grace_ms=0), timeout=2)
    assert (await rstore.read(fast_client, ks, timeout=2)).policy is None


async def test_no_policy_every_region_plans(fast_client: EtcdClient, key_prefix: str,
                                            planners: dict[str, Planner]) -> None:
    ks = Keyspace(key_prefix.rstrip("/"))
    for node, region in (("a1", "a"), ("b1", "b")):
        planners[node] = start(fast_client, ks, node, region)
    await wait_until(lambda: owned(planners, "a") == 4 and owned(planners, "b") == 4)
    assert all(p.guard.state().role == "any" for p in planners.values())


async def test_only_the_primary_owns_and_a_switchover_moves_everything(fast_client: EtcdClient, key_prefix: str,
                                                                        planners: dict[str, Planner]) -> None:
    ks = Keyspace(key_prefix.rstrip("/"))
    await rstore.cas(fast_client, ks, 0, RegionPolicy("a", ("b",)), timeout=2)
    for node, region in (("a1", "a"), ("a2", "a"), ("b1", "b"), ("b2", "b")):
        planners[node] = start(fast_client, ks, node, region)
    await wait_until(lambda: owned(planners, "a") == 8)
    await asyncio.sleep(1.0)
    assert owned(planners, "b") == 0
    assert {n: p.guard.state().role for n, p in planners.items()} == {"a1": "primary", "a2": "primary",
                                                                       "b1": "standby", "b2": "standby"}
    cur = await rstore.read(fast_client, ks, timeout=2)
    assert cur.policy is not None
    await rstore.cas(fast_client, ks, cur.version,
                     rp.moved(cur.policy, "b", ChangeKind.SWITCHOVER, by="test", now_ms=SYSTEM_CLOCK.wall_ms()),
                     timeout=2)
    await wait_until(lambda: owned(planners, "b") == 8 and owned(planners, "a") == 0)
    assert all(len(p.own.owned) == 4 for n, p in planners.items() if n.startswith("b"))


async def test_lost_primary_fails_over_after_the_grace(fast_client: EtcdClient, key_prefix: str,
                                                       planners: dict[str, Planner]) -> None:
    ks = Keyspace(key_prefix.rstrip("/"))
    await rstore.cas(fast_client, ks, 0, RegionPolicy("a", ("b", "c"), failover_grace_ms=1500), timeout=2)
    for node, region in (("a1", "a"), ("b1", "b"), ("c1", "c")):
        planners[node] = start(fast_client, ks, node, region)
    await wait_until(lambda: owned(planners, "a") == 8)
    # The clock starts before the stop: its lease is revoked (members/ loses it, and b1's grace starts)
    # partway through stop(), which then still shuts the rest down (measured 1.37 s from its return).
    t0 = asyncio.get_running_loop().time()
    await planners.pop("a1").stop()  # revokes its lease: members/ loses it at once
    await wait_until(lambda: owned(planners, "b") == 8, timeout=15)
    took = asyncio.get_running_loop().time() - t0
    assert took >= 1.4, f"failed over after {took:.2f}s, before the 1.5 s grace"
    cur = await rstore.read(fast_client, ks, timeout=2)
    assert cur.policy is not None and cur.policy.primary == "b" and cur.policy.standby == ("a", "c")
    assert cur.policy.last is not None and cur.policy.last.kind is ChangeKind.FAILOVER
    assert cur.policy.last.by == "b1"
    assert owned(planners, "c") == 0
    assert planners["c1"].guard.state().changes == {"automatic failover": 1}


async def test_suspended_primary_planners_do_not_count_as_live(fast_client: EtcdClient, key_prefix: str,
                                                               planners: dict[str, Planner]) -> None:
    ks = Keyspace(key_prefix.rstrip("/"))
    planners["b1"] = start(fast_client, ks, "b1", "b")
    await wait_until(lambda: planners["b1"].own.members.synced.is_set())
    m = MemberInfo("a1", "a", "", 0, suspended="clock_skew")
    await fast_client.put(ks.member("a1"), m.encode())
    await rstore.cas(fast_client, ks, 0, RegionPolicy("a", ("b",), failover_grace_ms=1000), timeout=2)
    await wait_until(lambda: owned(planners, "b") == 8, timeout=10)


async def test_auto_failback_waits_for_a_stable_old_primary(fast_client: EtcdClient, key_prefix: str,
                                                            planners: dict[str, Planner]) -> None:
    ks = Keyspace(key_prefix.rstrip("/"))
    await rstore.cas(fast_client, ks, 0, RegionPolicy("a", ("b",), failover_grace_ms=1000,
                                                      failback=rp.Failback.AUTO, failback_stable_ms=2500), timeout=2)
    planners["a1"] = start(fast_client, ks, "a1", "a")
    planners["b1"] = start(fast_client, ks, "b1", "b")
    await wait_until(lambda: owned(planners, "a") == 8)
    await planners.pop("a1").stop()
    await wait_until(lambda: owned(planners, "b") == 8, timeout=15)
    # A flap: a comes back for less than the stable period and goes again: planning stays in b.
    planners["a1"] = start(fast_client, ks, "a1", "a")
    await asyncio.sleep(1.5)
    await planners.pop("a1").stop()
    await asyncio.sleep(2.0)
    cur = await rstore.read(fast_client, ks, timeout=2)
    assert cur.policy is not None and cur.policy.primary == "b" and owned(planners, "b") == 8
    # Back for good: after the stable period it takes planning back (failback, written by a's planner).
    planners["a1"] = start(fast_client, ks, "a1", "a")
    t0 = asyncio.get_running_loop().time()
    await wait_until(lambda: owned(planners, "a") == 8, timeout=20)
    assert asyncio.get_running_loop().time() - t0 >= 2.4
    cur = await rstore.read(fast_client, ks, timeout=2)
    assert cur.policy is not None and cur.policy.primary == "a"
    assert [c.kind for c in cur.policy.history] == [ChangeKind.FAILOVER, ChangeKind.FAILBACK]
    assert cur.policy.last is not None and cur.policy.last.by == "a1"


async def test_an_unreadable_record_keeps_the_last_good_policy(fast_client: EtcdClient, key_prefix: str,
                                                               planners: dict[str, Planner]) -> None:
    ks = Keyspace(key_prefix.rstrip("/"))
    await rstore.cas(fast_client, ks, 0, RegionPolicy("a", ("b",)), timeout=2)
    for node, region in (("a1", "a"), ("b1", "b")):
        planners[node] = start(fast_client, ks, node, region)
    await wait_until(lambda: owned(planners, "a") == 8)
    # Malformed, not merely newer (an unknown failback mode is read as manual: region/compat.py).
    await fast_client.put(ks.region_policy, b'{"primary": "b", "failover_grace_ms": "soon"}')
    await asyncio.sleep(1.0)
    assert owned(planners, "a") == 8 and owned(planners, "b") == 0
    assert planners["b1"].guard.current.policy is not None and planners["b1"].guard.current.policy.primary == "a"


async def test_a_record_from_a_newer_version_is_acted_on(fast_client: EtcdClient, key_prefix: str,
                                                         planners: dict[str, Planner]) -> None:
    """A history kind and keys this version does not know (region/compat.py) do not make the record
    unreadable: the planners follow its primary, and the record is kept as it was."""
    ks = Keyspace(key_prefix.rstrip("/"))
    await rstore.cas(fast_client, ks, 0, RegionPolicy("a", ("b",)), timeout=2)
    for node, region in (("a1", "a"), ("b1", "b")):
        planners[node] = start(fast_client, ks, node, region)
    await wait_until(lambda: owned(planners, "a") == 8)
    # An unknown history kind, unknown keys, and unknown values of known fields (failback, affinity mode).
    newer = {"primary": "b", "standby": ["a"], "failback": "scheduled", "history": [
        {"at_ms": 1, "kind": "quarantine", "from": "a", "to": "b", "by": "n9", "reason": "newer", "zones": [1]}],
        "quarantined": {"a": 1}, "affinity": {"default": {"mode": "nearest"}}}
    await fast_client.put(ks.region_policy, json.dumps(newer).encode())
    await wait_until(lambda: owned(planners, "b") == 8)
    got = await fast_client.get(ks.region_policy, timeout=2)
    assert got is not None and json.loads(got.value) == newer  # nobody rewrote it meanwhile
    p = planners["a1"].guard.current.policy
    assert p is not None and p.history[0].kind == "quarantine" and p.extra == {"quarantined": {"a": 1}}
    assert p.failback is rp.Failback.MANUAL and p.affinity.default.mode is Mode.PREFER
