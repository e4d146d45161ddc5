"""AdminService: cluster status, region switchover, planner drain, clock probe.

Status is assembled by the answering node from etcd (members, owners, checkpoints, drain requests,
region policy) and from each planner's own view of its dispatch queue and worker streams: the
answering node asks every other live planner for its local part (GetClusterStatus with the
`x-sched-local-only` header) with a short deadline, and measures the clock offset of each on the
way (Cristian's method). A planner that does not answer in time is listed with zero load and no
offset rather than failing the whole call.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass, replace

import grpc
from google.protobuf.duration_pb2 import Duration

from scheduler._gen.scheduler.v1 import admin_service_pb2 as apb
from scheduler._gen.scheduler.v1 import admin_service_pb2_grpc as agrpc
from scheduler._gen.scheduler.v1 import cluster_pb2 as cpb
from scheduler.api import inputs, paging
from scheduler.api.convert import fencing_token_pb
from scheduler.api.errors import Context, grpc_errors
from scheduler.api.quotas import QuotaAdmin
from scheduler.auth.access import OPEN, Authz
from scheduler.auth.audit import AuditLog
from scheduler.clock import Clock
from scheduler.errors import FailedPrecondition, InvalidArgument, NotFound, VersionMismatch
from scheduler.ids import FencingToken
from scheduler.planner.ownership import MemberInfo, Ownership
from scheduler.region import affinity as ra
from scheduler.region import policy as rp
from scheduler.region import store as rstore
from scheduler.status import NodeStatus
from scheduler.store.etcd.ops import Compare, delete, put
from scheduler.store.keyspace import Keyspace
from scheduler.store.kv import KV
from scheduler.timeconv import ms_to_duration, ms_to_timestamp
from scheduler.tls import PLAINTEXT, Dialer

log = logging.getLogger("scheduler.api.admin")

LOCAL_ONLY = "x-sched-local-only"
PEER_TIMEOUT = 0.5  # seconds a peer has to report its local load


@dataclass(frozen=True)
class LocalView:
    """What only this node knows (its dispatch queue, its worker streams, its partition loops), as the
    node's status snapshot (scheduler/status.py)."""

    status: Callable[[], NodeStatus]

    def queue_depth(self) -> int:
        return sum(self.status().queue_depth.values())

    def workers(self) -> list[tuple[str, str, str, int, int]]:
        """(worker id, pool, region, capacity, running) per worker stream."""
        return [(w.worker_id, w.pool, w.region, w.capacity, w.running) for w in self.status().workers]

    def waiting(self) -> dict[int, int]:
        """Owned partition -> the oldest due (or retry) time of an execution waiting for a worker."""
        return {p.partition: p.oldest_waiting_ms for p in self.status().owned if p.oldest_waiting_ms is not None}


def _policy(value: bytes | None, version: int) -> cpb.RegionPolicy:
    if value is None:
        return cpb.RegionPolicy()
    return policy_pb(rp.decode(value), version)


def policy_pb(p: rp.RegionPolicy, version: int) -> cpb.RegionPolicy:
    return cpb.RegionPolicy(
        primary_region=p.primary, version=version, updated_at=ms_to_timestamp(p.updated_ms), reason=p.reason,
        standby_regions=list(p.standby), failover_grace=ms_to_duration(p.failover_grace_ms),
        failback=p.failback.value, failback_stable=ms_to_duration(p.failback_stable_ms),
        history=[cpb.RegionChange(at=ms_to_timestamp(c.at_ms), kind=str(c.kind), from_region=c.from_region,
                                  to_region=c.to_region, by=c.by, reason=c.reason) for c in p.history],
        default_affinity=affinity_pb(p.affinity.default),
        pool_affinity=[cpb.PoolAffinity(pool=n, affinity=affinity_pb(a)) for n, a in p.affinity.pools])


def affinity_pb(a: ra.Affinity) -> cpb.WorkerAffinity:
    out = cpb.WorkerAffinity(mode=a.mode.value)
    if a.mode is ra.Mode.PREFER:
        out.prefer_wait.CopyFrom(ms_to_duration(a.prefer_wait_ms))
    return out


