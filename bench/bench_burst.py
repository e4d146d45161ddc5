"""Burst: N schedules due at the same instant, all started how fast (issue 12, P5: 100,000 within 5 s).

A 2-planner cluster (etcd, planners and no-op workers as processes on this machine) holds two sets of
one-shot schedules (a yearly spec naming one second): a baseline burst of `--baseline` schedules at T1,
then the measured burst of `--burst` at T2, after the baseline has drained. Both bursts run on the same
cluster in the same session, so the ratio between them is what the machine's noise leaves alone. Printed
per burst: how many started, the time until the last one started (worker start - planned time), start
lag p50 / p99, starts per second over the burst (N / time until the last started), CPU seconds of the
planners, workers and etcd during it and per execution; then the measured burst's start rate against the
baseline's, and the goal.

    python bench/bench_burst.py                   # full: 100,000 at T2, baseline 10,000 at T1
    python bench/bench_burst.py --quick           # CI smoke: 2,000 and 200, no timing asserts
    python bench/bench_burst.py --burst 50000 --lookahead-ms 10000 --workdir /tmp/burst

Schedules are written straight into etcd through `ScheduleStore.create_batch` (as `bench_scale.py` does);
T1 is chosen far enough ahead for the creates, the planners' claims and loads (`--lead`), and the run
stops with a message if the cluster is not ready 2 s before T1.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from bench_e2e import _cpu_s, _spawn, _stop  # noqa: E402
from bench_scale import PREFIX, Planner, add_cluster_args, spawn_planners, stop_all, wait_loaded  # noqa: E402

from chaos.infra.etcd import EtcdCluster, find_binary  # noqa: E402
from scheduler.clock import SYSTEM_CLOCK  # noqa: E402
from scheduler.model import Policies, Schedule  # noqa: E402
from scheduler.store.etcd import EtcdClient  # noqa: E402
from scheduler.store.keyspace import Keyspace  # noqa: E402
from scheduler.store.schedules import MAX_BATCH, ScheduleStore  # noqa: E402
from scheduler.timeplan import Overlap  # noqa: E402

GOAL_N, GOAL_S = 100_000, 5.0  # issue 12, P5


def at_instant(ms: int) -> str:
    """A seconds-first spec that fires at this instant (UTC) once a year."""
    t = datetime.fromtimestamp(ms / 1000, UTC)
    return f"{t.second} {t.minute} {t.hour} {t.day} {t.month} *"


async def create(store: ScheduleStore, prefix: str, n: int, due_ms: int) -> None:
    pol = Policies(overlap=Overlap.ALLOW_ALL)
    spec = at_instant(due_ms)
    sem = asyncio.Semaphore(16)

    async def batch(lo: int) -> None:
        async with sem:
            await store.create_batch([Schedule(id=f"{prefix}{i:07d}", tenant=f"t{i % 10}", spec=spec,
                                               worker_pool="bench", task_type="noop", policies=pol)
                                      for i in range(lo, min(n, lo + MAX_BATCH))], SYSTEM_CLOCK.wall_ms())

    await asyncio.gather(*(batch(lo) for lo in range(0, n, MAX_BATCH)))


@dataclass
class Burst:
    name: str
    n: int
    due_ms: int
    cpu: dict[str, float]  # planners, workers, etcd: CPU seconds from 1 s before the instant to the end


def cpu_now(planners: list[Planner], workers: list[subprocess.Popen[bytes]], etcd_pid: int) -> dict[str, float]:
    return {"planners": sum(_cpu_s(p.proc.pid) for p in planners), "workers": sum(_cpu_s(w.pid) for w in workers),
            "etcd": _cpu_s(etcd_pid)}


async def measure(b: Burst, settle_s: float, planners: list[Planner], workers: list[subprocess.Popen[bytes]],
                  etcd_pid: int) -> None:
    """CPU from 1 s before the burst's instant until `settle_s` after it."""
    await asyncio.sleep(max(0.0, (b.due_ms - 1000 - SYSTEM_CLOCK.wall_ms()) / 1000))
    before = cpu_now(planners, workers, etcd_pid)
    await asyncio.sleep(max(0.0, (b.due_ms + settle_s * 1000 - SYSTEM_CLOCK.wall_ms()) / 1000))
    after = cpu_now(planners, workers, etcd_pid)
    b.cpu = {k: after[k] - before[k] for k in before}


