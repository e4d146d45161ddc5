"""The checks etcd makes before it applies a request, with etcd's limits and quirks.

They run in etcd's order: gRPC's message size limit, then the API layer (empty keys, too many ops,
put/delete overlaps in one txn), then the raft layer's --max-request-bytes for writes. Only then does
the apply step look at leases and revisions (server.py). Request sizes are the protobuf wire sizes,
computed here rather than by building messages, so the twin does not depend on generated code.
"""

from __future__ import annotations

from collections.abc import Sequence

import grpc

from scheduler.store.etcd.ops import Compare, CompareTarget, DeleteOp, Op, PutOp, RangeOp, TxnOp
from scheduler.store.memory import _status

__all__ = ["DEFAULT_MAX_REQUEST_BYTES", "DEFAULT_MAX_TXN_OPS", "Limits", "check_request", "check_txn"]

DEFAULT_MAX_TXN_OPS = 128  # etcd --max-txn-ops
DEFAULT_MAX_REQUEST_BYTES = 1536 * 1024  # etcd --max-request-bytes
_GRPC_OVERHEAD = 512 * 1024  # etcd lets gRPC receive this much more than --max-request-bytes
_RAFT_ENVELOPE = 24  # InternalRaftRequest header and ID around the request, give or take a byte


class Limits:
    def __init__(self, max_txn_ops: int = DEFAULT_MAX_TXN_OPS,
                 max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES) -> None:
        self.max_txn_ops = max_txn_ops
        self.max_request_bytes = max_request_bytes


def check_request(limits: Limits, op: Op) -> None:
    """A single put, delete or range request."""
    size = _op_size(op)
    _check_grpc_size(limits, size)
    if not op.key:
        raise _status.error(_status.EMPTY_KEY, write=not isinstance(op, RangeOp))
    if not isinstance(op, RangeOp):
        _check_raft_size(limits, size)


def check_txn(limits: Limits, compare: Sequence[Compare], success: Sequence[Op], failure: Sequence[Op]) -> None:
    _check_operand_types(compare, success, failure)
    # etcd's isTxnReadonly, and EtcdClient's read/write split: any op but a range makes a write.
    write = not all(isinstance(op, RangeOp) for op in (*success, *failure))
    size = _txn_size(compare, success, failure)
    _check_grpc_size(limits, size)
    _check_txn_request(compare, success, failure, limits.max_txn_ops, write)
    for branch in (success, failure):
        try:
            _intervals(branch)
        except _Overlap:
            raise _status.error(_status.DUPLICATE_KEY, write=write) from None
    if write:  # a read-only txn is served without raft, so only gRPC's limit applies to it
        _check_raft_size(limits, size)


def _check_operand_types(compare: Sequence[Compare], success: Sequence[Op], failure: Sequence[Op]) -> None:
    for c in compare:
        # EtcdClient refuses these while building the request, before anything is sent.
        if isinstance(c.operand, bytes) != (c.target is CompareTarget.VALUE):
            kind = "bytes" if c.target is CompareTarget.VALUE else "an int"
            raise TypeError(f"compare on {c.target.name} needs {kind}")
    for op in (*success, *failure):
        if isinstance(op, TxnOp):
            _check_operand_types(op.compare, op.success, op.failure)


def _check_txn_request(compare: Sequence[Compare], success: Sequence[Op], failure: Sequence[Op],
                       max_ops: int, write: bool) -> None:
    """etcd's checkTxnRequest: a nested txn may only use the ops its parent left over (measured:
    100 reads plus a nested txn of 28 is refused at the default 128)."""
    ops = max(len(compare), len(success), len(failure))
    if ops > max_ops:
        raise _status.error(_status.TOO_MANY_OPS, write=write)
    if any(not c.key for c in compare):
        raise _status.error(_status.EMPTY_KEY, write=write)
    for op in (*success, *failure):
        if isinstance(op, TxnOp):
            _check_txn_request(op.compare, op.success, op.failure, max_ops - ops, write)
        elif not op.key:
            raise _status.error(_status.EMPTY_KEY, write=write)


class _Overlap(Exception):
    pass


_Interval = tuple[bytes, bytes]  # a delete's (key, range_end)


