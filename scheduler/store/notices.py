"""Notices: how a partition's owner learns at once of execution records that others changed.

The owner keeps its partition's unfinished executions in memory and otherwise only sees the writes it
makes itself or that its own dispatcher records. Anyone else who changes a record (an API operation
on any node, a worker result recorded by a node that does not own the partition) also puts a notice
key in the same txn: `notices/<partition>/<schedule id>/<from ms>-<through ms>`, meaning "re-read this
schedule's records planned in [from, through]". Every node watches the notices prefix; the owner
re-reads the named records, acts on them (dispatch, drop, tell a worker to stop a cancelled attempt)
and deletes the notice in a fenced txn that compares its mod_revision, so a newer notice on the same
key is never lost. Notices of a partition nobody owns wait for the next owner, whose claim re-reads
every unfinished execution and then clears them; owners also re-list their notices periodically, so
leftovers cannot pile up.

The value is empty, or JSON `{"c": attempt, "why": reason}` when an in-flight attempt was cancelled: a
node that is not the owner but holds that attempt's worker stream (after a re-attach) stops it too. Or
`{"h": attempt, "w": worker}`, a vouch: a node that no longer owns the partition still hears that worker
list that attempt as running on the stream the attempt came on (dispatch/liveness.py, `Vouches`); an owner
holding the attempt as an orphan (its worker has no stream to the owner) waits on instead of giving it up.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from scheduler.store.etcd.ops import PutOp, put
from scheduler.store.keyspace import Keyspace, partition_for


@dataclass(frozen=True)
class Notice:
    partition: int
    schedule_id: str
    from_ms: int
    through_ms: int
    cancel_attempt: int = 0  # > 0: this attempt was cancelled; its worker must be told to stop
    reason: str = ""
    held_attempt: int = 0  # > 0: a vouch that `worker` still runs this attempt (heard by a node not the owner)
    worker: str = ""


def notice_op(ks: Keyspace, partitions: int, schedule_id: str, from_ms: int, through_ms: int | None = None, *,
              cancel_attempt: int = 0, reason: str = "", held_attempt: int = 0, worker: str = "") -> PutOp:
    p = partition_for(schedule_id, partitions)
    value = b""
    if cancel_attempt:
        value = json.dumps({"c": cancel_attempt, "why": reason}, separators=(",", ":")).encode()
    elif held_attempt:
        value = json.dumps({"h": held_attempt, "w": worker}, separators=(",", ":")).encode()
    return put(ks.notice(p, schedule_id, from_ms, from_ms if through_ms is None else through_ms), value)


def parse_notice(key: bytes, value: bytes) -> Notice | None:
    """The notice a key/value holds, or None for a key that is not one (never raises: a watch must go on)."""
    try:
        head, sid, span = key.rsplit(b"/", 2)
        partition = int(head.rsplit(b"/", 1)[1])
        a, _, b = span.partition(b"-")
        d = json.loads(value) if value else {}
        return Notice(partition, sid.decode(), int(a), int(b), int(d.get("c", 0)), str(d.get("why", "")),
                      int(d.get("h", 0)), str(d.get("w", "")))
    except (ValueError, IndexError, AttributeError, TypeError):
        return None
