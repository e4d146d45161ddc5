"""Reading, compare-and-swapping and watching quota records (`/quotas/<tenant>`, `/cluster/quota`).

Writes compare the record's mod_revision with the one read (create_revision == 0 when there was none): two
admins who decided on the same snapshot cannot both win (the loser gets `Stale`, the API re-reads or
reports ABORTED). The API reads the records it enforces on each call (one round trip, no staleness); the
planners, which need a tenant's rate for every run they materialize, keep `QuotaView`, fed by a watch, so
a change reaches them within one watch delivery (milliseconds; a stream that broke re-lists from etcd).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass

from scheduler.quota import usage
from scheduler.quota.record import Quota, decode, encode, resolve, validate
from scheduler.store.etcd.errors import Compacted, EtcdError
from scheduler.store.etcd.ops import Compare, delete, get, put
from scheduler.store.etcd.types import EventType
from scheduler.store.keyspace import Keyspace
from scheduler.store.kv import KV

log = logging.getLogger("scheduler.quota")


@dataclass(frozen=True)
class Versioned:
    quota: Quota | None  # None: no record
    version: int  # the record's mod_revision; 0 when absent


class Stale(Exception):
    """The record changed since it was read: nothing was written."""


def _parse(value: bytes | None, version: int, key: bytes) -> Versioned:
    if value is None:
        return Versioned(None, 0)
    try:
        return Versioned(decode(value), version)
    except (ValueError, TypeError) as e:
        # A record nobody can read must not stop the tenant's creates: it reads as no record (and says so).
        log.error("unreadable quota record %s: %s", key.decode(errors="replace"), e,
                  extra={"event": "quota_unreadable"})
        return Versioned(None, version)


def key_of(ks: Keyspace, tenant: str | None) -> bytes:
    """The record's key: a tenant's, or the cluster default's (tenant None)."""
    return ks.default_quota if tenant is None else ks.quota(tenant)


async def read(kv: KV, ks: Keyspace, tenant: str | None, *, timeout: float) -> Versioned:
    k = key_of(ks, tenant)
    got = await kv.get(k, timeout=timeout)
    return _parse(None if got is None else got.value, 0 if got is None else got.mod_revision, k)


async def effective(kv: KV, ks: Keyspace, tenant: str, *, timeout: float) -> Quota:
    """The limits that apply to `tenant` now: its record and the default, read together (one txn)."""
    return (await effective_and_usage(kv, ks, tenant, timeout=timeout))[0]


async def effective_and_usage(kv: KV, ks: Keyspace, tenant: str, *, timeout: float) -> tuple[Quota, usage.Usage]:
    """The limits that apply to `tenant` and its schedules-held counter, in one round trip (a create needs
    both: reading them apart cost single creates a quarter of their rate in bench/bench_create.py)."""
    r = await kv.txn([], [get(ks.quota(tenant)), get(ks.default_quota), get(ks.usage(tenant))], timeout=timeout)
    own, dflt, held = (getattr(x, "kvs", ()) for x in r.responses)
    a = _parse(own[0].value, own[0].mod_revision, ks.quota(tenant)) if own else Versioned(None, 0)
    b = _parse(dflt[0].value, dflt[0].mod_revision, ks.default_quota) if dflt else Versioned(None, 0)
    u = usage.from_kv(tenant, held[0].value if held else None, held[0].mod_revision if held else 0)
    return resolve(a.quota, b.quota), u


async def list_all(kv: KV, ks: Keyspace, *, timeout: float) -> list[tuple[str, Versioned]]:
    """Every tenant record, by tenant name."""
    r = await kv.range(ks.quotas, prefix=True, timeout=timeout)
    return [(ks.last_segment(x.key), _parse(x.value, x.mod_revision, x.key)) for x in r.kvs]


async def cas(kv: KV, ks: Keyspace, tenant: str | None, expected_version: int, new: Quota, *,
              timeout: float) -> int:
    """Write `new` iff the record is still at `expected_version` (0: absent). Returns the new version."""
    validate(new)
    k = key_of(ks, tenant)
    cmp = Compare.mod_revision(k, "==", expected_version) if expected_version else Compare.create_revision(k, "==", 0)
    r = await kv.txn([cmp], [put(k, encode(new))], timeout=timeout)
    if not r.succeeded:
        raise Stale(f"the quota record is no longer at version {expected_version}")
    return r.revision


