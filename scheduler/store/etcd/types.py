"""Typed results of the etcd client. Generated protobuf types never leave `scheduler.store.etcd`:
everything a caller sees is one of these frozen values (converted in `_pb.py`)."""

from __future__ import annotations

import enum
from dataclasses import dataclass

__all__ = [
    "DeleteResult",
    "EventType",
    "KeyValue",
    "Lease",
    "LeaseTimeToLive",
    "Member",
    "OpResult",
    "PutResult",
    "RangeResult",
    "ResponseHeader",
    "SortOrder",
    "SortTarget",
    "Status",
    "TxnResult",
    "WatchBatch",
    "WatchEvent",
    "WatchFilter",
]


# Enum values are etcd's wire numbers, so conversion is int(member).
class SortOrder(enum.IntEnum):
    NONE = 0
    ASCEND = 1
    DESCEND = 2


class SortTarget(enum.IntEnum):
    KEY = 0
    VERSION = 1
    CREATE = 2
    MOD = 3
    VALUE = 4


class EventType(enum.IntEnum):
    PUT = 0
    DELETE = 1


class WatchFilter(enum.IntEnum):
    """Server-side watch filters: drop events of that kind before they are sent."""

    NO_PUT = 0
    NO_DELETE = 1


@dataclass(frozen=True, slots=True)
class ResponseHeader:
    cluster_id: int
    member_id: int
    revision: int
    raft_term: int


@dataclass(frozen=True, slots=True)
class KeyValue:
    key: bytes
    value: bytes
    create_revision: int
    mod_revision: int
    version: int
    lease: int


@dataclass(frozen=True, slots=True)
class RangeResult:
    header: ResponseHeader
    kvs: tuple[KeyValue, ...]
    more: bool  # the limit cut the result short
    count: int  # keys in the whole range, regardless of the limit

    @property
    def revision(self) -> int:
        return self.header.revision


@dataclass(frozen=True, slots=True)
class PutResult:
    header: ResponseHeader
    prev_kv: KeyValue | None

    @property
    def revision(self) -> int:
        return self.header.revision


@dataclass(frozen=True, slots=True)
class DeleteResult:
    header: ResponseHeader
    deleted: int
    prev_kvs: tuple[KeyValue, ...]

    @property
    def revision(self) -> int:
        return self.header.revision




@dataclass(frozen=True, slots=True)
class TxnResult:
    header: ResponseHeader
    succeeded: bool
    responses: tuple[OpResult, ...]  # of the branch that ran, in request order

    @property
    def revision(self) -> int:
        return self.header.revision


OpResult = RangeResult | PutResult | DeleteResult | TxnResult  # TxnResult: a nested txn's answer


@dataclass(frozen=True, slots=True)
class Lease:
    id: int
    ttl: int  # seconds, as granted by the server
    # Monotonic time (client clock) at which the grant was *sent*. The server started the TTL no
    # earlier than this, so sent_at + ttl is a safe upper bound for the lease's expiry.
    sent_at: float


@dataclass(frozen=True, slots=True)
class LeaseTimeToLive:
    header: ResponseHeader
    id: int
    ttl: int  # remaining seconds; -1 when the lease has expired or never existed
    granted_ttl: int
    keys: tuple[bytes, ...]


@dataclass(frozen=True, slots=True)
class Member:
    id: int
    name: str
    peer_urls: tuple[str, ...]
    client_urls: tuple[str, ...]
    is_learner: bool


@dataclass(frozen=True, slots=True)
class Status:
    header: ResponseHeader
    version: str
    db_size: int
    db_size_in_use: int
    leader: int
    raft_index: int
    raft_term: int
    raft_applied_index: int
    errors: tuple[str, ...]
    is_learner: bool


@dataclass(frozen=True, slots=True)
class WatchEvent:
    type: EventType
    kv: KeyValue  # for DELETE: the key with mod_revision = the delete's revision
    prev_kv: KeyValue | None

    @property
    def revision(self) -> int:
        return self.kv.mod_revision


@dataclass(frozen=True, slots=True)
class WatchBatch:
    """One watch response. `revision` is etcd's header revision. Without events the batch is a
    progress notification: every event at or below `revision` has been delivered. With events it
    may run ahead of them (a watcher catching up on history); take progress from the events then."""

    revision: int
    events: tuple[WatchEvent, ...]

    @property
    def is_progress(self) -> bool:
        return not self.events
