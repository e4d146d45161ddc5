"""Contract: revisions, versions and range reads, identical on the twin and on etcd."""

from __future__ import annotations

import pytest

from scheduler.store.etcd import (
    Compacted,
    EtcdError,
    KeyValue,
    LeaseNotFound,
    OutcomeUnknown,
    RequestTooLarge,
    SortOrder,
    SortTarget,
    Unavailable,
    ops,
)
from scheduler.store.kv import KV
from tests.store.contract.helpers import b, revoke_quietly


async def _fill(kv: KV, prefix: str, values: dict[str, bytes]) -> dict[str, int]:
    """Put each key (in the given order); the revision of each put."""
    return {k: (await kv.put(prefix + k, v)).revision for k, v in values.items()}


async def test_every_write_request_is_one_revision(kv: KV, key_prefix: str) -> None:
    p = key_prefix
    first = await kv.put(p + "a", b"1")
    second = await kv.put(p + "a", b"1")  # the same value again is still a write
    assert second.revision == first.revision + 1

    many = await kv.txn([], [ops.put(p + "b", b"2"), ops.put(p + "c", b"3"), ops.delete(p + "a")])
    assert many.revision == second.revision + 1
    kvs = (await kv.range(p, prefix=True)).kvs
    assert {kv_.mod_revision for kv_ in kvs} == {many.revision}

    # Requests that change nothing leave the revision where it is and report it.
    assert (await kv.delete(p + "missing")).revision == many.revision
    assert (await kv.delete(p + "zz", prefix=True)).deleted == 0
    assert (await kv.txn([], [ops.delete(p + "missing"), ops.get(p + "b")])).revision == many.revision
    # A value compare on a missing key fails, so the put never runs.
    failed = await kv.txn([ops.Compare.value(p + "missing", "==", b"")], [ops.put(p + "x", b"")])
    assert (failed.succeeded, failed.revision) == (False, many.revision)
    assert (await kv.range(p + "b")).revision == many.revision

    both = await kv.delete(p, prefix=True)
    assert both.deleted == 2
    assert both.revision == many.revision + 1  # several keys, one request, one revision


async def test_create_mod_revision_and_version(kv: KV, key_prefix: str) -> None:
    key = key_prefix + "k"
    created = await kv.put(key, b"1")
    updated = await kv.put(key, b"2", prev_kv=True)
    assert updated.prev_kv == KeyValue(b(key), b"1", created.revision, created.revision, 1, 0)
    now = await kv.get(key)
    assert now == KeyValue(b(key), b"2", created.revision, updated.revision, 2, 0)

    gone = await kv.delete(key, prev_kv=True)
    assert gone.deleted == 1
    assert gone.prev_kvs == (now,)
    assert await kv.get(key) is None

    # A new life of the key: version starts again at 1 and create_revision is the new put's.
    again = await kv.put(key, b"3", prev_kv=True)
    assert again.prev_kv is None
    assert await kv.get(key) == KeyValue(b(key), b"3", again.revision, again.revision, 1, 0)


async def test_reads_at_past_revisions(kv: KV, key_prefix: str) -> None:
    key = key_prefix + "k"
    before = (await kv.range(key)).revision
    v1 = await kv.put(key, b"1")
    v2 = await kv.put(key, b"2")
    deleted = await kv.delete(key)
    v3 = await kv.put(key, b"3")

    assert await kv.get(key, revision=before) is None  # not created yet
    one = await kv.get(key, revision=v1.revision)
    assert one is not None
    assert (one.value, one.version) == (b"1", 1)
    two = await kv.get(key, revision=deleted.revision - 1)
    assert two is not None
    assert (two.value, two.mod_revision) == (b"2", v2.revision)
    assert await kv.get(key, revision=deleted.revision) is None
    three = await kv.get(key, revision=v3.revision)
    assert three is not None
    assert three.create_revision == v3.revision

    old = await kv.range(key_prefix, prefix=True, revision=v1.revision)
    assert old.revision == v3.revision  # the header says "now", whatever revision was read
    assert old.count == 1

    with pytest.raises(EtcdError, match="future revision") as caught:
        await kv.range(key, revision=v3.revision + 1000)
    assert not isinstance(caught.value, Compacted | Unavailable | OutcomeUnknown)


