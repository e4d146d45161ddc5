"""The region guard of one planner: who may plan under the region policy, and the automatic moves
(failover, failback=auto) this planner makes (DESIGN.md "Regions"; decisions in region/policy.py).

It watches `/cluster/region` and feeds the ownership layer's `eligible` hook, as the clock guard does:
only planners of the policy's primary region are eligible (no record: every planner is, as before
regions existed). Unlike the clock guard's, this say is about every member, not only this planner:
all planners compute the same eligible set from the same policy, so the standby region's planners
stay at a share of zero and the primary's split the partitions between them. On a change the
ownership layer is woken at once: an ineligible planner releases each partition after its in-flight
batch (fenced delete, as a drain does) and the new region's planners claim them as the owner keys go.

Before the policy has been read at all, nobody is eligible: a planner must not claim in a region that
is not allowed to plan, even for a moment.

Liveness comes from members/ (each record lives with its planner's session lease): the guard keeps,
on this process's clock, when a planner of each region was last live and since when each region has
been live without a gap. A planner that is suspended (clock skew) or drained does not count as live.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from scheduler.clock import Clock
from scheduler.errors import InvalidArgument, OutcomeUnknown
from scheduler.planner.ownership import MemberInfo, Ownership
from scheduler.region import policy as rp
from scheduler.region import store as rstore
from scheduler.region.policy import ChangeKind, RegionView
from scheduler.status import RegionStatus
from scheduler.store.cache import PrefixCache
from scheduler.store.etcd.errors import EtcdError
from scheduler.store.keyspace import Keyspace
from scheduler.store.kv import KV

log = logging.getLogger("scheduler.planner.region")

TICK = 0.25  # seconds between judgments when nothing changes (the grace is counted in these steps)


class RegionGuard:
    def __init__(self, *, kv: KV, ks: Keyspace, node_id: str, region: str, clock: Clock, ownership: Ownership,
                 rpc_timeout: float) -> None:
        self.kv, self.ks, self.node_id, self.region, self.clock = kv, ks, node_id, region, clock
        self.own, self.timeout = ownership, rpc_timeout
        self.cache = PrefixCache(kv, ks.region_policy, timeout=rpc_timeout)
        self.current = rstore.Versioned(None, 0)
        self.changes: dict[str, int] = {}  # kind -> changes seen (metrics)
        self.written: dict[str, int] = {}  # kind -> changes this planner wrote
        self.last_seen_ms: dict[str, int] = {}  # region -> when a planner of it was last live (our wall clock)
        self.healthy_since_ms: dict[str, int] = {}  # region -> since when it has had live planners, no gap
        self._started_ms = 0
        self._unreadable = -1  # version of a record that could not be decoded (logged once)
        # Told every new policy (the node hands it to its dispatcher: worker affinity, planning region).
        self.on_policy: Callable[[rp.RegionPolicy | None], None] = lambda p: None

    # ---- what the ownership layer and the node read -------------------------------------------------

    def eligible(self, m: MemberInfo) -> bool:
        if not self.cache.synced.is_set():
            return False
        return rp.eligible_region(self.current.policy, m.region)

    def live_regions(self) -> dict[str, int]:
        drained = self.own.drained()
        out: dict[str, int] = {}
        for kv in self.own.members.items.values():
            m = MemberInfo.decode(kv.value)
            if not m.suspended and m.node_id not in drained:
                out[m.region] = out.get(m.region, 0) + 1
        return out

    def primary_last_seen_ago_ms(self) -> int | None:
        p = self.current.policy
        if p is None:
            return None
        if self.live_regions().get(p.primary, 0):
            return 0
        return max(0, self.clock.wall_ms() - self.last_seen_ms.get(p.primary, self._started_ms or self.clock.wall_ms()))

    def state(self) -> RegionStatus:
        p = self.current.policy
        role = "any" if p is None else "primary" if p.primary == self.region else "standby"
        return RegionStatus(region=self.region, role=role, policy_version=self.current.version,
                            changes=dict(self.changes), primary_last_seen_ago_ms=self.primary_last_seen_ago_ms())

    # ---- the loop -------------------------------------------------------------------------------------

    async def run(self) -> None:
        cache = asyncio.create_task(self.cache.run(), name="region-policy-cache")
        try:
            await self.cache.synced.wait()
            await self.own.members.synced.wait()
            self._started_ms = self.clock.wall_ms()
            self.own.wake()  # eligible() said no to everyone until now: reconcile at once, not at the next tick
            while True:
                self._observe_policy()
                self._observe_members()
                await self._act()
                await self._wait()
        finally:
            cache.cancel()
            await asyncio.gather(cache, return_exceptions=True)

    async def _wait(self) -> None:
        # A policy change wakes us at once; members are looked at every TICK (members.changed belongs to
        # the ownership layer, which clears it: waiting on it here could spin while it is set).
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.cache.changed.wait(), TICK)
        self.cache.changed.clear()

    def _observe_policy(self) -> None:
        kv = self.cache.items.get(self.ks.region_policy)
        version = 0 if kv is None else kv.mod_revision
        if version == self.current.version and (kv is None) == (self.current.policy is None):
            return
        if version == self._unreadable:
            return  # said so once
        try:
            new = rstore.parse(None if kv is None else kv.value, version)
        except (ValueError, KeyError, TypeError) as e:
            # A record nobody can act on: keep the last good one, loudly. Ownership stays exclusive per
            # partition either way (owner keys are create-if-absent); only where planning runs is at stake.
            self._unreadable = version
            log.error("unreadable region policy (version %d): %s; keeping the previous one", version, e,
                      extra={"event": "region_policy_unreadable"})
            return
        if new.policy is not None and (unread := new.policy.unread_values()):
            log.warning("region policy version %d holds values a newer version wrote: %s; acting on the fallbacks "
                        "until every planner is upgraded", version, ", ".join(unread),
                        extra={"event": "region_policy_newer_values", "version": version})
        old = self.current
        self.current = new
        self.on_policy(new.policy)
        c = new.policy.last if new.policy else None
        if old.version and c is not None:
            self.changes[str(c.kind)] = self.changes.get(str(c.kind), 0) + 1
        primary = new.policy.primary if new.policy else None
        eligible = rp.eligible_region(new.policy, self.region)
        log.warning("region policy version %d: primary %s; this planner (%s) is %s", version, primary or "(none)",
                    self.region, "eligible" if eligible else "standing by",
                    extra={"event": "region_policy", "version": version, "primary": primary,
                           "kind": str(c.kind) if c else None, "eligible": eligible})
        self.own.wake()  # act at once: release (after in-flight batches) or claim

    def _observe_members(self) -> None:
        now = self.clock.wall_ms()
        live = self.live_regions()
        for r in live:
            self.last_seen_ms[r] = now
            self.healthy_since_ms.setdefault(r, now)
        for r in [r for r in self.healthy_since_ms if r not in live]:
            del self.healthy_since_ms[r]

    def view(self) -> RegionView:
        p = self.current.policy
        primary = p.primary if p else ""
        return RegionView(now_ms=self.clock.wall_ms(), live=self.live_regions(),
                          primary_last_seen_ms=self.last_seen_ms.get(primary, self._started_ms),
                          healthy_since_ms=dict(self.healthy_since_ms))

    async def _act(self) -> None:
        p = self.current.policy
        # Only a planner that holds a live session and may plan itself writes: a suspended or drained
        # planner must not pull planning into its region.
        if p is None or self.own.session is None or self.own.suspended or self.own.drain_requested:
            return
        move = rp.decide(p, self.view(), self.region)
        if move is None:
            return
        to, kind = move
        new = rp.moved(p, to, kind, by=self.node_id, now_ms=self.clock.wall_ms())
        try:
            version = await rstore.cas(self.kv, self.ks, self.current.version, new, timeout=self.timeout)
        except rstore.Stale:
            log.info("region policy changed under us: another planner moved first",
                     extra={"event": "region_move_lost", "kind": kind.value, "to": to})
            return
        except (EtcdError, OutcomeUnknown, InvalidArgument) as e:
            # Outcome unknown: the watch tells us whether it landed; the next tick re-judges either way.
            log.warning("writing the region policy (%s to %s): %s", kind.value, to, e)
            return
        self.written[kind.value] = self.written.get(kind.value, 0) + 1
        v = self.view()
        gone = "" if kind is ChangeKind.FAILBACK else (
            f" (no planner of {p.primary} live for {v.now_ms - v.primary_last_seen_ms} ms)")
        log.warning("region %s: planning moves from %s to %s%s", kind.value, p.primary, to, gone,
                    extra={"event": "region_move", "kind": kind.value, "from": p.primary, "to": to,
                           "version": version})