def report(b: Burst, lags: list[int]) -> float:
    """Print one burst's row; returns its start rate (executions/s until the last one started)."""
    last = max(lags, default=0)
    rate = len(lags) / max(last / 1000, 1e-3)
    n = max(len(lags), 1)
    cpu = sum(b.cpu.values())

    def pct(q: float) -> float:
        return float(lags[min(len(lags) - 1, int(q * len(lags)))]) if lags else float("nan")

    print(f"{b.name:9} {b.n:>9,} {len(lags):>9,} {last / 1000:>10.2f} {pct(0.5):>8.0f} {pct(0.99):>8.0f} "
          f"{rate:>10,.0f} {cpu:>7.1f} {cpu / n * 1e6:>6.0f} = {b.cpu['planners'] / n * 1e6:.0f} + "
          f"{b.cpu['workers'] / n * 1e6:.0f} + {b.cpu['etcd'] / n * 1e6:.0f}")
    if len(lags) < b.n:
        # Not a timing figure: a run not started in the whole settle window is stuck somewhere (a session-21
        # change left 1,077 of 100,000 held until the planners' shutdown; this line is how it showed).
        print(f"WARNING: {b.n - len(lags):,} of the {b.name}'s {b.n:,} runs never started within the window; "
              f"look at the run's etcd (holds, scheduled records) and the planner logs in the workdir")
    return rate


