"""`schedctl region affinity` (the real binary) against a real cluster: etcd and a `schedctl planner`
process serving the API. Each change is read back from etcd itself, and bad input must exit 2 with a
message naming the flag and the reason while the stored record stays byte for byte what it was."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from chaos.infra.etcd import EtcdCluster
from chaos.infra.planners import API, PlannerSet
from scheduler.region import policy as rp
from scheduler.region.affinity import Affinity, Mode
from scheduler.store.etcd import EtcdClient
from scheduler.store.keyspace import Keyspace
from tests.integration.test_cli_cluster import Cluster

pytestmark = pytest.mark.etcd


class Stored:
    """The raw `/cluster/region` record, read from etcd (not through the API under test)."""

    def __init__(self, etcd: EtcdCluster, key_prefix: str) -> None:
        self.etcd, self.ks = etcd, Keyspace(key_prefix.rstrip("/"))

    def raw(self) -> tuple[bytes, int]:
        async def get() -> tuple[bytes, int]:
            async with EtcdClient(self.etcd.config(timeout=5)) as kv:
                got = await kv.get(self.ks.region_policy, timeout=5)
                assert got is not None, "no region policy record"
                return got.value, got.mod_revision
        return asyncio.run(get())

    def policy(self) -> rp.RegionPolicy:
        return rp.decode(self.raw()[0])


@pytest.fixture
def api(etcd_server: EtcdCluster, key_prefix: str, tmp_path: Path) -> Iterator[tuple[Cluster, Stored]]:
    # One planner, no worker: affinity is a policy edit, nothing needs to run.
    planners = PlannerSet(tmp_path / "planners", etcd_server.endpoints, key_prefix.rstrip("/"), partitions=2,
                          settings=dict(API))
    try:
        _, address = planners.start_serving("p1")
        c = Cluster(address, tmp_path)
        c.wait("the API to answer", lambda: c.run("cluster", "status", "--json").returncode == 0)
        yield c, Stored(etcd_server, key_prefix)
    finally:
        planners.close()


def test_region_affinity_end_to_end(api: tuple[Cluster, Stored]) -> None:
    c, stored = api
    r = c.run("region", "affinity", "--pool", "gpu", "--mode", "strict")
    assert r.returncode == 4 and "no region policy yet" in r.stderr, r.stderr  # switch over first
    region = c.json("cluster", "status")["planners"][0]["planner"]["region"]
    c.ok("region", "switchover", region, "--no-wait")

    out = c.ok("region", "affinity", "--pool", "gpu", "--mode", "strict", "--reason", "data stays home").stdout
    assert "gpu strict" in out, out
    assert stored.policy().affinity.for_pool("gpu") == Affinity(Mode.STRICT)
    # A wait belongs to prefer only: with any it is refused, naming the flag, and nothing changes.
    before = stored.raw()
    r = c.run("region", "affinity", "--default", "--mode", "any", "--prefer-wait", "500ms")
    assert r.returncode == 2 and "--prefer-wait: only applies to --mode prefer" in r.stderr, r.stderr
    assert stored.raw() == before
    pol = c.json("region", "affinity", "--default", "--mode", "any")
    assert pol["default_affinity"]["mode"] == "any", pol
    c.ok("region", "affinity", "--pool", "batch", "--mode", "prefer", "--prefer-wait", "500ms")
    aff = stored.policy().affinity
    assert aff.default == Affinity(Mode.ANY)
    assert aff.for_pool("batch") == Affinity(Mode.PREFER, 500) and aff.for_pool("gpu") == Affinity(Mode.STRICT)

    text = c.ok("region", "status").stdout
    assert "worker affinity: default any; batch prefer (wait 500ms); gpu strict" in text, text
    assert "data stays home" in text, text  # the history entry of kind affinity, with the reason
    st = c.json("region", "status")["region_policy"]
    assert st["default_affinity"]["mode"] == "any", st
    assert {p["pool"]: p["affinity"]["mode"] for p in st["pool_affinity"]} == {"batch": "prefer", "gpu": "strict"}
    assert [h["kind"] for h in st["history"]].count("affinity") == 3

    c.ok("region", "affinity", "--pool", "batch", "--clear")
    assert stored.policy().affinity.pools == (("gpu", Affinity(Mode.STRICT)),)
    assert "worker affinity: default any; gpu strict\n" in c.ok("region", "status").stdout

    before = stored.raw()
    for args, flag, why in [
        (["--pool", "gpu", "--mode", "sometimes"], "--mode", "one of strict, prefer, any"),
        (["--pool", "gpu", "--mode", "prefer", "--prefer-wait=-1s"], "--prefer-wait", "must be positive"),
        (["--pool", "gpu", "--mode", "prefer", "--prefer-wait", "-2"], "--prefer-wait", "must be positive"),
        (["--pool", "gpu", "--mode", "prefer", "--prefer-wait", "0"], "--prefer-wait", "must be positive"),
        (["--pool", "gpu", "--mode", "prefer", "--prefer-wait", "soon"], "--prefer-wait", "is not a duration"),
        (["--pool", "gpu", "--default", "--mode", "any"], "--default", "not allowed with argument --pool"),
        (["--mode", "any"], "--pool --default", "is required"),
        (["--pool", "gpu"], "--mode", "is required"),
        (["--default", "--clear"], "--clear", "cannot be cleared"),
    ]:
        r = c.run("region", "affinity", *args)
        assert r.returncode == 2, (args, r.returncode, r.stderr)
        assert flag in r.stderr and why in r.stderr, (args, r.stderr)
    assert stored.raw() == before, "bad input changed the stored policy"
