"""Per-partition checkpoint watermark: every planned time at or before it has been handled.

Written only through fenced writes, and never backwards: the writer refuses a lower value, and the
txn also compares the key's mod_revision with the one this owner last saw, so a value it did not
read (written by an earlier owner it has not caught up with) cannot be overwritten blindly.
The value records the writer and its token, so an auditor can attribute every write.

`sched_rev` is the etcd revision through which the writer had taken in its partition's schedule
changes when it planned up to the watermark. A schedule whose current version is newer was not known
to that writer, so a new owner plans its times after its activation afresh instead of from the
watermark (creates are idempotent); without it, a crash between a create and the owner's next round
could leave the planned times between the activation and the watermark unplanned for ever.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from scheduler.errors import SchedError
from scheduler.store.etcd.ops import Compare, Op, put
from scheduler.store.keyspace import Keyspace
from scheduler.store.kv import KV


class WatermarkRegression(SchedError):
    """A checkpoint write would move the watermark backwards."""


@dataclass(frozen=True)
class Checkpoint:
    partition: int
    watermark_ms: int  # 0: never written
    mod_revision: int  # 0: key absent
    writer: str = ""
    token: int = 0
    sched_rev: int = 0  # 0: unknown (written by an older version): every schedule counts as new

    def encode(self) -> bytes:
        return json.dumps(
            {"watermark_ms": self.watermark_ms, "writer": self.writer, "token": self.token,
             "sched_rev": self.sched_rev}, separators=(",", ":")
        ).encode()


def decode(partition: int, value: bytes, mod_revision: int) -> Checkpoint:
    d = json.loads(value)
    return Checkpoint(partition, int(d["watermark_ms"]), mod_revision, str(d.get("writer", "")), int(d.get("token", 0)),
                      int(d.get("sched_rev", 0)))


async def read_checkpoint(kv: KV, ks: Keyspace, partition: int, *, timeout: float | None = None) -> Checkpoint:
    kv_ = await kv.get(ks.checkpoint(partition), timeout=timeout)
    if kv_ is None:
        return Checkpoint(partition, 0, 0)
    return decode(partition, kv_.value, kv_.mod_revision)


def advance(
    ks: Keyspace, current: Checkpoint, watermark_ms: int, writer: str, token: int, sched_rev: int = 0
) -> tuple[list[Compare], list[Op], Checkpoint]:
    """Compares and ops that move `current` to `watermark_ms` (pass them to fenced_txn).

    Returns the new Checkpoint without its mod_revision: the caller fills it in from the txn's
    revision once committed.
    """
    if watermark_ms < current.watermark_ms:
        raise WatermarkRegression(
            f"partition {current.partition}: watermark {watermark_ms} < current {current.watermark_ms}"
        )
    key = ks.checkpoint(current.partition)
    guard = (
        Compare.mod_revision(key, "==", current.mod_revision)
        if current.mod_revision
        else Compare.create_revision(key, "==", 0)
    )
    new = Checkpoint(current.partition, watermark_ms, 0, writer, token, sched_rev)
    return [guard], [put(key, new.encode())], new
