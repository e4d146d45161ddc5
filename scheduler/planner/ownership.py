"""Claiming, holding and giving up partitions (DESIGN.md, Ownership and fencing).

One session lease per process. A claim is `if create_revision(owner) == 0 then put(owner, me,
lease)`; the put's revision is the partition's fencing token. Owners learn of every change by
watching the members/ and owners/ prefixes (PrefixCache), recompute the pure rebalance decision,
and act. A partition is dropped AT ONCE when a fenced write is rejected, when the owner key changes
under us, or when the session's local self-fence deadline passes, even if etcd is unreachable.
Surplus partitions are released only after their in-flight writes finish.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Protocol

from scheduler.clock import Clock
from scheduler.config import CoordinationSettings
from scheduler.errors import FencedOut, OutcomeUnknown, SchedError
from scheduler.planner.rebalance import OwnershipSnapshot, RebalanceDecision, decide
from scheduler.store.cache import PrefixCache
from scheduler.store.etcd.deadline import LeaseObserver
from scheduler.store.etcd.errors import EtcdError
from scheduler.store.etcd.ops import Compare, delete, get, put
from scheduler.store.fenced import Fence
from scheduler.store.keyspace import Keyspace
from scheduler.store.kv import KV
from scheduler.store.session import Session, revoke_lease

log = logging.getLogger(__name__)

# A lost session's lease is revoked again this often while etcd does not answer (bounded by renew_interval),
# for at most this long: long enough for a quorum to come back, and the TTL ends the lease anyway after that.
REVOKE_RETRY_EVERY_S = 0.25
REVOKE_RETRY_FOR_S = 60.0


class LostReason(StrEnum):
    FENCED_OUT = "fenced_out"  # a fenced write was rejected
    OWNER_CHANGED = "owner_changed"  # the owner key vanished or was re-created by someone else
    SESSION_LOST = "session_lost"  # lease expired or the local self-fence deadline passed
    RELEASED = "released"  # we gave it up (rebalance, drain, shutdown)
    UNSERVED = "unserved"  # the session given up: none of its partitions could be served (Ownership.resign)


class ClusterMismatch(SchedError):
    """The cluster was initialised with another partition count: refuse to start."""


class NotOwner(SchedError):
    """This planner does not own (or may no longer write to) the partition."""


class OwnershipListener(Protocol):
    def on_acquired(self, fence: Fence) -> None: ...

    def on_lost(self, partition: int, reason: LostReason) -> None: ...


@dataclass
class _Owned:
    token: int
    inflight: int = 0
    releasing: bool = False
    idle: asyncio.Event = field(default_factory=asyncio.Event)


@dataclass(frozen=True)
class MemberInfo:
    node_id: str
    region: str
    api_address: str
    started_at_ms: int
    # Why the planner refuses to own partitions on its own (e.g. "clock_skew"); "": it does not. Every
    # planner leaves a suspended member out of the eligible set, so the others take its share.
    suspended: str = ""
    # Whether a worker stream has reached this planner since it started: False until one has (a planner that
    # serves worker streams says so from the start); None: not told (older builds, planners without a worker
    # service), taken as ready. A peer that joined within the hold-down and has no worker yet is settling for
    # everyone, even a planner itself in its own start-up (`Ownership.snapshot`).
    workers: bool | None = None

    def encode(self) -> bytes:
        d = dict(self.__dict__)
        if self.workers is None:
            del d["workers"]
        return json.dumps(d, separators=(",", ":")).encode()

    @staticmethod
    def decode(value: bytes) -> MemberInfo:
        d = json.loads(value)
        w = d.get("workers")
        return MemberInfo(str(d["node_id"]), str(d["region"]), str(d["api_address"]), int(d["started_at_ms"]),
                          str(d.get("suspended", "")), None if w is None else bool(w))


class Ownership:
    def __init__(
        self,
        kv: KV,
        ks: Keyspace,
        settings: CoordinationSettings,
        clock: Clock,
        listener: OwnershipListener | None = None,
        eligible: Callable[[MemberInfo], bool] | None = None,
    ) -> None:
        self._kv, self._ks, self._s, self._clock = kv, ks, settings, clock
        self._listener = listener
        self._eligible = eligible or (lambda m: True)
        self.owned: dict[int, _Owned] = {}
        self.session: Session | None = None
        self.members = PrefixCache(kv, ks.members, timeout=settings.rpc_timeout)
        self.owners = PrefixCache(kv, ks.owners, timeout=settings.rpc_timeout)
        # Drain requests (AdminService.DrainPlanner, written by whichever node took the call): a
        # drained planner claims nothing and releases what it owns, and every planner leaves it out
        # of the eligible set so that the others take its share.
        self.drains = PrefixCache(kv, ks.drains, timeout=settings.rpc_timeout)
        self.draining = False
        # Why this planner suspends itself (ClockGuard: "clock_skew"); published in its member record.
        self.suspended = ""
        self._published_suspended = ""
        # None: this planner does not say (no worker service); False until a worker stream reaches it (MemberInfo).
        self.workers_seen: bool | None = None
        self.claims = 0
        self.sessions = 0
        self.last_decision: RebalanceDecision | None = None
        self.lease_observer: LeaseObserver | None = None  # metrics of the sessions' keepalives
        # A planned release (rebalance, drain, shutdown) waits, after its in-flight writes and at most
        # `release_settle_s`, for this: the node's "no dispatch of this partition still waits for its
        # start" (a start is recorded only under the dispatching owner's claim, so one that arrives after
        # the release is refused and the run waits out its start-by before a new owner sends it again).
        self.release_settle: Callable[[int], Awaitable[None]] | None = None
        self.release_settle_s = 2.0
        self._member_started: dict[int, int] = {}  # session lease -> started_at_ms of its member record
        # Rebalance hold-down (rebalance.py, `settling`): when this node first saw each peer's member
        # record (key, create revision: one session), by its own monotonic clock, so that neither a
        # peer's wall clock nor skew between them decides. Peers already there at our first look count
        # as settled: they were running before us.
        self._first_seen: dict[tuple[bytes, int], float] = {}
        self._seen_any = False
        self._session_mono = 0.0  # when our current session started (monotonic)
        # Rescues (rebalance.py, `long_free`): since when each partition has been free in our synced view of
        # owners/ (monotonic), and when we claimed each partition we hold as a rescue.
        self._free_since: dict[int, float] = {}
        self._rescued: dict[int, float] = {}
        self.rescues = 0
        self._wake = asyncio.Event()
        self._changed_owned = asyncio.Event()
        self._tasks: set[asyncio.Task[None]] = set()
        self._revokes: set[asyncio.Task[None]] = set()  # lost sessions' leases still being revoked
        self._resign = False  # resign() asked the current session to end
        self.resigned = 0  # sessions given up for it

    def advertise(self, api_address: str) -> None:
        """Before run(): the API address to register (known once the gRPC server is bound)."""
        self._s = replace(self._s, api_address=api_address)

    # ---- what writers use ------------------------------------------------------------------------

    def fence(self, partition: int) -> Fence | None:
        """The fence for a write to `partition`, or None when we must not write to it now."""
        o = self.owned.get(partition)
        if o is None or o.releasing or self.session is None:
            return None
        if self.session.fenced():
            self._wake.set()  # the loop drops everything
            return None
        return Fence(partition, self._ks.owner(partition), o.token)

    @contextlib.asynccontextmanager
    async def writing(self, partition: int) -> AsyncIterator[Fence]:
        """Hold the partition for one write: a release waits until we leave. A FencedOut raised
        inside drops the partition at once (and is re-raised)."""
        fence = self.fence(partition)
        if fence is None:
            raise NotOwner(f"partition {partition} is not writable by {self._s.node_id}")
        o = self.owned[partition]
        o.inflight += 1
        o.idle.clear()
        try:
            yield fence
        except FencedOut:
            self._lose(partition, LostReason.FENCED_OUT, token=fence.token)
            raise
        finally:
            o.inflight -= 1
            if o.inflight == 0:
                o.idle.set()

    def resign(self) -> None:
        """Give the current session up (every partition with it) and stay out for a lease TTL: for a node
        whose partitions cannot be served while its lease is still renewed (a gray link to etcd that
        carries the small keep-alives but times out the partitions' reads and writes). Without it the
        partitions stayed with such a node until its lease lapsed by chance: a game day saw one keep four
        partitions unserved for 5 s behind a flaky link, and their runs start 8 s late."""
        if self.session is not None and not self._resign:
            self._resign = True
            self._wake.set()

    def wake(self) -> None:
        """Reconcile now: the `eligible` hook's answer may have changed."""
        self._wake.set()

    async def set_suspended(self, reason: str) -> bool:
        """Publish in the member record that this planner suspends ("clock_skew") or resumes ("")
        ownership on its own judgment, so that the others leave it out of (or take it back into) their
        shares. Locally the `eligible` hook says so already (and this wakes the reconcile that acts on
        it: a suspended planner releases every partition, fenced). Returns whether the record is up to
        date (False: no session yet, or etcd refused; call again)."""
        if reason != self.suspended:
            self.suspended = reason
            self._wake.set()
        session = self.session
        if reason == self._published_suspended:
            return True
        if session is None or not await self._publish_member(session, logging.WARNING, f"suspended={reason!r}"):
            return False
        self._published_suspended = reason
        return True

    async def _publish_member(self, session: Session, level: int, what: str) -> bool:
        """Put this planner's member record again under the session's lease (after a change of what it says);
        False, logged at `level`, when etcd refused or did not answer."""
        try:
            await self._kv.put(self._ks.member(self._s.node_id), self._member_info(session).encode(),
                               lease=session.lease_id, timeout=self._s.rpc_timeout)
        except (EtcdError, OutcomeUnknown) as e:
            log.log(level, "publishing %s: %s", what, e)
            return False
        return True

    def _member_info(self, session: Session) -> MemberInfo:
        started = self._member_started.get(session.lease_id)
        if started is None:
            started = self._member_started[session.lease_id] = self._clock.wall_ms()
        return MemberInfo(self._s.node_id, self._s.region, self._s.api_address, started, self.suspended,
                          self.workers_seen)

    async def set_workers_seen(self) -> None:
        """A worker stream reached this planner: published once (the member record is re-put under the session's
        lease), so that peers in their own start-up may hand it partitions now. A failed put is left to the next
        session's record, or to the hold-down's end, which makes the flag moot: it only delays hand-overs."""
        if self.workers_seen is not False:
            return
        self.workers_seen = True
        session = self.session
        if session is not None:
            await self._publish_member(session, logging.INFO, "workers=true")

    def drained(self) -> frozenset[str]:
        """Node ids with a drain request."""
        return frozenset(self._ks.last_segment(k) for k in self.drains.items)

    @property
    def drain_requested(self) -> bool:
        return self._ks.drain(self._s.node_id) in self.drains.items

    async def _startup_keys(self) -> None:
        """A fresh process is not drained (a drain lasts until the planner restarts), and its region
        is recorded as known (Switchover refuses regions no planner has ever registered in)."""
        await self._kv.delete(self._ks.drain(self._s.node_id), timeout=self._s.rpc_timeout)
        await self._kv.put(self._ks.region(self._s.region), b"{}", timeout=self._s.rpc_timeout)

    def owned_partitions(self) -> dict[int, int]:
        return {p: o.token for p, o in self.owned.items() if not o.releasing}

    # ---- lifecycle -------------------------------------------------------------------------------

    async def ensure_cluster(self) -> None:
        """Record P at first start; refuse to run with a different P afterwards."""
        key = self._ks.cluster_config
        want = json.dumps({"partitions": self._s.partitions}).encode()
        r = await self._kv.txn([Compare.create_revision(key, "==", 0)], [put(key, want)], [get(key)],
                               timeout=self._s.rpc_timeout)
        if r.succeeded:
            log.info("initialised cluster with %d partitions", self._s.partitions)
            return
        rr = r.responses[0]
        have = json.loads(rr.kvs[0].value)["partitions"] if hasattr(rr, "kvs") and rr.kvs else None
        if have != self._s.partitions:
            raise ClusterMismatch(
                f"partitions: the cluster was initialised with {have} partitions, this node is configured "
                f"with {self._s.partitions}; P is fixed at cluster init"
            )

    async def run(self) -> None:
        """Own partitions until cancelled. Survives etcd outages and lost leases by starting over."""
        await self._retry(self.ensure_cluster)
        await self._retry(self._startup_keys)
        caches = [asyncio.create_task(c.run(), name=f"cache-{c.prefix!r}")
                  for c in (self.members, self.owners, self.drains)]
        try:
            while True:
                try:
                    await self._one_session()
                except (EtcdError, OutcomeUnknown) as e:
                    log.warning("session ended: %s", e)
                self._drop_all(LostReason.SESSION_LOST)
                if self._resign:
                    # Out of the way for a lease TTL, so that a peer with a working link claims first; then
                    # a new session (if this node's link works again, it takes its share back).
                    self._resign = False
                    self.resigned += 1
                    await asyncio.sleep(self._s.lease_ttl)
                else:
                    await asyncio.sleep(min(self._s.renew, 1.0))
        finally:
            self._drop_all(LostReason.SESSION_LOST)
            for t in caches:
                t.cancel()
            await asyncio.gather(*caches, return_exceptions=True)
            for t in self._revokes:
                t.cancel()
            await asyncio.gather(*self._revokes, return_exceptions=True)
            if self.session is not None:
                await self.session.close(revoke=True)

    def _revoke_later(self, lease_id: int) -> None:
        task = asyncio.create_task(self._revoke_until_gone(lease_id), name=f"revoke-{lease_id:x}")
        self._revokes.add(task)
        task.add_done_callback(self._revokes.discard)

    async def _revoke_until_gone(self, lease_id: int) -> None:
        """Revoke a lost session's lease once etcd answers again, so that its owner keys go as soon as the
        quorum is back rather than a TTL later. Alongside the next session, which never shares the lease."""
        give_up = self._clock.monotonic() + REVOKE_RETRY_FOR_S
        tries = 1
        while self._clock.monotonic() < give_up:
            await asyncio.sleep(min(self._s.renew, REVOKE_RETRY_EVERY_S))
            tries += 1
            if await revoke_lease(self._kv, lease_id, self._s.rpc_timeout):
                log.info("lease of a lost session revoked", extra={"event": "lease_revoked_late",
                                                                   "lease": f"{lease_id:x}", "tries": tries})
                return
        log.warning("lease of a lost session not revoked: etcd did not answer; its TTL ends it",
                    extra={"event": "lease_revoke_given_up", "lease": f"{lease_id:x}", "tries": tries})

    async def drain(self) -> None:
        """Stop claiming and hand every partition over (after in-flight writes finish)."""
        self.draining = True
        self._wake.set()
        while self.owned:
            self._changed_owned.clear()
            await self._changed_owned.wait()

    async def _retry(self, fn: Callable[[], Awaitable[None]]) -> None:
        while True:
            try:
                await fn()
                return
            except (EtcdError, OutcomeUnknown) as e:
                log.warning("retrying after etcd error: %s", e)
                await asyncio.sleep(0.2)

    async def _one_session(self) -> None:
        session = Session(self._kv, self._s, self.lease_observer)
        await session.start()
        self._session_mono = self._clock.monotonic()
        self.session = session
        self.sessions += 1
        try:
            self._member_started = {}
            info = self._member_info(session)
            await self._kv.put(self._ks.member(self._s.node_id), info.encode(), lease=session.lease_id,
                               timeout=self._s.rpc_timeout)
            self._published_suspended = info.suspended
            lost = asyncio.create_task(session.keeper.wait_lost())
            try:
                while not session.fenced():
                    await self._wait_for_change(lost)
                    if session.fenced():
                        break
                    if lost.done() and not self.owned:
                        # Only with unsafe_disable_self_fence (tests): the keeper gave the lease up at
                        # its local deadline and etcd has since taken every partition back; start over.
                        break
                    if self._resign:
                        break
                    await self._reconcile(session)
            finally:
                lost.cancel()
            if self._resign:
                log.warning("session %x given up: none of its partitions could be served", session.lease_id)
                self._drop_all(LostReason.UNSERVED)
            else:
                log.warning("session %x lost: dropping all partitions", session.lease_id)
        finally:
            self._drop_all(LostReason.SESSION_LOST)
            self.session = None
            # Every session that ends is revoked (best effort, bounded by rpc_timeout), so that peers stop
            # counting us as a member and take our partitions at once instead of after the TTL. A session
            # lost at its local deadline is no exception: behind a slow link the keep-alives still reach etcd
            # while their answers come back too late, so etcd keeps the lease, and with it the partitions we
            # just dropped, up to a TTL longer (half game day gd-s20b: r2-p2's owner keys stood 2.1 s past its
            # loss, then a 0.4 s session of its own stood as a member owning nothing, and its peers waited
            # orphan_grace to rescue its share: 12 runs 8.2-8.4 s late). Always safe: we own nothing any more
            # (_drop_all above) and every write is fenced on its owner key. With etcd unreachable the revoke
            # fails after rpc_timeout, and `_revoke_later` keeps trying: a lease does not expire while etcd has
            # no quorum, and the leader elected when it is back gives every lease a fresh TTL (game day, session
            # 28: owner keys of sessions lost in a quorum loss stood 3.1 s after the quorum was back, and their
            # runs started 8.6 s late).
            lease_id = session.lease_id
            if not await session.close(revoke=True):
                self._revoke_later(lease_id)

    async def _wait_for_change(self, lost: asyncio.Task[object]) -> None:
        events = (self.members.changed, self.owners.changed, self.drains.changed, self._wake)
        waits = [asyncio.ensure_future(e.wait()) for e in events]
        # A finished `lost` with the session not fenced happens only with unsafe_disable_self_fence:
        # waiting on it again would turn this loop into a busy spin.
        also = [] if lost.done() else [lost]
        # A partition turns long-free by time alone, with no event: wake when the first one does.
        now = self._clock.monotonic()
        dues = [t + self._s.orphan_after - now for t in self._free_since.values()]
        timeout = min([self._s.renew, *(d + 0.01 for d in dues if d > 0)])
        try:
            await asyncio.wait([*waits, *also], timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waits:
                w.cancel()
        for e in events:
            e.clear()

    # ---- snapshot -> decide -> act -----------------------------------------------------------------

    def snapshot(self) -> OwnershipSnapshot:
        owners: dict[int, str] = {}
        for key, kv in self.owners.items.items():
            p = self._ks.partition_of(key)
            owners[p] = json.loads(kv.value)["node"]
        eligible = []
        settling = set()
        drained = self.drained()
        now = self._clock.monotonic()
        hold = self._s.rebalance_holddown
        seen = self._first_seen
        for gone in [k for k in seen if self.members.items.get(k[0]) is None
                     or self.members.items[k[0]].create_revision != k[1]]:
            del seen[gone]  # that session ended: forget it
        # While we are in our own start-up (a cold start of the whole cluster, every planner back after a
        # region outage), what we hold we claimed moments ago, alone: hand it on at once, since spreading
        # the backlog is what recovers fastest. The hold-down protects planners in steady state.
        young = now - self._session_mono < hold
        for kv in self.members.items.values():
            first = seen.setdefault((kv.key, kv.create_revision), now if self._seen_any else now - hold)
            info = MemberInfo.decode(kv.value)
            # ... except to a peer that has no worker yet: a planner just restarted whose workers are still in
            # their reconnect backoff would sit on what it is handed (a game day, session 36: a partition handed
            # back to a restarted planner 0.1 s after it joined waited 2.6 s for a worker stream; its run started
            # 10.5 s late, bound 8 s). Bounded by the hold-down like any settling.
            if info.node_id != self._s.node_id and now - first < hold and (not young or info.workers is False):
                settling.add(info.node_id)
            if info.node_id in drained:
                continue
            if info.suspended and info.node_id != self._s.node_id:
                continue  # a peer that stood down on its own (its clock is out of bounds); our own say is the hook's
            if self._eligible(info) and not (self.draining and info.node_id == self._s.node_id):
                eligible.append(info.node_id)
        self._seen_any = self._seen_any or bool(self.members.items)
        free_since = self._free_since
        for p in [p for p in free_since if p in owners or p in self.owned]:
            del free_since[p]
        for p in range(self._s.partitions):
            if p not in owners and p not in self.owned:  # ours: our claim is not in the watched view yet
                free_since.setdefault(p, now)
        grace = self._s.orphan_after
        long_free = frozenset(p for p, t in free_since.items() if now - t >= grace)
        rescued = self._rescued
        for p in [p for p, t in rescued.items() if p not in self.owned or now - t >= self._s.rescue_hold]:
            del rescued[p]
        return OwnershipSnapshot(self._s.partitions, self._s.node_id, tuple(sorted(eligible)), owners,
                                 frozenset(settling), long_free, frozenset(rescued))

    async def _reconcile(self, session: Session) -> None:
        if not (self.members.synced.is_set() and self.owners.synced.is_set() and self.drains.synced.is_set()):
            return
        # Owner keys that vanished or were re-created by someone else: we lost those partitions.
        for p, o in list(self.owned.items()):
            if o.releasing:
                continue  # our own delete; _release reports it
            kv = self.owners.items.get(self._ks.owner(p))
            if (kv is None or kv.create_revision != o.token) and self.owners.revision >= o.token:
                self._lose(p, LostReason.OWNER_CHANGED, token=o.token)
        # Owner keys under our live lease that we do not hold (a release whose delete failed, a claim whose
        # outcome was unknown and landed after we looked): nobody serves them and no peer can claim them
        # until our session ends. Delete them, fenced on their own create_revision.
        for key, kv in list(self.owners.items.items()):
            p = self._ks.partition_of(key)
            if kv.lease == session.lease_id and p not in self.owned:
                try:
                    r = await self._kv.txn([Compare.create_revision(key, "==", kv.create_revision)], [delete(key)],
                                           timeout=self._s.rpc_timeout)
                except EtcdError as e:
                    log.warning("deleting a stray owner key of partition %d: %s", p, e)
                    continue
                if r.succeeded:
                    log.warning("deleted an owner key of ours that we do not hold",
                                extra={"partition": p, "token": kv.create_revision, "event": "stray_owner_key"})
        decision = decide(self.snapshot())
        self.last_decision = decision
        for p in decision.release:
            if p in self.owned and not self.owned[p].releasing:
                task = asyncio.create_task(self._release(p), name=f"release-{p}")
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
        rescue = set(decision.rescue)
        for p in decision.claim:
            if session.fenced():
                return
            if await self._claim(p, session) and p in rescue:
                self._rescued[p] = self._clock.monotonic()
                self.rescues += 1
                log.warning("claimed a partition left free beyond its share", extra={
                    "partition": p, "event": "rescue_claim",
                    "free_s": round(self._rescued[p] - self._free_since.get(p, self._rescued[p]), 3)})

    async def _claim(self, partition: int, session: Session) -> bool:
        key = self._ks.owner(partition)
        value = json.dumps({"node": self._s.node_id, "lease": f"{session.lease_id:x}"}).encode()
        try:
            r = await self._kv.txn([Compare.create_revision(key, "==", 0)],
                                   [put(key, value, lease=session.lease_id)], [get(key)],
                                   timeout=self._s.rpc_timeout)
        except OutcomeUnknown:
            # The claim may have landed: our owner key, created under our lease, says so.
            kv = await self._kv.get(key, timeout=self._s.rpc_timeout)
            if kv is None or kv.lease != session.lease_id:
                return False
            token = kv.create_revision
        else:
            if not r.succeeded:
                return False  # someone else got there first; the owners/ watch will tell us
            token = r.revision
        self.claims += 1
        self.owned[partition] = _Owned(token)
        self.owned[partition].idle.set()
        log.info("claimed partition", extra={"partition": partition, "token": token})
        if self._listener is not None:
            self._listener.on_acquired(Fence(partition, key, token))
        return True

    async def _release(self, partition: int) -> None:
        o = self.owned.get(partition)
        if o is None:
            return
        o.releasing = True
        await o.idle.wait()  # in-flight writes first
        if self.release_settle is not None and self.owned.get(partition) is o:
            # ... then the starts of what it dispatched: a smoke drill's restarted planner took a partition
            # back while runs it had just been sent were unconfirmed, and those started 10 s late.
            try:
                await asyncio.wait_for(self.release_settle(partition), timeout=self.release_settle_s)
            except TimeoutError:
                log.info("released with dispatches still waiting for their start",
                         extra={"partition": partition, "event": "release_unsettled"})
        if self.owned.get(partition) is not o:
            return  # lost meanwhile
        key = self._ks.owner(partition)
        # The handover IS the delete: until etcd has answered it, the owner key names us under our session
        # lease, which we keep renewing, so no peer can claim the partition and we no longer serve it (a game
        # day's F5 killed the etcd member two releases' deletes went to: both keys stayed 33 and 47 s, until
        # those planners' sessions happened to end). Retry until etcd answers; the compare on our claim's
        # revision makes a retry after an unknown outcome harmless. A lost session ends the loop (_drop_all),
        # and then the lease's expiry deletes the key.
        pause = 0.05
        while self.owned.get(partition) is o:
            try:
                # Only our own claim: never delete a key somebody else has re-created since.
                await self._kv.txn([Compare.create_revision(key, "==", o.token)], [delete(key)],
                                   timeout=self._s.rpc_timeout)
                break
            except EtcdError as e:
                log.warning("releasing partition %d: %s; retrying", partition, e,
                            extra={"partition": partition, "event": "release_retry"})
                await asyncio.sleep(pause)
                pause = min(2 * pause, self._s.renew)
        self._lose(partition, LostReason.RELEASED, token=o.token)
        self._wake.set()

    def _lose(self, partition: int, reason: LostReason, *, token: int) -> None:
        o = self.owned.get(partition)
        if o is None or o.token != token:
            return
        del self.owned[partition]
        self._changed_owned.set()
        log.warning("lost partition", extra={"partition": partition, "token": token, "reason": reason.value})
        if self._listener is not None:
            self._listener.on_lost(partition, reason)

    def _drop_all(self, reason: LostReason) -> None:
        for p, o in list(self.owned.items()):
            self._lose(p, reason, token=o.token)
