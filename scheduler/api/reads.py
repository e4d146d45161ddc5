"""Read paths of the List* calls: chunked range scans of etcd and in-memory paging.

Lists are ordered by something other than key order across partitions (schedule id, dead-lettered
time), so a page is the smallest `page_size` matches after the token's position over one scan of
the relevant prefix, read in chunks of SCAN_CHUNK keys (each chunk one etcd range, never one huge
response). The cost is one scan per page: fine for operator and client listing, and the filters
with a schedule id narrow the scan to that schedule's keys.
"""

from __future__ import annotations

import heapq
from collections.abc import AsyncIterator, Callable, Iterable
from typing import Any, TypeVar

from scheduler.store.etcd.ops import prefix_end
from scheduler.store.etcd.types import KeyValue
from scheduler.store.kv import KV

SCAN_CHUNK = 1000
T = TypeVar("T")


async def scan(kv: KV, start: bytes, end: bytes, *, timeout: float) -> AsyncIterator[KeyValue]:
    """Every key in [start, end), in chunks; all chunks read at the first chunk's revision, so a
    page is one consistent snapshot."""
    rev = 0
    while True:
        r = await kv.range(start, range_end=end, limit=SCAN_CHUNK, revision=rev, timeout=timeout)
        rev = rev or r.revision
        for x in r.kvs:
            yield x
        if not r.more or not r.kvs:
            return
        start = r.kvs[-1].key + b"\x00"


def prefix_range(prefix: bytes) -> tuple[bytes, bytes]:
    return prefix, prefix_end(prefix)


def page(items: Iterable[T], key: Callable[[T], Any], after: Any, size: int) -> tuple[list[T], bool]:
    """The `size` smallest items by `key` strictly after `after` (None: from the start), and whether
    more follow."""
    cand = (x for x in items if after is None or key(x) > after)
    chosen = heapq.nsmallest(size + 1, cand, key=key)
    return chosen[:size], len(chosen) > size
