"""The `kv` fixture: every contract test runs once on the in-memory twin and once on a real etcd.

The real etcd is one server for the whole suite (starting one costs about half a second), so tests
must not disturb each other: each writes only under its own `key_prefix` (deleted afterwards), and
no test relies on history from before it started. That also makes compaction safe here: a test
compacts at most up to its own revisions, which nothing later reads. Leases a test leaves behind
lose their keys with the prefix, so their expiry cannot move the revision under a later test.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest

from chaos.infra.etcd import EtcdCluster
from scheduler.store.etcd import EtcdClient
from scheduler.store.kv import KV
from scheduler.store.memory import MemoryKV

# Both backends send periodic progress notifications this often (etcd's default is 10 minutes).
PROGRESS_INTERVAL = 0.5


@pytest.fixture(scope="session")
def contract_etcd(tmp_path_factory: pytest.TempPathFactory, etcd_binary: str) -> Iterator[EtcdCluster]:
    cluster = EtcdCluster(
        tmp_path_factory.mktemp("contract-etcd"),
        binary=etcd_binary,
        progress_notify_interval=f"{int(PROGRESS_INTERVAL * 1000)}ms",
        unsafe_no_fsync=True,  # nothing here survives a crash on purpose; fsync only costs time
    )
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.close()


@pytest.fixture(params=["memory", pytest.param("etcd", marks=pytest.mark.etcd)])
async def kv(request: pytest.FixtureRequest, key_prefix: str) -> AsyncIterator[KV]:
    if request.param == "memory":
        async with MemoryKV(progress_notify_interval=PROGRESS_INTERVAL) as twin:
            yield twin
        return
    cluster: EtcdCluster = request.getfixturevalue("contract_etcd")
    async with EtcdClient(cluster.config(timeout=5.0)) as etcd:
        try:
            yield etcd
        finally:
            await etcd.delete(key_prefix, prefix=True)
