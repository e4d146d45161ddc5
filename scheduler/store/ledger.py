"""The execution ledger in etcd: record keys, create-if-absent and compare-and-swap operations.

- Materialization: `create_ops` returns nested txns `if create_revision(key) == 0 then put`, to be
  committed inside the owner's fenced batch: a second create of the same execution id is skipped,
  never overwritten, and never fails the batch.
- Transitions: `cas_op` guards the put with `mod_revision(key) == the revision we read`, so two
  planners recording results for the same execution cannot both win, and a decision made on a stale
  read is refused (re-read and decide again). Entering the dead-letter state also writes the
  dead-letter index key; leaving it (replay, discard) deletes it, in the same nested txn.
- Skips: one record per skipped range `(after, through]` of one schedule (timeplan.missed).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from scheduler.execution import TERMINAL, ExecState, Execution
from scheduler.ids import ExecutionId
from scheduler.store.codec import decode_execution, encode_execution, peek_state
from scheduler.store.etcd.ops import Compare, Op, TxnOp, delete, get, put, txn
from scheduler.store.etcd.types import RangeResult, TxnResult
from scheduler.store.keyspace import Keyspace, partition_for
from scheduler.store.kv import KV
from scheduler.store.paging import range_pages
from scheduler.tasks import Pacer
from scheduler.timeplan.missed import SkipRange


@dataclass(frozen=True)
class ClaimListing:
    """`Ledger.list_for_claim`: the unfinished records, the final records of the runs before them that the
    overlap rule may still need, the revision of the read, and per schedule the planned times after
    `recorded_after` that have a record, whatever its state (what the previous owner wrote ahead)."""

    unfinished: list[Execution]
    ended: list[Execution]
    revision: int
    recorded: dict[str, list[int]] = field(default_factory=dict)


@dataclass(frozen=True)
class DeadLetterEntry:
    """One entry of the dead-letter index: key `Keyspace.dead_letter` (`/dead/<partition>/<schedule
    id>/<planned ms>`, parsed back by `Keyspace.dead_letter_of`), value JSON `{"id", "tenant", "task",
    "dead_ms", "payload"}` (the payload as hex: what a replay runs by default). Written and deleted in
    the same nested txn as the record's transition into / out of DEAD_LETTER (`Ledger.cas_op`); listed
    by ListDeadLetters, which reads the records themselves by `id`."""

    id: ExecutionId
    tenant: str
    task_type: str
    dead_ms: int
    payload: bytes

    @property
    def execution_id(self) -> str:
        return str(self.id)

    def value(self) -> bytes:
        return json.dumps({"id": str(self.id), "tenant": self.tenant, "task": self.task_type,
                           "dead_ms": self.dead_ms, "payload": self.payload.hex()}, separators=(",", ":")).encode()

    @staticmethod
    def decode(ks: Keyspace, key: bytes, value: bytes) -> DeadLetterEntry:
        d = json.loads(value)
        return DeadLetterEntry(ks.dead_letter_of(key), str(d.get("tenant", "")), str(d.get("task", "")),
                               int(d.get("dead_ms", 0)), bytes.fromhex(d.get("payload", "")))

    @staticmethod
    def payload_of(value: bytes) -> bytes | None:
        """The payload of an entry's value alone; None if it cannot be read."""
        try:
            return bytes.fromhex(json.loads(value).get("payload", ""))
        except (ValueError, AttributeError):
            return None


