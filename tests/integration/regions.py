"""A multi-region engine for the region drills (tests/integration/test_regions_drill.py): one etcd, planner
processes in several regions (`schedctl planner --region`), effect workers, every-second schedules, and the
checks: one effect per execution id, every planned time of the window run or skipped with a reason, the
ownership history (chaos/history: no two owners, no stale write), and no partition held by two regions.

An `/owners/` watch runs for the whole drill and stamps each event with this process's monotonic clock, so
that the pause of a move (owner key deleted -> next claim) and the time until a region owns every partition
are measured from what etcd recorded, not from the planners' own view.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from chaos.history import HistoryReport, read_and_check
from chaos.infra.etcd import EtcdCluster
from chaos.infra.planners import PlannerSet, schedctl_binary
from chaos.infra.procs import spawn
from scheduler.clock import SYSTEM_CLOCK
from scheduler.execution import ExecState, Execution
from scheduler.ids import execution_id
from scheduler.model import Policies, RetryPolicy, Schedule
from scheduler.region import store as rstore
from scheduler.region.policy import RegionPolicy
from scheduler.store.etcd import EtcdClient, EtcdError
from scheduler.store.etcd.types import EventType
from scheduler.store.keyspace import Keyspace
from scheduler.store.ledger import Ledger
from scheduler.store.schedules import ScheduleStore
from scheduler.timeplan import MissedRuns, Overlap, parse_spec
from tests.integration.engine import PLANNER_SETTINGS, WORKER, effects_once, kill_process, stop_process

PREFIX = "/regions-drill"


@dataclass(frozen=True)
class OwnerEvent:
    at: float  # monotonic, when the watch delivered it
    revision: int
    partition: int
    node: str  # "" for a delete


@dataclass
class RegionEngine:
    etcd: EtcdCluster
    base: Path
    kv: EtcdClient
    partitions: int = 8
    schedules: int = 100
    planners_per_region: int = 2
    planner_settings: dict[str, str] = field(default_factory=lambda: dict(PLANNER_SETTINGS))
    workers: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    region_of: dict[str, str] = field(default_factory=dict)  # node id -> region
    addresses: list[str] = field(default_factory=list)
    owner_events: list[OwnerEvent] = field(default_factory=list)
    created_ms: int = 0
    killed_workers: set[str] = field(default_factory=set)
    # Each run holds its worker 0.2 s (20 in flight at 100/s), so that a killed region's worker dies with runs
    # in flight: their loss and retry is what a region loss must get right (without it, few were in flight).
    payload: bytes = b'{"hold_s": 0.2}'

    def __post_init__(self) -> None:
        self.ks = Keyspace(PREFIX)
        self.planners = PlannerSet(self.base / "planners", self.etcd.endpoints, PREFIX, partitions=self.partitions,
                                   settings=self.planner_settings)
        self.effects = self.base / "effects.log"
        self.times = self.base / "times.log"
        self._watch: asyncio.Task[None] | None = None

    # ---- set-up --------------------------------------------------------------------------------------

    async def policy(self, policy: RegionPolicy) -> int:
        cur = await rstore.read(self.kv, self.ks, timeout=2)
        return await rstore.cas(self.kv, self.ks, cur.version, policy, timeout=2)

    async def create_schedules(self) -> None:
        store = ScheduleStore(self.kv, self.ks, self.partitions)
        self.created_ms = SYSTEM_CLOCK.wall_ms()
        policies = Policies(missed_runs=MissedRuns.ALL, catchup_cap=1000, catchup_window_ms=600_000,
                            overlap=Overlap.ALLOW_ALL, execution_timeout_ms=20_000,
                            retry=RetryPolicy(max_attempts=5, initial_backoff_ms=200, max_backoff_ms=1000))
        for i in range(self.schedules):
            await store.create(Schedule(id=f"job-{i:03d}", tenant=f"tenant-{i % 3}", spec="* * * * * *",
                                        worker_pool="pool", task_type="effect", policies=policies,
                                        payload=self.payload), self.created_ms)

    async def start_regions(self, *regions: str) -> None:
        """Planners of every region (their own ports, read back), then one effect worker per region dialling
        every planner (workers stream to all planners; any planner records results)."""
        for r in regions:
            for i in range(1, self.planners_per_region + 1):
                node = f"{r}-p{i}"
                self.region_of[node] = r
                self.planners.start(node, settings={"region": r, "api_port": "0"})
        for node in self.region_of:
            self.addresses.append(await self.planners[node].serving())
        for r in regions:
            self.start_worker(f"{r}-w1")
        self._watch = asyncio.create_task(self._watch_owners())

    def start_worker(self, wid: str) -> None:
        argv = [sys.executable, WORKER, "--id", wid, "--planners", ",".join(self.addresses),
                "--effects", str(self.effects), "--times", str(self.times), "--region", wid.split("-")[0]]
        self.workers[wid] = spawn(argv, self.base / f"{wid}.log")

    def kill_region(self, region: str) -> None:
        """SIGKILL every planner and worker of `region`: no drain, no revoke."""
        for node, r in self.region_of.items():
            if r == region:
                self.planners[node].kill()
        for wid, p in self.workers.items():
            if wid.startswith(f"{region}-"):
                kill_process(p)
                self.killed_workers.add(wid)

    async def close(self) -> None:
        if self._watch is not None:
            self._watch.cancel()
            await asyncio.gather(self._watch, return_exceptions=True)
        for p in self.workers.values():
            stop_process(p, timeout=5)
        self.planners.close()

    # ---- what etcd says --------------------------------------------------------------------------------

    async def _watch_owners(self) -> None:
        rev = (await self.kv.range(self.ks.owners, prefix=True, count_only=True)).revision
        r = await self.kv.range(self.ks.owners, prefix=True)
        now = time.monotonic()
        for kv in r.kvs:
            self.owner_events.append(OwnerEvent(now, kv.mod_revision, self.ks.partition_of(kv.key),
                                                json.loads(kv.value)["node"]))
        while True:
            try:
                watch = self.kv.watch(self.ks.owners, prefix=True, start_revision=rev + 1)
                try:
                    async for batch in watch:
                        now = time.monotonic()
                        for ev in batch.events:
                            rev = max(rev, ev.revision)
                            node = json.loads(ev.kv.value)["node"] if ev.type is EventType.PUT else ""
                            self.owner_events.append(OwnerEvent(now, ev.revision, self.ks.partition_of(ev.kv.key),
                                                                node))
                finally:
                    await watch.close()
            except EtcdError:
                await asyncio.sleep(0.1)

    def owners_now(self) -> dict[int, str]:
        cur: dict[int, str] = {}
        for e in self.owner_events:
            if e.node:
                cur[e.partition] = e.node
            else:
                cur.pop(e.partition, None)
        return cur

    def region_owns_all(self, region: str) -> bool:
        cur = self.owners_now()
        return len(cur) == self.partitions and all(self.region_of.get(n) == region for n in cur.values())

    async def until_region_owns_all(self, region: str, timeout: float) -> float:
        """Monotonic time at which the watch first saw `region` own every partition."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.region_owns_all(region):
                return self.owner_events[-1].at
            await asyncio.sleep(0.02)
        raise AssertionError(f"{region} did not own every partition within {timeout:g}s: {self.owners_now()}\n"
                             f"{self.planners.logs(25)}")

    def pauses_after(self, since: float) -> dict[int, float]:
        """Per partition, the longest it went without an owner (delete -> next claim) after `since`."""
        out: dict[int, float] = {}
        gone: dict[int, float] = {}
        for e in self.owner_events:
            if e.at < since:
                continue
            if not e.node:
                gone[e.partition] = e.at
            elif e.partition in gone:
                out[e.partition] = max(out.get(e.partition, 0.0), e.at - gone.pop(e.partition))
        return out

    def two_regions_at_once(self) -> list[str]:
        """Revisions at which a partition had owners in two regions (or two owners at all): the owner key is
        create-if-absent, so a claim put while another owner's key exists is a violation."""
        cur: dict[int, str] = {}
        bad = []
        for e in sorted(self.owner_events, key=lambda e: e.revision):
            if e.node:
                if e.partition in cur and cur[e.partition] != e.node:
                    bad.append(f"rev {e.revision}: partition {e.partition} claimed by {e.node} "
                               f"({self.region_of.get(e.node)}) while {cur[e.partition]} "
                               f"({self.region_of.get(cur[e.partition])}) held it")
                cur[e.partition] = e.node
            else:
                cur.pop(e.partition, None)
        return bad

    def first_start_after(self, wall_ms: int) -> int | None:
        """Wall ms of the first handler start after `wall_ms` (times.log, the workers' clocks)."""
        if not self.times.exists():
            return None
        starts = [int(ln.split()[2]) for ln in self.times.read_text().splitlines() if len(ln.split()) == 3]
        later = [t for t in starts if t > wall_ms]
        return min(later) if later else None

    # ---- the checks ----------------------------------------------------------------------------------------

    async def accounted(self, window_end_ms: int) -> tuple[Counter[str], list[str]]:
        """Every planned time in (created, window_end]: counted by how it ended (ran, skipped with a reason),
        or listed as missing with its state. Asserts one effect per succeeded id."""
        ledger = Ledger(self.ks, self.partitions)
        records: dict[str, Execution] = {}
        skips: dict[str, list[tuple[int, int]]] = {}
        for p in range(self.partitions):
            for rec in (await ledger.list_partition(self.kv, p, timeout=5.0))[0]:
                records[rec.id] = rec
            r = await self.kv.range(self.ks.skips(p), prefix=True, timeout=5.0)
            for s in r.kvs:
                sid, span = s.key.decode().rsplit("/", 2)[-2:]
                after, through = (int(x) for x in span.split("-"))
                skips.setdefault(sid, []).append((after, through))
        # A killed region's worker may have made an effect whose result died with it: retried, not a duplicate.
        ids = effects_once(self.effects, frozenset(self.killed_workers), records)
        plan = parse_spec("* * * * * *")
        missing: list[str] = []
        states: Counter[str] = Counter()
        for i in range(self.schedules):
            sid = f"job-{i:03d}"
            for t in plan.between_ms(self.created_ms + 1_000, window_end_ms):
                eid = execution_id(sid, t)
                e = records.get(eid)
                if e is not None:
                    if e.state is ExecState.SUCCEEDED:
                        assert ids.get(eid) == 1, f"{eid} succeeded without exactly one effect"
                        states["succeeded"] += 1
                        states["retried"] += e.attempt > 1
                        continue
                    if e.state is ExecState.SKIPPED and e.skip_reason:
                        states[f"skipped:{e.skip_reason}"] += 1
                        continue
                if any(a < t <= b for a, b in skips.get(sid, [])):
                    states["skip-range"] += 1
                    continue
                missing.append(f"{eid}: {e.state.value if e else 'no record, no skip'}")
        return states, missing

    async def until_accounted(self, window_end_ms: int, timeout: float) -> float:
        """Wait (processes running) until every planned time of the window ran or was skipped; returns the
        seconds it took. The bound is the caller's: a run in flight on a killed worker is given up only
        after the new owner's heartbeat timeout (docs/workers.md), so a fixed sleep raced it on a slow
        machine (CI: 14 runs still `running` 3 s after the window, their give-up not yet due)."""
        t0 = time.monotonic()
        while True:
            _, missing = await self.accounted(window_end_ms)
            if not missing or time.monotonic() - t0 > timeout:
                return time.monotonic() - t0
            await asyncio.sleep(0.5)

    async def check(self, window_end_ms: int) -> Counter[str]:
        """One effect per id; every planned time in (created, window_end] ran or was skipped with a reason;
        the ownership history is clean. Returns the states counted."""
        states, missing = await self.accounted(window_end_ms)
        assert not missing, f"{len(missing)} planned times neither completed nor skipped: {missing[:10]}"
        report: HistoryReport = await read_and_check(self.kv, self.ks)
        assert not report.violations, "\n".join(report.violations[:20])
        bad = self.two_regions_at_once()
        assert not bad, "\n".join(bad[:10])
        return states

    # ---- the CLI ---------------------------------------------------------------------------------------------

    def schedctl(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run([schedctl_binary(), *args, "--server", self.addresses[-1]], capture_output=True,
                              text=True, timeout=timeout, check=False)

