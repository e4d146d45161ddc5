"""Reading and compare-and-swapping the region policy record (`/cluster/region`, docs/keyspace.md).

Every write compares the record's mod_revision with the one the writer read (create_revision == 0 when
there was none), so two writers that decided on the same snapshot cannot both win: the loser gets
`Stale` and re-reads. The record's mod_revision is the policy's `version` in the API.
"""

from __future__ import annotations

from dataclasses import dataclass

from scheduler.region.policy import RegionPolicy, decode, encode, validate
from scheduler.store.etcd.ops import Compare, put
from scheduler.store.keyspace import Keyspace
from scheduler.store.kv import KV


@dataclass(frozen=True)
class Versioned:
    policy: RegionPolicy | None  # None: no record (every planner eligible)
    version: int  # the record's mod_revision; 0 when absent


class Stale(Exception):
    """The record changed since it was read: nothing was written."""


def parse(value: bytes | None, version: int) -> Versioned:
    return Versioned(None if value is None else decode(value), version if value is not None else 0)


async def read(kv: KV, ks: Keyspace, *, timeout: float) -> Versioned:
    got = await kv.get(ks.region_policy, timeout=timeout)
    return parse(None if got is None else got.value, 0 if got is None else got.mod_revision)


async def cas(kv: KV, ks: Keyspace, expected_version: int, new: RegionPolicy, *, timeout: float) -> int:
    """Write `new` iff the record is still at `expected_version` (0: absent). Returns the new version;
    raises Stale when someone else wrote first, InvalidArgument for a bad policy."""
    validate(new)
    key = ks.region_policy
    cmp = (Compare.mod_revision(key, "==", expected_version) if expected_version
           else Compare.create_revision(key, "==", 0))
    r = await kv.txn([cmp], [put(key, encode(new))], timeout=timeout)
    if not r.succeeded:
        raise Stale(f"the region policy is no longer at version {expected_version}")
    return r.revision
