"""The schedules-held counter of a tenant (`/usage/<tenant>`, JSON `{"schedules": n}`), written in the same
txn as every create and delete of the tenant's schedules, so that two creates racing at the limit cannot
both pass: each compares the counter's mod_revision with the one it read, and the loser re-reads.

A tenant whose counter does not exist yet (schedules from before this version, or a tenant that never had a
limit) is counted once, by a scan, when a limit first applies; the txn that creates the counter also
compares that no schedule was created and none deleted since the scan's revision (range compares over
`/schedules/` and `/tombstones/`), so a create or delete on a node that did not write the counter makes the
count start over instead of going wrong. While a tenant has no counter and no limit, creates and deletes
only compare that the counter is still absent (a counter created meanwhile makes them retry and keep it).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from scheduler.store.etcd.ops import Compare, CompareTarget, Op, prefix_end, put
from scheduler.store.keyspace import Keyspace
from scheduler.store.kv import KV
from scheduler.store.paging import range_pages


@dataclass(frozen=True)
class Usage:
    tenant: str
    schedules: int
    version: int  # the counter's mod_revision; 0: no counter
    counted_at: int = 0  # a fresh count from a scan at this revision (no counter yet), else 0

    @property
    def tracked(self) -> bool:
        return bool(self.version or self.counted_at)


def decode(value: bytes) -> int:
    try:
        return max(0, int(json.loads(value).get("schedules", 0)))
    except (ValueError, AttributeError, TypeError):
        return 0


def encode(n: int) -> bytes:
    return json.dumps({"schedules": max(0, n)}, separators=(",", ":")).encode()


def from_kv(tenant: str, value: bytes | None, mod_revision: int) -> Usage:
    return Usage(tenant, 0, 0) if value is None else Usage(tenant, decode(value), mod_revision)


async def count(kv: KV, ks: Keyspace, tenant: str, *, timeout: float) -> Usage:
    """The tenant's schedules, counted by a scan at one revision (the snapshot the guard compares to)."""
    n, rev = 0, 0
    needle = b'"tenant":' + json.dumps(tenant).encode() + b","
    async for kvs, snapshot in range_pages(kv, ks.all_schedules, page=2000, timeout=timeout):
        rev = snapshot
        n += sum(1 for x in kvs if needle in x.value and json.loads(x.value).get("tenant") == tenant)
    if not rev:  # an empty keyspace: the revision to guard from is etcd's current one
        rev = (await kv.range(ks.all_schedules, prefix=True, count_only=True, timeout=timeout)).revision
    return Usage(tenant, n, 0, counted_at=rev)


def guard(ks: Keyspace, u: Usage) -> list[Compare]:
    """The compares that make a write of `u` (its counter's next value) valid: the counter is where it was
    read, and for a fresh count, no schedule created or deleted since the scan."""
    key = ks.usage(u.tenant)
    if u.version:
        return [Compare.mod_revision(key, "==", u.version)]
    out = [Compare.create_revision(key, "==", 0)]
    if u.counted_at:
        out += [Compare(ks.all_schedules, CompareTarget.CREATE, "<", u.counted_at + 1, prefix_end(ks.all_schedules)),
                Compare(ks.all_tombstones, CompareTarget.MOD, "<", u.counted_at + 1, prefix_end(ks.all_tombstones))]
    return out


def write(ks: Keyspace, u: Usage, delta: int) -> list[Op]:
    """The counter's put (nothing while the tenant is not tracked)."""
    return [put(ks.usage(u.tenant), encode(u.schedules + delta))] if u.tracked else []