async def remove(kv: KV, ks: Keyspace, tenant: str | None, expected_version: int, *, timeout: float) -> None:
    k = key_of(ks, tenant)
    r = await kv.txn([Compare.mod_revision(k, "==", expected_version)], [delete(k)], timeout=timeout)
    if not r.succeeded:
        raise Stale(f"the quota record is no longer at version {expected_version}")


class _StreamEnded(Exception):
    """A watch stream ended without an error: list and watch again (the other stream is stopped with it)."""


class QuotaView:
    """Every quota record of the cluster, kept current by watching `/quotas/` and `/cluster/quota`
    (the planner's side: `rate(tenant)` is on the path of every materialized run, so no read per call).

    Staleness is bounded by the watch's delivery (a change applies to the next round of every partition
    loop after it arrives); after a broken or compacted stream the view is re-listed before it resumes.
    `on_change` is called after each applied change (the pacer forgets rates that went away)."""

    def __init__(self, kv: KV, ks: Keyspace, *, timeout: float) -> None:
        self.kv, self.ks, self.timeout = kv, ks, timeout
        self.own: dict[str, Quota] = {}
        self.default: Quota | None = None
        self.revision = 0  # of the last change applied (tests wait for it)
        self.on_change: Callable[[], None] = lambda: None
        self._any_rate = False

    def quota(self, tenant: str) -> Quota:
        return resolve(self.own.get(tenant), self.default)

    def any_rate(self) -> bool:
        """Whether any record (or the default) sets an executions-per-second limit (kept per change: asked
        once per partition round)."""
        return self._any_rate

    def _changed(self) -> None:
        self._any_rate = (self.default is not None and self.default.executions_per_second > 0) or any(
            q.executions_per_second > 0 for q in self.own.values())
        self.on_change()

    def rate(self, tenant: str) -> float:
        """Executions per second the tenant may start, cluster-wide (0: unlimited)."""
        return self.quota(tenant).executions_per_second

    async def load(self) -> int:
        r = await self.kv.txn([], [get(self.ks.quotas, prefix=True), get(self.ks.default_quota)],
                              timeout=self.timeout)
        own, dflt = (getattr(x, "kvs", ()) for x in r.responses)
        self.own = {self.ks.last_segment(x.key): q for x in own
                    if (q := _parse(x.value, x.mod_revision, x.key).quota) is not None}
        self.default = _parse(dflt[0].value, dflt[0].mod_revision, self.ks.default_quota).quota if dflt else None
        self.revision = r.revision
        self._changed()
        return r.revision

    def apply(self, kind: EventType, key: bytes, value: bytes, revision: int) -> None:
        q = None if kind is EventType.DELETE else _parse(value, revision, key).quota
        if key == self.ks.default_quota:
            self.default = q
        elif key.startswith(self.ks.quotas):
            tenant = self.ks.last_segment(key)
            if q is None:
                self.own.pop(tenant, None)
            else:
                self.own[tenant] = q
        self.revision = max(self.revision, revision)
        self._changed()

    async def run(self) -> None:
        """Load, then follow both keys' changes for ever (cancel to stop)."""
        while True:
            try:
                rev = await self.load()
                # `/cluster/quota` and `/quotas/` share no prefix: two streams, which end together (a task
                # group cancels the other when one fails, and both start again from a fresh listing).
                async with asyncio.TaskGroup() as tg:
                    tg.create_task(self._follow(self.ks.quotas, True, rev))
                    tg.create_task(self._follow(self.ks.default_quota, False, rev))
            except* (Compacted, _StreamEnded):
                pass  # re-list: what changed meanwhile is in the listing
            except* EtcdError as eg:
                log.warning("quota watch: %s", eg.exceptions[0])
                await asyncio.sleep(0.5)

    async def _follow(self, key: bytes, prefix: bool, rev: int) -> None:
        watch = self.kv.watch(key, prefix=prefix, start_revision=rev + 1)
        try:
            async for batch in watch:
                for ev in batch.events:
                    self.apply(ev.type, ev.kv.key, ev.kv.value, ev.kv.mod_revision)
        finally:
            await watch.close()
        raise _StreamEnded(key.decode(errors="replace"))
