"""Scale: a 2-planner cluster holding N schedules (issue 12, P3: 1,000,000), as processes on this machine.

N schedules are written straight into etcd through `ScheduleStore.create_batch` (127 per txn, several
txns in flight: the API would take minutes). Of them, `--due` fire every second (`* * * * * *`, run by
no-op workers); the rest are yearly (`0 0 1 1 *`), held and planned but not due during the run. Then
the planners start together, claim and load their shares, and the cluster runs for a window. Printed:

- create rate (schedules/s through the store), etcd db size (total and in use) per schedule,
- per planner: schedules owned, claim/load time (spawn until every partition it owns has loaded: its
  `partition_loaded` log lines), RSS and peak RSS above an idle planner's (one with no schedules, started
  first in the same run) per owned schedule, the longest event-loop stall
  (`scheduler_event_loop_stall_max_seconds`), and the keepalive round trip (mean, p99 bucket),
- session losses (lease lost log lines and `scheduler_leases_lost_total`): must be 0,
- start lag p50 / p99 / max of the due executions during the window (worker start - planned time),
  and how many ran against how many were due.

    python bench/bench_scale.py                          # full: 1,000,000 schedules, 256 partitions, 60 s
    python bench/bench_scale.py --quick                  # CI smoke: 20,000 schedules, 32 partitions, 8 s
    python bench/bench_scale.py --schedules 300000 --window 30 --workdir /tmp/scale
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from chaos.infra.etcd import EtcdCluster, find_binary  # noqa: E402
from scheduler.clock import SYSTEM_CLOCK  # noqa: E402
from scheduler.model import Policies, Schedule  # noqa: E402
from scheduler.store.etcd import EtcdClient  # noqa: E402
from scheduler.store.keyspace import Keyspace  # noqa: E402
from scheduler.store.schedules import MAX_BATCH, ScheduleStore  # noqa: E402
from scheduler.timeplan import Overlap  # noqa: E402

sys.path.insert(0, str(ROOT / "bench"))
from bench_e2e import _spawn, _stop  # noqa: E402

PREFIX = "/scale"
SETTLE_S = 3.0  # after the window, before the workers stop


@dataclass
class Planner:
    name: str
    proc: subprocess.Popen[bytes]
    log: Path
    spawned: float
    api: str = ""
    metrics: str = ""
    loaded: dict[int, int] = field(default_factory=dict)  # partition -> schedules, latest load line
    load_seconds: dict[int, float] = field(default_factory=dict)
    ready_after: float | None = None
    lease_lost_lines: int = 0
    _offset: int = 0

    def read_log(self) -> None:
        with self.log.open("rb") as f:
            f.seek(self._offset)
            chunk = f.read()
        end = chunk.rfind(b"\n") + 1
        self._offset += end
        for line in chunk[:end].splitlines():
            try:
                d = json.loads(line)
            except ValueError:
                continue
            ev = d.get("event")
            if ev == "serving":
                self.api = str(d["address"])
            elif ev == "metrics_serving":
                self.metrics = str(d["address"])
            elif ev == "partition_loaded":
                self.loaded[int(d["partition"])] = int(d["schedules"])
                self.load_seconds[int(d["partition"])] = float(d["seconds"])
            elif "lease" in str(d.get("msg", "")) and "lost" in str(d.get("msg", "")):
                self.lease_lost_lines += 1


def scrape(address: str) -> dict[str, float]:
    """Unlabelled samples and label-summed totals of a Prometheus text page."""
    text = urllib.request.urlopen(f"http://{address}/metrics", timeout=10).read().decode()
    out: dict[str, float] = {}
    for m in re.finditer(r"^([a-zA-Z_:][\w:]*)(\{[^}]*\})? (\S+)$", text, re.M):
        out[m.group(1)] = out.get(m.group(1), 0.0) + float(m.group(3))
    return out


def renew_latency(address: str) -> tuple[float, float]:
    """(mean, p99 bucket bound) of the planner's acknowledged keepalive round trips, seconds: the keep-alive
    waits for the event loop twice per renewal (send, ack), so a starved loop shows here first."""
    text = urllib.request.urlopen(f"http://{address}/metrics", timeout=10).read().decode()
    buckets = [(float("inf") if m.group(1) == "+Inf" else float(m.group(1)), float(m.group(2))) for m in re.finditer(
        r'^scheduler_lease_renew_latency_seconds_bucket\{le="([^"]+)"\} (\S+)$', text, re.M)]
    total = re.search(r"^scheduler_lease_renew_latency_seconds_sum (\S+)$", text, re.M)
    count = re.search(r"^scheduler_lease_renew_latency_seconds_count (\S+)$", text, re.M)
    n = float(count.group(1)) if count else 0.0
    mean = float(total.group(1)) / n if total and n else float("nan")
    p99 = next((le for le, c in sorted(buckets) if n and c >= 0.99 * n), float("nan"))
    return mean, p99


def rss_kib(pid: int) -> tuple[int, int]:
    """(VmRSS, VmHWM: the peak) in KiB."""
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
    return int(fields["VmRSS"].split()[0]), int(fields["VmHWM"].split()[0])


async def create_all(store: ScheduleStore, n: int, due: int) -> float:
    """Write n schedules through the store in batched txns; returns schedules/s."""
    now = SYSTEM_CLOCK.wall_ms()
    pol = Policies(overlap=Overlap.ALLOW_ALL)

    def sched(i: int) -> Schedule:
        spec = "* * * * * *" if i < due else "0 0 1 1 *"
        return Schedule(id=f"s{i:07d}", tenant=f"t{i % 10}", spec=spec, worker_pool="bench", task_type="noop",
                        policies=pol)

    sem = asyncio.Semaphore(16)

    async def batch(lo: int) -> None:
        async with sem:
            await store.create_batch([sched(i) for i in range(lo, min(n, lo + MAX_BATCH))], now)

    t0 = time.monotonic()
    await asyncio.gather(*(batch(lo) for lo in range(0, n, MAX_BATCH)))
    return n / (time.monotonic() - t0)


async def idle_planner_rss(schedctl: str, cluster: EtcdCluster, args: argparse.Namespace, workdir: Path) -> int:
    """RSS (KiB) of a planner owning every partition of an empty prefix: the baseline of RSS per schedule."""
    log = workdir / "planner-idle.log"
    proc = _spawn([schedctl, "planner", "--node-id", "idle", "--etcd-endpoints", ",".join(cluster.endpoints),
                   "--etcd-prefix", PREFIX + "-idle", "--partitions", str(args.partitions), "--api-port", "0",
                   "--metrics-address", "127.0.0.1:0", "--log-level", "info"], log)
    try:
        idle = Planner("idle", proc, log, time.monotonic())
        while len(idle.loaded) < args.partitions:
            await asyncio.sleep(0.5)
            idle.read_log()
            assert proc.poll() is None, f"the idle planner exited; see {log}"
        await asyncio.sleep(2.0)
        return rss_kib(proc.pid)[0]
    finally:
        _stop(proc)


async def owners(kv: EtcdClient) -> dict[int, str]:
    r = await kv.range(f"{PREFIX}/owners/", prefix=True)
    return {int(x.key.rsplit(b"/", 1)[1]): str(json.loads(x.value)["node"]) for x in r.kvs}


def spawn_planners(schedctl: str, cluster: EtcdCluster, args: argparse.Namespace, workdir: Path,
                   lookahead_ms: int = 1000, extra: Sequence[str] = ()) -> list[Planner]:
    """`args.planners` planner processes on PREFIX (logs in workdir/planner{i}.log); `extra`: more planner flags."""
    out = []
    for i in range(args.planners):
        log = workdir / f"planner{i}.log"
        proc = _spawn([schedctl, "planner", "--node-id", f"p{i}", "--etcd-endpoints", ",".join(cluster.endpoints),
                       "--etcd-prefix", PREFIX, "--partitions", str(args.partitions), "--api-port", "0",
                       "--metrics-address", "127.0.0.1:0", "--log-level", "info", "--lookahead-ms",
                       str(lookahead_ms), "--lease-ttl", str(args.lease_ttl), "--rpc-timeout", str(args.rpc_timeout),
                       *extra], log)
        out.append(Planner(f"p{i}", proc, log, time.monotonic()))
    return out


def stop_all(workers: list[subprocess.Popen[bytes]], planners: list[Planner], cluster: EtcdCluster) -> None:
    """Workers first (their results still have planners to go to), then planners, then etcd."""
    for w in workers:
        _stop(w)
    for p in planners:
        _stop(p.proc)
    cluster.close()


def add_cluster_args(ap: argparse.ArgumentParser, workers: int) -> None:
    """The options both cluster benchmarks take (planners, workers, lease TTL, etcd call timeout)."""
    ap.add_argument("--planners", type=int, default=2)
    ap.add_argument("--workers", type=int, default=workers)
    ap.add_argument("--lease-ttl", type=int, default=5)
    ap.add_argument("--rpc-timeout", type=float, default=1.0,
                    help="the planners' etcd call timeout (a 2 s TTL needs 0.4: renew + 2 x rpc_timeout <= "
                         "TTL - margin)")


async def wait_loaded(kv: EtcdClient, planners: list[Planner], partitions: int, timeout: float, workdir: Path) -> None:
    """Until every partition is owned and every planner has loaded all it owns (`ready_after` set)."""
    loop = asyncio.get_running_loop()
    give_up = loop.time() + timeout
    while True:
        await asyncio.sleep(0.5)
        own = await owners(kv)
        for p in planners:
            if p.proc.poll() is not None:
                raise SystemExit(f"planner {p.name} exited ({p.proc.returncode}): {p.log.read_text()[-2000:]}")
            p.read_log()
            mine = {q for q, node in own.items() if node == p.name}
            if mine and mine <= p.loaded.keys() and p.ready_after is None:
                p.ready_after = time.monotonic() - p.spawned
            elif not mine <= p.loaded.keys():
                p.ready_after = None  # a rebalance handed it more: not ready yet
        if (len(own) == partitions and all(p.ready_after is not None for p in planners)
                and all(p.api and p.metrics for p in planners)):
            return
        if loop.time() > give_up:
            raise SystemExit(f"the cluster did not load within {timeout:.0f} s "
                             f"(owned {len(own)}/{partitions}); logs in {workdir}")


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
            rate = await create_all(store, args.schedules, args.due)
            etcd_metrics = scrape(cluster.endpoints[0])
            db, in_use = etcd_metrics["etcd_mvcc_db_total_size_in_bytes"], \
                etcd_metrics["etcd_mvcc_db_total_size_in_use_in_bytes"]
            print(f"created {args.schedules:,} schedules at {rate:,.0f}/s through ScheduleStore.create_batch; "
                  f"etcd db {db / 2**20:,.0f} MiB ({db / args.schedules:.0f} B per schedule), "
                  f"in use {in_use / 2**20:,.0f} MiB ({in_use / args.schedules:.0f} B per schedule)")
            schedctl = str(Path(sys.executable).parent / "schedctl")
            empty_rss = await idle_planner_rss(schedctl, cluster, args, workdir)
            print(f"an idle planner (no schedules, same settings) uses {empty_rss / 1024:.0f} MiB RSS: "
                  "the per-schedule figures below subtract it")
            planners += spawn_planners(schedctl, cluster, args, workdir)
            await wait_loaded(kv, planners, args.partitions, args.load_timeout, workdir)
            addrs = ",".join(p.api for p in planners)
            outs = [workdir / f"lags-{i}.json" for i in range(args.workers)]
            for i in range(args.workers):
                workers.append(_spawn([sys.executable, str(ROOT / "bench" / "noop_worker.py"), "--id", f"w{i}",
                                       "--planners", addrs, "--out", str(outs[i])], workdir / f"worker{i}.log"))
            await asyncio.sleep(args.warmup)
            w0 = SYSTEM_CLOCK.wall_ms()
            await asyncio.sleep(args.window)
            w1 = SYSTEM_CLOCK.wall_ms()
            # Runs planned just before w1 start up to a lag bound later: stopping the workers at w1 cut off
            # the window's last second (counted as not run) and the very lags being measured.
            await asyncio.sleep(SETTLE_S)
            own = await owners(kv)
            for w in workers:
                _stop(w)
            lags = sorted(lag for o in outs if o.exists() for planned, lag in json.loads(o.read_text())
                          if w0 <= planned < w1)
            due_in_window = args.due * round((w1 - w0) / 1000)
            load_avg = os.getloadavg()
            print(f"{'planner':8} {'owned':>9} {'schedules':>10} {'ready s':>8} {'load s (sum)':>12} "
                  f"{'+RSS MiB':>8} {'+peak MiB':>9} {'B/sched':>8} {'peak B/sched':>12} {'stall max s':>11} "
                  f"{'leases lost':>11} {'renew mean ms':>13} {'renew p99 <= ms':>15}")
            total_lost = 0
            for p in planners:
                p.read_log()
                m = scrape(p.metrics)
                mine_now = [q for q, node in own.items() if node == p.name]
                held = sum(p.loaded.get(q, 0) for q in mine_now)
                rss, peak = rss_kib(p.proc.pid)
                rss, peak = rss - empty_rss, peak - empty_rss  # what holding the schedules costs
                renew_mean, renew_p99 = renew_latency(p.metrics)
                lost = max(int(m.get("scheduler_leases_lost_total", 0)), p.lease_lost_lines)
                total_lost += lost
                print(f"{p.name:8} {len(mine_now):>9} {held:>10,} {p.ready_after or float('nan'):>8.1f} "
                      f"{sum(p.load_seconds.values()):>12.1f} {rss / 1024:>8.0f} {peak / 1024:>9.0f} "
                      f"{rss * 1024 / max(held, 1):>8.0f} {peak * 1024 / max(held, 1):>12.0f} "
                      f"{m.get('scheduler_event_loop_stall_max_seconds', float('nan')):>11.3f} {lost:>11} "
                      f"{renew_mean * 1000:>13.1f} {renew_p99 * 1000:>15.0f}")

            def pct(q: float) -> float:
                return float(lags[min(len(lags) - 1, int(q * len(lags)))]) if lags else float("nan")

            print(f"due executions in the {args.window:.0f} s window: {len(lags):,} ran of {due_in_window:,} due; "
                  f"start lag p50 {pct(0.5):.0f} ms, p99 {pct(0.99):.0f} ms, max {lags[-1] if lags else 0:.0f} ms")
            print(f"session losses: {total_lost} (must be 0); load average {load_avg[0]:.2f} "
                  f"{load_avg[1]:.2f} {load_avg[2]:.2f}")
    finally:
        stop_all(workers, planners, cluster)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="CI smoke: a small cluster, no timing asserts")
    ap.add_argument("--schedules", type=int, help="schedules held (default 1,000,000; --quick 20,000)")
    ap.add_argument("--due", type=int, help="of them, schedules due every second (default 500; --quick 50)")
    ap.add_argument("--partitions", type=int, help="P (default 256; --quick 32)")
    add_cluster_args(ap, workers=1)
    ap.add_argument("--window", type=float, help="measured seconds after loading (default 60; --quick 8)")
    ap.add_argument("--warmup", type=float, default=5.0, help="seconds between the workers' start and the window")
    ap.add_argument("--load-timeout", type=float, default=900.0)
    ap.add_argument("--workdir", help="keep etcd's data and the logs here instead of a temporary directory")
    args = ap.parse_args()
    args.schedules = args.schedules or (20_000 if args.quick else 1_000_000)
    args.due = args.due if args.due is not None else (50 if args.quick else 500)
    args.partitions = args.partitions or (32 if args.quick else 256)
    args.window = args.window or (8.0 if args.quick else 60.0)
    if args.quick:
        args.warmup = min(args.warmup, 3.0)
    with tempfile.TemporaryDirectory() as tmp_dir:
        workdir = Path(args.workdir or tmp_dir)
        workdir.mkdir(parents=True, exist_ok=True)
        asyncio.run(run(args, workdir))


if __name__ == "__main__":
    main()
