"""Transaction building blocks: compares and operations, as plain values.

A fencing write is `txn([Compare.create_revision(owner_key, "==", token)], [put(...), ...])`: the
compare and the writes it protects travel in one request, so etcd applies both or neither.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, TypedDict, Unpack

from scheduler.store.etcd.types import SortOrder, SortTarget

__all__ = [
    "Compare",
    "CompareTarget",
    "DeleteOp",
    "Key",
    "Op",
    "PutOp",
    "RangeOp",
    "RangeOptions",
    "delete",
    "get",
    "key_range",
    "prefix_end",
    "put",
    "to_bytes",
]

Key = str | bytes
CompareOp = Literal["==", "!=", ">", "<"]


def to_bytes(key: Key) -> bytes:
    return key.encode() if isinstance(key, str) else key


def prefix_end(prefix: bytes) -> bytes:
    """The smallest key greater than every key starting with `prefix` (etcd's range_end for a prefix)."""
    end = bytearray(prefix)
    while end:
        if end[-1] < 0xFF:
            end[-1] += 1
            return bytes(end)
        end.pop()
    return b"\0"  # all-0xff or empty prefix: etcd reads "\0" as "to the end of the keyspace"


def key_range(key: Key, *, prefix: bool = False, range_end: Key | None = None) -> tuple[bytes, bytes]:
    """(key, range_end) for etcd: one key, a prefix, or an explicit [key, range_end)."""
    k = to_bytes(key)
    if prefix and range_end is not None:
        raise ValueError("give either prefix=True or range_end, not both")
    if prefix:
        return (k, prefix_end(k)) if k else (b"\0", b"\0")  # empty prefix: the whole keyspace
    return k, (to_bytes(range_end) if range_end is not None else b"")


class CompareTarget(enum.IntEnum):  # values are etcd's wire numbers
    VERSION = 0
    CREATE = 1
    MOD = 2
    VALUE = 3
    LEASE = 4


@dataclass(frozen=True, slots=True)
class Compare:
    key: bytes
    target: CompareTarget
    op: CompareOp
    operand: int | bytes
    range_end: bytes = b""  # non-empty: the compare must hold for every key in [key, range_end)

    @classmethod
    def version(cls, key: Key, op: CompareOp, version: int, *, prefix: bool = False) -> Compare:
        return cls._make(key, CompareTarget.VERSION, op, version, prefix)

    @classmethod
    def create_revision(cls, key: Key, op: CompareOp, revision: int, *, prefix: bool = False) -> Compare:
        """`create_revision(k, "==", 0)` means "k does not exist"; with a token it is the fence."""
        return cls._make(key, CompareTarget.CREATE, op, revision, prefix)

    @classmethod
    def mod_revision(cls, key: Key, op: CompareOp, revision: int, *, prefix: bool = False) -> Compare:
        return cls._make(key, CompareTarget.MOD, op, revision, prefix)

    @classmethod
    def value(cls, key: Key, op: CompareOp, value: bytes, *, prefix: bool = False) -> Compare:
        return cls._make(key, CompareTarget.VALUE, op, value, prefix)

    @classmethod
    def lease(cls, key: Key, op: CompareOp, lease_id: int, *, prefix: bool = False) -> Compare:
        return cls._make(key, CompareTarget.LEASE, op, lease_id, prefix)

    @classmethod
    def _make(cls, key: Key, target: CompareTarget, op: CompareOp, operand: int | bytes, prefix: bool) -> Compare:
        k, end = key_range(key, prefix=prefix)
        return cls(k, target, op, operand, end)


class RangeOptions(TypedDict, total=False):
    """Options of a range read, shared by `EtcdClient.range` and `get` (defaults live in `get`)."""

    prefix: bool
    range_end: Key | None
    limit: int
    revision: int
    keys_only: bool
    count_only: bool
    serializable: bool
    sort_order: SortOrder
    sort_target: SortTarget
    min_mod_revision: int
    max_mod_revision: int
    min_create_revision: int
    max_create_revision: int


@dataclass(frozen=True, slots=True)
class RangeOp:
    key: bytes
    range_end: bytes
    limit: int
    revision: int
    keys_only: bool
    count_only: bool
    serializable: bool
    sort_order: SortOrder
    sort_target: SortTarget
    min_mod_revision: int
    max_mod_revision: int
    min_create_revision: int
    max_create_revision: int


@dataclass(frozen=True, slots=True)
class PutOp:
    key: bytes
    value: bytes
    lease: int = 0
    prev_kv: bool = False


@dataclass(frozen=True, slots=True)
class DeleteOp:
    key: bytes
    range_end: bytes = b""
    prev_kv: bool = False


@dataclass(frozen=True, slots=True)
class TxnOp:
    """A txn nested inside another txn's branch (etcd >= 3.3). Its compares guard only its own ops,
    so one outer txn can carry the fence for a batch while each record is created only if absent:
    `TxnOp([Compare.create_revision(k, "==", 0)], [put(k, v)])` skips a duplicate without failing
    the batch."""

    compare: tuple[Compare, ...]
    success: tuple[Op, ...] = ()
    failure: tuple[Op, ...] = ()

    @property
    def key(self) -> bytes:  # for size estimates and error messages
        return b"<txn>"


Op = RangeOp | PutOp | DeleteOp | TxnOp


def txn(compare: Sequence[Compare], success: Sequence[Op] = (), failure: Sequence[Op] = ()) -> TxnOp:
    return TxnOp(tuple(compare), tuple(success), tuple(failure))


def get(key: Key, **options: Unpack[RangeOptions]) -> RangeOp:
    k, end = key_range(key, prefix=options.get("prefix", False), range_end=options.get("range_end"))
    limit = options.get("limit", 0)
    if limit < 0:
        raise ValueError(f"limit must be >= 0, got {limit}")
    return RangeOp(
        key=k,
        range_end=end,
        limit=limit,
        revision=options.get("revision", 0),
        keys_only=options.get("keys_only", False),
        count_only=options.get("count_only", False),
        serializable=options.get("serializable", False),
        sort_order=options.get("sort_order", SortOrder.NONE),
        sort_target=options.get("sort_target", SortTarget.KEY),
        min_mod_revision=options.get("min_mod_revision", 0),
        max_mod_revision=options.get("max_mod_revision", 0),
        min_create_revision=options.get("min_create_revision", 0),
        max_create_revision=options.get("max_create_revision", 0),
    )


def put(key: Key, value: bytes, *, lease: int = 0, prev_kv: bool = False) -> PutOp:
    return PutOp(to_bytes(key), value, lease, prev_kv)


def delete(key: Key, *, prefix: bool = False, range_end: Key | None = None, prev_kv: bool = False) -> DeleteOp:
    k, end = key_range(key, prefix=prefix, range_end=range_end)
    return DeleteOp(k, end, prev_kv)
