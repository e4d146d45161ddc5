"""KV, txn, compaction, cluster and maintenance calls against a real etcd."""

from __future__ import annotations

import asyncio

import pytest

from chaos.infra.etcd import EtcdCluster, EtcdFactory
from scheduler.store.etcd import (
    Compacted,
    Compare,
    DeleteResult,
    EtcdClient,
    NoSpace,
    PutResult,
    RangeResult,
    RequestTooLarge,
    SortOrder,
    SortTarget,
    ops,
)

pytestmark = pytest.mark.etcd


async def _fill(etcd: EtcdClient, prefix: str, n: int) -> list[int]:
    return [(await etcd.put(f"{prefix}{i:02d}", f"v{i}".encode())).revision for i in range(n)]


async def test_range_limit_sets_more_and_count(etcd_client: EtcdClient, key_prefix: str) -> None:
    await _fill(etcd_client, key_prefix, 5)
    r = await etcd_client.range(key_prefix, prefix=True, limit=2)
    assert [kv.key for kv in r.kvs] == [f"{key_prefix}00".encode(), f"{key_prefix}01".encode()]
    assert r.more is True
    assert r.count == 5
    whole = await etcd_client.range(key_prefix, prefix=True, limit=5)
    assert len(whole.kvs) == 5
    assert whole.more is False


async def test_range_options(etcd_client: EtcdClient, key_prefix: str) -> None:
    await _fill(etcd_client, key_prefix, 3)
    keys_only = await etcd_client.range(key_prefix, prefix=True, keys_only=True)
    assert [kv.value for kv in keys_only.kvs] == [b"", b"", b""]
    counted = await etcd_client.range(key_prefix, prefix=True, count_only=True)
    assert counted.kvs == ()
    assert counted.count == 3
    newest_first = await etcd_client.range(
        key_prefix, prefix=True, sort_order=SortOrder.DESCEND, sort_target=SortTarget.MOD
    )
    assert [kv.value for kv in newest_first.kvs] == [b"v2", b"v1", b"v0"]
    stale_ok = await etcd_client.range(key_prefix, prefix=True, serializable=True)
    assert stale_ok.count == 3
    explicit = await etcd_client.range(f"{key_prefix}00", range_end=f"{key_prefix}02")
    assert [kv.value for kv in explicit.kvs] == [b"v0", b"v1"]
    assert await etcd_client.get(f"{key_prefix}nope") is None


async def test_read_at_an_old_revision(etcd_client: EtcdClient, key_prefix: str) -> None:
    key = f"{key_prefix}k"
    first = await etcd_client.put(key, b"old")
    await etcd_client.put(key, b"new")
    then = await etcd_client.get(key, revision=first.revision)
    assert then is not None
    assert then.value == b"old"
    now = await etcd_client.get(key)
    assert now is not None
    assert now.value == b"new"
    assert now.version == 2
    assert now.create_revision == first.revision


async def test_put_with_lease_and_prev_kv(etcd_client: EtcdClient, key_prefix: str) -> None:
    key = f"{key_prefix}k"
    lease = await etcd_client.lease_grant(30)
    first = await etcd_client.put(key, b"a", lease=lease.id, prev_kv=True)
    assert first.prev_kv is None
    second = await etcd_client.put(key, b"b", prev_kv=True)
    assert second.prev_kv is not None
    assert second.prev_kv.value == b"a"
    assert second.prev_kv.lease == lease.id
    ttl = await etcd_client.lease_time_to_live(lease.id, keys=True)
    assert ttl.keys == ()  # the second put carried no lease, so it detached the key
    await etcd_client.lease_revoke(lease.id)


async def test_delete_prefix_with_prev_kv(etcd_client: EtcdClient, key_prefix: str) -> None:
    await _fill(etcd_client, key_prefix, 3)
    one = await etcd_client.delete(f"{key_prefix}00", prev_kv=True)
    assert one.deleted == 1
    assert [kv.value for kv in one.prev_kvs] == [b"v0"]
    rest = await etcd_client.delete(key_prefix, prefix=True)
    assert rest.deleted == 2
    assert (await etcd_client.range(key_prefix, prefix=True)).count == 0