async def test_limit_more_and_count(kv: KV, key_prefix: str) -> None:
    revs = await _fill(kv, key_prefix, {f"{i:02d}": b(f"v{i}") for i in range(5)})
    r = await kv.range(key_prefix, prefix=True, limit=2)
    assert [kv_.key for kv_ in r.kvs] == [b(key_prefix + "00"), b(key_prefix + "01")]
    assert (r.more, r.count) == (True, 5)
    exact = await kv.range(key_prefix, prefix=True, limit=5)
    assert (len(exact.kvs), exact.more, exact.count) == (5, False, 5)

    # Revision filters thin out the keys, but `count` is of the whole range (etcd counts first).
    newer = await kv.range(key_prefix, prefix=True, min_mod_revision=revs["03"], limit=1)
    assert [kv_.value for kv_ in newer.kvs] == [b"v3"]
    assert (newer.more, newer.count) == (True, 5)
    window = await kv.range(
        key_prefix, prefix=True, min_create_revision=revs["01"], max_create_revision=revs["02"]
    )
    assert [kv_.value for kv_ in window.kvs] == [b"v1", b"v2"]
    oldest = await kv.range(key_prefix, prefix=True, max_mod_revision=revs["00"])
    assert [kv_.value for kv_ in oldest.kvs] == [b"v0"]


async def test_keys_only_and_count_only(kv: KV, key_prefix: str) -> None:
    await _fill(kv, key_prefix, {"a": b"1", "b": b"2", "c": b"3"})
    keys = await kv.range(key_prefix, prefix=True, keys_only=True)
    assert [kv_.value for kv_ in keys.kvs] == [b"", b"", b""]
    assert [kv_.version for kv_ in keys.kvs] == [1, 1, 1]  # only the value is left out
    counted = await kv.range(key_prefix, prefix=True, count_only=True, limit=1)
    assert (counted.kvs, counted.more, counted.count) == ((), False, 3)


async def test_sort_orders_and_targets(kv: KV, key_prefix: str) -> None:
    # Values, versions and create revisions all order the keys differently, and without ties.
    await _fill(kv, key_prefix, {"b": b"z", "a": b"y", "c": b"x"})
    await kv.put(key_prefix + "a", b"w")
    await kv.put(key_prefix + "a", b"v")
    await kv.put(key_prefix + "c", b"u")

    async def order(order: SortOrder = SortOrder.NONE, target: SortTarget = SortTarget.KEY) -> str:
        r = await kv.range(key_prefix, prefix=True, sort_order=order, sort_target=target)
        return "".join(kv_.key.decode()[-1] for kv_ in r.kvs)

    assert await order() == "abc"
    assert await order(SortOrder.DESCEND) == "cba"
    assert await order(target=SortTarget.VERSION) == "bca"  # no order given: ascending
    assert await order(SortOrder.DESCEND, SortTarget.VERSION) == "acb"
    assert await order(SortOrder.ASCEND, SortTarget.CREATE) == "bac"
    assert await order(SortOrder.DESCEND, SortTarget.MOD) == "cab"
    assert await order(SortOrder.ASCEND, SortTarget.VALUE) == "cab"
    limited = await kv.range(key_prefix, prefix=True, sort_order=SortOrder.DESCEND,
                             sort_target=SortTarget.VALUE, limit=1)
    assert ([kv_.value for kv_ in limited.kvs], limited.more) == ([b"z"], True)  # sorted, then cut


async def test_range_forms(kv: KV, key_prefix: str) -> None:
    await _fill(kv, key_prefix, {"a": b"1", "b": b"2", "ba": b"3", "c": b"4"})
    explicit = await kv.range(key_prefix + "b", range_end=key_prefix + "c")
    assert [kv_.value for kv_ in explicit.kvs] == [b"2", b"3"]
    assert (await kv.range(key_prefix + "b", prefix=True)).count == 2
    assert (await kv.range(key_prefix + "c", range_end=key_prefix + "a")).count == 0  # end before start
    assert (await kv.range(key_prefix + "b")).count == 1  # one key, not a prefix

    # range_end "\0" means "every key from here on". Keys sorting after everything other tests
    # write (they start with "/"), so that the count is ours alone.
    tail = b"\xfe" + b(key_prefix)
    try:
        await kv.put(tail + b"1", b"x")
        await kv.put(tail + b"2", b"y")
        from_tail = await kv.range(tail, range_end=b"\0")
        assert [kv_.key for kv_ in from_tail.kvs] == [tail + b"1", tail + b"2"]
        assert (await kv.range(tail + b"2", range_end=b"\0")).count == 1
    finally:
        await kv.delete(tail, prefix=True)