async def run(args: argparse.Namespace, workdir: Path) -> None:
    etcd_bin = find_binary("etcd")
    assert etcd_bin, "etcd not found: run scripts/setup.sh"
    cluster = EtcdCluster(workdir / "etcd", binary=etcd_bin, auto_compaction_mode="periodic",
                          auto_compaction_retention="1m", quota_backend_bytes=8 * 1024**3).start()
    planners: list[Planner] = []
    workers: list[subprocess.Popen[bytes]] = []
    try:
        async with EtcdClient(cluster.config(timeout=30.0)) as kv:
            store = ScheduleStore(kv, Keyspace(PREFIX), args.partitions, timeout=30.0)
            now = SYSTEM_CLOCK.wall_ms()
            # Far enough ahead for the creates (about 15,000/s here) and the planners' claims and loads.
            t1 = (now + int((args.lead + (args.baseline + args.burst) / 10_000) * 1000)) // 1000 * 1000 + 1000
            t2 = t1 + int(args.gap * 1000)
            t0 = time.monotonic()
            await create(store, "base", args.baseline, t1)
            await create(store, "burst", args.burst, t2)
            print(f"created {args.baseline:,} schedules due at T1 and {args.burst:,} at T2 = T1 + {args.gap:.0f} s "
                  f"in {time.monotonic() - t0:.1f} s; planners {args.planners}, workers {args.workers}, "
                  f"partitions {args.partitions}, lookahead {args.lookahead_ms} ms, "
                  f"start ahead {args.start_ahead_ms} ms, start window {args.start_window or 'adaptive'}")
            schedctl = str(Path(sys.executable).parent / "schedctl")
            ahead = ["--start-ahead-ms", str(args.start_ahead_ms)] if args.start_ahead_ms else []
            ahead += ["--start-window", str(args.start_window)] if args.start_window else []
            planners += spawn_planners(schedctl, cluster, args, workdir, lookahead_ms=args.lookahead_ms, extra=ahead)
            await wait_loaded(kv, planners, args.partitions, args.load_timeout, workdir)
            addrs = ",".join(p.api for p in planners)
            outs = [workdir / f"lags-{i}.json" for i in range(args.workers)]
            for i in range(args.workers):
                workers.append(_spawn([sys.executable, str(ROOT / "bench" / "noop_worker.py"), "--id", f"w{i}",
                                       "--planners", addrs, "--out", str(outs[i]), "--concurrency",
                                       str(args.concurrency)], workdir / f"worker{i}.log"))
            ready_in = (t1 - SYSTEM_CLOCK.wall_ms()) / 1000
            if ready_in < 2.0:
                raise SystemExit(f"the cluster was ready only {ready_in:.1f} s before T1: raise --lead")
            print(f"cluster ready {ready_in:.1f} s before T1")
            etcd_pid = cluster.members[0].pid
            bursts = [Burst("baseline", args.baseline, t1, {}), Burst("burst", args.burst, t2, {})]
            for b in bursts:
                await measure(b, args.gap - 2.0 if b is bursts[0] else args.settle, planners, workers, etcd_pid)
            for w in workers:
                _stop(w)
            lags: dict[int, list[int]] = {t1: [], t2: []}
            for o in outs:
                if o.exists():
                    for planned, lag in json.loads(o.read_text()):
                        if planned in lags:
                            lags[planned].append(int(lag))
            print(f"{'burst':9} {'due':>9} {'started':>9} {'all by s':>10} {'p50 ms':>8} {'p99 ms':>8} "
                  f"{'starts/s':>10} {'CPU s':>7} {'us/exec = planners + workers + etcd'}")
            rates = [report(b, sorted(lags[b.due_ms])) for b in bursts]
            print(f"start rate, burst / baseline: {rates[1] / max(rates[0], 1e-9):.2f}")
            done = sorted(lags[t2])
            within = sum(1 for x in done if x <= GOAL_S * 1000)
            print(f"goal (issue 12, P5): {GOAL_N:,} due in one second all started within {GOAL_S:.0f} s; here "
                  f"{within:,} of {args.burst:,} started within {GOAL_S:.0f} s, the last after "
                  f"{max(done, default=0) / 1000:.1f} s")
    finally:
        stop_all(workers, planners, cluster)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="CI smoke: 2,000 and 200, no timing asserts")
    ap.add_argument("--burst", type=int, help="schedules due at T2 (default 100,000; --quick 2,000)")
    ap.add_argument("--baseline", type=int, help="schedules due at T1 (default 10,000; --quick 200)")
    ap.add_argument("--partitions", type=int, help="P (default 64; --quick 16)")
    add_cluster_args(ap, workers=2)
    ap.add_argument("--concurrency", type=int, default=2048, help="each worker's concurrent executions")
    ap.add_argument("--lookahead-ms", type=int, default=1000, help="the planners' materialization lookahead")
    ap.add_argument("--start-ahead-ms", type=int, default=0,
                    help="the planners' start_ahead_ms (at most --lookahead-ms; give workers --concurrency for the "
                         "runs they then hold)")
    ap.add_argument("--start-window", type=int, default=0,
                    help="the planners' start_window (0: adaptive, the default; a number past every worker's slots "
                         "is the window off)")
    ap.add_argument("--lead", type=float, help="seconds from the creates to T1 (default 25; --quick 6)")
    ap.add_argument("--gap", type=float, help="seconds from T1 to T2 (default 30; --quick 8)")
    ap.add_argument("--settle", type=float, help="seconds after T2 the run waits for starts (default 60; --quick 8)")
    ap.add_argument("--load-timeout", type=float, default=300.0)
    ap.add_argument("--workdir", help="keep etcd's data and the logs here instead of a temporary directory")
    args = ap.parse_args()
    args.burst = args.burst or (2_000 if args.quick else GOAL_N)
    args.baseline = args.baseline or (200 if args.quick else 10_000)
    args.partitions = args.partitions or (16 if args.quick else 64)
    args.lead = args.lead or (6.0 if args.quick else 25.0)
    args.gap = args.gap or (8.0 if args.quick else 30.0)
    args.settle = args.settle or (8.0 if args.quick else 60.0)
    with tempfile.TemporaryDirectory() as tmp_dir:
        workdir = Path(args.workdir or tmp_dir)
        workdir.mkdir(parents=True, exist_ok=True)
        asyncio.run(run(args, workdir))


if __name__ == "__main__":
    main()
