"""Issue 11's proof with real processes: one etcd, planners in regions a and b (2 each), an effect worker per
region, 100 schedules firing every second (effects logged outside the system by the workers).

- Region loss: SIGKILL every planner and the worker of the primary region; measure the time until the
  standby region owns every partition (from the /owners/ watch) and until handlers start again.
- Switchover under load and failback via `schedctl region switchover --to` / `region failback`: the pause
  measured by the CLI and from the /owners/ watch (goal < 2 s).
- Bad input through the CLI: nothing changes.

Both check: no execution id has two effects, every planned time of the window ran or was skipped with a
reason, the ownership history is clean, and no partition was ever held by two owners (two regions) at one
revision. The racing-standbys CAS test against real etcd is tests/store/test_regions.py.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from chaos.infra.etcd import EtcdCluster, EtcdFactory
from scheduler.clock import SYSTEM_CLOCK
from scheduler.region import store as rstore
from scheduler.region.policy import DEFAULT_FAILOVER_GRACE_MS, ChangeKind, RegionPolicy
from scheduler.store.etcd import EtcdClient
from tests.integration.regions import RegionEngine

pytestmark = pytest.mark.etcd

GRACE_MS = int(os.environ.get("SCHED_REGION_GRACE_MS", "2000"))  # tuned for the test (lease TTL 2 s)
GIVE_UP_S = 10 + 1  # the planner's default heartbeat_timeout + heartbeat_interval (scheduler/planner/settings.py)


async def region_loss(eng: RegionEngine, kv: EtcdClient, regions: tuple[str, ...], grace_ms: int,
                      kill_etcd: Callable[[], None] | None = None) -> tuple[float, float | None]:
    """Primary `regions[0]`, standbys the rest in order; SIGKILL all of the primary's planners and its worker
    (and, with `kill_etcd`, its etcd member) at once. Returns (seconds until the first standby owns every
    partition, seconds until a handler starts again), both from the kill."""
    primary, standby = regions[0], regions[1:]
    await eng.policy(RegionPolicy(primary, standby, failover_grace_ms=grace_ms))
    await eng.create_schedules()
    try:
        await eng.start_regions(*regions)
        await eng.until_region_owns_all(primary, timeout=90)
        await asyncio.sleep(6.0)
        assert eng.region_owns_all(primary), "a standby region claimed partitions while the primary was live"
        # Kill 0.1 s into a second: every schedule fires on the second and each run holds its worker 0.2 s,
        # so the primary's worker dies with runs in flight (at a random instant it mostly had none).
        await asyncio.sleep((1100 - SYSTEM_CLOCK.wall_ms() % 1000) % 1000 / 1000)
        kill_mono, kill_wall = time.monotonic(), SYSTEM_CLOCK.wall_ms()
        eng.kill_region(primary)
        if kill_etcd is not None:
            kill_etcd()
        owned_at = await eng.until_region_owns_all(standby[0], timeout=grace_ms / 1000 + 40)
        await asyncio.sleep(6.0)
        window_end = SYSTEM_CLOCK.wall_ms() - 3_000
        restart = eng.first_start_after(kill_wall + 200)  # a handler start after the kill (the standby's dispatch)
        # Runs in flight on the killed worker are given up by their new owner a heartbeat timeout (plus an
        # interval) after its claim, then retried: the window is accounted for by then, with room for a slow
        # machine; later than that is a failure (check below), not a longer wait.
        settled = await eng.until_accounted(window_end, timeout=GIVE_UP_S + 15)
    finally:
        await eng.close()
    states = await eng.check(window_end)
    cur = await rstore.read(kv, eng.ks, timeout=5)
    assert cur.policy is not None and cur.policy.primary == standby[0]
    assert cur.policy.last is not None and cur.policy.last.kind is ChangeKind.FAILOVER
    assert cur.policy.last.by.startswith(f"{standby[0]}-")
    took = owned_at - kill_mono
    resumed = None if restart is None else (restart - kill_wall) / 1000
    print(f"\nregion loss ({len(regions)} regions): standby owns every partition {took:.2f}s after the kill "
          f"(grace {grace_ms} ms, lease TTL {eng.planner_settings.get('lease_ttl', '5 (default)')} s); handlers "
          f"start again {resumed}s after it; every planned time accounted {settled:.1f}s after the window; "
          f"planned times {dict(states)}")
    assert took >= grace_ms / 1000, "failed over before the grace"
    assert took < grace_ms / 1000 + 8, f"failover took {took:.2f}s"
    assert resumed is not None and resumed < grace_ms / 1000 + 8, f"executions resumed after {resumed}s"
    assert states["retried"] > 0, "no run was in flight on the killed worker: the drill did not test its loss"
    return took, resumed


async def test_region_loss_fails_over_to_the_standby(etcd_factory: EtcdFactory, tmp_path: Path) -> None:
    etcd = etcd_factory()
    async with EtcdClient(etcd.config(timeout=2.0)) as kv:
        await region_loss(RegionEngine(etcd, tmp_path, kv), kv, ("a", "b"), GRACE_MS)


@pytest.mark.slow
async def test_region_loss_three_regions_with_their_etcd_member(etcd_cluster3: EtcdCluster, tmp_path: Path) -> None:
    """The issue's topology: one etcd member per region; the primary loses its planners, its worker and its
    etcd member at once (the other two keep quorum). b is first in the standby order; c stands by."""
    async with EtcdClient(etcd_cluster3.config(timeout=2.0)) as kv:
        eng = RegionEngine(etcd_cluster3, tmp_path, kv)
        await region_loss(eng, kv, ("a", "b", "c"), GRACE_MS, kill_etcd=lambda: etcd_cluster3.kill(0))


@pytest.mark.slow
async def test_region_loss_with_default_timings(etcd_factory: EtcdFactory, tmp_path: Path) -> None:
    """Lease TTL 5 s and failover_grace 15 s (the defaults): expect about TTL + grace + 1 s."""
    etcd = etcd_factory()
    async with EtcdClient(etcd.config(timeout=2.0)) as kv:
        eng = RegionEngine(etcd, tmp_path, kv, planner_settings={"lookahead_ms": "1000", "late_grace_ms": "2000"})
        await region_loss(eng, kv, ("a", "b"), DEFAULT_FAILOVER_GRACE_MS)


async def test_switchover_under_load_and_failback(etcd_factory: EtcdFactory, tmp_path: Path) -> None:
    etcd = etcd_factory()
    async with EtcdClient(etcd.config(timeout=2.0)) as kv:
        eng = RegionEngine(etcd, tmp_path, kv)
        await eng.policy(RegionPolicy("a", ("b",), failover_grace_ms=10_000))
        await eng.create_schedules()
        try:
            await eng.start_regions("a", "b")
            await eng.until_region_owns_all("a", timeout=60)
            await asyncio.sleep(4.0)
            # --- bad input: nothing changes --------------------------------------------------------------
            before = (await rstore.read(kv, eng.ks, timeout=2)).version
            r = await asyncio.to_thread(eng.schedctl, "region", "switchover", "--to", "mars")
            assert r.returncode == 4 and "'mars'" in r.stderr, r.stderr
            r = await asyncio.to_thread(eng.schedctl, "region", "switchover", "--to", "b", "--failover-grace", "0")
            assert r.returncode == 2 and "failover_grace" in r.stderr, r.stderr
            r = await asyncio.to_thread(eng.schedctl, "region", "switchover", "--to", "b", "--failover-grace=-3s")
            assert r.returncode == 2 and "failover_grace" in r.stderr, r.stderr
            await kv.put(eng.ks.region("gone"), b"{}")  # a region that once had planners, none live now
            r = await asyncio.to_thread(eng.schedctl, "region", "switchover", "--to", "gone")
            assert r.returncode == 4 and "'gone'" in r.stderr, r.stderr
            assert (await rstore.read(kv, eng.ks, timeout=2)).version == before
            # --- dry run ------------------------------------------------------------------------------------
            r = await asyncio.to_thread(eng.schedctl, "region", "switchover", "--to", "b", "--dry-run")
            assert r.returncode == 0 and f"{eng.partitions}/{eng.partitions} partitions would move" in r.stdout, \
                r.stdout + r.stderr
            assert (await rstore.read(kv, eng.ks, timeout=2)).version == before
            # --- switchover a -> b under load ---------------------------------------------------------------
            t_sw = time.monotonic()
            r = await asyncio.to_thread(eng.schedctl, "region", "switchover", "--to", "b", "--reason", "drill",
                                        "--json", "--timeout", "30")
            assert r.returncode == 0, r.stdout + r.stderr
            sw = json.loads(r.stdout)
            assert sw["primary_region"] == "b" and sw["wait"]["complete"], sw
            assert eng.region_owns_all("b")
            pause_sw = max(eng.pauses_after(t_sw).values(), default=0.0)
            await asyncio.sleep(4.0)
            # --- failback b -> a -------------------------------------------------------------------------------
            t_fb = time.monotonic()
            r = await asyncio.to_thread(eng.schedctl, "region", "failback", "--reason", "drill done", "--timeout", "30")
            assert r.returncode == 0 and "switchover complete" in r.stdout, r.stdout + r.stderr
            fb_text = r.stdout.strip().splitlines()[-1]
            assert eng.region_owns_all("a")
            pause_fb = max(eng.pauses_after(t_fb).values(), default=0.0)
            r = await asyncio.to_thread(eng.schedctl, "region", "status")
            assert r.returncode == 0 and "failback" in r.stdout and "switchover" in r.stdout, r.stdout
            await asyncio.sleep(4.0)
            window_end = SYSTEM_CLOCK.wall_ms() - 3_000
            await eng.until_accounted(window_end, timeout=20)
        finally:
            await eng.close()
        states = await eng.check(window_end)
        cur = await rstore.read(kv, eng.ks, timeout=2)
        assert cur.policy is not None and cur.policy.primary == "a"
        assert [c.kind for c in cur.policy.history][-2:] == [ChangeKind.SWITCHOVER, ChangeKind.FAILBACK]
        print(f"\nswitchover: complete {sw['wait']['complete_after_s']}s after the write (CLI), longest partition "
              f"pause from the /owners/ watch {pause_sw:.3f}s; failback: {fb_text}, watch pause {pause_fb:.3f}s; "
              f"planned times {dict(states)}")
        assert pause_sw < 2.0 and pause_fb < 2.0, (pause_sw, pause_fb)
