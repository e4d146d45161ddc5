"""Shared fixtures. The etcd ones start real etcd processes (chaos/infra/etcd.py).

- `etcd_server`: one member per test module, shared by that module's tests: use unique key
  prefixes (`key_prefix`), and do not kill, pause or compact it (use `etcd_factory` for that).
- `etcd_factory`: start dedicated servers with options; all are stopped when the test ends.
- `etcd_cluster3`: a fresh 3-member cluster per test (tests kill members).
- `etcd_client`: an EtcdClient connected to `etcd_server`.

Without an etcd binary these fixtures FAIL (not skip): CI must notice a missing server.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

from chaos.infra.etcd import ETCD_MISSING, EtcdCluster, EtcdFactory, find_binary
from scheduler.store.etcd import EtcdClient
from tests import hang_dump

# Hypothesis' defaults assume an idle machine: a 200 ms deadline per example and a health check that
# fails a test whose data generation is slow. On a loaded 2-core CI machine both fail tests whose
# logic is fine; tests that set their own `settings` still override these for the fields they set.
settings.register_profile("shared-machine", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("shared-machine")

hang_dump.install()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Any:
    # A test hung in asyncio shows its tasks' stacks in the log before pytest-timeout ends it.
    with hang_dump.watching():
        return (yield)


_ETCD_FIXTURES = frozenset({"etcd_binary", "etcd_server", "etcd_factory", "etcd_cluster3", "etcd_client"})


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # A test that reaches etcd through a fixture is an `etcd` test even if its module forgot the mark,
    # so that `-m "not etcd"` never starts a server by accident.
    full = os.environ.get("SCHED_FULL") == "1"
    for item in items:
        if _ETCD_FIXTURES.intersection(getattr(item, "fixturenames", ())) and not item.get_closest_marker("etcd"):
            item.add_marker(pytest.mark.etcd)
        # The quick (CI) mode leaves out long runs; SCHED_FULL=1 (scripts/test.sh) includes them.
        if not full and item.get_closest_marker("slow"):
            item.add_marker(pytest.mark.skip(reason="long-running (marked slow): set SCHED_FULL=1 to run it"))


@pytest.fixture(scope="session")
def etcd_binary() -> str:
    binary = find_binary("etcd")
    if binary is None:
        pytest.fail(ETCD_MISSING, pytrace=False)
    return binary


def _start(base: Path, binary: str, **options: Any) -> EtcdCluster:
    return EtcdCluster(base, binary=binary, **options).start()


@pytest.fixture(scope="module")
def etcd_server(tmp_path_factory: pytest.TempPathFactory, etcd_binary: str) -> Iterator[EtcdCluster]:
    # Progress notifications every 500 ms (etcd's default is 10 min) so watch tests need not wait.
    cluster = _start(tmp_path_factory.mktemp("etcd"), etcd_binary, progress_notify_interval="500ms")
    try:
        yield cluster
    finally:
        cluster.close()


@pytest.fixture
def etcd_factory(tmp_path: Path, etcd_binary: str) -> Iterator[EtcdFactory]:
    started: list[EtcdCluster] = []

    def factory(**options: Any) -> EtcdCluster:
        base = tmp_path / f"etcd{len(started)}"
        cluster = EtcdCluster(base, binary=etcd_binary, **options)
        started.append(cluster)  # before start(): a failed start still gets closed
        return cluster.start()

    try:
        yield factory
    finally:
        for cluster in started:
            cluster.close()


@pytest.fixture
def etcd_cluster3(etcd_factory: EtcdFactory) -> EtcdCluster:
    return etcd_factory(size=3)


@pytest.fixture
async def etcd_client(etcd_server: EtcdCluster) -> AsyncIterator[EtcdClient]:
    async with EtcdClient(etcd_server.config()) as client:
        yield client


@pytest.fixture
def key_prefix() -> str:
    """A key prefix no other test uses (tests share a server per module)."""
    return f"/t/{uuid.uuid4().hex[:12]}/"
