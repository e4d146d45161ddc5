"""The schedule store: one key per schedule under its partition, the key's mod_revision as the etag.

Schedules are written by the API (any node), not by partition owners, so these writes are not
fenced: they are compare-and-swaps on the schedule key itself. Owners learn of changes by watching
their partitions' schedule prefixes.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from scheduler.errors import AlreadyExists, FailedPrecondition, NotFound, ResourceExhausted, VersionMismatch
from scheduler.model import Schedule
from scheduler.quota import usage as qusage
from scheduler.store.checkpoint import Checkpoint, read_checkpoint
from scheduler.store.codec import (
    ScheduleMeta,
    decode_schedule_meta,
    decode_stored_schedule,
    encode_schedule,
    plan_fields,
)
from scheduler.store.etcd.ops import Compare, Op, delete, get, prefix_end, put
from scheduler.store.keyspace import Keyspace, partition_for
from scheduler.store.kv import KV
from scheduler.store.paging import range_pages
from scheduler.tasks import Pacer


@dataclass(frozen=True, slots=True)
class StoredSchedule:
    schedule: Schedule  # .version = etcd mod_revision
    activated_ms: int  # planned times before this are not owed (creation, resume, spec change)
    partition: int
    meta: ScheduleMeta = field(default_factory=ScheduleMeta)

    @property
    def activation_rev(self) -> int:
        """The etcd revision of the write that set the current activation (see ScheduleMeta)."""
        return self.meta.activated_rev or self.schedule.version


# Activation changes that may wait for a planner to see them (the partition has no owner): beyond this
# an update that starts a new activation is refused rather than lose the planned times of the oldest.
MAX_UNSEEN_ACTIVATIONS = 16

# Re-reads of a tenant's schedules-held counter that another create or delete of the tenant moved meanwhile.
_USAGE_ATTEMPTS = 32


def over_quota(tenant: str, limit: int, held: int, adding: int) -> ResourceExhausted:
    return ResourceExhausted(f"tenant {tenant!r} is at its schedules quota: limit {limit}, holds {held}, "
                             f"this request adds {adding} (schedctl tenant quota get {tenant})")


def batch_ops(schedules: int, tenants: int) -> int:
    """The most compares (or ops) a create txn of `schedules` spread over `tenants` carries: one per schedule,
    and per tenant its counter's guard (up to 3 compares: the counter, and after a count by scan the two range
    compares) and its put."""
    return schedules + 3 * tenants


# Schedules one create_batch txn may hold: etcd's --max-txn-ops (128) bounds its compares and its puts, and
# etcd 3.5.16 refuses 128 in one branch (config.CoordinationSettings.max_txn_ops). Values are ~600 B, so
# a full batch stays far below the 1.5 MiB request limit. Each tenant's counter takes room too (`batch_ops`:
# up to 3 compares and a put), so a batch of one tenant holds 124 (127 before quotas); one of more tenants
# that does not fit one txn with their counters goes as several (bench/bench_scale.py's 10 tenants: 97 each).
_TXN_OPS = 127
MAX_BATCH = _TXN_OPS - 3


def pruned_history(history: tuple[dict[str, Any], ...], current_rev: int, ck: Checkpoint) -> tuple[dict[str, Any], ...]:
    """The activations a new owner may still have to plan: an entry goes once a checkpoint's writer had
    seen the activation after it (that writer settled the entry up to its end when it saw the change);
    `current_rev` is the revision of the activation after the last entry."""
    if not history:
        return ()
    revs = [int(h.get("rev", 0)) for h in history[1:]] + [current_rev]
    return tuple(h for h, nxt in zip(history, revs, strict=True) if not ck.sched_rev or nxt > ck.sched_rev)


def _activation_changed(old: Schedule, new: Schedule) -> bool:
    """Changes after which planned times are computed afresh from the update time."""
    return (old.spec, old.time_zone, old.start_ms, old.end_ms, old.state, old.policies.dst_gap,
            old.policies.dst_overlap) != (new.spec, new.time_zone, new.start_ms, new.end_ms, new.state,
                                          new.policies.dst_gap, new.policies.dst_overlap)


class ScheduleStore:
    def __init__(self, kv: KV, ks: Keyspace, partitions: int, timeout: float = 1.0) -> None:
        self.kv, self.ks, self.partitions, self.timeout = kv, ks, partitions, timeout

    def partition(self, schedule_id: str) -> int:
        return partition_for(schedule_id, self.partitions)

    async def usage(self, tenant: str, limit: int) -> qusage.Usage:
        """The tenant's schedules-held counter; counted by a scan when there is none yet and `limit` applies."""
        got = await self.kv.get(self.ks.usage(tenant), timeout=self.timeout)
        u = qusage.from_kv(tenant, got.value if got else None, got.mod_revision if got else 0)
        if not u.version and limit:
            u = await qusage.count(self.kv, self.ks, tenant, timeout=self.timeout)
        return u

    async def create(self, s: Schedule, now_ms: int, *, request_id: str = "", limit: int = 0,
                     usage: qusage.Usage | None = None) -> StoredSchedule:
        """Create if the id is free. A retry of the same request (same non-empty `request_id`) gets
        the stored schedule back instead of AlreadyExists. `limit` > 0: the tenant's schedules-held quota,
        checked against its counter in the same txn (ResourceExhausted, nothing written, when at it).
        `usage`: the counter as the caller just read it (saves a read; a stale one only costs a retry)."""
        p = self.partition(s.id)
        key = self.ks.schedule(p, s.id)
        meta = ScheduleMeta(now_ms, now_ms, request_id)
        for _ in range(_USAGE_ATTEMPTS):
            if usage is not None and (usage.version or not limit):
                u, usage = usage, None
            else:
                u = await self.usage(s.tenant, limit)
            if limit and u.schedules + 1 > limit:
                existing = await self.kv.get(key, timeout=self.timeout)
                if existing is None:
                    raise over_quota(s.tenant, limit, u.schedules, 1)
                return self._existing(existing.value, existing.mod_revision, p, s.id, request_id, s)
            r = await self.kv.txn([Compare.create_revision(key, "==", 0), *qusage.guard(self.ks, u)],
                                  [put(key, encode_schedule(s, activated_ms=now_ms, meta=meta)),
                                   *qusage.write(self.ks, u, +1)], [get(key)],
                                  timeout=self.timeout)
            if r.succeeded:
                return StoredSchedule(replace(s, version=r.revision), now_ms, p, meta)
            kvs = getattr(r.responses[0], "kvs", ())
            if kvs:
                return self._existing(kvs[0].value, kvs[0].mod_revision, p, s.id, request_id, s)
            # the id is free: the tenant's counter moved (another create or delete of the tenant): again
        raise VersionMismatch(f"tenant {s.tenant!r}: its schedule count kept changing under this create; retry")

    def _existing(self, value: bytes, mod_revision: int, p: int, sid: str, request_id: str,
                  asked: Schedule | None = None) -> StoredSchedule:
        if request_id and decode_schedule_meta(value).request_id == request_id:
            stored = self._stored(value, mod_revision, p)
            # A retry carries the same schedule. One that does not is another request reusing the key (an outside
            # audit, session 36: it got the first schedule back as if created): refused, as payment APIs refuse
            # an idempotency key reused with other parameters. Unless the schedule changed since its create:
            # then the create's own fields are gone and a retry cannot be told from a reuse.
            if (asked is not None and stored.meta.updated_ms == stored.meta.created_ms
                    and replace(asked, version=0) != replace(stored.schedule, version=0)):
                # Why, only to the schedule's own tenant: another tenant learns no more than that the id is taken.
                raise AlreadyExists(f"schedule {sid!r} already exists" + (
                    f": request_id {request_id!r} was used to create it with other fields"
                    if asked.tenant == stored.schedule.tenant else ""))
            return stored
        raise AlreadyExists(f"schedule {sid!r} already exists")

    async def create_batch(self, schedules: Sequence[Schedule], now_ms: int, *, request_id: str = "",
                           limits: Mapping[str, int] | None = None) -> list[StoredSchedule | None]:
        """Create each schedule whose id is free, in one txn per attempt: every key's `create_revision == 0`
        is compared, so the txn writes all of them or none; when some ids are taken (its failure branch
        reads them) it is sent again without those, until it applies. Returns, in order, the stored
        schedule, or None for an id another request holds (one created by a request with the same
        non-empty `request_id` is returned as created: a retried batch is safe). At most `MAX_BATCH`
        schedules (etcd's --max-txn-ops bounds the compares and the puts of one txn); callers with more
        send several batches (`create_many`); a batch that fits `MAX_BATCH` schedules but not their tenants'
        counters as well (`batch_ops`) is sent as several, like `create_many` (all or none holds per txn only).
        `limits`: tenant -> schedules-held quota (absent or 0: none);
        each tenant's counter moves in the same txn, ResourceExhausted when the batch would pass a limit."""
        if len(schedules) > MAX_BATCH:
            raise ValueError(f"at most {MAX_BATCH} schedules per batch, got {len(schedules)}")
        ids = [x.id for x in schedules]
        if len(set(ids)) != len(ids):
            raise ValueError("a batch names one schedule id twice")
        if batch_ops(len(schedules), len({x.tenant for x in schedules})) > _TXN_OPS:
            # Too many for one txn with the tenants' counters (etcd counts compares and ops): several txns.
            return await self.create_many(schedules, now_ms, request_id=request_id, limits=limits)
        limits = limits or {}
        meta = ScheduleMeta(now_ms, now_ms, request_id)
        out: list[StoredSchedule | None] = [None] * len(schedules)
        todo = list(range(len(schedules)))
        # Each failed round settles at least one item (a taken id) or saw a tenant's counter move.
        for _ in range(MAX_BATCH + _USAGE_ATTEMPTS):
            if not todo:
                break
            tenants = sorted({schedules[i].tenant for i in todo})
            us = {t: await self.usage(t, limits.get(t, 0)) for t in tenants}
            parts = [self.partition(ids[i]) for i in todo]
            keys = [self.ks.schedule(p, ids[i]) for p, i in zip(parts, todo, strict=True)]
            adds = {t: sum(1 for i in todo if schedules[i].tenant == t) for t in tenants}
            over = [t for t in tenants if limits.get(t, 0) and us[t].schedules + adds[t] > limits[t]]
            if over:
                # Ids already taken (a retried batch) do not count: settle them first, then decide.
                got = await self.kv.txn([], [get(k) for k in keys], timeout=self.timeout)
                free = self._settle_taken(todo, parts, got.responses, out, request_id)
                if len(free) == len(todo):
                    t = over[0]
                    raise over_quota(t, limits[t], us[t].schedules, adds[t])
                todo = free
                continue
            compares = [Compare.create_revision(k, "==", 0) for k in keys]
            ops: list[Op] = [put(k, encode_schedule(schedules[i], activated_ms=now_ms, meta=meta))
                             for k, i in zip(keys, todo, strict=True)]
            for t in tenants:
                compares += qusage.guard(self.ks, us[t])
                ops += qusage.write(self.ks, us[t], adds[t])
            r = await self.kv.txn(compares, ops, [get(k) for k in keys], timeout=self.timeout)
            if r.succeeded:
                for i, p in zip(todo, parts, strict=True):
                    out[i] = StoredSchedule(replace(schedules[i], version=r.revision), now_ms, p, meta)
                todo = []
                break
            todo = self._settle_taken(todo, parts, r.responses, out, request_id)
        if todo:  # out of attempts with ids still free: never report those as taken by someone else
            raise VersionMismatch("the schedule counts of this batch's tenants kept changing under it; retry "
                                  "(with the same request_id, what was created is reported as created)")
        return out

    def _settle_taken(self, todo: list[int], parts: list[int], responses: Sequence[object],
                      out: list[StoredSchedule | None], request_id: str) -> list[int]:
        """Of the items `todo`, those whose id is still free; a taken one is settled in `out` (the stored
        schedule when this request created it, None when another did)."""
        free: list[int] = []
        for i, p, rr in zip(todo, parts, responses, strict=True):
            kvs = getattr(rr, "kvs", ())
            if not kvs:
                free.append(i)  # not taken: it goes in the next attempt
            elif request_id and decode_schedule_meta(kvs[0].value).request_id == request_id:
                out[i] = self._stored(kvs[0].value, kvs[0].mod_revision, p)
        return free

    async def create_many(self, schedules: Sequence[Schedule], now_ms: int, *, request_id: str = "",
                          max_bytes: int = 1_000_000, in_flight: int = 4,
                          limits: Mapping[str, int] | None = None) -> list[StoredSchedule | None]:
        """`create_batch` over any number of schedules: batches of at most MAX_BATCH schedules and
        `max_bytes` of values (below etcd's 1.5 MiB request limit), `in_flight` txns at a time. Not atomic
        across batches: a failure (etcd unreachable, outcome unknown) may leave earlier batches written;
        a retry with the same `request_id` then reports them as created."""
        batches: list[list[int]] = []
        size = 0
        tenants: set[str] = set()
        for i, x in enumerate(schedules):
            n = len(encode_schedule(x, activated_ms=now_ms)) + 200  # + meta, key and framing
            more = tenants | {x.tenant}
            if not batches or batch_ops(len(batches[-1]) + 1, len(more)) > _TXN_OPS or size + n > max_bytes:
                batches.append([])
                size = 0
                more = {x.tenant}
            batches[-1].append(i)
            size += n
            tenants = more
        out: list[StoredSchedule | None] = [None] * len(schedules)
        sem = asyncio.Semaphore(in_flight)

        async def one(batch: list[int]) -> None:
            async with sem:
                got = await self.create_batch([schedules[i] for i in batch], now_ms, request_id=request_id,
                                              limits=limits)
            for i, st in zip(batch, got, strict=True):
                out[i] = st

        await asyncio.gather(*(one(b) for b in batches))
        return out

    @staticmethod
    def _stored(value: bytes, mod_revision: int, partition: int) -> StoredSchedule:
        s, activated, meta = decode_stored_schedule(value, mod_revision)
        return StoredSchedule(s, activated, partition, meta)

    async def get(self, schedule_id: str) -> StoredSchedule:
        p = self.partition(schedule_id)
        kv = await self.kv.get(self.ks.schedule(p, schedule_id), timeout=self.timeout)
        if kv is None:
            raise NotFound(f"schedule {schedule_id!r} not found")
        return self._stored(kv.value, kv.mod_revision, p)

    async def update(self, s: Schedule, expected_version: int | None, now_ms: int) -> StoredSchedule:
        """Replace the schedule; `expected_version` None means last writer wins."""
        cur = await self.get(s.id)
        if expected_version is not None and cur.schedule.version != expected_version:
            raise VersionMismatch(f"schedule {s.id!r} is at version {cur.schedule.version}, not {expected_version}")
        changed = _activation_changed(cur.schedule, s)
        activated = now_ms if changed else cur.activated_ms
        key = self.ks.schedule(cur.partition, s.id)
        history = cur.meta.history
        if changed:
            ck = await read_checkpoint(self.kv, self.ks, cur.partition, timeout=self.timeout)
            history = (*pruned_history(history, cur.activation_rev, ck),
                       plan_fields(cur.schedule, cur.activated_ms, cur.activation_rev))
            if len(history) > MAX_UNSEEN_ACTIVATIONS:
                raise FailedPrecondition(
                    f"schedule {s.id!r}: {MAX_UNSEEN_ACTIVATIONS} earlier changes of its spec or state still wait for "
                    f"a planner of partition {cur.partition} to see them (none has checkpointed it since), the most "
                    "that may wait without losing track of their planned times: start "
                    "a planner (schedctl cluster status shows who owns what) and retry")
        # A new activation is this put's own revision (0); otherwise the activation keeps its revision.
        meta = replace(cur.meta, updated_ms=now_ms, activated_rev=0 if changed else cur.activation_rev,
                       history=history)
        r = await self.kv.txn([Compare.mod_revision(key, "==", cur.schedule.version)],
                              [put(key, encode_schedule(s, activated_ms=activated, meta=meta))], [get(key)],
                              timeout=self.timeout)
        if not r.succeeded:
            raise VersionMismatch(f"schedule {s.id!r} changed concurrently; read it again")
        return StoredSchedule(replace(s, version=r.revision), activated, cur.partition, meta)

    async def delete(self, schedule_id: str, expected_version: int | None = None, *, now_ms: int) -> None:
        """Delete the schedule, leaving a tombstone (the value, and when) in the same txn: the partition's
        owner, or the next one if none was there to see the delete, records the planned times that were
        owed up to the delete (`now_ms`, the delete's instant) and then removes it. `now_ms` has no default:
        a tombstone without its instant says nothing about which planned times were owed."""
        p = self.partition(schedule_id)
        key = self.ks.schedule(p, schedule_id)
        for _ in range(5 + _USAGE_ATTEMPTS):
            cur = await self.kv.get(key, timeout=self.timeout)
            if cur is None:
                raise NotFound(f"schedule {schedule_id!r} not found")
            if expected_version and cur.mod_revision != expected_version:
                raise VersionMismatch(f"schedule {schedule_id!r} is not at version {expected_version}")
            value = json.loads(cur.value)
            u = await self.usage(str(value.get("tenant", "")), 0)  # the counter moves down only if it exists
            tomb = self.ks.tombstone(p, schedule_id)
            # A tombstone still there is an earlier schedule of this id whose delete no owner has handled yet
            # (deleted, created again and now deleted again while the partition had no owner). Overwritten, it
            # took with it the planned times that schedule owed up to its delete (the stateful twin: a planned
            # time at the first delete's instant, missed silently). Kept inside the new one, oldest first.
            old = await self.kv.get(tomb, timeout=self.timeout)
            stone_d: dict[str, Any] = {"deleted_ms": now_ms, "rev": cur.mod_revision, "schedule": value}
            if old is not None:
                prev = json.loads(old.value)
                earlier = [*prev.pop("earlier", ()), prev]
                if len(earlier) >= MAX_UNSEEN_ACTIVATIONS:
                    raise FailedPrecondition(
                        f"schedule {schedule_id!r}: {len(earlier)} earlier deletes of this id wait for partition "
                        f"{p}'s owner; a planner must claim it first (schedctl cluster status)")
                stone_d["earlier"] = earlier
            stone = json.dumps(stone_d, separators=(",", ":"))
            res = await self.kv.txn([Compare.mod_revision(key, "==", cur.mod_revision),
                                     Compare.mod_revision(tomb, "==", old.mod_revision if old is not None else 0),
                                     *qusage.guard(self.ks, u)],
                                    [delete(key), put(tomb, stone.encode()), *qusage.write(self.ks, u, -1)],
                                    timeout=self.timeout)
            if res.succeeded:
                return
            if expected_version:
                again = await self.kv.get(key, timeout=self.timeout)
                if again is None or again.mod_revision != expected_version:
                    raise VersionMismatch(f"schedule {schedule_id!r} is not at version {expected_version}")
        raise VersionMismatch(f"schedule {schedule_id!r} keeps changing; read it again")

    async def list_partition(self, partition: int, *, page: int = 1000,
                             pacer: Pacer | None = None) -> tuple[list[StoredSchedule], int]:
        """All schedules of a partition and the revision they were read at (to watch from). Read in pages
        at one revision and decoded with event-loop turns between bounded stretches (`pacer`): a claim of
        a big partition must not starve the lease keep-alive (store/paging.py)."""
        out: list[StoredSchedule] = []
        rev = 0
        async for kvs, snapshot in range_pages(self.kv, self.ks.schedules(partition), page=page,
                                               timeout=self.timeout):
            rev = snapshot
            for kv in kvs:
                out.append(self._stored(kv.value, kv.mod_revision, partition))
                if pacer is not None:
                    await pacer.pace()
        return out, rev

    async def scan(self, *, after_key: bytes = b"", limit: int = 1000) -> tuple[list[StoredSchedule], bytes]:
        """One chunk of every schedule in key order (partition, then id), starting after `after_key`;
        returns the chunk and the last key read (b"" when the scan is complete)."""
        start = after_key + b"\x00" if after_key else self.ks.all_schedules
        r = await self.kv.range(start, range_end=prefix_end(self.ks.all_schedules), limit=limit,
                                timeout=self.timeout)
        out = [self._stored(kv.value, kv.mod_revision, self.ks.partition_of_schedule(kv.key)) for kv in r.kvs]
        return out, (r.kvs[-1].key if r.kvs and r.more else b"")