def _hits(deletes: list[_Interval], key: bytes) -> bool:
    # etcd's interval tree reads range_end b"\0" ("to the end") as the plain string "\0", an empty
    # interval, so a put inside such a delete passes. Kept on purpose (measured on 3.5.16).
    return any((key == start) if not end else (start <= key < end) for start, end in deletes)


def _intervals(ops: Sequence[Op]) -> tuple[set[bytes], list[_Interval]]:
    """etcd's checkIntervals, literally: no two puts of one key and no put inside a delete in one
    branch, counting nested txns (whose two branches may put the same key, as only one runs). Two
    deletes may overlap and reads are free. Like etcd, a nested txn's deletes only count against
    puts that come in *later* nested txns or at this level."""
    deletes = [(op.key, op.range_end) for op in ops if isinstance(op, DeleteOp)]
    puts: set[bytes] = set()
    for op in ops:
        if not isinstance(op, TxnOp):
            continue
        then_puts, then_deletes = _intervals(op.success)
        else_puts, else_deletes = _intervals(op.failure)
        for key in then_puts:
            if key in puts or _hits(deletes, key):
                raise _Overlap
            puts.add(key)
        for key in else_puts:
            if (key in puts and key not in then_puts) or _hits(deletes, key):
                raise _Overlap
            puts.add(key)
        deletes += then_deletes + else_deletes
    for op in ops:
        if isinstance(op, PutOp):
            if op.key in puts or _hits(deletes, op.key):
                raise _Overlap
            puts.add(op.key)
    return puts, deletes


def _check_grpc_size(limits: Limits, size: int) -> None:
    limit = limits.max_request_bytes + _GRPC_OVERHEAD
    if size > limit:
        status = grpc.StatusCode.RESOURCE_EXHAUSTED
        details = f"grpc: received message larger than max ({size} vs. {limit})"
        raise _status.error(_status.Status(status, details), write=True)


def _check_raft_size(limits: Limits, size: int) -> None:
    if size + _RAFT_ENVELOPE > limits.max_request_bytes:
        raise _status.error(_status.REQUEST_TOO_LARGE, write=True)


# ---- protobuf wire sizes (proto3: default scalars are not sent; oneof members always are) -------


def _varint(n: int) -> int:
    if n < 0:
        return 10  # negative int64s are sent as ten-byte varints
    size = 1
    while n >= 0x80:
        n >>= 7
        size += 1
    return size


def _bytes(value: bytes, tag: int = 1) -> int:
    return tag + _varint(len(value)) + len(value) if value else 0


def _int(value: int, tag: int = 1) -> int:
    return tag + _varint(value) if value else 0


def _message(size: int) -> int:
    return 1 + _varint(size) + size


def _op_size(op: Op) -> int:
    if isinstance(op, PutOp):
        return _bytes(op.key) + _bytes(op.value) + _int(op.lease) + _int(int(op.prev_kv))
    if isinstance(op, DeleteOp):
        return _bytes(op.key) + _bytes(op.range_end) + _int(int(op.prev_kv))
    if isinstance(op, TxnOp):
        return _txn_size(op.compare, op.success, op.failure)
    flags = (op.serializable, op.keys_only, op.count_only)
    numbers = (op.limit, op.revision, int(op.sort_order), int(op.sort_target), op.min_mod_revision,
               op.max_mod_revision, op.min_create_revision, op.max_create_revision)
    return (_bytes(op.key) + _bytes(op.range_end) + sum(_int(n) for n in numbers)
            + sum(_int(int(f)) for f in flags))


_COMPARE_RESULT = {"==": 0, ">": 1, "<": 2, "!=": 3}  # etcd's wire numbers


def _compare_size(c: Compare) -> int:
    operand = (1 + _varint(len(c.operand)) + len(c.operand) if isinstance(c.operand, bytes)
               else 1 + _varint(c.operand))
    return (_int(_COMPARE_RESULT[c.op]) + _int(int(c.target)) + _bytes(c.key) + operand
            + _bytes(c.range_end, tag=2))


def _txn_size(compare: Sequence[Compare], success: Sequence[Op], failure: Sequence[Op]) -> int:
    return (sum(_message(_compare_size(c)) for c in compare)
            + sum(_message(_message(_op_size(op))) for op in (*success, *failure)))
