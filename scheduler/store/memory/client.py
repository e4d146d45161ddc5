
"""MemoryKV: a `KV` client of the in-memory etcd twin, plus the fault hooks tests need.

Each MemoryKV is one simulated process: it owns its keepers and watches, and its faults (paused
keepalives, a cut connection, injected errors) affect only it. `MemoryKV()` starts a cluster of its
own; `MemoryKV(server=cluster)` or `cluster.client()` joins an existing one.

Every request yields to the event loop once before it is applied, as a real RPC would.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal, TypeVar, Unpack

import grpc

from scheduler.store.etcd.connection import Clock
from scheduler.store.etcd.errors import EtcdError
from scheduler.store.etcd.ops import (
    Compare,
    Key,
    Op,
    RangeOp,
    RangeOptions,
    delete,
    get,
    key_range,
    put,
)
from scheduler.store.etcd.types import (
    DeleteResult,
    KeyValue,
    Lease,
    LeaseTimeToLive,
    PutResult,
    RangeResult,
    ResponseHeader,
    TxnResult,
    WatchFilter,
)
from scheduler.store.memory import _status
from scheduler.store.memory.keeper import MemoryKeeper
from scheduler.store.memory.leases import DEFAULT_MIN_TTL
from scheduler.store.memory.server import DEFAULT_PROGRESS_INTERVAL, MemoryEtcd
from scheduler.store.memory.watch import MemoryWatcher

__all__ = ["MemoryKV", "OpKind"]

T = TypeVar("T")

OpKind = Literal["range", "put", "delete", "txn", "compact", "lease_grant", "lease_revoke", "lease_time_to_live"]


@dataclass(frozen=True, slots=True)
class _Fault:
    exc: BaseException | None
    after_apply: bool


class MemoryKV:
    def __init__(
        self,
        clock: Clock | None = None,
        *,
        server: MemoryEtcd | None = None,
        progress_notify_interval: float | None = None,
        min_lease_ttl: int | None = None,
    ) -> None:
        """`clock`: monotonic seconds (default: the system's). The other settings are the cluster's:
        give them here to start a cluster, or pass `server` to join one."""
        if server is None:
            server = MemoryEtcd(
                clock=clock,
                progress_notify_interval=progress_notify_interval or DEFAULT_PROGRESS_INTERVAL,
                min_lease_ttl=DEFAULT_MIN_TTL if min_lease_ttl is None else min_lease_ttl,
            )
        elif clock is not None or progress_notify_interval is not None or min_lease_ttl is not None:
            raise ValueError("clock and cluster settings belong to the server; set them on MemoryEtcd")
        self._server = server
        self._clock = server.clock
        server.attach_client()
        self._keepers: dict[MemoryKeeper, None] = {}
        self._watchers: dict[MemoryWatcher, None] = {}
        self._faults: defaultdict[OpKind, deque[_Fault]] = defaultdict(deque)
        self._keepalives_paused = False
        self._connected = True
        self._closed = False

    @property
    def server(self) -> MemoryEtcd:
        return self._server

    # ---- KV -------------------------------------------------------------------------------------

    async def range(self, key: Key, *, timeout: float | None = None, **options: Unpack[RangeOptions]) -> RangeResult:
        op = get(key, **options)
        return await self._call("range", False, lambda: self._server.range(op))

    async def get(self, key: Key, *, revision: int = 0, serializable: bool = False,
                  timeout: float | None = None) -> KeyValue | None:
        result = await self.range(key, revision=revision, serializable=serializable, timeout=timeout)
        return result.kvs[0] if result.kvs else None

    async def put(self, key: Key, value: bytes, *, lease: int = 0, prev_kv: bool = False,
                  timeout: float | None = None) -> PutResult:
        op = put(key, value, lease=lease, prev_kv=prev_kv)
        return await self._call("put", True, lambda: self._server.put(op))

    async def delete(self, key: Key, *, prefix: bool = False, range_end: Key | None = None,
                     prev_kv: bool = False, timeout: float | None = None) -> DeleteResult:
        op = delete(key, prefix=prefix, range_end=range_end, prev_kv=prev_kv)
        return await self._call("delete", True, lambda: self._server.delete(op))

    async def txn(self, compare: Sequence[Compare], success: Sequence[Op] = (), failure: Sequence[Op] = (),
                  *, timeout: float | None = None) -> TxnResult:
        write = not all(isinstance(op, RangeOp) for op in (*success, *failure))
        return await self._call("txn", write, lambda: self._server.txn(compare, success, failure))

    async def compact(self, revision: int, *, physical: bool = False,
                      timeout: float | None = None) -> ResponseHeader:
        return await self._call("compact", True, lambda: self._server.compact(revision))

    # ---- leases ---------------------------------------------------------------------------------

    async def lease_grant(self, ttl: int, *, lease_id: int = 0, timeout: float | None = None) -> Lease:
        sent_at = self._clock()
        state = await self._call("lease_grant", True, lambda: self._server.lease_grant(ttl, lease_id))
        return Lease(id=state.id, ttl=state.ttl, sent_at=sent_at)

    async def lease_revoke(self, lease_id: int, *, timeout: float | None = None) -> ResponseHeader:
        return await self._call("lease_revoke", True, lambda: self._server.lease_revoke(lease_id))

    async def lease_time_to_live(self, lease_id: int, *, keys: bool = False,
                                 timeout: float | None = None) -> LeaseTimeToLive:
        return await self._call("lease_time_to_live", False, lambda: self._server.lease_time_to_live(lease_id, keys))

    def keep_alive(self, lease: Lease, *, safety_margin: float, renew_interval: float | None = None,
                   ack_timeout: float | None = None) -> MemoryKeeper:
        self._check_open()
        keeper = MemoryKeeper(self, self._clock, lease, safety_margin=safety_margin,
                              renew_interval=renew_interval, ack_timeout=ack_timeout)
        self._keepers[keeper] = None
        self._server.add_keeper(keeper)
        self._server.ensure_timers()
        self._server.run_due()  # the first renewal goes out at once, as LeaseKeeper's does
        return keeper

    # ---- watch ----------------------------------------------------------------------------------

    def watch(self, key: Key, *, prefix: bool = False, range_end: Key | None = None, start_revision: int = 0,
              progress_notify: bool = False, prev_kv: bool = False,
              filters: Sequence[WatchFilter] = ()) -> MemoryWatcher:
        """As EtcdClient.watch: created on the first iteration; pass start_revision to be exact."""
        self._check_open()
        k, end = key_range(key, prefix=prefix, range_end=range_end)
        watcher = MemoryWatcher(self, k, end, start_revision=start_revision, progress_notify=progress_notify,
                                prev_kv=prev_kv, filters=filters)
        self._watchers[watcher] = None
        self._server.ensure_timers()
        return watcher

    async def close(self) -> None:
        """Stop this client's keepers (without revoking) and watches. The cluster lives on."""
        if self._closed:
            return
        for keeper in list(self._keepers):
            await keeper.stop()
        for watcher in list(self._watchers):
            await watcher.close()
        self._closed = True
        self._server.detach_client()

    async def __aenter__(self) -> MemoryKV:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    # ---- test hooks -----------------------------------------------------------------------------

    def run_due(self) -> None:
        """Run the cluster's timers now (after moving a fake clock, instead of waiting a tick)."""
        self._server.run_due()

    def fail_next(self, kind: OpKind, exc: BaseException | None = None, *, after_apply: bool = False) -> None:
        """Make the next request of `kind` from this client fail once with `exc`. The default is
        what a timeout gives: OutcomeUnknown for a write (a txn that writes), Unavailable for a read.
        `after_apply=True` applies the request first: the write landed, the answer was lost."""
        self._faults[kind].append(_Fault(exc, after_apply))

    def pause_keepalives(self) -> None:
        """Renewals from this client's keepers stop reaching etcd (the keepers still send them)."""
        self._keepalives_paused = True

    def resume_keepalives(self) -> None:
        self._keepalives_paused = False

    def disconnect(self) -> None:
        """Cut this client off etcd: requests fail at once without being applied (reads Unavailable,
        writes OutcomeUnknown), keepalives are lost, watch streams break."""
        self._connected = False
        for watcher in list(self._watchers):
            self._server.forget_watch(watcher)
            watcher.break_stream()

    def reconnect(self) -> None:
        """Connected again: watches resume from where they were (or raise Compacted)."""
        self._connected = True
        for watcher in list(self._watchers):
            watcher.wake()

    # ---- for keepers and watchers (KeepaliveSink, WatchHost) ------------------------------------

    @property
    def connected(self) -> bool:
        return self._connected and not self._closed

    def send_keepalive(self, lease_id: int) -> int | None:
        if self._keepalives_paused or not self.connected:
            return None
        return self._server.renew(lease_id)

    def forget_keeper(self, keeper: MemoryKeeper) -> None:
        self._keepers.pop(keeper, None)
        self._server.forget_keeper(keeper)

    def open_watch(self, watcher: MemoryWatcher) -> None:
        self._server.run_due()
        self._server.open_watch(watcher)

    def forget_watch(self, watcher: MemoryWatcher) -> None:
        self._watchers.pop(watcher, None)
        self._server.forget_watch(watcher)

    def current_revision(self) -> int:
        return self._server.revision

    # ---- internals ------------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("this MemoryKV is closed")

    async def _call(self, kind: OpKind, write: bool, apply: Callable[[], T]) -> T:
        self._check_open()
        self._server.ensure_timers()
        await asyncio.sleep(0)  # in flight: other tasks run before etcd applies it
        self._check_open()
        self._server.run_due()
        if not self._connected:
            raise _injected("etcd unreachable (MemoryKV.disconnect)", write=write)
        fault = self._faults[kind].popleft() if self._faults.get(kind) else None
        if fault is None:
            return apply()
        if fault.after_apply:
            apply()
        raise fault.exc if fault.exc is not None else _injected(f"injected fault on {kind}", write=write)


def _injected(why: str, *, write: bool) -> EtcdError:
    # A deadline passing is what a real client sees in both cases; the client's table makes it
    # OutcomeUnknown for a write and Unavailable for a read.
    return _status.error(_status.Status(grpc.StatusCode.DEADLINE_EXCEEDED, why), write=write)

