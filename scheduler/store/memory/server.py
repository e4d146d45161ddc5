"""MemoryEtcd: the server side of the twin. One instance is one etcd cluster; `MemoryKV` clients
(one per simulated process) talk to it.

Requests are applied synchronously, in etcd's order: checks (checks.py), compares against the state
before the txn, the apply-time checks of the branch that runs (leases exist, read revisions are
valid), then the writes as one revision. Time is the injected monotonic clock: `run_due()` expires
leases (one revision per lease that had keys), renews keepers and sends periodic progress
notifications. Clients call it before every request, and a background task calls it every 10 ms
while an event loop runs, so a fake clock moved by a test takes effect at the next request or tick.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from scheduler.clock import SYSTEM_CLOCK
from scheduler.store.etcd.connection import Clock
from scheduler.store.etcd.errors import Compacted
from scheduler.store.etcd.ops import Compare, CompareTarget, DeleteOp, Op, PutOp, RangeOp, TxnOp
from scheduler.store.etcd.types import (
    DeleteResult,
    EventType,
    KeyValue,
    LeaseTimeToLive,
    OpResult,
    PutResult,
    RangeResult,
    ResponseHeader,
    SortOrder,
    SortTarget,
    TxnResult,
)
from scheduler.store.memory import _status
from scheduler.store.memory.checks import (
    DEFAULT_MAX_REQUEST_BYTES,
    DEFAULT_MAX_TXN_OPS,
    Limits,
    check_request,
    check_txn,
)
from scheduler.store.memory.keeper import MemoryKeeper
from scheduler.store.memory.leases import DEFAULT_MIN_TTL, Leases, LeaseState
from scheduler.store.memory.mvcc import Keyspace, WriteTxn
from scheduler.store.memory.watch import MemoryWatcher

if TYPE_CHECKING:
    from scheduler.store.memory.client import MemoryKV

__all__ = ["DEFAULT_PROGRESS_INTERVAL", "MemoryEtcd"]

log = logging.getLogger(__name__)

_TICK = 0.01  # real seconds between two runs of the timers
_CLUSTER_ID, _MEMBER_ID, _RAFT_TERM = 0x7E57, 0x1, 1
DEFAULT_PROGRESS_INTERVAL = 600.0  # etcd's --experimental-watch-progress-notify-interval default

_SORT_KEYS: dict[SortTarget, Callable[[KeyValue], int | bytes]] = {
    SortTarget.KEY: lambda kv: kv.key,
    SortTarget.VERSION: lambda kv: kv.version,
    SortTarget.CREATE: lambda kv: kv.create_revision,
    SortTarget.MOD: lambda kv: kv.mod_revision,
    SortTarget.VALUE: lambda kv: kv.value,
}

_Built = Callable[[ResponseHeader], OpResult]  # a txn op's result, once the txn's header is known


@dataclass(slots=True)
class _Plan:
    """A txn with its compares decided: the branch that runs, nested txns decided as well."""

    succeeded: bool
    ops: list[RangeOp | PutOp | DeleteOp | _Plan]

    def leaves(self) -> Iterator[RangeOp | PutOp | DeleteOp]:
        for op in self.ops:
            if isinstance(op, _Plan):
                yield from op.leaves()
            else:
                yield op


class MemoryEtcd:
    def __init__(
        self,
        *,
        clock: Clock | None = None,
        progress_notify_interval: float = DEFAULT_PROGRESS_INTERVAL,
        min_lease_ttl: int = DEFAULT_MIN_TTL,
        max_txn_ops: int = DEFAULT_MAX_TXN_OPS,
        max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
    ) -> None:
        if progress_notify_interval <= 0:
            raise ValueError("progress_notify_interval must be > 0")
        self.clock: Clock = clock or SYSTEM_CLOCK.monotonic
        self.progress_notify_interval = progress_notify_interval
        self.limits = Limits(max_txn_ops, max_request_bytes)
        self.space = Keyspace()
        self.leases = Leases(min_lease_ttl)
        # dicts as insertion-ordered sets, so that timers and notifications run in a stable order
        self._watchers: dict[MemoryWatcher, None] = {}
        self._keepers: dict[MemoryKeeper, None] = {}
        self._clients = 0
        self._ticker: asyncio.Task[None] | None = None
        self._ticker_loop: asyncio.AbstractEventLoop | None = None

    def client(self) -> MemoryKV:
        """A new client of this cluster (another process, with its own keepers, watches and faults)."""
        from scheduler.store.memory.client import MemoryKV

        return MemoryKV(server=self)

    @property
    def revision(self) -> int:
        return self.space.revision

    @property
    def compact_revision(self) -> int:
        return self.space.compact_revision

    def header(self) -> ResponseHeader:
        return ResponseHeader(_CLUSTER_ID, _MEMBER_ID, self.space.revision, _RAFT_TERM)

    # ---- KV -------------------------------------------------------------------------------------

    def range(self, op: RangeOp) -> RangeResult:
        check_request(self.limits, op)
        self._check_read_revision(op.revision, write=False)
        kvs, more, count = self._read(op)
        return RangeResult(self.header(), kvs, more, count)

    def put(self, op: PutOp) -> PutResult:
        check_request(self.limits, op)
        self._check_lease(op.lease)
        txn = WriteTxn(self.space)
        _, prev = txn.put(op.key, op.value, op.lease)
        self._commit(txn)
        return PutResult(self.header(), prev if op.prev_kv else None)

    def delete(self, op: DeleteOp) -> DeleteResult:
        check_request(self.limits, op)
        txn = WriteTxn(self.space)
        deleted = txn.delete(op.key, op.range_end)
        self._commit(txn)
        return DeleteResult(self.header(), len(deleted), tuple(deleted) if op.prev_kv else ())

    def txn(self, compare: Sequence[Compare], success: Sequence[Op], failure: Sequence[Op]) -> TxnResult:
        check_txn(self.limits, compare, success, failure)
        # Every compare, nested ones included, sees the state before the txn (etcd's compareToPath
        # runs before anything is applied; measured: a nested compare misses an earlier put).
        plan = self._plan(compare, success, failure)
        write = not all(isinstance(op, RangeOp) for op in (*success, *failure))
        # etcd checks the branches that run before applying any of them, so a txn fails whole:
        # first every put's lease, then every read's revision.
        for op in plan.leaves():
            if isinstance(op, PutOp):
                self._check_lease(op.lease)
        for op in plan.leaves():
            if isinstance(op, RangeOp):
                self._check_read_revision(op.revision, write=write)
        txn = WriteTxn(self.space)
        build = self._apply_plan(txn, plan)
        self._commit(txn)
        return build(self.header())

    def compact(self, revision: int) -> ResponseHeader:
        if revision <= self.space.compact_revision:
            raise _status.error(_status.COMPACTED, write=True)
        if revision > self.space.revision:
            raise _status.error(_status.FUTURE_REVISION, write=True)
        self.space.compact(revision)
        return self.header()

    # ---- leases ---------------------------------------------------------------------------------

    def lease_grant(self, ttl: int, lease_id: int = 0) -> LeaseState:
        return self.leases.grant(ttl, lease_id, self.clock())

    def lease_revoke(self, lease_id: int) -> ResponseHeader:
        if self.leases.get(lease_id) is None:
            raise _status.error(_status.LEASE_NOT_FOUND, write=True)
        self._revoke(lease_id)
        return self.header()

    def lease_time_to_live(self, lease_id: int, keys: bool = False) -> LeaseTimeToLive:
        lease = self.leases.get(lease_id)
        if lease is None:
            return LeaseTimeToLive(self.header(), lease_id, -1, 0, ())
        # etcd lists the keys in map order (random); sorted here, so compare them as a set.
        attached = tuple(sorted(lease.keys)) if keys else ()
        return LeaseTimeToLive(self.header(), lease_id, lease.remaining(self.clock()), lease.ttl, attached)

    def renew(self, lease_id: int) -> int:
        return self.leases.renew(lease_id, self.clock())

    # ---- watches and keepers (registered by clients) --------------------------------------------

    def open_watch(self, watcher: MemoryWatcher) -> None:
        start = watcher.next_revision
        if start == 0:
            start = self.space.revision + 1
        elif start < self.space.compact_revision:
            raise Compacted(self.space.compact_revision)
        history = self.space.events(start) if start <= self.space.revision else []
        watcher.on_created(start, self.space.revision, history, self.space.compact_revision)
        watcher.progress_due = self.clock() + self.progress_notify_interval
        watcher.progress_allowed = True
        self._watchers[watcher] = None

    def forget_watch(self, watcher: MemoryWatcher) -> None:
        self._watchers.pop(watcher, None)

    def add_keeper(self, keeper: MemoryKeeper) -> None:
        self._keepers[keeper] = None

    def forget_keeper(self, keeper: MemoryKeeper) -> None:
        self._keepers.pop(keeper, None)

    # ---- time -----------------------------------------------------------------------------------

    def run_due(self) -> None:
        """Do everything that is due on the clock: expire leases, then renew keepers (an expired
        lease cannot be renewed), then send periodic progress notifications."""
        now = self.clock()
        for lease in self.leases.expired(now):
            self._revoke(lease.id)
        for keeper in list(self._keepers):
            keeper.run_due()
        for watcher in list(self._watchers):
            if watcher.progress_notify and now >= watcher.progress_due:
                if watcher.progress_allowed:
                    watcher.queue_progress(self.space.revision)
                watcher.progress_allowed = True
                watcher.progress_due = now + self.progress_notify_interval

    def attach_client(self) -> None:
        self._clients += 1

    def detach_client(self) -> None:
        self._clients -= 1
        if self._clients <= 0 and self._ticker is not None:
            self._ticker.cancel()
            self._ticker = None

    def ensure_timers(self) -> None:
        """Start the background timer task on the running loop, if there is one."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        if self._ticker is None or self._ticker.done() or self._ticker_loop is not loop:
            self._ticker = loop.create_task(self._tick_forever(), name="memory-etcd-timers")
            self._ticker_loop = loop

    async def _tick_forever(self) -> None:
        while True:
            await asyncio.sleep(_TICK)
            try:
                self.run_due()
            except Exception:
                log.exception("MemoryEtcd timers failed")  # keep ticking: one bad run must not stop expiry

    # ---- internals ------------------------------------------------------------------------------

    def _check_lease(self, lease_id: int) -> None:
        if lease_id and self.leases.get(lease_id) is None:
            raise _status.error(_status.LEASE_NOT_FOUND, write=True)

    def _check_read_revision(self, revision: int, *, write: bool) -> None:
        if revision > self.space.revision:
            raise _status.error(_status.FUTURE_REVISION, write=write)
        if 0 < revision < self.space.compact_revision:
            raise _status.error(_status.COMPACTED, write=write)

    def _read(self, op: RangeOp) -> tuple[tuple[KeyValue, ...], bool, int]:
        """etcd's range apply: count before the revision filters, filter, sort, then cut at limit."""
        kvs = self.space.range(op.key, op.range_end, op.revision or None)
        count = len(kvs)
        if op.count_only:
            return (), False, count
        if op.max_mod_revision:
            kvs = [kv for kv in kvs if kv.mod_revision <= op.max_mod_revision]
        if op.min_mod_revision:
            kvs = [kv for kv in kvs if kv.mod_revision >= op.min_mod_revision]
        if op.max_create_revision:
            kvs = [kv for kv in kvs if kv.create_revision <= op.max_create_revision]
        if op.min_create_revision:
            kvs = [kv for kv in kvs if kv.create_revision >= op.min_create_revision]
        order = op.sort_order
        if op.sort_target is not SortTarget.KEY and order is SortOrder.NONE:
            order = SortOrder.ASCEND  # etcd sorts by a non-key target even when no order is given
        if order is not SortOrder.NONE and not (op.sort_target is SortTarget.KEY and order is SortOrder.ASCEND):
            # Python's sort is stable also in reverse, as etcd's insertion sort is for small results;
            # etcd leaves the order of ties open for larger ones.
            kvs.sort(key=_SORT_KEYS[op.sort_target], reverse=order is SortOrder.DESCEND)
        more = 0 < op.limit < len(kvs)
        if more:
            kvs = kvs[: op.limit]
        if op.keys_only:
            kvs = [KeyValue(kv.key, b"", kv.create_revision, kv.mod_revision, kv.version, kv.lease) for kv in kvs]
        return tuple(kvs), more, count

    def _holds(self, c: Compare) -> bool:
        kvs = self.space.range(c.key, c.range_end)
        if not kvs:
            # etcd: a value compare on a missing key always fails; the others compare with 0.
            return c.target is not CompareTarget.VALUE and _compare(c, None)
        return all(_compare(c, kv) for kv in kvs)

    def _plan(self, compare: Sequence[Compare], success: Sequence[Op], failure: Sequence[Op]) -> _Plan:
        succeeded = all(self._holds(c) for c in compare)
        branch = success if succeeded else failure
        return _Plan(succeeded, [self._plan(op.compare, op.success, op.failure) if isinstance(op, TxnOp) else op
                                 for op in branch])

    def _apply_plan(self, txn: WriteTxn, plan: _Plan) -> Callable[[ResponseHeader], TxnResult]:
        built = [self._apply_plan(txn, op) if isinstance(op, _Plan) else self._apply(txn, op) for op in plan.ops]
        return lambda h: TxnResult(h, plan.succeeded, tuple(b(h) for b in built))

    def _apply(self, txn: WriteTxn, op: RangeOp | PutOp | DeleteOp) -> _Built:
        if isinstance(op, PutOp):
            _, prev = txn.put(op.key, op.value, op.lease)
            prev_kv = prev if op.prev_kv else None
            return lambda h: PutResult(h, prev_kv)
        if isinstance(op, DeleteOp):
            deleted = txn.delete(op.key, op.range_end)
            prev_kvs = tuple(deleted) if op.prev_kv else ()
            return lambda h: DeleteResult(h, len(deleted), prev_kvs)
        # A read inside a txn sees the txn's earlier writes (etcd reads at its pending revision).
        kvs, more, count = self._read(op)
        return lambda h: RangeResult(h, kvs, more, count)

    def _commit(self, txn: WriteTxn) -> None:
        revision = txn.commit()
        if not txn.events:
            return
        for event in txn.events:
            old = event.prev_kv.lease if event.prev_kv is not None else 0
            new = event.kv.lease if event.type is EventType.PUT else 0
            if old != new:
                self.leases.detach(old, event.kv.key)
            self.leases.attach(new, event.kv.key)
        compact = self.space.compact_revision
        for watcher in list(self._watchers):
            watcher.on_revision(revision, txn.events, compact)

    def _revoke(self, lease_id: int) -> None:
        """Delete the lease and its keys, in key order, as one revision (none if it had no keys)."""
        lease = self.leases.pop(lease_id)
        if lease is None:
            return
        txn = WriteTxn(self.space)
        for key in sorted(lease.keys):
            txn.delete(key, b"")
        self._commit(txn)


def _compare(c: Compare, kv: KeyValue | None) -> bool:
    actual: int | bytes
    if c.target is CompareTarget.VALUE:
        actual = kv.value if kv is not None else b""
    elif kv is None:
        actual = 0
    else:
        actual = {
            CompareTarget.VERSION: kv.version,
            CompareTarget.CREATE: kv.create_revision,
            CompareTarget.MOD: kv.mod_revision,
            CompareTarget.LEASE: kv.lease,
        }[c.target]
    operand = c.operand
    if c.op == "==":
        return actual == operand
    if c.op == "!=":
        return actual != operand
    if isinstance(actual, bytes) and isinstance(operand, bytes):
        return actual > operand if c.op == ">" else actual < operand
    if isinstance(actual, int) and isinstance(operand, int):
        return actual > operand if c.op == ">" else actual < operand
    return False  # unreachable: checks.check_txn refuses mismatched operand types
