"""Reading a large prefix in pages, all at one revision.

A claim used to read a partition's schedules (and its execution history) in one range: at 1,000,000
schedules that is tens of MB decoded in one go, on the event loop, before anything else runs, and all
partitions claimed together hold their whole listings in memory at once. Pages bound both: each
response is at most `page` keys, and the event loop gets a turn between them. Every page after the
first reads at the first one's revision, so the listing is one consistent snapshot exactly like a
single range (a compaction past that revision in between fails the read: the caller reloads).
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from scheduler.store.etcd.ops import prefix_end
from scheduler.store.etcd.types import KeyValue
from scheduler.store.kv import KV

DEFAULT_PAGE = 1000  # keys per response: about 0.6 MB of schedules


async def range_pages(kv: KV, prefix: bytes, *, page: int = DEFAULT_PAGE, keys_only: bool = False,
                      timeout: float | None = None) -> AsyncIterator[tuple[tuple[KeyValue, ...], int]]:
    """Yield (kvs of one page, the snapshot's revision), in key order, until the prefix is read."""
    if page < 1:
        raise ValueError("page must be >= 1")
    end = prefix_end(prefix)
    start, revision = prefix, 0
    while True:
        r = await kv.range(start, range_end=end, limit=page, revision=revision, keys_only=keys_only,
                           timeout=timeout)
        if revision == 0:
            revision = r.revision
        yield r.kvs, revision
        if not r.more or not r.kvs:
            return
        start = r.kvs[-1].key + b"\x00"
