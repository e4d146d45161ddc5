"""A guard against txns etcd refuses as malformed: two writes of one key in one request.

etcd rejects a txn whose puts and deletes (nested txns included) name the same key twice with
INVALID_ARGUMENT ("duplicate key given in txn request"), and refuses the whole request. For a planner
that means the same batch is rebuilt and refused again after every reload: one bad pair of ops stops
the partition. Two transitions of one record in one batch are always a bug of the caller, so the guard
keeps the first op that writes a key, drops the later ones, and reports them (the caller logs an
ERROR and counts it); the rest of the batch goes through.
"""

from __future__ import annotations

from collections.abc import Sequence

from scheduler.store.etcd.ops import DeleteOp, Op, PutOp, TxnOp


def written_keys(op: Op) -> set[bytes]:
    """Keys a put, a single-key delete, or either branch of a nested txn writes."""
    if isinstance(op, PutOp):
        return {op.key}
    if isinstance(op, DeleteOp):
        return {op.key} if not op.range_end else set()
    if isinstance(op, TxnOp):
        out: set[bytes] = set()
        for branch in (op.success, op.failure):
            for x in branch:
                out |= written_keys(x)
        return out
    return set()


def duplicate_write(ops: Sequence[Op]) -> bytes | None:
    """The first key that two ops of the batch write, or None."""
    seen: set[bytes] = set()
    for op in ops:
        keys = written_keys(op)
        both = keys & seen
        if both:
            return min(both)
        seen |= keys
    return None
