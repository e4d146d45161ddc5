"""A small engine under test for the process-level proofs: one etcd, `schedctl planner` processes and
effect-worker processes (tests/integration/effect_worker.py), and the etcd-side readers the checks use.

Everything is started through chaos/infra/procs.py (backstops: atexit, parent-death signal) and stopped
by pid in `close()`; call it from a finalizer.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from chaos.infra.etcd import EtcdCluster
from chaos.infra.planners import FAST, PlannerProcess, PlannerSet
from chaos.infra.procs import forget, spawn
from scheduler.clock import SYSTEM_CLOCK
from scheduler.execution import ExecState, Execution
from scheduler.model import Policies, Schedule
from scheduler.store.etcd import EtcdClient, EtcdError
from scheduler.store.keyspace import Keyspace, partition_for
from scheduler.store.ledger import Ledger
from scheduler.store.schedules import ScheduleStore

WORKER = str(Path(__file__).with_name("effect_worker.py"))
PLANNER_SETTINGS = {**FAST, "lookahead_ms": "1000", "late_grace_ms": "2000"}


def stop_process(p: subprocess.Popen[bytes], timeout: float = 15.0) -> int:
    """SIGTERM, wait, SIGKILL if it hangs; returns the exit code."""
    if p.poll() is None:
        os.kill(p.pid, signal.SIGTERM)
        try:
            p.wait(timeout)
        except subprocess.TimeoutExpired:
            os.kill(p.pid, signal.SIGKILL)
            p.wait()
    forget(p.pid)
    rc = p.poll()
    assert rc is not None
    return rc


def kill_process(p: subprocess.Popen[bytes]) -> None:
    if p.poll() is None:
        os.kill(p.pid, signal.SIGKILL)
        p.wait()
    forget(p.pid)


async def wait_until(check: Callable[[], Awaitable[bool]], timeout: float, what: str, every: float = 0.1) -> float:
    """Poll `check` until it holds; returns the seconds it took. Fails naming `what` on timeout."""
    t0 = time.monotonic()
    while not await check():
        if time.monotonic() - t0 > timeout:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        await asyncio.sleep(every)
    return time.monotonic() - t0


def next_second_ms(after_s: float) -> int:
    """A whole second at least `after_s` from now (a planned time of an every-second spec)."""
    return (SYSTEM_CLOCK.wall_ms() + int(after_s * 1000)) // 1000 * 1000 + 1000


def effects_once(path: Path, killed: frozenset[str] = frozenset(),
                 records: Mapping[str, Execution] | None = None) -> Counter[str]:
    """Execution id -> completed effects, from a drill's effects file (`<id> <attempt> <worker>` lines,
    written by tests/integration/effect_worker.py); fails if any id ran twice.

    One exception, the harness's own rule (chaos/once.py, `result_lost_with_worker`): an effect made by a
    worker the drill SIGKILLed (`killed`), whose attempt the ledger (`records`) never recorded as succeeded,
    followed by an effect of a later attempt. Its result died with the worker, so the retry under the same
    idempotency key is the product's at-least-once step under a crash (drills.md F5, F7), not a duplicate;
    it is counted once. A retry after a recorded success, or a second effect from a live worker, still fails."""
    effects: dict[str, list[tuple[int, str]]] = {}
    for ln in path.read_text().splitlines() if path.exists() else []:
        eid, attempt, worker = ln.split()[:3]
        effects.setdefault(eid, []).append((int(attempt), worker))
    ids: Counter[str] = Counter()
    dupes: dict[str, list[tuple[int, str]]] = {}
    for eid, made in effects.items():
        counted = [(a, w) for i, (a, w) in enumerate(made)
                   if not _result_lost_with_worker(a, w, made[i + 1:], killed, (records or {}).get(eid))]
        ids[eid] = len(counted)
        if len(counted) > 1:
            dupes[eid] = made
    assert not dupes, f"{len(dupes)} execution ids ran twice, e.g. {list(dupes.items())[:5]}"
    return ids


def _result_lost_with_worker(attempt: int, worker: str, later: list[tuple[int, str]], killed: frozenset[str],
                             rec: Execution | None) -> bool:
    if worker not in killed or rec is None or not any(a > attempt for a, _ in later):
        return False
    return not any(x.attempt == attempt and x.finished_ms and x.succeeded for x in rec.attempts)


def lines(path: Path) -> list[list[str]]:
    """`<id> <attempt> <worker>` lines of an effects/starts file."""
    return [ln.split() for ln in path.read_text().splitlines()] if path.exists() else []


@dataclass
class Engine:
    etcd: EtcdCluster
    base: Path
    kv: EtcdClient
    partitions: int = 4
    prefix: str = "/eng"
    planner_settings: dict[str, str] = field(default_factory=lambda: dict(PLANNER_SETTINGS))
    workers: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    addresses: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.ks = Keyspace(self.prefix)
        self.planners = PlannerSet(self.base / "planners", self.etcd.endpoints, self.prefix,
                                   partitions=self.partitions, settings=self.planner_settings)
        self.store = ScheduleStore(self.kv, self.ks, self.partitions)
        self.ledger = Ledger(self.ks, self.partitions)
        self.effects = self.base / "effects.log"
        self.starts = self.base / "starts.log"
        self.times = self.base / "times.log"  # `<id> <attempt> <wall ms>` per handler start (worker's clock)

    # ---- processes ------------------------------------------------------------------------------

    def start_planner(self, node_id: str, **settings: str) -> PlannerProcess:
        """Start a planner on a port of its own choosing and wait until it serves (workers started
        after this dial it)."""
        proc, address = self.planners.start_serving(node_id, settings={"api_port": "0", **settings})
        self.addresses.append(address)
        return proc

    def start_worker(self, wid: str, *, drain_grace: float = 5.0,
                     planners: list[str] | None = None) -> subprocess.Popen[bytes]:
        """An effect worker dialling `planners` (default: every planner started)."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("SCHED_")}
        argv = [sys.executable, WORKER, "--id", wid, "--planners", ",".join(planners or self.addresses),
                "--effects", str(self.effects), "--starts", str(self.starts), "--times", str(self.times),
                "--drain-grace", str(drain_grace)]
        p = spawn(argv, self.base / f"{wid}.log", env=env)
        self.workers[wid] = p
        return p

    def close(self) -> None:
        for p in self.workers.values():
            kill_process(p)
        self.planners.close()

    # ---- etcd-side reads ------------------------------------------------------------------------

    async def owned(self, timeout: float = 60) -> None:
        """Until every partition has an owner. A planned time is materialized only by its partition's
        owner, and one not materialized within late_grace_ms of its time is a missed run: a test that
        plans a few seconds ahead must not start its clock while a planner, slow to start on a loaded
        machine, is still claiming."""
        async def check() -> bool:
            try:
                r = await self.kv.range(self.ks.owners, prefix=True, keys_only=True, timeout=2.0)
            except EtcdError:
                return False
            return len({self.ks.partition_of(x.key) for x in r.kvs}) == self.partitions
        try:
            await wait_until(check, timeout, "every partition to be owned")
        except AssertionError as err:
            raise AssertionError(f"{err}\n{self.logs()}") from None

    async def create(self, *schedules: Schedule) -> None:
        for s in schedules:
            await self.store.create(s, SYSTEM_CLOCK.wall_ms())

    async def record(self, schedule_id: str, planned_ms: int) -> Execution | None:
        return await self.ledger.get(self.kv, schedule_id, planned_ms, timeout=2.0)

    async def executions(self) -> list[Execution]:
        out: list[Execution] = []
        for p in range(self.partitions):
            out += (await self.ledger.list_partition(self.kv, p, timeout=5.0))[0]
        return out

    async def dead_letter(self, schedule_id: str, planned_ms: int) -> dict[str, object] | None:
        p = partition_for(schedule_id, self.partitions)
        got = await self.kv.get(self.ks.dead_letter(p, schedule_id, planned_ms), timeout=2.0)
        return None if got is None else dict(json.loads(got.value))

    def logs(self) -> str:
        parts = [self.planners.logs(20)]
        for wid in self.workers:
            path = self.base / f"{wid}.log"
            tail = path.read_text(errors="replace").splitlines()[-15:] if path.exists() else []
            parts.append(f"--- worker {wid}\n" + "\n".join(tail))
        return "\n".join(parts)


