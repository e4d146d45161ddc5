"""Drain mode of partition ownership against a real etcd: a drain key written by anyone makes the
named planner release everything and claim nothing, the others take its whole share, and a
restart of the drained planner clears it."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest

from scheduler.clock import FakeClock
from scheduler.planner.ownership import Ownership
from scheduler.store.etcd import EtcdClient
from scheduler.store.keyspace import Keyspace
from tests.store.test_coordination import FAST, Recorder, fast_client, wait_until

pytestmark = pytest.mark.etcd
__all__ = ["fast_client"]  # the fixture, re-used


async def test_drain_hands_everything_over_and_restart_undrains(fast_client: EtcdClient, key_prefix: str) -> None:
    ks = Keyspace(key_prefix.rstrip("/"))
    a_clock = FakeClock()
    hold = 5.0
    a = Ownership(fast_client, ks, replace(FAST, node_id="a", rebalance_holddown=hold), a_clock, listener=Recorder())
    b_rec = Recorder()
    b = Ownership(fast_client, ks, replace(FAST, node_id="b"), FakeClock(), listener=b_rec)
    ta, tb = asyncio.create_task(a.run()), asyncio.create_task(b.run())
    tb2: asyncio.Task[None] | None = None
    try:
        # A cold start: whichever started first hands on its surplus at once, since its own session is inside
        # the hold-down too (a's clock does not move here).
        await wait_until(lambda: len(a.owned) == 4 and len(b.owned) == 4)
        await fast_client.put(ks.drain("b"), b'{"reason":"test"}')  # as AdminService.DrainPlanner does
        await wait_until(lambda: len(a.owned) == 8 and not b.owned)
        assert b.drain_requested and a.drained() == {"b"}
        assert all(r == "released" for kind, _p, r in b_rec.events if kind == "lost")
        await asyncio.sleep(1.0)  # several reconcile rounds later b still claims nothing
        assert not b.owned and len(a.owned) == 8
        # A restarted b (same node id) deletes its drain key and gets its share back, once the rebalance
        # hold-down is over by a's clock: until then a keeps everything (and every partition stays owned).
        tb.cancel()
        await asyncio.gather(tb, return_exceptions=True)
        a_clock.advance(hold)  # a is in steady state now
        b2 = Ownership(fast_client, ks, replace(FAST, node_id="b"), FakeClock(), listener=Recorder())
        tb2 = asyncio.create_task(b2.run())
        await wait_until(lambda: b2.session is not None and ks.member("b") in a.members.items)
        await asyncio.sleep(1.5)  # several reconcile rounds
        assert not b2.owned and len(a.owned) == 8, "a made room for b inside its hold-down"
        a_clock.advance(hold)
        await wait_until(lambda: len(a.owned) == 4 and len(b2.owned) == 4)
        assert await fast_client.get(ks.drain("b")) is None
        assert await fast_client.get(ks.region("default")) is not None  # regions are registered at start
    finally:
        for t in (ta, tb, tb2):
            if t is not None:
                t.cancel()
        await asyncio.gather(*(t for t in (ta, tb, tb2) if t is not None), return_exceptions=True)


async def test_suspended_planner_releases_and_the_others_take_its_share(fast_client: EtcdClient,
                                                                         key_prefix: str) -> None:
    """The clock-skew guard's path through the ownership layer: the `eligible` hook says no for this
    planner (it releases at once, fenced), `set_suspended` publishes it (the other takes the whole share),
    and both undo it."""
    ks = Keyspace(key_prefix.rstrip("/"))
    skewed = {"b": False}
    a = Ownership(fast_client, ks, replace(FAST, node_id="a"), FakeClock(), listener=Recorder())
    b_rec = Recorder()
    b = Ownership(fast_client, ks, replace(FAST, node_id="b"), FakeClock(), listener=b_rec,
                  eligible=lambda m: not (m.node_id == "b" and skewed["b"]))
    ta, tb = asyncio.create_task(a.run()), asyncio.create_task(b.run())
    try:
        await wait_until(lambda: len(a.owned) == 4 and len(b.owned) == 4)
        skewed["b"] = True
        assert await b.set_suspended("clock_skew")
        await wait_until(lambda: len(a.owned) == 8 and not b.owned)
        assert all(r == "released" for kind, _p, r in b_rec.events if kind == "lost")
        member = await fast_client.get(ks.member("b"))
        assert member is not None and b'"suspended":"clock_skew"' in member.value
        await asyncio.sleep(1.0)
        assert not b.owned and len(a.owned) == 8
        skewed["b"] = False
        assert await b.set_suspended("")
        await wait_until(lambda: len(a.owned) == 4 and len(b.owned) == 4)
    finally:
        for t in (ta, tb):
            t.cancel()
        await asyncio.gather(ta, tb, return_exceptions=True)


async def test_a_planner_in_its_own_start_up_hands_nothing_to_a_peer_without_workers(
        fast_client: EtcdClient, key_prefix: str) -> None:
    """A game day (session 36, seed 3): after an F4 every planner was in its own start-up, which ignores the
    hold-down, so a partition went back to a planner 0.1 s after its restart, whose workers were still in their
    reconnect backoff; its run started 10.5 s late (bound 8 s). A peer that joined within the hold-down and says it
    has no worker yet is settling even then; once it says it has one, it gets its share at once."""
    ks = Keyspace(key_prefix.rstrip("/"))
    hold = 600.0  # neither clock moves: both stay in their own start-up, as after a cold start
    a, b = (Ownership(fast_client, ks, replace(FAST, node_id=n, rebalance_holddown=hold), FakeClock(),
                      listener=Recorder()) for n in "ab")
    b.workers_seen = False  # it serves worker streams and none has reached it yet (PlannerNode.make_dispatcher)
    ta = asyncio.create_task(a.run())
    tb: asyncio.Task[None] | None = None
    try:
        await wait_until(lambda: len(a.owned) == 8)
        tb = asyncio.create_task(b.run())
        await wait_until(lambda: b.session is not None and ks.member("b") in a.members.items)
        await asyncio.sleep(1.5)  # several reconcile rounds
        assert not b.owned and len(a.owned) == 8, "a handed partitions to a planner with no worker"
        await b.set_workers_seen()
        await wait_until(lambda: len(a.owned) == 4 and len(b.owned) == 4)
    finally:
        for t in (ta, tb):
            if t is not None:
                t.cancel()
        await asyncio.gather(*(t for t in (ta, tb) if t is not None), return_exceptions=True)
