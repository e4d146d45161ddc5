"""EtcdClient: the asyncio etcd v3 client used by the store layer.

Every RPC takes a `timeout` (seconds; None means `EtcdConfig.timeout`). Reads raise `Unavailable`
when etcd cannot answer in time; writes (put, delete, txn with a put/delete, compact, lease grant
and revoke) raise `OutcomeUnknown` instead and are never retried here.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Sequence
from typing import Unpack

from scheduler.store.etcd import _pb
from scheduler.store.etcd.connection import Clock, Connection, EtcdConfig
from scheduler.store.etcd.lease import LeaseKeeper
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
    Member,
    PutResult,
    RangeResult,
    ResponseHeader,
    Status,
    TxnResult,
    WatchFilter,
)
from scheduler.store.etcd.watch import Watcher

__all__ = ["EtcdClient"]


class EtcdClient:
    def __init__(self, config: EtcdConfig, *, clock: Clock = time.monotonic) -> None:
        self.config = config
        self._conn = Connection(config, clock)
        # Closed with the client, so nothing keeps retrying on a closed channel.
        self._keepers: weakref.WeakSet[LeaseKeeper] = weakref.WeakSet()
        self._watchers: weakref.WeakSet[Watcher] = weakref.WeakSet()

    @property
    def authentications(self) -> int:
        """Tokens obtained so far (1 after connect with credentials; +1 per re-authentication)."""
        return self._conn.authentications

    async def connect(self, *, timeout: float | None = None) -> None:
        """Authenticate when credentials are configured. Without them there is nothing to do:
        the channel connects on the first call."""
        await self._conn.authenticate(timeout=timeout)

    async def close(self) -> None:
        """Stop every keeper (without revoking) and watcher of this client, then the channel."""
        for keeper in list(self._keepers):
            await keeper.stop()
        for watcher in list(self._watchers):
            await watcher.close()
        await self._conn.close()

    async def __aenter__(self) -> EtcdClient:
        try:
            await self.connect()
        except BaseException:
            await self.close()
            raise
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    # ---- KV -------------------------------------------------------------------------------------

    async def range(self, key: Key, *, timeout: float | None = None, **options: Unpack[RangeOptions]) -> RangeResult:
        op = get(key, **options)
        response = await self._conn.unary(self._conn.stubs.kv.Range, _pb.range_request(op), write=False,
                                          timeout=timeout)
        return _pb.range_result(response)

    async def get(self, key: Key, *, revision: int = 0, serializable: bool = False,
                  timeout: float | None = None) -> KeyValue | None:
        """The one key, or None when it does not exist (at `revision`, if given)."""
        result = await self.range(key, revision=revision, serializable=serializable, timeout=timeout)
        return result.kvs[0] if result.kvs else None

    async def put(self, key: Key, value: bytes, *, lease: int = 0, prev_kv: bool = False,
                  timeout: float | None = None) -> PutResult:
        request = _pb.put_request(put(key, value, lease=lease, prev_kv=prev_kv))
        response = await self._conn.unary(self._conn.stubs.kv.Put, request, write=True, timeout=timeout)
        return _pb.put_result(response)

    async def delete(self, key: Key, *, prefix: bool = False, range_end: Key | None = None,
                     prev_kv: bool = False, timeout: float | None = None) -> DeleteResult:
        request = _pb.delete_request(delete(key, prefix=prefix, range_end=range_end, prev_kv=prev_kv))
        response = await self._conn.unary(self._conn.stubs.kv.DeleteRange, request, write=True, timeout=timeout)
        return _pb.delete_result(response)

    async def txn(self, compare: Sequence[Compare], success: Sequence[Op] = (), failure: Sequence[Op] = (),
                  *, timeout: float | None = None) -> TxnResult:
        """If every compare holds, run `success`, else `failure`; atomically, at one revision.
        Always look at `succeeded`: a failed compare is not an error."""
        request = _pb.txn_request(compare, success, failure)
        # A txn that only reads is a read (retryable); anything that writes is a write.
        write = not all(isinstance(op, RangeOp) for op in (*success, *failure))
        response = await self._conn.unary(self._conn.stubs.kv.Txn, request, write=write, timeout=timeout)
        return _pb.txn_result(response)

    async def compact(self, revision: int, *, physical: bool = False,
                      timeout: float | None = None) -> ResponseHeader:
        request = _pb.compaction_request(revision, physical)
        response = await self._conn.unary(self._conn.stubs.kv.Compact, request, write=True, timeout=timeout)
        return _pb.header(response.header)

    # ---- leases ---------------------------------------------------------------------------------

    async def lease_grant(self, ttl: int, *, lease_id: int = 0, timeout: float | None = None) -> Lease:
        sent_at = self._conn.clock()  # before sending: the server's TTL cannot start earlier
        request = _pb.lease_grant_request(ttl, lease_id)
        response = await self._conn.unary(self._conn.stubs.lease.LeaseGrant, request, write=True, timeout=timeout)
        return Lease(id=int(response.ID), ttl=int(response.TTL), sent_at=sent_at)

    async def lease_revoke(self, lease_id: int, *, timeout: float | None = None) -> ResponseHeader:
        request = _pb.lease_revoke_request(lease_id)
        response = await self._conn.unary(self._conn.stubs.lease.LeaseRevoke, request, write=True,
                                          timeout=timeout)
        return _pb.header(response.header)

    async def lease_time_to_live(self, lease_id: int, *, keys: bool = False,
                                 timeout: float | None = None) -> LeaseTimeToLive:
        request = _pb.lease_ttl_request(lease_id, keys)
        response = await self._conn.unary(self._conn.stubs.lease.LeaseTimeToLive, request, write=False,
                                          timeout=timeout)
        return _pb.lease_ttl(response)

    def keep_alive(self, lease: Lease, *, safety_margin: float, renew_interval: float | None = None,
                   ack_timeout: float | None = None) -> LeaseKeeper:
        """Start renewing `lease` on one stream (renewal every TTL/3 unless told otherwise)."""
        keeper = LeaseKeeper(self._conn, lease, safety_margin=safety_margin, renew_interval=renew_interval,
                             ack_timeout=ack_timeout)
        keeper.start()
        self._keepers.add(keeper)
        return keeper

    # ---- watch ----------------------------------------------------------------------------------

    def watch(self, key: Key, *, prefix: bool = False, range_end: Key | None = None, start_revision: int = 0,
              progress_notify: bool = False, prev_kv: bool = False,
              filters: Sequence[WatchFilter] = ()) -> Watcher:
        """Watch a key or range from `start_revision` (inclusive; 0 = from now). For a gap-free
        handover from a range read at revision R, pass start_revision=R + 1."""
        k, end = key_range(key, prefix=prefix, range_end=range_end)
        watcher = Watcher(self._conn, k, end, start_revision=start_revision, progress_notify=progress_notify,
                          prev_kv=prev_kv, filters=filters)
        self._watchers.add(watcher)
        return watcher

    # ---- cluster and maintenance ----------------------------------------------------------------

    async def member_list(self, *, linearizable: bool = False, timeout: float | None = None) -> tuple[Member, ...]:
        request = _pb.member_list_request(linearizable)
        response = await self._conn.unary(self._conn.stubs.cluster.MemberList, request, write=False,
                                          timeout=timeout)
        return _pb.members(response)

    async def status(self, *, timeout: float | None = None) -> Status:
        """Status of whichever member the channel picks for this call."""
        response = await self._conn.unary(self._conn.stubs.maintenance.Status, _pb.status_request(),
                                          write=False, timeout=timeout)
        return _pb.status(response)