# ---- waiting on what the processes do (shared by the worker failure and heartbeat drills) ---------------


def once(sid: str, planned_ms: int, payload: dict[str, object], policies: Policies) -> Schedule:
    """A schedule with exactly one planned time, run by the effect worker's `effect` task."""
    return Schedule(id=sid, tenant="t", spec="* * * * * *", worker_pool="pool", task_type="effect",
                    payload=json.dumps(payload).encode(), start_ms=planned_ms, end_ms=planned_ms, policies=policies)


async def connected(eng: Engine, wid: str, n: int = 1) -> None:
    """Worker `wid` has connected to planner p1 at least `n` times, and every partition is owned (so
    a time planned from now on is materialized in time)."""
    async def check() -> bool:
        return sum(1 for e in eng.planners["p1"].events("worker_connected") if e.get("worker") == wid) >= n
    try:
        await wait_until(check, 30, f"worker {wid} to connect")
    except AssertionError as err:
        raise AssertionError(f"{err}\n{eng.logs()}") from None
    await eng.owned()


async def started(eng: Engine, eid: str, attempt: int, wid: str) -> None:
    async def check() -> bool:
        return [eid, str(attempt), wid] in lines(eng.starts)
    await wait_until(check, 30, f"{eid} attempt {attempt} to start on {wid}")


async def final(eng: Engine, sid: str, planned_ms: int, timeout: float = 40) -> Execution:
    """The record once it has succeeded (fails with the record and the process logs otherwise)."""
    async def check() -> bool:
        e = await eng.record(sid, planned_ms)
        return e is not None and e.state is ExecState.SUCCEEDED
    try:
        await wait_until(check, timeout, f"{sid} to succeed")
    except AssertionError as err:
        raise AssertionError(f"{err}; record: {await eng.record(sid, planned_ms)}\n{eng.logs()}") from None
    e = await eng.record(sid, planned_ms)
    assert e is not None
    return e
