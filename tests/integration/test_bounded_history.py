"""Bounded history: with retention (planner settings retention_ms / retention_count per schedule) and
etcd auto-compaction, etcd's live data and its database file stay bounded while executions keep being
created, run and removed; dead letters are never removed.

A planner process and a worker process run 100 every-second schedules (plus one that always fails
permanently, every 5 s) against an etcd started with `--auto-compaction-mode=periodic
--auto-compaction-retention=5s`. Every 2 s the test samples etcd's Status (dbSize, dbSizeInUse) and the
number of execution records. Quick mode (CI) runs ~45 s; `SCHED_FULL=1` also runs the ~10 min version
(marked `slow`). Without retention the records and dbSizeInUse grow linearly and the checks fail (see
docs/operations.md, "Bounded history", for the numbers and how to size both settings).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from chaos.infra.etcd import EtcdFactory
from scheduler.execution import ExecState
from scheduler.model import Policies, Schedule
from scheduler.store.etcd import EtcdClient
from tests.integration.engine import Engine, lines

pytestmark = pytest.mark.etcd

SCHEDULES = 100
RETENTION_COUNT = 5
RETENTION_MS = 20_000
WARMUP_S = 15.0  # retention_ms + a few sweeps: from here on the history should be level
MiB = 1 << 20


@dataclass(frozen=True)
class Sample:
    at: float  # seconds since the load started
    records: int  # execution records in etcd
    db_size: int
    db_in_use: int
    completed: int  # side effects so far


def summarize(samples: list[Sample]) -> str:
    return "\n".join(f"  t={s.at:5.0f}s records={s.records:6d} dbSize={s.db_size / MiB:6.2f} MiB "
                     f"inUse={s.db_in_use / MiB:6.2f} MiB completed={s.completed}" for s in samples)


async def run_load(etcd_factory: EtcdFactory, tmp_path: Path, seconds: float,
                   report: Callable[[str], None] = print) -> tuple[list[Sample], Engine, int]:
    etcd = etcd_factory(auto_compaction_mode="periodic", auto_compaction_retention="5s")
    samples: list[Sample] = []
    async with EtcdClient(etcd.config(timeout=5.0)) as kv:
        eng = Engine(etcd, tmp_path, kv, prefix="/hist")
        try:
            eng.start_planner("p1", retention_count=str(RETENTION_COUNT), retention_ms=str(RETENTION_MS),
                              retention_interval="1")
            eng.start_worker("w1")
            every = Policies(execution_timeout_ms=10_000)
            await eng.create(*(Schedule(id=f"job-{i:03d}", tenant=f"t{i % 4}", spec="* * * * * *",
                                        worker_pool="pool", task_type="effect", payload=b'{"note": "' +
                                        b"x" * 200 + b'"}', policies=every) for i in range(SCHEDULES)))
            await eng.create(Schedule(id="doomed", tenant="t0", spec="*/5 * * * * *", worker_pool="pool",
                                      task_type="effect", payload=json.dumps({"fail": "permanent"}).encode()))
            t0 = time.monotonic()
            while (now := time.monotonic() - t0) < seconds:
                st = await kv.status()
                r = await kv.range(eng.ks._k("executions", ""), prefix=True, count_only=True)
                samples.append(Sample(now, r.count, st.db_size, st.db_size_in_use, len(lines(eng.effects))))
                await asyncio.sleep(2.0)
            dead = [e for e in await eng.executions() if e.schedule_id == "doomed"]
            assert all(e.state is ExecState.DEAD_LETTER for e in dead if e.terminal or e.attempts)
            dead_letters = sum(1 for e in dead if e.state is ExecState.DEAD_LETTER)
            index = (await kv.range(eng.ks.dead_letters(), prefix=True, count_only=True)).count
            assert index == dead_letters, f"{index} dead-letter index keys for {dead_letters} dead letters"
        except BaseException:
            report(eng.logs())
            raise
        finally:
            eng.close()
    report(f"\nbounded history, {seconds:.0f}s, {SCHEDULES}/s:\n{summarize(samples)}\n"
           f"  dead letters kept: {dead_letters}")
    return samples, eng, dead_letters


def check_bounded(samples: list[Sample], seconds: float, dead_letters: int) -> None:
    """Every check is made and all failures reported together, so a run shows which ones a regression trips."""
    steady = [s for s in samples if s.at >= WARMUP_S]
    assert len(steady) >= 6, "too few samples after the warm-up"
    # Compaction every 5 s makes dbSizeInUse saw-tooth; the maximum over a third of the run is stable.
    first, last = steady[: len(steady) // 3], steady[-(len(steady) // 3):]
    problems = []
    # The work went on the whole time: executions kept being created, run and removed.
    ran = last[-1].completed - first[0].completed
    if ran < 0.5 * SCHEDULES * (last[-1].at - first[0].at):
        problems.append(f"only {ran} executions ran in the steady phase")
    # Records: what retention keeps (count per schedule, the lookahead, the ones in flight) + dead letters.
    bound = SCHEDULES * (RETENTION_COUNT + 4) + dead_letters + 50
    worst = max(s.records for s in steady)
    if worst > bound:
        problems.append(f"{worst} execution records in etcd; retention should keep at most about {bound}")
    # Live data in etcd's database: level, not growing with the executions that ran.
    early, late = max(s.db_in_use for s in first), max(s.db_in_use for s in last)
    if late > 1.15 * early + MiB / 4:
        problems.append(f"dbSizeInUse grew from {early / MiB:.2f} to {late / MiB:.2f} MiB")
    # The file itself: compaction frees pages that later writes reuse, so it levels off too.
    early_file, late_file = max(s.db_size for s in first), max(s.db_size for s in last)
    if late_file > 1.25 * early_file + MiB / 2:
        problems.append(f"dbSize grew from {early_file / MiB:.2f} to {late_file / MiB:.2f} MiB")
    if dead_letters < seconds / 5 - 4:
        problems.append(f"only {dead_letters} dead letters kept: retention removed some?")
    assert not problems, "history is not bounded:\n" + "\n".join(problems)


async def test_history_stays_bounded(etcd_factory: EtcdFactory, tmp_path: Path) -> None:
    seconds = 42.0
    samples, _, dead = await run_load(etcd_factory, tmp_path, seconds)
    check_bounded(samples, seconds, dead)


@pytest.mark.slow
@pytest.mark.timeout(900)
async def test_history_stays_bounded_for_ten_minutes(etcd_factory: EtcdFactory, tmp_path: Path) -> None:
    seconds = 600.0
    samples, _, dead = await run_load(etcd_factory, tmp_path, seconds)
    check_bounded(samples, seconds, dead)