async def test_txn_compares_and_both_branches(etcd_client: EtcdClient, key_prefix: str) -> None:
    owner, data = f"{key_prefix}owner", f"{key_prefix}data"
    # Claim: create_revision == 0 means "absent"; the put's revision becomes the fencing token.
    claim = await etcd_client.txn([Compare.create_revision(owner, "==", 0)], [ops.put(owner, b"me")])
    assert claim.succeeded
    token = claim.revision

    fenced = await etcd_client.txn(
        [Compare.create_revision(owner, "==", token)],
        [ops.put(data, b"1"), ops.get(owner)],
        [ops.get(owner)],
    )
    assert fenced.succeeded
    put_result, read = fenced.responses
    assert isinstance(put_result, PutResult)
    assert isinstance(read, RangeResult)
    assert read.kvs[0].value == b"me"

    stale = await etcd_client.txn(
        [Compare.create_revision(owner, "==", token - 1)],
        [ops.put(data, b"stale")],
        [ops.get(owner), ops.delete(f"{key_prefix}nothing")],
    )
    assert not stale.succeeded
    current, deleted = stale.responses
    assert isinstance(current, RangeResult)
    assert current.kvs[0].create_revision == token
    assert isinstance(deleted, DeleteResult)
    data_kv = await etcd_client.get(data)
    assert data_kv is not None
    assert data_kv.value == b"1"  # the stale writer's put did not land
    lease = await etcd_client.lease_grant(30)
    await etcd_client.put(f"{key_prefix}leased", b"x", lease=lease.id)
    checks = [
        Compare.mod_revision(data, "==", data_kv.mod_revision),
        Compare.version(data, "==", 1),
        Compare.version(owner, ">", 0),
        Compare.value(data, "==", b"1"),
        Compare.value(data, "!=", b"2"),
        Compare.create_revision(owner, "<", token + 1),
        Compare.lease(f"{key_prefix}leased", "==", lease.id),
        Compare.version(key_prefix, ">", 0, prefix=True),
    ]
    assert (await etcd_client.txn(checks)).succeeded
    for check in checks:
        assert (await etcd_client.txn([check])).succeeded, check
    assert not (await etcd_client.txn([Compare.value(data, "==", b"2")])).succeeded
    assert not (await etcd_client.txn([Compare.lease(data, "==", lease.id)])).succeeded
    await etcd_client.lease_revoke(lease.id)


async def test_request_too_large(etcd_client: EtcdClient, key_prefix: str) -> None:
    # etcd's own limit (--max-request-bytes, 1.5 MiB) and gRPC's (about 2 MiB) both map to one error.
    for size in (int(1.6 * 1024 * 1024), 3 * 1024 * 1024):
        with pytest.raises(RequestTooLarge):
            await etcd_client.put(f"{key_prefix}big", b"x" * size)
    assert await etcd_client.get(f"{key_prefix}big") is None


async def test_member_list_and_status(etcd_client: EtcdClient, etcd_server: EtcdCluster) -> None:
    members = await etcd_client.member_list()
    assert [m.name for m in members] == ["m0"]
    assert members[0].client_urls == (f"http://{etcd_server.endpoints[0]}",)
    status = await etcd_client.status()
    assert status.version.startswith("3.")
    assert status.leader == members[0].id
    assert status.db_size > 0


async def test_compact_then_old_reads_fail(etcd_factory: EtcdFactory) -> None:
    server = etcd_factory()
    async with EtcdClient(server.config()) as etcd:
        first = await etcd.put("k", b"1")
        last = await etcd.put("k", b"2")
        await etcd.compact(last.revision, physical=True)
        with pytest.raises(Compacted):
            await etcd.range("k", revision=first.revision)
        kv = await etcd.get("k", revision=last.revision)
        assert kv is not None
        assert kv.value == b"2"


async def test_auto_compaction_option_compacts_history(etcd_factory: EtcdFactory) -> None:
    server = etcd_factory(auto_compaction_mode="periodic", auto_compaction_retention="1s")
    async with EtcdClient(server.config()) as etcd:
        first = await etcd.put("k", b"1")
        for _ in range(100):  # etcd compacts about every retention period; give it up to 10 s
            await etcd.put("k", b"2")
            try:
                await etcd.range("k", revision=first.revision)
            except Compacted:
                return
            await asyncio.sleep(0.1)
        pytest.fail("no automatic compaction within 10 s")


async def test_exhausted_quota_is_no_space(etcd_factory: EtcdFactory) -> None:
    server = etcd_factory(quota_backend_bytes=2 * 1024 * 1024)
    async with EtcdClient(server.config()) as etcd:
        async def fill() -> None:
            for i in range(100):  # 10 MB against a 2 MiB quota
                await etcd.put(f"k{i}", b"x" * 100_000)

        with pytest.raises(NoSpace):
            await fill()
        assert "NOSPACE" in " ".join((await etcd.status()).errors)
        assert await etcd.get("k0") is not None  # reads still work
