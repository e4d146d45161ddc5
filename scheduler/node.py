"""One planner node: etcd client, session, partition ownership, and a planner loop per owned partition.

The node watches the whole schedules/ prefix once (one stream, not one per partition) and routes
each change to the planner of the partition it belongs to. A partition's planner is restarted from
etcd's state after anything that may have left its snapshot stale (a lost compare-and-swap, an
unknown outcome, an etcd error); it ends for good when the partition is lost.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from scheduler._gen.scheduler.v1 import cluster_pb2
from scheduler.api.admin_service import AdminService, LocalView
from scheduler.api.operations import Operations
from scheduler.api.ports import OperationsPort
from scheduler.api.schedule_service import ScheduleService
from scheduler.auth.config import AuthConfig
from scheduler.auth.setup import build_security
from scheduler.clock import SYSTEM_CLOCK, Clock
from scheduler.config import CoordinationSettings, EtcdSettings
from scheduler.dispatch.service import Dispatcher
from scheduler.errors import FencedOut, NotFound, OutcomeUnknown
from scheduler.execution import ExecState, Execution, log_fields
from scheduler.ids import FencingToken, execution_id, schedule_of
from scheduler.loop_lag import LoopLagProbe, collect_soon
from scheduler.metrics.planner import PlannerMetrics
from scheduler.planner.clock_guard import ClockGuard, GuardedClock
from scheduler.planner.ownership import LostReason, MemberInfo, NotOwner, Ownership
from scheduler.planner.partition import DispatchSink, PartitionPlanner, PlannerStats, Restart
from scheduler.planner.region_guard import RegionGuard
from scheduler.planner.settings import PlannerSettings
from scheduler.quota.pacer import TenantPacer
from scheduler.quota.store import QuotaView
from scheduler.region.policy import RegionPolicy
from scheduler.status import NodeStatus, PartitionStatus, WorkerStatus
from scheduler.store.codec import decode_stored_schedule
from scheduler.store.combiner import WriteCombiner
from scheduler.store.etcd import EtcdClient, EtcdConfig
from scheduler.store.etcd.errors import Compacted, EtcdError, Malformed
from scheduler.store.etcd.ops import Op
from scheduler.store.etcd.types import EventType
from scheduler.store.fenced import CompareFailed, Fence, FenceStats
from scheduler.store.keyspace import Keyspace
from scheduler.store.kv import KV
from scheduler.store.ledger import Ledger
from scheduler.store.notices import notice_op, parse_notice
from scheduler.store.schedules import ScheduleStore, StoredSchedule
from scheduler.tls import PLAINTEXT, Dialer

log = logging.getLogger("scheduler.node")

LOADS_AT_ONCE = 2  # partitions of one node that load (claim-time reads and planning) at the same time


def etcd_client(s: EtcdSettings, rpc_timeout: float) -> EtcdClient:
    return EtcdClient(
        EtcdConfig(
            endpoints=s.etcd_endpoints,
            username=s.etcd_username,
            password=s.etcd_password,
            ca_file=s.etcd_ca_file,
            cert_file=s.etcd_cert_file,
            key_file=s.etcd_key_file,
            tls_server_name=s.etcd_tls_server_name,
            timeout=rpc_timeout,
        )
    )


def default_operations(node: PlannerNode) -> OperationsPort:
    """The operations behind trigger, rerun, backfill, cancel and the dead-letter calls."""
    return Operations(node.kv, node.ks, node.s.partitions, node.store, node.ledger, node.plan_clock,
                      rpc_timeout=node.s.rpc_timeout)


class NullDispatcher:
    """No workers attached: executions are materialized and wait in the ledger."""

    def capacity(self, pool: str) -> int:
        return 0

    def served(self, pool: str) -> bool:
        return False

    def reserve(self, pool: str, n: int) -> None:
        return None

    def release(self, pool: str, n: int) -> None:
        return None

    def submit(self, e: Execution, payload: bytes, token: FencingToken) -> None:
        raise AssertionError("nothing is dispatched without capacity")

    def expect(self, attempts: Sequence[tuple[str, int]]) -> None:
        return None

    def cancel(self, e: Execution, reason: str) -> None:
        return None

    def disarm(self, e: Execution) -> None:
        return None

    def may_arm(self, pool: str) -> bool:
        return False


class PlannerNode:
    def __init__(
        self,
        kv: KV,
        ks: Keyspace,
        settings: CoordinationSettings,
        clock: Clock,
        *,
        planner: PlannerSettings | None = None,
        dispatcher: DispatchSink | None = None,
        metrics: PlannerMetrics | None = None,
        peers: Dialer = PLAINTEXT,
        auth_config: AuthConfig | None = None,
    ) -> None:
        self.kv, self.ks, self.s, self.clock = kv, ks, settings, clock
        self.peers = peers  # channels to other planners (clock probes, status fan-out): mutual TLS when set
        self.planner_settings = planner or PlannerSettings()
        self.dispatcher: DispatchSink = dispatcher or NullDispatcher()
        self.ownership = Ownership(kv, ks, settings, clock, listener=self, eligible=self._eligible)
        self._workers_seen_task: asyncio.Task[None] | None = None
        # The clock-skew guard: probes the peers, suspends ownership while this clock is out of bounds,
        # and bounds the wall time the partition loops plan with (`plan_clock`). The API's GetTime and
        # the guard's own probes keep the raw clock: peers must measure the real skew.
        self.clock_guard = ClockGuard(node_id=settings.node_id, clock=clock, ownership=self.ownership,
                                      settings=self.planner_settings, dial=peers)
        self.plan_clock = GuardedClock(clock, self.clock_guard)
        # The region guard: only planners of the region policy's primary region are eligible (no policy:
        # all are); it also makes this planner's automatic moves (failover, failback=auto).
        self.region_guard = RegionGuard(kv=kv, ks=ks, node_id=settings.node_id, region=settings.region, clock=clock,
                                        ownership=self.ownership, rpc_timeout=settings.rpc_timeout)
        self.region_guard.on_policy = self._region_policy
        # Always kept (plain ints): served over HTTP only when metrics_address is set (cli/planner.py).
        self.metrics = metrics or PlannerMetrics(schedule_limit=self.planner_settings.metrics_schedule_limit)
        self.metrics.observe(self.status)
        self.ownership.lease_observer = self.metrics
        self.ownership.release_settle = self._settle_starts
        self.store = ScheduleStore(kv, ks, settings.partitions, timeout=settings.rpc_timeout)
        # Who may do what (scheduler/auth/): from auth_file, or open (logged once) without one.
        self.security = build_security(self.planner_settings, kv, ks, clock, settings.node_id, settings.rpc_timeout,
                                       config=auth_config)
        self.clock_guard.peer_metadata = self.security.peer_metadata
        self.ledger = Ledger(ks, settings.partitions)
        self.fence_stats = FenceStats()
        self.loop_stats = PlannerStats()  # over every partition loop this node ran (rounds: a spin shows)
        self.combiner = WriteCombiner(kv, max_ops=settings.max_txn_ops, max_bytes=settings.max_txn_bytes,
                                      timeout=settings.rpc_timeout, disable_fencing=settings.unsafe_disable_fencing,
                                      stats=self.fence_stats)
        # Tenant quotas as the planner needs them (a watch-fed view) and the executions-per-second pacer that
        # defers over-quota starts; each node paces with its share of a tenant's rate (owned partitions / P).
        self.quotas = QuotaView(kv, ks, timeout=settings.rpc_timeout)
        self.pacer = TenantPacer(self.quotas.rate,
                                 # at least one partition's share: a node that materializes owns one (a share of
                                 # 0 while claiming would push the tenant's next slot out without end)
                                 lambda: max(1, len(self.ownership.owned_partitions())) / max(1, settings.partitions),
                                 self.quotas.any_rate)
        self.quotas.on_change = self.pacer.forget
        self.metrics.quota_deferrals = self.pacer.stats
        self.planners: dict[int, PartitionPlanner] = {}
        # Claim-time loads are CPU-bound and sliced (PartitionPlanner.load); this many at once keeps one
        # reading from etcd while another decodes, and keeps each event-loop turn short however many
        # partitions were claimed together (docs/architecture.md, "A busy planner keeps its session").
        self.load_gate = asyncio.Semaphore(LOADS_AT_ONCE)
        # The longest the event loop went without a turn (log line on a stall, a gauge in the metrics): the
        # keep-alive waits that long for its turn too. Real time, whatever clock the node was given.
        self.loop_lag = LoopLagProbe(SYSTEM_CLOCK.monotonic, warn_after=min(0.5, settings.renew / 2))
        self.restarts = 0  # partition planners restarted from etcd's state (a lost CAS, an unknown outcome)
        self.restart_reasons: dict[str, int] = {}  # the same, by reason (metrics)
        # Per owned partition: since when its planner keeps failing on etcd (no run of it lasting a lease
        # TTL), and when its current planner started; `_resign_if_unserved` reads both.
        self._unserved_since: dict[int, float] = {}
        self._planner_started: dict[int, float] = {}
        self._failed_at: dict[int, float] = {}
        self._loops: dict[int, asyncio.Task[None]] = {}
        # Every partition task still running, including those cancelled on a loss or a re-claim and no
        # longer in _loops: shutdown waits for all of them before the etcd channel closes (a drill's
        # planner logged "unhandled exception during asyncio.run() shutdown ... Channel is closed" from a
        # partition task that had been dropped from _loops but was still unwinding).
        self._all_loops: set[asyncio.Task[None]] = set()

    def _eligible(self, m: MemberInfo) -> bool:
        """The ownership layer's `eligible` hook: a planner of the policy's primary region (any region when
        there is no policy), and this planner only while its clock is in bounds."""
        return self.region_guard.eligible(m) and self.clock_guard.eligible(m)

    def advertise(self, api_address: str) -> None:
        """Set the address registered with our membership (known once the server is bound)."""
        self.s = replace(self.s, api_address=api_address)
        self.ownership.advertise(api_address)

    def make_dispatcher(self, **options: Any) -> Dispatcher:
        """The gRPC-facing dispatcher, wired to this node's ledger, members and planners."""
        options.setdefault("heartbeat_interval", self.planner_settings.heartbeat_interval)
        options.setdefault("heartbeat_timeout", self.planner_settings.heartbeat_timeout)
        options.setdefault("duplicate_file", self.planner_settings.unsafe_duplicate_delivery_file)  # tests only
        options.setdefault("start_window", self.planner_settings.start_window)
        options.setdefault("authz", self.security.authz)
        # A result or start for a partition another node owns carries a notice in the same txn, telling
        # that owner to re-read the record (`_notice_unless_owned`: nothing on the common path, the owner).
        # The guarded clock here too: a skewed planner that still serves worker streams (it owns nothing once
        # the guard trips) records results, starts and deadlines on every partition; with its raw clock a
        # +30 s skew stamped results 30 s in the future, and the overlap rule then skipped runs due up to
        # then (a drill's `[bad-skip] ... manufactured overlap`). GetTime (AdminService) keeps the raw clock:
        # it is what peers probe to find the skew.
        d = Dispatcher(node_id=self.s.node_id, region=self.s.region, kv=self.kv, ledger=self.ledger,
                       clock=self.plan_clock,
                       planners=self.planner_infos, on_transition=self._on_transition,
                       lookup=self.lookup_pending, on_capacity=self._wake_starved,
                       on_lost_attempts=self.on_lost_attempts, on_started=self._on_started,
                       notice_for=self._notice_unless_owned, owns=self.owns_execution, payload_of=self.payload_of,
                       rpc_timeout=self.s.rpc_timeout, on_worker=self._worker_connected, **options)
        self.dispatcher = d
        if self.ownership.workers_seen is None:
            self.ownership.workers_seen = False  # published with the session: no worker yet (planner/ownership.py)
        d.set_region_policy(self.region_guard.current.policy)
        return d

    def _worker_connected(self) -> None:
        if self.ownership.workers_seen is False and self._workers_seen_task is None:
            # Kept referenced: the loop holds only a weak reference to a task.
            self._workers_seen_task = asyncio.create_task(self.ownership.set_workers_seen(), name="workers-seen")

    def _region_policy(self, policy: RegionPolicy | None) -> None:
        """A new region policy: the dispatcher applies its planning region and worker affinity at once."""
        if isinstance(self.dispatcher, Dispatcher):
            self.dispatcher.set_region_policy(policy)

    def make_api(self, ops: OperationsPort | None = None) -> tuple[ScheduleService, AdminService]:
        """The ScheduleService and AdminService of this node (any node serves any schedule).
        `ops`: the operations behind trigger/rerun/backfill/cancel/dead letters; by default the
        project's implementation (tests pass a fake)."""
        if ops is None:
            ops = default_operations(self)
        schedules = ScheduleService(kv=self.kv, ks=self.ks, store=self.store, ledger=self.ledger, clock=self.plan_clock,
                                    ops=ops, rpc_timeout=self.s.rpc_timeout, authz=self.security.authz)

        admin = AdminService(kv=self.kv, ks=self.ks, ownership=self.ownership, clock=self.clock,
                             node_id=self.s.node_id, region=self.s.region, partitions=self.s.partitions,
                             local=LocalView(self.status), rpc_timeout=self.s.rpc_timeout,
                             primary_last_seen_ago_ms=self.region_guard.primary_last_seen_ago_ms, dial=self.peers,
                             audit=self.security.audit, peer_metadata=self.security.peer_metadata,
                             authz=self.security.authz)
        return schedules, admin

    def status(self) -> NodeStatus:
        """This node's state as one snapshot (scheduler/status.py): what metrics and cluster status read."""
        owned = set(self.ownership.owned_partitions())
        parts = tuple(PartitionStatus(p, planner.ck.watermark_ms, planner.pending.oldest_ready())
                      for p, planner in sorted(self.planners.items()) if p in owned)
        d = self.dispatcher
        depth: dict[str, int] = {}
        workers: tuple[WorkerStatus, ...] = ()
        cross: dict[str, int] = {}
        windows: dict[str, tuple[int, int, int, int]] = {}
        disarmed = 0
        if isinstance(d, Dispatcher):
            cross = dict(d.cross_region)
            windows = {pool: (int(w.size), w.waiting, w.cuts, w.expired) for pool, w in d.window.pools.items()}
            disarmed = d.disarmed
            depth = d.queue.depths()
            workers = tuple(WorkerStatus(c.worker_id, c.pool, c.region, c.capacity, c.credits, c.reported)
                            for c in d.conns.values())
        return NodeStatus(now_ms=self.clock.wall_ms(), owned=parts, queue_depth=depth, workers=workers,
                          fenced_txns=self.fence_stats.txns, fencing_rejections=self.fence_stats.fenced_out,
                          restarts=dict(self.restart_reasons), rounds=self.loop_stats.rounds,
                          clock=self.clock_guard.state(), region=self.region_guard.state(),
                          cross_region_assignments=cross, node_id=self.s.node_id, partitions=self.s.partitions,
                          loop_stall_max_s=self.loop_lag.max_stall, start_windows=windows, disarmed=disarmed)

    def planner_infos(self) -> list[cluster_pb2.PlannerInfo]:
        out = []
        for kv in self.ownership.members.items.values():
            m = MemberInfo.decode(kv.value)
            out.append(cluster_pb2.PlannerInfo(node_id=m.node_id, region=m.region, api_address=m.api_address,
                                               liveness=cluster_pb2.PLANNER_LIVENESS_ALIVE))
        return out

    def lookup_pending(self, execution_id: str) -> Execution | None:
        """An unfinished execution of a partition this node plans, as its planner last wrote it."""
        sid = schedule_of(execution_id)
        planner = self.planners.get(self.store.partition(sid))
        return None if planner is None else planner.pending.get(execution_id)

    def _wake_starved(self) -> None:
        for p in self.planners.values():
            if p.starved:
                p.starved = False
                p.wake.set()

    def _on_transition(self, e: Execution) -> None:
        """A worker's result recorded by this node's dispatcher (for any partition)."""
        self.metrics.attempt_recorded(e)
        partition = self.store.partition(e.schedule_id)
        if e.state is ExecState.DEAD_LETTER:
            log.info("execution dead-lettered", extra={"event": "dead_letter", "task_type": e.task_type,
                                                       **log_fields(e, partition)})
        elif log.isEnabledFor(logging.DEBUG):  # per-execution: only when asked for (hot path)
            log.debug("result recorded", extra={"event": "result", **log_fields(e, partition)})
        planner = self.planners.get(partition)
        if planner is not None:
            planner.record_transition(e)

    async def _settle_starts(self, partition: int) -> None:
        """Until no attempt this node dispatched for `partition` still waits for its start (Ownership
        bounds the wait): a planned release hands over runs that started, not runs whose start the next
        owner's claim would refuse."""
        while (planner := self.planners.get(partition)) is not None and \
                planner.pending.awaiting_start(self.clock.wall_ms()):  # noqa: ASYNC110
            # A poll, not an event: starts reach the snapshot on several paths (this node's recorder, a
            # notice read, a reload), and the wait is short and bounded (Ownership.release_settle_s).
            await asyncio.sleep(0.05)

    def _on_started(self, e: Execution) -> None:
        """A start recorded by this node's dispatcher: the owner's snapshot takes the RUNNING record in
        (no wake: nothing for the round to do, and starts come thousands a second)."""
        planner = self.planners.get(self.store.partition(e.schedule_id))
        if planner is not None:
            planner.record_started(e)

    def owns_execution(self, execution_id: str) -> bool:
        """Whether this node plans the partition of an execution id."""
        return self._owns_schedule(schedule_of(execution_id))

    def _owns_schedule(self, schedule_id: str) -> bool:
        return self.store.partition(schedule_id) in self.planners

    def _notice_unless_owned(self, schedule_id: str, planned_ms: int) -> list[Op]:
        """A notice for the owner when this node changes a record of a partition it does not own."""
        if self._owns_schedule(schedule_id):
            return []
        return [notice_op(self.ks, self.s.partitions, schedule_id, planned_ms)]

    def on_lost_attempts(self, attempts: list[tuple[str, int]]) -> None:
        """Attempts whose worker stream ended and that no stream re-attached within the heartbeat timeout.
        The owner's planner times them out (its CAS against the record it holds: a result recorded meanwhile
        wins). Attempts of partitions this node does not own are left to their owner's recorded deadline:
        this node cannot see whether the owner re-attached them, and a timeout written without the owner's
        knowledge could retry an attempt its worker still runs for the owner."""
        by_partition: dict[int, list[tuple[str, int]]] = {}
        for eid, n in attempts:
            by_partition.setdefault(self.store.partition(schedule_of(eid)), []).append((eid, n))
        for partition, keys in by_partition.items():
            planner = self.planners.get(partition)
            if planner is not None:
                planner.lose(keys)
            else:
                log.info("lost attempts of a partition not owned here: left to the owner's deadline",
                         extra={"event": "attempts_lost_unowned", "partition": partition, "count": len(keys)})

    async def payload_of(self, schedule_id: str) -> bytes:
        """The schedule's payload, kept with a dead letter so that a replay runs with it."""
        try:
            return (await self.store.get(schedule_id)).schedule.payload
        except NotFound:
            return b""

    # OwnershipListener
    def on_acquired(self, fence: Fence) -> None:
        log.info("acquired", extra={"event": "acquired", "partition": fence.partition, "token": fence.token})
        old = self._loops.pop(fence.partition, None)
        if old is not None:
            old.cancel()
        task = asyncio.create_task(self._partition(fence.partition, fence.token))
        self._loops[fence.partition] = task
        self._all_loops.add(task)
        task.add_done_callback(self._all_loops.discard)

    def on_lost(self, partition: int, reason: LostReason) -> None:
        log.warning("lost", extra={"event": "lost", "partition": partition, "reason": reason.value})
        self.metrics.partition_lost(reason.value)
        self.planners.pop(partition, None)
        for d in (self._unserved_since, self._planner_started, self._failed_at):
            d.pop(partition, None)
        task = self._loops.pop(partition, None)
        if task is not None and task is not asyncio.current_task():
            task.cancel()  # stop planning and dispatching for this partition at once
        collect_soon()  # its planner's structures are cyclic garbage now

    async def _partition(self, partition: int, token: int = 0) -> None:
        # Restarts back off while they come quickly one after the other: a reload that leads to the same
        # failure must not spin (20 restarts a second, each reading the whole partition), and one that
        # keeps failing is visible in the metrics and the log, not only as a quiet INFO line.
        backoff = self.planner_settings.loop_interval
        while True:
            planner = PartitionPlanner(
                partition, kv=self.kv, ks=self.ks, ownership=self.ownership, store=self.store, ledger=self.ledger,
                dispatcher=self.dispatcher, settings=self.planner_settings, clock=self.plan_clock,
                node_id=self.s.node_id, rpc_timeout=self.s.rpc_timeout,
                disable_fencing=self.s.unsafe_disable_fencing, fence_stats=self.fence_stats,
                max_ops=self.s.max_txn_ops, combiner=self.combiner, metrics=self.metrics,
                node_stats=self.loop_stats, load_gate=self.load_gate, pacer=self.pacer,
            )
            self.planners[partition] = planner
            started = self.clock.monotonic()
            self._planner_started[partition] = started
            try:
                await planner.run()
            except NotOwner:
                return
            except FencedOut as e:
                log.warning("fenced out", extra={"event": "fenced_out", "partition": partition,
                                                 "token": str(FencingToken(partition, token)), "error": str(e)})
                return
            except Malformed as e:
                self._restarted("malformed_txn")
                log.error("etcd refused a write of this partition as malformed (a bug): reloading the partition",
                          exc_info=e, extra={"event": "malformed_txn", "partition": partition})
            except (Restart, OutcomeUnknown, CompareFailed, EtcdError) as e:
                reason = ("stale_state" if isinstance(e, Restart) else "outcome_unknown"
                          if isinstance(e, OutcomeUnknown) else "compare_failed" if isinstance(e, CompareFailed)
                          else "etcd_error")
                self._restarted(reason)
                level = logging.WARNING if backoff > self.planner_settings.loop_interval else logging.INFO
                log.log(level, "restarting partition planner: %s", e,
                        extra={"event": "partition_restart", "partition": partition, "reason": reason})
                if reason in ("outcome_unknown", "etcd_error"):
                    now = self.clock.monotonic()
                    if now - started >= self.s.lease_ttl:
                        self._unserved_since[partition] = now  # it served a while: a new streak begins
                    else:
                        self._unserved_since.setdefault(partition, now)
                    self._failed_at[partition] = now
                    self._resign_if_unserved(now)
            # A planner that ran for a while starts over quickly; one that failed again soon waits longer.
            ran = self.clock.monotonic() - started
            backoff = self.planner_settings.loop_interval if ran > 10 else min(backoff * 2, 5.0)
            await asyncio.sleep(backoff)

    def _resign_if_unserved(self, now: float) -> None:
        """Give the session up when every partition this node owns has failed on etcd, again and again, for
        `resign_after` (its planners reload and fail, none lasting a lease TTL) while the lease is still
        renewed: a gray link that carries the keep-alives but not the partitions' reads and writes. A peer
        whose link works takes them over (Ownership.resign). One partition failing alone is its own problem
        (a bad record): the others being served, nothing is given up."""
        owned = list(self.ownership.owned)
        after, ttl = self.s.resign_after, self.s.lease_ttl
        def unserved(p: int) -> bool:
            since, began = self._unserved_since.get(p), self._planner_started.get(p, 0.0)
            # Failing for `after`, and now waiting to restart or restarted less than a TTL ago.
            return since is not None and now - since >= after and (
                self._failed_at.get(p, 0.0) >= began or now - began < ttl)

        if not owned or not all(unserved(p) for p in owned):
            return
        log.warning("giving the session up: no partition could be served for %.1f s", after,
                    extra={"event": "resign_unserved", "partitions": len(owned)})
        self._unserved_since.clear()
        self._failed_at.clear()
        self.ownership.resign()

    def _restarted(self, reason: str) -> None:
        self.restarts += 1
        self.restart_reasons[reason] = self.restart_reasons.get(reason, 0) + 1

    async def _watch(self, prefix: bytes, route: Callable[[EventType, bytes, bytes, int], None],
                     on_compacted: Callable[[PartitionPlanner], None], start_rev: int = 0) -> None:
        """One watch stream over a whole prefix, resumed after errors, each event routed. `start_rev`:
        deliver every change after it (read before any partition is claimed, so that no change between
        a partition's load and the watch's start can fall between the two)."""
        rev = start_rev
        while True:
            try:
                if rev == 0:
                    rev = (await self.kv.range(prefix, prefix=True, count_only=True)).revision
                watch = self.kv.watch(prefix, prefix=True, start_revision=rev + 1)
                try:
                    async for batch in watch:
                        for ev in batch.events:
                            rev = max(rev, ev.revision)
                            route(ev.type, ev.kv.key, ev.kv.value, ev.kv.mod_revision)
                finally:
                    await watch.close()
            except Compacted:
                rev = 0  # fresh events from now on; the planners catch up on what was missed
                for p in self.planners.values():
                    on_compacted(p)
            except EtcdError as e:
                log.warning("watch %s: %s", prefix.decode(errors="replace"), e)
                await asyncio.sleep(0.2)

    async def _watch_schedules(self, start_rev: int = 0) -> None:
        """Route schedule changes to the owning partition planners (they reload on their own restarts)."""
        await self._watch(self.ks.all_schedules, self._route, self._schedules_missed, start_rev)

    @staticmethod
    def _schedules_missed(p: PartitionPlanner) -> None:
        """Schedule changes were compacted away before the watch saw them: the planner reloads."""
        p.reload = True
        p.wake.set()

    async def _watch_notices(self, start_rev: int = 0) -> None:
        """Route notices (records changed by others) to the owning partition planners."""
        await self._watch(self.ks.notices(), self._route_notice, lambda p: p.rescan_notices(), start_rev)

    async def _current_revision(self) -> int:
        while True:
            try:
                return (await self.kv.range(self.ks.all_schedules, prefix=True, count_only=True)).revision
            except EtcdError as e:
                log.warning("reading etcd's revision to start the watches: %s", e)
                await asyncio.sleep(0.2)

    def _route_notice(self, kind: EventType, key: bytes, value: bytes, mod_revision: int) -> None:
        if kind is not EventType.PUT:
            return  # the owner deleting a notice it handled
        n = parse_notice(key, value)
        if n is None:
            return
        if n.held_attempt and isinstance(self.dispatcher, Dispatcher):
            # A vouch (dispatch/vouch.py), taken in whether or not we own the partition yet: the first one after a
            # planned handover can come just before our claim, which clears the notice unread.
            self.dispatcher.liveness.vouched((execution_id(n.schedule_id, n.from_ms), n.held_attempt), n.worker)
        planner = self.planners.get(n.partition)
        if planner is not None:
            planner.on_notice(key, n, mod_revision)
        elif n.cancel_attempt and isinstance(self.dispatcher, Dispatcher):
            # Not the owner, but the attempt's worker may have re-attached to us: stop it here too.
            self.dispatcher.cancel_attempt(execution_id(n.schedule_id, n.from_ms), n.cancel_attempt, n.reason)

    def _route(self, kind: EventType, key: bytes, value: bytes, mod_revision: int) -> None:
        parts = key.rsplit(b"/", 2)
        partition, sid = int(parts[-2]), parts[-1].decode()
        planner = self.planners.get(partition)
        if planner is None:
            return
        if kind is EventType.PUT:
            s, activated, meta = decode_stored_schedule(value, mod_revision)
            planner.on_schedule_put(StoredSchedule(s, activated, partition, meta))
        else:
            planner.on_schedule_delete(sid, mod_revision)

    async def run(self) -> None:
        # The watches start from a revision read before any partition can be claimed: a partition loaded
        # at a later revision then sees every change after its listing (before, a schedule created while
        # the watch was still starting could be in neither the listing nor the watch).
        start_rev = await self._current_revision()
        watchers = [asyncio.create_task(self._watch_schedules(start_rev)),
                    asyncio.create_task(self._watch_notices(start_rev)),
                    asyncio.create_task(self.clock_guard.run(), name="clock-guard"),
                    asyncio.create_task(self.region_guard.run(), name="region-guard"),
                    asyncio.create_task(self.loop_lag.run(), name="loop-lag"),
                    asyncio.create_task(self.quotas.run(), name="quota-watch")]
        try:
            await self.ownership.run()
        finally:
            for w in watchers:
                w.cancel()
            loops = list(self._all_loops)
            for t in loops:
                t.cancel()
            with contextlib.suppress(Exception):
                await asyncio.gather(*watchers, *loops, return_exceptions=True)