class Ledger:
    def __init__(self, ks: Keyspace, partitions: int) -> None:
        self.ks, self.partitions = ks, partitions

    def key(self, e: Execution) -> bytes:
        return self.ks.execution(partition_for(e.schedule_id, self.partitions), e.schedule_id, e.planned_ms)

    def create_ops(self, execs: Sequence[Execution]) -> list[TxnOp]:
        """Create-if-absent for each record. One that exists already is left alone; the caller reads
        those back with `read` (rare: a previous owner's lookahead, a trigger at a planned time). A read
        in each create's failure branch cost a range op per record built, sent and answered for the
        one case in thousands (issue 12: about 5% of a materializing planner's CPU)."""
        out = []
        for e in execs:
            k = self.key(e)
            out.append(TxnOp((Compare.create_revision(k, "==", 0),), (put(k, encode_execution(e)),), ()))
        return out

    async def read(self, kv: KV, execs: Sequence[Execution], *, timeout: float | None = None) -> list[Execution]:
        """The records of `execs` as etcd has them now (those that exist), in batches of one txn each."""
        out: list[Execution] = []
        for i in range(0, len(execs), 100):
            r = await kv.txn([], [get(self.key(e)) for e in execs[i:i + 100]], timeout=timeout)
            for g in r.responses:
                if isinstance(g, RangeResult):
                    out += [decode_execution(x.value, x.mod_revision) for x in g.kvs]
        return out

    async def planned_in(self, kv: KV, partition: int, spans: Sequence[tuple[str, int, int]], *,
                         timeout: float | None = None) -> list[list[int]]:
        """For each (schedule id, after, through), the planned times in (after, through] that have an execution
        record now, ascending (keys only), in batches of one txn each."""
        out: list[list[int]] = []
        for i in range(0, len(spans), 100):
            ops = [get(self.ks.execution(partition, sid, a + 1), range_end=self.ks.execution(partition, sid, b + 1),
                       keys_only=True) for sid, a, b in spans[i:i + 100]]
            r = await kv.txn([], ops, timeout=timeout)
            out += [sorted(self.ks.execution_id_of(x.key).planned_ms for x in g.kvs)
                    for g in r.responses if isinstance(g, RangeResult)]
        return out

    def create_op(self, e: Execution, extra: Sequence[Op] = ()) -> TxnOp:
        """Create-if-absent of one record; `extra` ops (a notice) apply only if the create does."""
        k = self.key(e)
        return txn([Compare.create_revision(k, "==", 0)], [put(k, encode_execution(e)), *extra])

    def cas_op(self, new: Execution, read_revision: int, *, payload: bytes = b"", now_ms: int = 0,
               old_state: ExecState | None = None, extra: Sequence[Op] = ()) -> TxnOp:
        """Write `new` if the record is still at `read_revision` (its mod_revision when read).

        `old_state`: the record's state at `read_revision`, when the caller knows it. A record that
        was not a dead letter there has no dead-letter index key (leaving that state deletes it in
        the same txn), so the delete is left out; if the record moved on, the compare fails anyway.
        `extra` ops (a notice for the partition's owner) apply only if the CAS does."""
        k = self.key(new)
        ops: list[Op] = [put(k, encode_execution(new))]
        if new.state is ExecState.DEAD_LETTER:
            p = partition_for(new.schedule_id, self.partitions)
            dl = DeadLetterEntry(ExecutionId(new.schedule_id, new.planned_ms), new.tenant, new.task_type, now_ms,
                                 payload)
            ops.append(put(self.ks.dead_letter(p, new.schedule_id, new.planned_ms), dl.value()))
        elif old_state is None or old_state is ExecState.DEAD_LETTER:
            p = partition_for(new.schedule_id, self.partitions)
            ops.append(delete(self.ks.dead_letter(p, new.schedule_id, new.planned_ms)))
        ops += extra
        return txn([Compare.mod_revision(k, "==", read_revision)], ops)

    def skip_op(self, partition: int, schedule_id: str, r: SkipRange) -> Op:
        value: dict[str, str] = {"reason": r.reason.value}
        if r.by is not None:  # the plan its instants are listed with (docs/keyspace.md, `skips/`)
            value["spec"] = r.by.spec
            if r.by.tz != "UTC":
                value["tz"] = r.by.tz
            if r.by.dst_gap:
                value["gap"] = r.by.dst_gap
            if r.by.dst_overlap:
                value["fold"] = r.by.dst_overlap
        return put(self.ks.skip(partition, schedule_id, r.after_ms, r.through_ms),
                   json.dumps(value, separators=(",", ":")).encode())

    async def get(self, kv: KV, schedule_id: str, planned_ms: int, *, timeout: float | None = None) -> Execution | None:
        p = partition_for(schedule_id, self.partitions)
        got = await kv.get(self.ks.execution(p, schedule_id, planned_ms), timeout=timeout)
        return None if got is None else decode_execution(got.value, got.mod_revision)

    async def list_unfinished(
        self, kv: KV, partition: int, *, timeout: float | None = None
    ) -> tuple[list[Execution], int]:
        """The partition's executions that are not terminal (what a new owner must track)."""
        listing = await self.list_for_claim(kv, partition, timeout=timeout)
        return listing.unfinished, listing.revision

    async def list_for_claim(
        self, kv: KV, partition: int, *, ran_before: int = 2, timeout: float | None = None,
        pacer: Pacer | None = None, recorded_after: int | None = None,
    ) -> ClaimListing:
        """What a new owner loads: the partition's executions that are not terminal, and for each schedule
        with one, the final records of its last `ran_before` runs that ran (an attempt went out) before
        it. Those are what the overlap rule judges a waiting run on once the run before it has left
        flight (dispatch_round.overlapped_by_ended): without them a takeover changed the decision (a
        drill saw buffer_one run every late run one after the other after a planner kill, 10.7 s behind,
        where the dead owner would have skipped them). Terminal records (most of a busy partition's
        history) are recognised without decoding them, and only the few kept are decoded. Read in pages at
        one revision, and the event loop gets a turn between bounded stretches (`pacer`, else every
        thousand records): a claim must not starve lease keep-alives.

        With `recorded_after`, the planned times after it that have a record are listed per schedule (from
        the keys alone): the previous owner may have written runs ahead of its checkpoint (a paused schedule
        holds the watermark back while the others are written up to the lookahead), and the claim's
        catch-up must not record a skip over a planned time that has its own record."""
        pacer = pacer or Pacer()
        out: list[Execution] = []
        ended: list[Execution] = []
        recorded: dict[str, list[int]] = {}
        # Planned times are zero-padded in the keys: compared as bytes, no int per key of a big ledger.
        after = None if recorded_after is None else self.ks.planned_key_part(max(recorded_after, 0))
        # Keys sort by schedule, then planned time: the runs that ran most recently before an unfinished
        # record of the same schedule are the last few terminal ones seen before it in the listing.
        group = b""
        recent: list[tuple[bytes, int]] = []
        revision = 0
        async for kvs, snapshot in range_pages(kv, self.ks.executions(partition), timeout=timeout):
            revision = snapshot
            for x in kvs:
                cut = x.key.rfind(b"/")
                g = x.key[:cut]
                if g != group:
                    group, recent = g, []
                if after is not None and x.key[cut + 1:] > after:
                    eid = self.ks.execution_id_of(x.key)
                    recorded.setdefault(eid.schedule_id, []).append(eid.planned_ms)
                st = peek_state(x.value)
                if st not in TERMINAL:
                    for value, rev in recent:
                        ended.append(decode_execution(value, rev))
                    recent = []
                    out.append(decode_execution(x.value, x.mod_revision))
                elif st is not ExecState.SKIPPED and ran_before > 0:  # a skip never ran: it overlapped nothing
                    recent.append((x.value, x.mod_revision))
                    del recent[:-ran_before]
                await pacer.pace()
        return ClaimListing(out, ended, revision, recorded)

    async def list_partition(
        self, kv: KV, partition: int, *, schedule_id: str | None = None, timeout: float | None = None
    ) -> tuple[list[Execution], int]:
        r = await kv.range(self.ks.executions(partition, schedule_id), prefix=True, timeout=timeout)
        return [decode_execution(x.value, x.mod_revision) for x in r.kvs], r.revision

    @staticmethod
    def cas_results(r: TxnResult) -> list[bool]:
        """Which nested CASes/creates of one committed txn took effect (in op order)."""
        return [bool(getattr(x, "succeeded", True)) for x in r.responses]

    @staticmethod
    def with_revision(e: Execution, revision: int) -> Execution:
        return replace(e, mod_revision=revision)
