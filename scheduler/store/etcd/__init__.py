"""A thin asyncio client over etcd's v3 gRPC API (grpc.aio, stubs generated from proto/etcd).

Chosen over the PyPI clients for control over the safety-relevant behaviour (research/deps.md §2):
writes are never retried, a timed-out write is `OutcomeUnknown`, a compacted watch raises
`Compacted`, one keepalive stream per lease with a local self-fencing deadline, watch resume.

    async with EtcdClient(EtcdConfig(endpoints=("127.0.0.1:2379",))) as etcd:
        r = await etcd.txn([Compare.create_revision(owner, "==", token)], [ops.put(k, v)])
"""

from scheduler.store.etcd import ops
from scheduler.store.etcd.client import EtcdClient
from scheduler.store.etcd.connection import Clock, EtcdConfig
from scheduler.store.etcd.deadline import LeaseLostReason
from scheduler.store.etcd.errors import (
    Compacted,
    EtcdError,
    LeaseLost,
    LeaseNotFound,
    NoSpace,
    OutcomeUnknown,
    PermissionDenied,
    RequestTooLarge,
    Unauthenticated,
    Unavailable,
)
from scheduler.store.etcd.lease import LeaseKeeper
from scheduler.store.etcd.ops import Compare, CompareTarget, DeleteOp, Op, PutOp, RangeOp, prefix_end
from scheduler.store.etcd.types import (
    DeleteResult,
    EventType,
    KeyValue,
    Lease,
    LeaseTimeToLive,
    Member,
    OpResult,
    PutResult,
    RangeResult,
    ResponseHeader,
    SortOrder,
    SortTarget,
    Status,
    TxnResult,
    WatchBatch,
    WatchEvent,
    WatchFilter,
)
from scheduler.store.etcd.watch import Watcher

__all__ = [
    "Clock",
    "Compacted",
    "Compare",
    "CompareTarget",
    "DeleteOp",
    "DeleteResult",
    "EtcdClient",
    "EtcdConfig",
    "EtcdError",
    "EventType",
    "KeyValue",
    "Lease",
    "LeaseKeeper",
    "LeaseLost",
    "LeaseLostReason",
    "LeaseNotFound",
    "LeaseTimeToLive",
    "Member",
    "NoSpace",
    "Op",
    "OpResult",
    "OutcomeUnknown",
    "PermissionDenied",
    "PutOp",
    "PutResult",
    "RangeOp",
    "RangeResult",
    "RequestTooLarge",
    "ResponseHeader",
    "SortOrder",
    "SortTarget",
    "Status",
    "TxnResult",
    "Unauthenticated",
    "Unavailable",
    "WatchBatch",
    "WatchEvent",
    "WatchFilter",
    "Watcher",
    "ops",
    "prefix_end",
]