def affinity_request(request: apb.SetWorkerAffinityRequest) -> tuple[str | None, ra.Affinity | None]:
    """(pool or None for the default, the affinity or None to clear the override), checked: raises
    InvalidArgument naming the field before anything is read or written."""
    pool = inputs.optional_name(request.pool, "pool")
    if request.default_affinity:
        if pool:
            raise InvalidArgument("pool", "must be empty with default_affinity")
        if request.clear:
            raise InvalidArgument("clear", "the default affinity cannot be cleared; set a mode")
    elif not pool:
        raise InvalidArgument("pool", "is required (or set default_affinity)")
    if request.clear:
        return pool, None
    mode = ra.parse_mode(request.mode)
    wait = ra.DEFAULT_PREFER_WAIT_MS
    if request.HasField("prefer_wait"):
        if mode is not ra.Mode.PREFER:
            raise InvalidArgument("prefer_wait", f"only applies to mode prefer (mode is {mode.value})")
        wait = request.prefer_wait.ToMilliseconds()
    a = ra.check(ra.Affinity(mode, wait))
    return (None if request.default_affinity else pool), a


class AdminService:
    """Registered with admin_service_pb2_grpc.add_AdminServiceServicer_to_server."""

    def __init__(self, *, kv: KV, ks: Keyspace, ownership: Ownership, clock: Clock, node_id: str, region: str,
                 partitions: int, local: LocalView, rpc_timeout: float,
                 primary_last_seen_ago_ms: Callable[[], int | None] = lambda: None,
                 dial: Dialer = PLAINTEXT, audit: AuditLog | None = None,
                 peer_metadata: tuple[tuple[str, str], ...] = (), authz: Authz = OPEN) -> None:
        self.dial = dial  # channels to peers for the status fan-out (mutual TLS when configured)
        self.kv, self.ks, self.own, self.clock = kv, ks, ownership, clock
        # The audit log (ListAuditEvents) and this planner's own bearer token for the status fan-out.
        self.audit, self.peer_metadata = audit, peer_metadata
        self.node_id, self.region, self.partitions, self.local = node_id, region, partitions, local
        self.timeout = rpc_timeout
        self.primary_last_seen_ago_ms = primary_last_seen_ago_ms
        self.quotas = QuotaAdmin(kv, ks, clock, rpc_timeout, authz)  # Set/Get/List/DeleteTenantQuota

    # ---- status ---------------------------------------------------------------------------------

    def _pools(self, rows: list[tuple[str, str, str, int, int]]) -> list[apb.WorkerPoolStatus]:
        by: dict[tuple[str, str], dict[str, tuple[int, int]]] = {}
        for wid, pool, region, cap, running in rows:
            by.setdefault((pool, region), {})[wid] = (cap, running)
        return [apb.WorkerPoolStatus(pool=p, region=r, connected_workers=len(ws), capacity=sum(c for c, _ in
                ws.values()), running=sum(n for _, n in ws.values()), worker_ids=sorted(ws))
                for (p, r), ws in sorted(by.items())]

    def _local_status(self, members: dict[str, MemberInfo]) -> apb.PlannerStatus:
        rows = self.local.workers()
        me = members.get(self.node_id)
        info = cpb.PlannerInfo(node_id=self.node_id, region=self.region,
                               api_address=me.api_address if me else "",
                               liveness=self._liveness(self.node_id, alive=True, suspended=self.own.suspended),
                               last_seen=ms_to_timestamp(self.clock.wall_ms()))
        return apb.PlannerStatus(planner=info, partitions_owned=len(self.own.owned_partitions()),
                                 dispatch_queue_depth=self.local.queue_depth(),
                                 connected_workers=len({r[0] for r in rows}))

    def _waiting(self, now: int) -> list[apb.PartitionStatus]:
        """This node's owned partitions with runs waiting for a worker (only the oldest_waiting field)."""
        return [apb.PartitionStatus(partition=p, oldest_waiting=ms_to_duration(max(0, now - t)))
                for p, t in sorted(self.local.waiting().items())]

    def _liveness(self, node_id: str, *, alive: bool, suspended: str = "") -> cpb.PlannerLiveness:
        """DOWN, DRAINING (asked to hand over), SUSPENDED (standing down on its own: clock skew), ALIVE."""
        if not alive:
            return cpb.PLANNER_LIVENESS_DOWN
        if node_id in self.own.drained():
            return cpb.PLANNER_LIVENESS_DRAINING
        return cpb.PLANNER_LIVENESS_SUSPENDED if suspended else cpb.PLANNER_LIVENESS_ALIVE

    async def _peer(self, m: MemberInfo) -> tuple[apb.GetClusterStatusResponse | None, Duration | None]:
        if not m.api_address:
            return None, None
        try:
            async with self.dial.aio_channel(m.api_address) as ch:
                # The midpoint on the monotonic clock: a wall-clock step during the call moves nothing.
                w0, t0 = self.clock.wall_ms(), self.clock.monotonic()
                r: apb.GetClusterStatusResponse = await agrpc.AdminServiceStub(ch).GetClusterStatus(
                    apb.GetClusterStatusRequest(), timeout=PEER_TIMEOUT,
                    metadata=((LOCAL_ONLY, "1"), *self.peer_metadata))
                t1 = self.clock.monotonic()
            return r, ms_to_duration(r.server_time.ToMilliseconds() - (w0 + round((t1 - t0) * 500)))
        except (TimeoutError, grpc.RpcError, OSError) as e:
            log.info("peer %s did not report its status: %s", m.node_id, e)
            return None, None

    async def _members(self) -> dict[str, MemberInfo]:
        r = await self.kv.range(self.ks.members, prefix=True, timeout=self.timeout)
        return {m.node_id: m for m in (MemberInfo.decode(x.value) for x in r.kvs)}

    @grpc_errors
    async def GetClusterStatus(self, request: apb.GetClusterStatusRequest,
                               context: Context) -> apb.GetClusterStatusResponse:
        now = self.clock.wall_ms()
        members = await self._members()
        me = self._local_status(members)
        if any(k == LOCAL_ONLY for k, _ in (context.invocation_metadata() or ())):
            return apb.GetClusterStatusResponse(server_time=ms_to_timestamp(now), answered_by=self.node_id,
                                                planners=[me], worker_pools=self._pools(self.local.workers()),
                                                partitions=self._waiting(now))
        owners = await self.kv.range(self.ks.owners, prefix=True, timeout=self.timeout)
        checkpoints = await self.kv.range(self.ks.checkpoints, prefix=True, timeout=self.timeout)
        policy = await self.kv.get(self.ks.region_policy, timeout=self.timeout)
        drains = await self.kv.range(self.ks.drains, prefix=True, keys_only=True, timeout=self.timeout)
        drained = {self.ks.last_segment(x.key) for x in drains.kvs}

        peers = [m for nid, m in members.items() if nid != self.node_id]
        answers = await asyncio.gather(*(self._peer(m) for m in peers))
        planners = [me]
        pools = self._pools(self.local.workers())
        waiting = {w.partition: w.oldest_waiting for w in self._waiting(now)}
        for m, (resp, offset) in zip(peers, answers, strict=True):
            ps = apb.PlannerStatus(planner=cpb.PlannerInfo(
                node_id=m.node_id, region=m.region, api_address=m.api_address,
                liveness=self._liveness(m.node_id, alive=True, suspended=m.suspended), last_seen=ms_to_timestamp(now)))
            if resp is not None and resp.planners:
                theirs = resp.planners[0]
                ps.partitions_owned, ps.dispatch_queue_depth = theirs.partitions_owned, theirs.dispatch_queue_depth
                ps.connected_workers = theirs.connected_workers
                pools = _merge_pools(pools, list(resp.worker_pools))
            for w in resp.partitions if resp is not None else ():
                waiting.setdefault(w.partition, w.oldest_waiting)
            if offset is not None:
                ps.clock_offset.CopyFrom(offset)
            planners.append(ps)
        for nid in sorted(drained - set(members)):  # asked to drain, and since gone
            planners.append(apb.PlannerStatus(planner=cpb.PlannerInfo(node_id=nid,
                                                                      liveness=cpb.PLANNER_LIVENESS_DOWN)))
        me.planner.liveness = cpb.PLANNER_LIVENESS_DRAINING if self.node_id in drained else me.planner.liveness
        planners.sort(key=lambda p: (p.planner.region, p.planner.node_id))

        owner_of = {self.ks.partition_of(x.key): (json.loads(x.value)["node"], x.create_revision) for x in owners.kvs}
        marks = {self.ks.partition_of(x.key): int(json.loads(x.value)["watermark_ms"]) for x in checkpoints.kvs}
        parts = []
        for p in range(self.partitions):
            st = apb.PartitionStatus(partition=p)
            if p in owner_of:
                node, rev = owner_of[p]
                st.owner = node
                st.owner_region = members[node].region if node in members else ""
                st.fencing_token.CopyFrom(fencing_token_pb(FencingToken(p, rev)))
            if marks.get(p):
                st.watermark.CopyFrom(ms_to_timestamp(marks[p]))
                st.lag.CopyFrom(ms_to_duration(max(0, now - marks[p])))
            if p in waiting and owner_of.get(p, ("",))[0]:
                st.oldest_waiting.CopyFrom(waiting[p])
            parts.append(st)
        out = apb.GetClusterStatusResponse(
            server_time=ms_to_timestamp(now), answered_by=self.node_id,
            region_policy=_policy(policy.value if policy else None, policy.mod_revision if policy else 0),
            planners=planners, partition_count=self.partitions, partitions=parts,
            dispatch_queue_depth=sum(p.dispatch_queue_depth for p in planners), worker_pools=pools)
        ago = self.primary_last_seen_ago_ms()
        if ago is not None and policy is not None:
            out.primary_last_seen_ago.CopyFrom(ms_to_duration(ago))
        return out

    # ---- switchover, drain, time -------------------------------------------------------------------

    @grpc_errors
    async def Switchover(self, request: apb.SwitchoverRequest, context: Context) -> apb.SwitchoverResponse:
        """Move planning to `target_region` (and/or change the policy's settings) by a CAS on the record:
        the old region's planners release after their in-flight batches, the new region's claim."""
        region = inputs.optional_name(request.target_region, "target_region")
        if not region:
            raise InvalidArgument("target_region", "is required")
        why = inputs.reason(request.reason)
        for i, r in enumerate(request.standby_regions):
            inputs.optional_name(r, f"standby_regions[{i}]")
        failback = request.failback
        if failback and failback not in {f.value for f in rp.Failback}:
            raise InvalidArgument("failback", f"is {failback!r}; one of manual, auto")
        if request.HasField("failover_grace") and request.failover_grace.ToMilliseconds() <= 0:
            raise InvalidArgument("failover_grace", "must be positive")
        if request.HasField("failback_stable") and request.failback_stable.ToMilliseconds() <= 0:
            raise InvalidArgument("failback_stable", "must be positive")
        known = await self._known_regions()
        if region not in known:
            raise FailedPrecondition(f"region {region!r}: no planner has ever registered in it "
                                     f"(known: {', '.join(sorted(known)) or 'none'})")
        for r in request.standby_regions:
            if r not in known:
                raise FailedPrecondition(f"standby region {r!r}: no planner has ever registered in it")
        drains = await self.kv.range(self.ks.drains, prefix=True, keys_only=True, timeout=self.timeout)
        drained = {self.ks.last_segment(x.key) for x in drains.kvs}
        if not any(m.region == region and m.node_id not in drained and not m.suspended
                   for m in (await self._members()).values()):
            raise FailedPrecondition(f"region {region!r} has no live planner that is not draining or suspended: "
                                     f"nothing would plan there")
        new, version = await self._cas_policy(
            request, lambda cur: self._next_policy(cur, region, known, why, request),
            "the region policy kept changing under this call (automatic failover?); read it again")
        c = new.last
        log.warning("region policy changed by the API: primary %s", region,
                    extra={"event": "region_switchover", "to": region, "version": version,
                           "kind": str(c.kind) if c else None, "reason": why})
        return apb.SwitchoverResponse(region_policy=policy_pb(new, version))

    @grpc_errors
    async def SetWorkerAffinity(self, request: apb.SetWorkerAffinityRequest,
                                context: Context) -> apb.SetWorkerAffinityResponse:
        """One pool's worker affinity (or the default), by a CAS on the policy with a history entry. The
        planners see the record change on their watch and apply it to their next pump."""
        pool, a = affinity_request(request)
        why = inputs.reason(request.reason)

        def make(cur: rp.RegionPolicy | None) -> rp.RegionPolicy:
            if cur is None:
                raise FailedPrecondition("there is no region policy yet: write one first "
                                         "(`schedctl region switchover --to REGION`)")
            return rp.with_affinity(cur, pool, a, by=self.node_id, now_ms=self.clock.wall_ms(), reason=why)

        new, version = await self._cas_policy(request, make, "the region policy kept changing under this call; "
                                                             "read it again")
        log.warning("worker affinity changed by the API: %s", new.history[-1].reason,
                    extra={"event": "region_affinity", "pool": pool, "version": version,
                           "mode": a.mode.value if a else None})
        return apb.SetWorkerAffinityResponse(region_policy=policy_pb(new, version))

    async def _cas_policy(self, request: apb.SwitchoverRequest | apb.SetWorkerAffinityRequest,
                          make: Callable[[rp.RegionPolicy | None], rp.RegionPolicy],
                          busy: str) -> tuple[rp.RegionPolicy, int]:
        """Read the region policy, build the next one from it, and write it by CAS on the version read (or on
        the caller's `expected_version`): a change written meanwhile (an automatic failover) makes the call
        retry, or fail with VersionMismatch when the caller named a version, rather than silently undo it."""
        for _ in range(3):
            cur = await rstore.read(self.kv, self.ks, timeout=self.timeout)
            if request.HasField("expected_version") and cur.version != request.expected_version:
                raise VersionMismatch(f"the region policy is at version {cur.version}, not "
                                      f"{request.expected_version}; read it again")
            new = make(cur.policy)
            try:
                return new, await rstore.cas(self.kv, self.ks, cur.version, new, timeout=self.timeout)
            except rstore.Stale:
                if request.HasField("expected_version"):
                    raise VersionMismatch(f"the region policy is not at version {request.expected_version}; "
                                          f"read it again") from None
        raise VersionMismatch(busy)

    def _next_policy(self, cur: rp.RegionPolicy | None, region: str, known: set[str], why: str,
                     request: apb.SwitchoverRequest) -> rp.RegionPolicy:
        now = self.clock.wall_ms()
        if cur is None:
            new = rp.initial(region, tuple(known), by=self.node_id, now_ms=now, reason=why)
        elif cur.primary != region:
            kind = rp.ChangeKind.FAILBACK if region == cur.previous_primary else rp.ChangeKind.SWITCHOVER
            new = rp.moved(cur, region, kind, by=self.node_id, now_ms=now, reason=why)
        else:
            new = cur  # settings only (or nothing): no history entry, planning does not move
        if request.standby_regions:
            new = replace(new, standby=tuple(request.standby_regions))
        if request.failback:
            # The operator chose the mode: a newer version's unread mode is not written back over it.
            new = replace(new, failback=rp.Failback(request.failback),
                          unread={k: v for k, v in new.unread.items() if k != "failback"})
        if request.HasField("failover_grace"):
            new = replace(new, failover_grace_ms=request.failover_grace.ToMilliseconds())
        if request.HasField("failback_stable"):
            new = replace(new, failback_stable_ms=request.failback_stable.ToMilliseconds())
        return rp.validate(new)

    async def _known_regions(self) -> set[str]:
        r = await self.kv.range(self.ks.regions, prefix=True, keys_only=True, timeout=self.timeout)
        return {self.ks.last_segment(x.key) for x in r.kvs}

    @grpc_errors
    async def DrainPlanner(self, request: apb.DrainPlannerRequest, context: Context) -> apb.DrainPlannerResponse:
        nid = inputs.optional_name(request.node_id, "node_id")
        if not nid:
            raise InvalidArgument("node_id", "is required")
        why = inputs.reason(request.reason)
        members = await self._members()
        m = members.get(nid)
        if m is None:
            raise NotFound(f"no live planner {nid!r}")
        key = self.ks.drain(nid)
        drains = await self.kv.range(self.ks.drains, prefix=True, keys_only=True, timeout=self.timeout)
        drained = {self.ks.last_segment(x.key) for x in drains.kvs}
        eligible, primary = await self._eligible(members)
        others = sorted(o for o in eligible if o != nid and o not in drained)
        if nid in eligible and not others and nid not in drained and not request.force:
            where = f" of the planning region {primary!r}" if primary else ""
            raise FailedPrecondition(
                f"{nid!r} is the only live planner{where} that is not draining or suspended: draining it stops every "
                f"partition until an undrain (`schedctl planner undrain {nid}`), a restart, a new planner"
                f"{' or a switchover' if primary else ''}; set force (`schedctl planner drain --force`) to do it "
                f"anyway")
        value = json.dumps({"reason": why, "requested_ms": self.clock.wall_ms(), "by": self.node_id},
                           separators=(",", ":")).encode()
        # Create-if-absent: draining a draining planner changes nothing (the first request stands).
        r = await self.kv.txn([Compare.create_revision(key, "==", 0)], [put(key, value)], timeout=self.timeout)
        if r.succeeded and nid in eligible and not request.force and not await self._someone_left(nid):
            # Two drains racing (each saw the other planner still eligible) would together stop
            # everything: whoever finds that after its write takes its own request back.
            await self.kv.txn([Compare.mod_revision(key, "==", r.revision)], [delete(key)], timeout=self.timeout)
            raise FailedPrecondition(f"another drain was requested at the same time: draining {nid!r} too would "
                                     f"leave no planner to own partitions; retry, or set force")
        log.info("drain requested", extra={"event": "drain_requested", "node": nid, "reason": why,
                                           "forced": request.force and not others})
        return apb.DrainPlannerResponse(planner=cpb.PlannerInfo(
            node_id=m.node_id, region=m.region, api_address=m.api_address, liveness=cpb.PLANNER_LIVENESS_DRAINING,
            last_seen=ms_to_timestamp(self.clock.wall_ms())))

    async def _someone_left(self, nid: str) -> bool:
        """Is a live planner other than `nid` that may own partitions without a drain request (after our write)?"""
        members = await self._members()
        drains = await self.kv.range(self.ks.drains, prefix=True, keys_only=True, timeout=self.timeout)
        drained = {self.ks.last_segment(x.key) for x in drains.kvs}
        eligible, _ = await self._eligible(members)
        return any(o != nid and o not in drained for o in eligible)

    async def _eligible(self, members: dict[str, MemberInfo]) -> tuple[set[str], str]:
        """The live planners that may own partitions, and the planning region ("" with no region policy): those
        of the primary region (a standby's planners claim nothing), not suspended (clock skew). Counting every
        live planner, a drain of the primary's only planner was accepted with standbys alive, and nothing
        planned until an automatic failover took the region away (an outside audit: 15 s, 7 runs of each
        per-second schedule decided as missed)."""
        got = await self.kv.get(self.ks.region_policy, timeout=self.timeout)
        primary = ""
        if got is not None:
            with contextlib.suppress(Exception):  # a policy this build cannot read: every region counts
                primary = rp.decode(got.value).primary
        return {n for n, m in members.items() if not m.suspended and (not primary or m.region == primary)}, primary

    @grpc_errors
    async def UndrainPlanner(self, request: apb.UndrainPlannerRequest,
                             context: Context) -> apb.UndrainPlannerResponse:
        """Delete the drain request: every planner's ownership loop watches the drain keys, so the
        planner counts as eligible again and claims its share at its next reconcile."""
        nid = inputs.optional_name(request.node_id, "node_id")
        if not nid:
            raise InvalidArgument("node_id", "is required")
        members = await self._members()
        m = members.get(nid)
        r = await self.kv.delete(self.ks.drain(nid), timeout=self.timeout)
        if m is None and not r.deleted:
            raise NotFound(f"no live planner {nid!r}, and no drain request for it")
        log.info("drain withdrawn", extra={"event": "drain_withdrawn", "node": nid})
        if m is None:
            return apb.UndrainPlannerResponse(planner=cpb.PlannerInfo(node_id=nid,
                                                                      liveness=cpb.PLANNER_LIVENESS_DOWN))
        return apb.UndrainPlannerResponse(planner=cpb.PlannerInfo(
            node_id=m.node_id, region=m.region, api_address=m.api_address, liveness=cpb.PLANNER_LIVENESS_ALIVE,
            last_seen=ms_to_timestamp(self.clock.wall_ms())))

    @grpc_errors
    async def GetTime(self, request: apb.GetTimeRequest, context: Context) -> apb.GetTimeResponse:
        return apb.GetTimeResponse(server_time=ms_to_timestamp(self.clock.wall_ms()), node_id=self.node_id,
                                   region=self.region)

    @grpc_errors
    async def ListAuditEvents(self, request: apb.ListAuditEventsRequest,
                              context: Context) -> apb.ListAuditEventsResponse:
        size = paging.page_size(request.page_size)
        filters = ["audit", request.newest_first]
        after = paging.decode_token(request.page_token, filters)
        if after is not None and not (isinstance(after, str) and after):
            raise InvalidArgument("page_token", "is not a token this server issued")
        if self.audit is None:
            return apb.ListAuditEventsResponse()
        events, last = await self.audit.list(after=after or "", limit=size, newest_first=request.newest_first)
        return apb.ListAuditEventsResponse(
            events=[apb.AuditEvent(id=e.key, time=ms_to_timestamp(e.at_ms), principal=e.who, action=e.action,
                                   target=e.target, result=e.result, message=e.message, node_id=e.node)
                    for e in events],
            next_page_token=paging.encode_token(filters, last) if last else "")


    # ---- tenant quotas (scheduler/api/quotas.py) -------------------------------------------------------

    @grpc_errors
    async def SetTenantQuota(self, request: apb.SetTenantQuotaRequest, context: Context) -> apb.SetTenantQuotaResponse:
        out = await self.quotas.set(request)
        log.warning("tenant quota set by the API", extra={"event": "quota_set", "tenant": out.quota.tenant or None,
                                                           "version": out.quota.version})
        return out

    @grpc_errors
    async def GetTenantQuota(self, request: apb.GetTenantQuotaRequest, context: Context) -> apb.GetTenantQuotaResponse:
        return await self.quotas.get(request)

    @grpc_errors
    async def ListTenantQuotas(self, request: apb.ListTenantQuotasRequest,
                               context: Context) -> apb.ListTenantQuotasResponse:
        return await self.quotas.list(request)

    @grpc_errors
    async def DeleteTenantQuota(self, request: apb.DeleteTenantQuotaRequest,
                                context: Context) -> apb.DeleteTenantQuotaResponse:
        out = await self.quotas.delete(request)
        log.warning("tenant quota deleted by the API",
                    extra={"event": "quota_deleted", "tenant": request.tenant or None, "deleted": out.deleted})
        return out


def _merge_pools(a: list[apb.WorkerPoolStatus], b: list[apb.WorkerPoolStatus]) -> list[apb.WorkerPoolStatus]:
    """Workers stream to every planner, so each planner sees (nearly) the same workers: per (pool, region)
    the distinct worker ids of all views (a worker connected to one planner only still counts, once);
    capacity and running are the largest view's (a sum would count a worker once per planner)."""
    best: dict[tuple[str, str], apb.WorkerPoolStatus] = {}
    ids: dict[tuple[str, str], set[str]] = {}
    for w in (*a, *b):
        k = (w.pool, w.region)
        ids.setdefault(k, set()).update(w.worker_ids)
        if k not in best or w.connected_workers > best[k].connected_workers:
            best[k] = w
    out = []
    for k in sorted(best):
        w = apb.WorkerPoolStatus()
        w.CopyFrom(best[k])
        if ids[k]:  # a peer of an older version sends no ids: keep its count
            del w.worker_ids[:]
            w.worker_ids.extend(sorted(ids[k]))
            w.connected_workers = len(ids[k])
        out.append(w)
    return out
