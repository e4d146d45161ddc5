"""The one door to the coordination store: the subset of etcd's API the project uses.

`EtcdClient` (real etcd) and `MemoryKV` (the in-memory twin for pure-logic and fast tests) both
implement it, and tests/store/contract/ runs one suite against both. Everything above floor 2 talks to
a `KV`, never to grpc or generated code. The vocabulary (ops, compares, results) is the plain
dataclasses of scheduler.store.etcd.ops / .types.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Protocol, Unpack

from scheduler.store.etcd.deadline import LeaseLostReason, LeaseObserver
from scheduler.store.etcd.ops import Compare, Key, Op, RangeOptions
from scheduler.store.etcd.types import (
    DeleteResult,
    KeyValue,
    Lease,
    LeaseTimeToLive,
    PutResult,
    RangeResult,
    ResponseHeader,
    TxnResult,
    WatchBatch,
    WatchFilter,
)


class Keeper(Protocol):
    """Keeps one lease alive and knows, on the local monotonic clock, until when it is safe."""

    lease_id: int
    ttl: int
    observer: LeaseObserver | None

    @property
    def last_ack(self) -> float: ...

    def deadline(self) -> float: ...

    def remaining(self) -> float: ...

    def alive(self) -> bool: ...

    def check(self) -> None: ...

    @property
    def lost_reason(self) -> LeaseLostReason | None: ...

    async def wait_lost(self) -> LeaseLostReason: ...

    async def stop(self) -> None: ...


class WatchStream(Protocol):
    @property
    def revision(self) -> int: ...

    def __aiter__(self) -> AsyncIterator[WatchBatch]: ...

    async def __anext__(self) -> WatchBatch: ...

    async def request_progress(self) -> bool: ...

    async def close(self) -> None: ...

    async def __aenter__(self) -> WatchStream: ...

    async def __aexit__(self, *exc_info: object) -> None: ...


class KV(Protocol):
    async def range(
        self, key: Key, *, timeout: float | None = None, **options: Unpack[RangeOptions]
    ) -> RangeResult: ...

    async def get(
        self, key: Key, *, revision: int = 0, serializable: bool = False, timeout: float | None = None
    ) -> KeyValue | None: ...

    async def put(
        self, key: Key, value: bytes, *, lease: int = 0, prev_kv: bool = False, timeout: float | None = None
    ) -> PutResult: ...

    async def delete(
        self,
        key: Key,
        *,
        prefix: bool = False,
        range_end: Key | None = None,
        prev_kv: bool = False,
        timeout: float | None = None,
    ) -> DeleteResult: ...

    async def txn(
        self,
        compare: Sequence[Compare],
        success: Sequence[Op] = (),
        failure: Sequence[Op] = (),
        *,
        timeout: float | None = None,
    ) -> TxnResult: ...

    async def compact(
        self, revision: int, *, physical: bool = False, timeout: float | None = None
    ) -> ResponseHeader: ...

    async def lease_grant(self, ttl: int, *, lease_id: int = 0, timeout: float | None = None) -> Lease: ...

    async def lease_revoke(self, lease_id: int, *, timeout: float | None = None) -> ResponseHeader: ...

    async def lease_time_to_live(
        self, lease_id: int, *, keys: bool = False, timeout: float | None = None
    ) -> LeaseTimeToLive: ...

    def keep_alive(
        self,
        lease: Lease,
        *,
        safety_margin: float,
        renew_interval: float | None = None,
        ack_timeout: float | None = None,
    ) -> Keeper: ...

    def watch(
        self,
        key: Key,
        *,
        prefix: bool = False,
        range_end: Key | None = None,
        start_revision: int = 0,
        progress_notify: bool = False,
        prev_kv: bool = False,
        filters: Sequence[WatchFilter] = (),
    ) -> WatchStream: ...

    async def close(self) -> None: ...
