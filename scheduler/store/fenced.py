"""Writes that depend on owning a partition, guarded by the claim's revision in the same txn.

`create_revision(owner_key) == token` holds exactly while the claim we made is the current one: a
lease expiry deletes the key, and any later claim re-creates it with a higher create_revision. So a
planner that was paused or cut off can never land a write after another has taken over, whatever
its own clock believes (DESIGN.md, Ownership and fencing).

Batches larger than etcd's limits are split into several txns, each fenced and each atomic; callers
put the checkpoint in the last chunk so that a crash between chunks only leaves work to redo.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from scheduler.errors import FencedOut, SchedError
from scheduler.ids import FencingToken
from scheduler.store.etcd.ops import Compare, DeleteOp, Op, PutOp, TxnOp, get
from scheduler.store.etcd.types import RangeResult, TxnResult
from scheduler.store.kv import KV


@dataclass(frozen=True)
class Fence:
    partition: int
    owner_key: bytes
    token: int  # revision of our claim = create_revision of the owner key while we own it

    @property
    def fencing_token(self) -> FencingToken:
        """What the attempts dispatched under this claim carry (`<partition>:<revision>`)."""
        return FencingToken(self.partition, self.token)


class CompareFailed(SchedError):
    """The fence held but one of the caller's own compares did not (someone changed that key)."""


@dataclass
class FenceStats:
    txns: int = 0
    fenced_out: int = 0
    unfenced: int = 0  # writes made with fencing disabled (tests only)


def _op_size(op: Op) -> int:
    if isinstance(op, PutOp):
        return len(op.key) + len(op.value) + 16
    if isinstance(op, DeleteOp):
        return len(op.key) + len(op.range_end) + 8
    if isinstance(op, TxnOp):
        return 16 + sum(len(c.key) + 24 for c in op.compare) + sum(_op_size(o) for o in (*op.success, *op.failure))
    return len(op.key) + len(op.range_end) + 32


def nested_width(op: Op) -> int:
    """Ops a nested txn uses from its parent's budget: etcd lets a nested txn use only the ops its
    parent left over (`max-txn-ops` minus the parent's own count)."""
    if isinstance(op, TxnOp):
        return max(len(op.compare), len(op.success), len(op.failure))
    return 0


def split_ops(ops: Sequence[Op], max_ops: int, max_bytes: int) -> list[list[Op]]:
    """Chunks that respect etcd's ops-per-txn and request-size limits, in the original order. A chunk
    holding nested txns is shorter by the widest one, so that it fits in what the parent leaves."""
    chunks: list[list[Op]] = []
    cur: list[Op] = []
    size = 0
    width = 0
    for op in ops:
        n = _op_size(op)
        w = nested_width(op)
        if n > max_bytes:
            raise SchedError(f"one operation on {op.key!r} is {n} bytes, above the {max_bytes}-byte txn limit")
        if cur and (len(cur) >= max_ops or len(cur) + max(width, w) > max_ops or size + n > max_bytes):
            chunks.append(cur)
            cur, size, width = [], 0, 0
        cur.append(op)
        size += n
        width = max(width, w)
    if cur:
        chunks.append(cur)
    return chunks


async def fenced_txn(
    kv: KV,
    fence: Fence,
    ops: Sequence[Op],
    *,
    compares: Sequence[Compare] = (),
    max_ops: int = 127,
    max_bytes: int = 1_000_000,
    timeout: float | None = None,
    disable_fencing: bool = False,
    stats: FenceStats | None = None,
) -> list[TxnResult]:
    """Commit `ops` under the fence. Raises FencedOut (drop the partition, do not retry),
    CompareFailed (the fence held, a caller compare did not), or OutcomeUnknown (re-read first).

    `compares` are only allowed when the ops fit one txn: they guard that txn alone.
    """
    chunks = split_ops(ops, max_ops, max_bytes) or [[]]
    if compares and len(chunks) > 1:
        raise SchedError("extra compares need the ops to fit in one txn")
    fence_cmp = [] if disable_fencing else [Compare.create_revision(fence.owner_key, "==", fence.token)]
    results = []
    for chunk in chunks:
        r = await kv.txn([*fence_cmp, *compares], chunk, [get(fence.owner_key)], timeout=timeout)
        if stats is not None:
            stats.txns += 1
            stats.unfenced += disable_fencing
        if not r.succeeded:
            owner = r.responses[0] if r.responses else None
            kvs = owner.kvs if isinstance(owner, RangeResult) else ()
            if not disable_fencing and (not kvs or kvs[0].create_revision != fence.token):
                if stats is not None:
                    stats.fenced_out += 1
                now = f"create_revision {kvs[0].create_revision}" if kvs else "no owner"
                raise FencedOut(f"partition {fence.partition}: token {fence.token} is stale ({now})")
            raise CompareFailed(f"partition {fence.partition}: a compare on the written keys failed")
        results.append(r)
    return results