async def test_put_attaches_and_detaches_leases(kv: KV, key_prefix: str) -> None:
    key = key_prefix + "k"
    lease = await kv.lease_grant(30)
    try:
        first = await kv.put(key, b"a", lease=lease.id)
        kv_ = await kv.get(key)
        assert kv_ is not None
        assert kv_.lease == lease.id
        assert (await kv.lease_time_to_live(lease.id, keys=True)).keys == (b(key),)
        second = await kv.put(key, b"b", prev_kv=True)  # no lease: the key leaves the lease
        assert second.prev_kv is not None
        assert (second.prev_kv.lease, second.prev_kv.mod_revision) == (lease.id, first.revision)
        assert (await kv.lease_time_to_live(lease.id, keys=True)).keys == ()
        await kv.lease_revoke(lease.id)
        assert await kv.get(key) is not None  # not the lease's any more: revoking left it alone
    finally:
        await revoke_quietly(kv, lease.id)


async def test_put_with_an_unknown_lease_is_refused_and_not_applied(kv: KV, key_prefix: str) -> None:
    lease = await kv.lease_grant(30)
    await kv.lease_revoke(lease.id)
    before = (await kv.range(key_prefix)).revision
    with pytest.raises(LeaseNotFound):
        await kv.put(key_prefix + "k", b"x", lease=lease.id)
    # In a txn, only the branch that runs is checked; when it is, nothing of the txn lands.
    with pytest.raises(LeaseNotFound):
        await kv.txn([], [ops.put(key_prefix + "j", b"x"), ops.put(key_prefix + "k", b"x", lease=lease.id)])
    skipped = await kv.txn([ops.Compare.version(key_prefix + "k", ">", 0)],
                           [ops.put(key_prefix + "k", b"x", lease=lease.id)], [ops.get(key_prefix + "k")])
    assert not skipped.succeeded
    assert (await kv.range(key_prefix, prefix=True)).count == 0
    assert (await kv.range(key_prefix)).revision == before


async def test_empty_keys_are_refused(kv: KV) -> None:
    with pytest.raises(EtcdError, match="key is not provided"):
        await kv.put(b"", b"x")
    with pytest.raises(EtcdError, match="key is not provided"):
        await kv.range(b"")
    with pytest.raises(EtcdError, match="key is not provided"):
        await kv.txn([ops.Compare.version(b"", "==", 0)])


async def test_requests_over_the_size_limits_are_refused(kv: KV, key_prefix: str) -> None:
    # etcd's own limit (--max-request-bytes, 1.5 MiB) and gRPC's (2 MiB) are the same error.
    for size in (int(1.6 * 1024 * 1024), 3 * 1024 * 1024):
        with pytest.raises(RequestTooLarge):
            await kv.put(key_prefix + "big", b"x" * size)
    # A txn counts as a whole: four puts of 400 KiB are over the limit together.
    chunk = b"x" * (400 * 1024)
    with pytest.raises(RequestTooLarge):
        await kv.txn([], [ops.put(f"{key_prefix}{i}", chunk) for i in range(4)])
    assert (await kv.range(key_prefix, prefix=True)).count == 0
    assert (await kv.txn([], [ops.put(f"{key_prefix}{i}", chunk) for i in range(3)])).succeeded


async def test_delete_with_prev_kvs(kv: KV, key_prefix: str) -> None:
    await _fill(kv, key_prefix, {"a": b"1", "b": b"2", "c": b"3"})
    one = await kv.delete(key_prefix + "a", prev_kv=True)
    assert (one.deleted, [p.value for p in one.prev_kvs]) == (1, [b"1"])
    rest = await kv.delete(key_prefix, prefix=True, prev_kv=True)
    assert (rest.deleted, [p.value for p in rest.prev_kvs]) == (2, [b"2", b"3"])
    quiet = await kv.delete(key_prefix + "x", range_end=key_prefix + "z")
    assert (quiet.deleted, quiet.prev_kvs) == (0, ())


async def test_compaction(kv: KV, key_prefix: str) -> None:
    key = key_prefix + "k"
    v1 = await kv.put(key, b"1")
    v2 = await kv.put(key, b"2")
    v3 = await kv.put(key, b"3")
    header = await kv.compact(v2.revision)
    assert header.revision == v3.revision  # compaction is not a write of a key

    with pytest.raises(Compacted):
        await kv.get(key, revision=v1.revision)
    with pytest.raises(Compacted):
        await kv.txn([], [ops.get(key, revision=v1.revision)])
    at = await kv.get(key, revision=v2.revision)  # the compaction revision itself is kept
    assert at is not None
    assert (at.value, at.version) == (b"2", 2)
    current = await kv.get(key)
    assert current is not None
    assert current.version == 3  # history is gone, versions are not

    with pytest.raises(Compacted):
        await kv.compact(v2.revision)  # not again
    with pytest.raises(EtcdError, match="future revision"):
        await kv.compact(v3.revision + 1000)
