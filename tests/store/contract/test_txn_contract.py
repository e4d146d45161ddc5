"""Contract: txn compares (etcd's rules for missing keys and ranges), branches, etcd's request
checks, and the fencing pattern the planner depends on."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from scheduler.store.etcd import (
    Compare,
    CompareTarget,
    DeleteResult,
    EtcdError,
    LeaseNotFound,
    Op,
    PutResult,
    RangeResult,
    TxnResult,
    ops,
)
from scheduler.store.kv import KV
from tests.store.contract.helpers import as_, revoke_quietly


async def _holds(kv: KV, compare: Compare) -> bool:
    return (await kv.txn([compare])).succeeded


async def test_compares_on_an_existing_key(kv: KV, key_prefix: str) -> None:
    key = key_prefix + "k"
    lease = await kv.lease_grant(30)
    try:
        created = await kv.put(key, b"b", lease=lease.id)
        updated = await kv.put(key, b"m", lease=lease.id)
        table = [  # (compare, holds)
            (Compare.version(key, "==", 2), True),
            (Compare.version(key, "!=", 2), False),
            (Compare.version(key, ">", 1), True),
            (Compare.version(key, "<", 2), False),
            (Compare.create_revision(key, "==", created.revision), True),
            (Compare.create_revision(key, "<", updated.revision), True),
            (Compare.mod_revision(key, "==", updated.revision), True),
            (Compare.mod_revision(key, ">", updated.revision), False),
            (Compare.value(key, "==", b"m"), True),
            (Compare.value(key, "!=", b"m"), False),
            (Compare.value(key, ">", b"a"), True),  # bytes order
            (Compare.value(key, "<", b"ma"), True),
            (Compare.value(key, ">", b"z"), False),
            (Compare.lease(key, "==", lease.id), True),
            (Compare.lease(key, "==", 0), False),
        ]
        assert [await _holds(kv, c) for c, _ in table] == [holds for _, holds in table]
        assert (await kv.txn([c for c, holds in table if holds])).succeeded  # all of them together
        assert not (await kv.txn([c for c, _ in table])).succeeded  # one false compare is enough
    finally:
        await revoke_quietly(kv, lease.id)


async def test_compares_on_a_missing_key(kv: KV, key_prefix: str) -> None:
    missing = key_prefix + "missing"
    table = [
        # A value compare against a missing key fails, whatever the operator ...
        (Compare.value(missing, "==", b""), False),
        (Compare.value(missing, "!=", b"x"), False),
        (Compare.value(missing, "<", b"x"), False),
        # ... the other targets compare the missing key as 0.
        (Compare.create_revision(missing, "==", 0), True),
        (Compare.mod_revision(missing, "==", 0), True),
        (Compare.version(missing, "==", 0), True),
        (Compare.version(missing, "<", 1), True),
        (Compare.version(missing, ">", 0), False),
        (Compare.lease(missing, "==", 0), True),
    ]
    assert [await _holds(kv, c) for c, _ in table] == [holds for _, holds in table]


async def test_range_compares_must_hold_for_every_key(kv: KV, key_prefix: str) -> None:
    p = key_prefix
    await kv.put(p + "a", b"1")
    await kv.put(p + "b", b"1")
    await kv.put(p + "b", b"2")
    assert await _holds(kv, Compare.version(p, ">", 0, prefix=True))
    assert not await _holds(kv, Compare.version(p, "==", 1, prefix=True))  # b is at version 2
    assert await _holds(kv, Compare.value(p + "a", "==", b"1", prefix=True))
    assert not await _holds(kv, Compare.value(p, "==", b"1", prefix=True))
    # An empty range behaves like one missing key.
    assert await _holds(kv, Compare.create_revision(p + "x", "==", 0, prefix=True))
    assert not await _holds(kv, Compare.value(p + "x", "==", b"", prefix=True))
    explicit = Compare(f"{p}a".encode(), CompareTarget.VERSION, "==", 1, range_end=f"{p}b".encode())
    assert await _holds(kv, explicit)  # [a, b): only a, at version 1


async def test_branches_return_results_in_order(kv: KV, key_prefix: str) -> None:
    p = key_prefix
    await kv.put(p + "gone", b"old")
    branch: list[Op] = [
        ops.put(p + "x", b"1", prev_kv=True),
        ops.get(p + "x"),  # a read after a write of the same txn sees the write
        ops.delete(p + "gone", prev_kv=True),
        ops.get(p, prefix=True, count_only=True),
    ]
    done = await kv.txn([Compare.create_revision(p + "x", "==", 0)], branch, [ops.get(p + "x")])
    assert done.succeeded
    put, read, deleted, counted = done.responses
    assert as_(PutResult, put).prev_kv is None
    r = as_(RangeResult, read)
    assert [(kv_.value, kv_.mod_revision) for kv_ in r.kvs] == [(b"1", done.revision)]
    d = as_(DeleteResult, deleted)
    assert (d.deleted, [kv_.value for kv_ in d.prev_kvs]) == (1, [b"old"])
    assert as_(RangeResult, counted).count == 1
    assert {res.revision for res in done.responses} == {done.revision}

    # The same txn again: the compare fails and the failure branch's reads come back instead.
    other = await kv.txn([Compare.create_revision(p + "x", "==", 0)], branch, [ops.get(p + "x"), ops.get(p + "no")])
    assert not other.succeeded
    assert other.revision == done.revision  # nothing written
    current, nothing = other.responses
    assert [kv_.value for kv_ in as_(RangeResult, current).kvs] == [b"1"]
    assert as_(RangeResult, nothing).kvs == ()


@pytest.mark.parametrize(
    "branch",
    [
        pytest.param(lambda p: [ops.put(p + "k", b"1"), ops.put(p + "k", b"2")], id="put-put"),
        pytest.param(lambda p: [ops.delete(p + "k"), ops.put(p + "k", b"1")], id="delete-put"),
        pytest.param(lambda p: [ops.put(p + "k", b"1"), ops.delete(p + "k")], id="put-delete"),
        pytest.param(lambda p: [ops.put(p + "k", b"1"), ops.delete(p, prefix=True)], id="put-in-deleted-prefix"),
    ],
)
async def test_duplicate_keys_in_one_branch_are_refused(
    kv: KV, key_prefix: str, branch: Callable[[str], list[Op]]
) -> None:
    before = (await kv.range(key_prefix)).revision
    with pytest.raises(EtcdError, match="duplicate key given in txn request"):
        await kv.txn([], branch(key_prefix))
    with pytest.raises(EtcdError, match="duplicate key"):  # also in the branch that would not run
        await kv.txn([Compare.version(key_prefix + "k", "==", 0)], [], branch(key_prefix))
    assert (await kv.range(key_prefix)).revision == before


async def test_overlaps_etcd_allows(kv: KV, key_prefix: str) -> None:
    p = key_prefix
    await kv.put(p + "a", b"1")
    # Two deletes may overlap; a read of a written key is fine; the same key in the two branches too.
    branch: list[Op] = [ops.delete(p + "a", prefix=True), ops.delete(p + "a"), ops.put(p + "b", b"1"), ops.get(p + "b")]
    r = await kv.txn([], branch)
    first, second, _, read = r.responses
    assert (as_(DeleteResult, first).deleted, as_(DeleteResult, second).deleted) == (1, 0)
    assert as_(RangeResult, read).count == 1
    both = await kv.txn([Compare.version(p + "b", "==", 1)], [ops.put(p + "b", b"2")], [ops.put(p + "b", b"3")])
    assert both.succeeded


async def test_too_many_operations(kv: KV, key_prefix: str) -> None:
    reads = [ops.get(key_prefix + str(i)) for i in range(128)]
    assert len((await kv.txn([], reads)).responses) == 128  # etcd's default --max-txn-ops
    with pytest.raises(EtcdError, match="too many operations in txn request"):
        await kv.txn([], [*reads, ops.get(key_prefix + "one-more")])


async def test_fencing_token_rejects_a_stale_owner(kv: KV, key_prefix: str) -> None:
    owner, data = key_prefix + "owner", key_prefix + "data"

    async def claim(me: bytes) -> int | None:
        r = await kv.txn([Compare.create_revision(owner, "==", 0)], [ops.put(owner, me)], [ops.get(owner)])
        return r.revision if r.succeeded else None

    async def fenced_write(token: int, value: bytes) -> bool:
        r = await kv.txn([Compare.create_revision(owner, "==", token)], [ops.put(data, value)])
        return r.succeeded

    token = await claim(b"planner-1")
    assert token is not None
    assert await claim(b"planner-2") is None  # taken
    assert await fenced_write(token, b"from-1")

    # Planner 1 loses the key (released, expired, deleted by an operator); planner 2 claims it.
    await kv.delete(owner)
    new_token = await claim(b"planner-2")
    assert new_token is not None
    assert new_token > token  # tokens only grow
    assert not await fenced_write(token, b"stale")  # the old owner is fenced out ...
    assert await fenced_write(new_token, b"from-2")
    kv_ = await kv.get(data)
    assert kv_ is not None
    assert (kv_.value, kv_.version) == (b"from-2", 2)  # ... and its write never landed

    # Rewriting the owner key (same owner, same life) keeps the token: create_revision stays.
    await kv.put(owner, b"planner-2-renamed")
    assert await fenced_write(new_token, b"still-2")


async def test_fencing_follows_the_owner_lease(kv: KV, key_prefix: str) -> None:
    owner, data = key_prefix + "owner", key_prefix + "data"
    lease = await kv.lease_grant(30)
    claimed = await kv.txn([Compare.create_revision(owner, "==", 0)], [ops.put(owner, b"me", lease=lease.id)])
    assert claimed.succeeded
    await kv.lease_revoke(lease.id)  # the session ends: its owner keys go with it
    fenced = await kv.txn([Compare.create_revision(owner, "==", claimed.revision)], [ops.put(data, b"x")])
    assert not fenced.succeeded
    assert await kv.get(data) is None


async def test_nested_txns_decide_on_the_state_before_the_txn(kv: KV, key_prefix: str) -> None:
    p = key_prefix
    owner, fence, old = p + "owner", p + "fenced", p + "rec-old"
    token = (await kv.put(owner, b"me")).revision
    await kv.put(old, b"first")
    # The fenced batch: records are created only if absent; a duplicate skips, the batch goes on.
    batch = await kv.txn(
        [Compare.create_revision(owner, "==", token)],
        [
            ops.put(fence, b"1"),
            ops.txn([Compare.create_revision(p + "rec-new", "==", 0)], [ops.put(p + "rec-new", b"x")]),
            ops.txn([Compare.create_revision(old, "==", 0)], [ops.put(old, b"again")], [ops.get(old)]),
            # Compares see the state before the txn, even after an earlier op of the same txn wrote ...
            ops.txn([Compare.create_revision(fence, "==", 0)], [ops.get(fence)]),
        ],
    )
    assert batch.succeeded
    _, created, duplicate, nested_read = batch.responses
    assert as_(TxnResult, created).succeeded
    dup = as_(TxnResult, duplicate)
    assert not dup.succeeded
    assert [kv_.value for kv_ in as_(RangeResult, dup.responses[0]).kvs] == [b"first"]
    seen = as_(TxnResult, nested_read)
    assert seen.succeeded
    # ... while reads see the txn's own writes.
    assert [kv_.value for kv_ in as_(RangeResult, seen.responses[0]).kvs] == [b"1"]
    kvs = (await kv.range(p + "rec-", prefix=True)).kvs
    assert [(kv_.value, kv_.mod_revision) for kv_ in kvs] == [(b"x", batch.revision), (b"first", token + 1)]


@pytest.mark.parametrize(
    ("branch", "refused"),
    [
        pytest.param(lambda p: [ops.put(p + "a", b"1"), ops.txn([], [ops.put(p + "a", b"2")])], True, id="put+nested"),
        pytest.param(lambda p: [ops.delete(p + "a"), ops.txn([], [ops.put(p + "a", b"2")])], True, id="del+nested"),
        pytest.param(lambda p: [ops.txn([], [ops.delete(p + "a")]), ops.put(p + "a", b"2")], True, id="nested-del+put"),
        pytest.param(lambda p: [ops.txn([], [ops.put(p + "a", b"1")]), ops.txn([], [ops.put(p + "a", b"2")])],
                     True, id="two-nested-puts"),
        pytest.param(lambda p: [ops.txn([], [ops.put(p + "a", b"1")], [ops.put(p + "a", b"2")])], False,
                     id="then-else-same-key"),
        # etcd's check is order-dependent across sibling nested txns; the twin copies it.
        pytest.param(lambda p: [ops.txn([], [ops.delete(p + "a")]), ops.txn([], [ops.put(p + "a", b"1")])],
                     True, id="nested-del-then-nested-put"),
        pytest.param(lambda p: [ops.txn([], [ops.put(p + "a", b"1")]), ops.txn([], [ops.delete(p + "a")])],
                     False, id="nested-put-then-nested-del"),
    ],
)
async def test_duplicate_keys_across_nested_txns(
    kv: KV, key_prefix: str, branch: Callable[[str], list[Op]], refused: bool
) -> None:
    if refused:
        with pytest.raises(EtcdError, match="duplicate key"):
            await kv.txn([], branch(key_prefix))
    else:
        assert (await kv.txn([], branch(key_prefix))).succeeded


async def test_two_cas_of_one_record_in_one_batch_are_refused(kv: KV, key_prefix: str) -> None:
    """The shape of issue 9 item 1: a fenced batch that withdraws a run and skips it again in the same
    round (two compare-and-swaps of one execution record, each with its dead-letter index delete) is
    refused whole by etcd, on both branches, whatever the compares say; the twin must refuse it too, or
    a planner test on the twin would never see the restart loop it causes."""
    rec, dead, owner = key_prefix + "exec", key_prefix + "dead", key_prefix + "owner"
    rev = (await kv.put(rec, b"scheduled")).revision
    token = (await kv.put(owner, b"me")).revision

    def cas(value: bytes) -> Op:
        return ops.txn([Compare.mod_revision(rec, "==", rev)], [ops.put(rec, value), ops.delete(dead)])

    with pytest.raises(EtcdError, match="duplicate key given in txn request"):
        await kv.txn([Compare.create_revision(owner, "==", token)], [cas(b"skipped:paused"), cas(b"skipped:paused")],
                     [ops.get(owner)])
    kv_ = await kv.get(rec)
    assert kv_ is not None and kv_.value == b"scheduled"  # nothing applied


async def test_nested_txns_share_the_op_limit_and_the_checks(kv: KV, key_prefix: str) -> None:
    reads = [ops.get(key_prefix + str(i)) for i in range(100)]
    # A nested txn may use what its parent leaves: 128 - 101 = 27 ops.
    assert (await kv.txn([], [*reads, ops.txn([], reads[:27])])).succeeded
    with pytest.raises(EtcdError, match="too many operations"):
        await kv.txn([], [*reads, ops.txn([], reads[:28])])

    lease = await kv.lease_grant(30)
    await kv.lease_revoke(lease.id)
    bad_put = ops.put(key_prefix + "k", b"x", lease=lease.id)
    with pytest.raises(LeaseNotFound):
        await kv.txn([], [ops.put(key_prefix + "j", b"1"), ops.txn([], [bad_put])])
    skipped = await kv.txn([], [ops.txn([Compare.version(key_prefix + "k", ">", 0)], [bad_put])])
    assert not as_(TxnResult, skipped.responses[0]).succeeded  # the branch that does not run is not checked
    assert (await kv.range(key_prefix, prefix=True)).count == 0
    read_only = await kv.txn([], [ops.txn([], [ops.get(key_prefix + "j")])])
    assert read_only.revision == skipped.revision  # nothing written: no revision
