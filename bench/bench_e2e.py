"""End-to-end throughput on this machine: etcd, planner(s) and worker(s) as separate processes.

N schedules fire every second (`* * * * * *`, so N executions/s are due), a no-op handler runs them.
Measured over a steady window after a warm-up, all in the same run:

- executions/s durably materialized (execution keys created in etcd during the window),
- executions/s completed end to end (no-op handler runs that started in the window, whatever their
  planned time: under overload the planned times being run fall behind the window),
- start lag p50 / p99 / max (worker start time minus planned time),
- etcd requests per execution (etcd's own grpc_server_handled_total, window delta / completed),
- CPU per completed execution, whole stack: planners, workers and etcd (/proc/<pid>/stat, window delta),
- the ceiling: raw etcd batched-put throughput (txns of 100 puts) measured first on an etcd of its
  own, stopped before the measured cluster starts, and the ratio materialized / ceiling. (On the
  cluster's own etcd the ceiling's 700k keys written and deleted left etcd busy, 0.6-0.7 core and
  2.5-3 GiB, through the window, and the planners measured 2,962-3,738/s where they keep up at 5,000.)

    python bench/bench_e2e.py                 # full: 3 offered rates, 40 s windows
    python bench/bench_e2e.py --quick         # CI smoke: one small rate, 6 s window
    python bench/bench_e2e.py --rates 2000,5000 --planners 2 --workers 2 --seconds 60
    python bench/bench_e2e.py --secure --rates 3000   # each rate plaintext, then mTLS + authorization
    python bench/bench_e2e.py --materialize-only --rates 20000 --planners 2   # issue 12's P1: materialization alone
    python bench/bench_e2e.py --compare-gc --rates 5000 --planners 2 --workers 2 --repeat 2   # collector threshold
    python bench/bench_e2e.py --compare-reserve --rates 2000,5000 --planners 2 --workers 2 --repeat 2
    python bench/bench_e2e.py --compare-ahead 800 --rates 2000 --planners 2 --workers 2 --repeat 2   # start ahead
    python bench/bench_e2e.py --compare-window --rates 2000,4000 --planners 2 --workers 2 --repeat 2   # start window

`--secure` runs every rate twice in the same session, the second time with the worker path secured as
production runs it (issue 14): the planners serve mutual TLS (certificates from `schedctl certs dev`) with
an auth file, and the workers dial with their certificate, whose CN maps to `bench:worker` (the pool's
worker role); so every stream is authenticated and every result, start and assignment goes through the
pool and tenant scope. etcd stays plaintext in both: its link is not the dispatch path. It prints the
secure / plaintext ratios of completed/s and lag p99.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from chaos.infra.etcd import EtcdCluster, find_binary, free_port  # noqa: E402
from scheduler.clock import SYSTEM_CLOCK  # noqa: E402
from scheduler.model import Policies, Schedule  # noqa: E402
from scheduler.planner.settings import PlannerSettings  # noqa: E402
from scheduler.store.etcd import EtcdClient  # noqa: E402
from scheduler.store.etcd.ops import put  # noqa: E402
from scheduler.store.keyspace import Keyspace  # noqa: E402
from scheduler.store.schedules import ScheduleStore  # noqa: E402
from scheduler.timeplan import Overlap  # noqa: E402

PARTITIONS = 32
PREFIX = "/bench"


@dataclass
class Result:
    rate: int
    materialized_per_s: float
    completed_per_s: float
    lag_p50: float
    lag_p99: float
    lag_max: float
    etcd_requests_per_exec: float
    ceiling_keys_per_s: float
    # CPU time over the window per completed execution, in microseconds: planners, workers, etcd.
    cpu_us: tuple[float, float, float] = (float("nan"),) * 3


_TICK = os.sysconf("SC_CLK_TCK")


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of a live process (/proc/<pid>/stat fields 14 and 15)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / _TICK


def _metric_total(url: str) -> float:
    text = urllib.request.urlopen(url, timeout=5).read().decode()
    return sum(float(m.group(1)) for m in re.finditer(r'^grpc_server_handled_total\{[^}]*\} (\S+)$', text, re.M))


async def ceiling(kv: EtcdClient, seconds: float) -> float:
    """Raw etcd batched-put throughput from this process: txns of 100 puts, 8 in flight."""
    n = 0
    end = time.monotonic() + seconds

    async def one(i: int) -> None:
        nonlocal n
        while time.monotonic() < end:
            await kv.txn([], [put(f"/ceiling/{i}/{n + j}", b"x" * 200) for j in range(100)])
            n += 100

    t0 = time.monotonic()
    await asyncio.gather(*(one(i) for i in range(8)))
    return n / (time.monotonic() - t0)


async def ceiling_alone(etcd_bin: str, workdir: Path, seconds: float) -> float:
    """`ceiling` on a throw-away etcd: the measured cluster's etcd never holds (or compacts) its keys."""
    cluster = EtcdCluster(workdir, binary=etcd_bin).start()
    try:
        async with EtcdClient(cluster.config(timeout=5.0)) as kv:
            return await ceiling(kv, seconds)
    finally:
        cluster.close()


def _spawn(argv: list[str], log: Path) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SCHED_")}
    with log.open("ab") as f:
        return subprocess.Popen(argv, stdout=f, stderr=f, stdin=subprocess.DEVNULL, env=env)


def _stop(p: subprocess.Popen[bytes]) -> None:
    if p.poll() is None:
        os.kill(p.pid, signal.SIGTERM)
        try:
            p.wait(20)
        except subprocess.TimeoutExpired:
            os.kill(p.pid, signal.SIGKILL)
            p.wait()


def _secure_files(workdir: Path) -> tuple[list[str], list[str]]:
    """(planner flags, worker flags) for mTLS + authorization, with throw-away certificates."""
    from scheduler.certs import dev_certs

    certs = workdir / "certs"
    if not (certs / "ca.crt").exists():
        dev_certs(certs)
    auth = workdir / "auth.toml"
    auth.write_text('[certs]\n"planner" = ["system:planner"]\n"worker" = ["bench:worker"]\n')
    planner = ["--tls-cert-file", str(certs / "planner.crt"), "--tls-key-file", str(certs / "planner.key"),
               "--tls-ca-file", str(certs / "ca.crt"), "--auth-file", str(auth)]
    worker = ["--tls-ca-file", str(certs / "ca.crt"), "--tls-cert-file", str(certs / "worker.crt"),
              "--tls-key-file", str(certs / "worker.key")]
    return planner, worker


async def run_rate(rate: int, args: argparse.Namespace, workdir: Path, secure: bool = False,
                   loop: str = "asyncio", gc_threshold: int | None = None, reserve: bool | None = None,
                   ahead: int | None = None, start_window: int | None = None) -> Result:
    workdir = workdir / (("secure" if secure else "plain") + ("" if loop == "asyncio" else f"-{loop}")
                         + ("" if gc_threshold is None else f"-gc{gc_threshold}")
                         + ("" if reserve is None else f"-reserve-{reserve}".lower())
                         + ("" if ahead is None else f"-ahead-{ahead}")
                         + ("" if start_window is None else f"-window-{start_window}"))
    workdir.mkdir(parents=True, exist_ok=True)
    sec_planner, sec_worker = _secure_files(workdir) if secure else ([], [])
    sec_planner, sec_worker = [*sec_planner, "--event-loop", loop], [*sec_worker, "--event-loop", loop]
    if gc_threshold is not None:  # planners and workers alike (both set it by default)
        sec_planner += ["--gc-threshold", str(gc_threshold)]
        sec_worker += ["--gc-threshold", str(gc_threshold)]
    if reserve is not None:  # planners only: the first attempt reserved in the create, or every dispatch written
        sec_planner += ["--reserve-first-attempt", "true" if reserve else "false"]
    if ahead is not None:  # planners only: runs handed to workers this long before they are due (0: off)
        sec_planner += ["--start-ahead-ms", str(ahead)]
    if start_window is not None:  # planners only: the start window (0: adaptive; past every slot count: off)
        sec_planner += ["--start-window", str(start_window)]
    etcd_bin = find_binary("etcd")
    assert etcd_bin, "etcd not found: run scripts/setup.sh"
    ceil = await ceiling_alone(etcd_bin, workdir / f"etcd-ceiling-{rate}", 3.0 if args.quick else 8.0)
    cluster = EtcdCluster(workdir / f"etcd-{rate}", binary=etcd_bin, auto_compaction_mode="periodic",
                          auto_compaction_retention="1m").start()
    procs: list[subprocess.Popen[bytes]] = []
    try:
        async with EtcdClient(cluster.config(timeout=5.0)) as kv:
            store = ScheduleStore(kv, Keyspace(PREFIX), PARTITIONS, timeout=5.0)
            now = SYSTEM_CLOCK.wall_ms()
            pol = Policies(overlap=Overlap.ALLOW_ALL)
            # --materialize-only: nothing is due before the window ends (the schedules start after it), and the
            # planners write 60 s ahead: the window measures materialization alone, on a backlog it cannot drain
            # (rate / 2000 s: creating the schedules takes about that long).
            begin = now + int((args.warmup + args.seconds + 5 + rate / 2000) * 1000) if args.materialize_only else None
            for start in range(0, rate, 200):
                await asyncio.gather(*(store.create(Schedule(id=f"b{i:06d}", tenant=f"t{i % 10}", spec="* * * * * *",
                                                             worker_pool="bench", task_type="noop", policies=pol,
                                                             start_ms=begin), now)
                                       for i in range(start, min(rate, start + 200))))
            ports = [free_port() for _ in range(args.planners)]
            addrs = ",".join(f"127.0.0.1:{p}" for p in ports)
            schedctl = str(Path(sys.executable).parent / "schedctl")
            for i, port in enumerate(ports):
                procs.append(_spawn([schedctl, "planner", "--node-id", f"p{i}", "--etcd-endpoints",
                                     ",".join(cluster.endpoints), "--etcd-prefix", PREFIX,
                                     "--partitions", str(PARTITIONS), "--api-port", str(port),
                                     "--log-level", args.log_level,
                                     "--lookahead-ms", "60000" if args.materialize_only else "1000",
                                     "--retention-ms", "600000", "--retention-count", "100000", *sec_planner],
                                    workdir / f"planner{i}.log"))
            outs = [workdir / f"lags-{rate}-{i}.json" for i in range(args.workers)]
            for i in range(args.workers):
                procs.append(_spawn([sys.executable, str(ROOT / "bench" / "noop_worker.py"), "--id", f"w{i}",
                                     "--planners", addrs, "--out", str(outs[i]),
                                     "--concurrency", str(args.worker_concurrency), *sec_worker],
                                    workdir / f"worker{i}.log"))
            await asyncio.sleep(args.warmup)
            metrics = f"http://{cluster.endpoints[0]}/metrics"  # etcd serves Prometheus metrics on its client URL
            rev0 = (await kv.range("/none")).revision
            req0 = _metric_total(metrics)
            roles = (procs[:args.planners], procs[args.planners:], [m.process for m in cluster.members if m.process])
            cpu0 = [sum(_cpu_s(p.pid) for p in ps) for ps in roles]
            w0 = SYSTEM_CLOCK.wall_ms()
            await asyncio.sleep(args.seconds)
            w1 = SYSTEM_CLOCK.wall_ms()
            cpu1 = [sum(_cpu_s(p.pid) for p in ps) for ps in roles]
            rev1 = (await kv.range("/none")).revision
            req1 = _metric_total(metrics)
            # Keys, not count_only: etcd's `count` ignores the revision filters (it counts the whole
            # range), which made every earlier run report all keys ever created as "in the window".
            created = len((await kv.range(f"{PREFIX}/executions/", prefix=True, keys_only=True,
                                          min_create_revision=rev0 + 1, max_create_revision=rev1,
                                          timeout=120.0)).kvs)  # up to a million keys on a busy etcd
            for p in procs[args.planners:]:
                _stop(p)
            lags: list[tuple[int, int]] = []
            for o in outs:
                if o.exists():
                    lags += [(int(a), int(b)) for a, b in json.loads(o.read_text())]
            # Starts that happened in the window (start = planned + lag), whatever their planned time:
            # under overload the planned times being run lag the window, and counting by planned time
            # would report a saturated system as idle.
            window = [lag for planned, lag in lags if w0 <= planned + lag < w1]
            window.sort()
            span = (w1 - w0) / 1000
            done = len(window)

            def pct(q: float) -> float:
                return float(window[min(len(window) - 1, int(q * len(window)))]) if window else float("nan")

            # CPU per completed execution; with --materialize-only, per materialized one (nothing completes).
            per = created if args.materialize_only else done
            us = [(b - a) * 1e6 / max(per, 1) for a, b in zip(cpu0, cpu1, strict=True)]
            return Result(rate, created / span, done / span, pct(0.5), pct(0.99), float(window[-1]) if window else
                          float("nan"), (req1 - req0) / max(done, 1), ceil, (us[0], us[1], us[2]))
    finally:
        for p in procs:
            _stop(p)
        cluster.close()


def _row(r: Result, label: str) -> None:
    print(f"{r.rate:>9} {r.materialized_per_s:>14.0f} {r.completed_per_s:>11.0f} {r.lag_p50:>10.0f} "
          f"{r.lag_p99:>7.0f} {r.lag_max:>7.0f} {r.etcd_requests_per_exec:>13.2f} "
          f"{r.ceiling_keys_per_s:>14.0f} {r.materialized_per_s / r.ceiling_keys_per_s:>11.3f} "
          f"{sum(r.cpu_us):>9.0f} = {r.cpu_us[0]:.0f} + {r.cpu_us[1]:.0f} + {r.cpu_us[2]:.0f} {label}", flush=True)


# What an A/B comparison prints, as a ratio B / A per pair.
_MEASURES: list[tuple[str, Callable[[Result], float]]] = [
    ("materialized/s", lambda r: r.materialized_per_s), ("completed/s", lambda r: r.completed_per_s),
    ("lag p99", lambda r: r.lag_p99), ("CPU us/exec", lambda r: sum(r.cpu_us)),
    ("planner CPU us/exec", lambda r: r.cpu_us[0]), ("worker CPU us/exec", lambda r: r.cpu_us[1])]


def _alternate(rate: int, args: argparse.Namespace, workdir: Path, a: tuple[str, dict[str, Any]],
               b: tuple[str, dict[str, Any]]) -> None:
    """Runs A and B alternating (A B B A ...), so that a drift of the machine hits both alike; each is a
    (label, run_rate keyword arguments) pair. Prints every run, then B / A per pair for each measure."""
    got: dict[str, list[Result]] = {a[0]: [], b[0]: []}
    for i in range(args.repeat):
        for label, kw in ((a, b) if i % 2 == 0 else (b, a)):
            r = asyncio.run(run_rate(rate, args, workdir / f"{label}-{i}", **kw))
            got[label].append(r)
            _row(r, label)
    for name, f in _MEASURES:
        ratios = [f(y) / max(f(x), 1e-9) for x, y in zip(got[a[0]], got[b[0]], strict=True)]
        print(f"{rate:>9} {b[0]} / {a[0]} {name}: " + ", ".join(f"{q:.3f}" for q in ratios), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--rates", default=None, help="offered executions/s, comma-separated")
    ap.add_argument("--planners", type=int, default=1)
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--seconds", type=float, default=None)
    ap.add_argument("--warmup", type=float, default=None)
    ap.add_argument("--log-level", default="warning")
    ap.add_argument("--workdir", default=None, help="keep logs here instead of a temporary directory")
    ap.add_argument("--secure", action="store_true", help="each rate also with mTLS + authorization; ratios")
    ap.add_argument("--compare-loops", action="store_true",
                    help="each rate on asyncio's loop and on uvloop (planners and workers), alternating; ratios")
    ap.add_argument("--compare-gc", action="store_true",
                    help="each rate with the processes' collector at CPython's threshold (700) and the default; ratios")
    ap.add_argument("--compare-reserve", action="store_true",
                    help="each rate with every dispatch written and with the first attempt reserved in the create "
                         "(reserve_first_attempt), alternating; ratios")
    ap.add_argument("--compare-ahead", type=int, default=0, metavar="MS",
                    help="each rate without start ahead and with start_ahead_ms MS (at most 1000: the lookahead), "
                         "alternating; ratios (give workers room for the runs they hold: --worker-concurrency)")
    ap.add_argument("--compare-window", action="store_true",
                    help="each rate with the start window off (a fixed size past every slot count) and adaptive "
                         "(the default), alternating; ratios")
    ap.add_argument("--worker-concurrency", type=int, default=512,
                    help="each no-op worker's concurrency (a run handed out ahead holds a slot until it ends)")
    ap.add_argument("--repeat", type=int, default=1,
                    help="with --compare-loops, --compare-gc, --compare-reserve, --compare-ahead or "
                         "--compare-window: pairs per rate")
    ap.add_argument("--materialize-only", action="store_true",
                    help="P1: schedules start after the window, planners write 60 s ahead: materialization alone "
                         "(CPU per materialized execution)")
    args = ap.parse_args()
    rates = [int(r) for r in (args.rates or ("200" if args.quick else "1000,2000,4000")).split(",")]
    args.seconds = args.seconds or (6.0 if args.quick else 40.0)
    args.warmup = args.warmup or (6.0 if args.quick else 10.0)
    with tempfile.TemporaryDirectory() as tmp_dir:
        tmp = args.workdir or tmp_dir
        Path(tmp).mkdir(parents=True, exist_ok=True)
        print(f"{'offered/s':>9} {'materialized/s':>14} {'completed/s':>11} {'lag p50 ms':>10} {'p99 ms':>7} "
              f"{'max ms':>7} {'etcd req/exec':>13} {'ceiling keys/s':>14} {'mat/ceiling':>11} "
              f"{'CPU us/exec planners+workers+etcd':>33}")
        for rate in rates:
            if args.compare_loops:
                _alternate(rate, args, Path(tmp) / str(rate), ("asyncio", {"loop": "asyncio"}),
                           ("uvloop", {"loop": "uvloop"}))
                continue
            if args.compare_gc:  # planners and workers: CPython's threshold against the default gc_threshold
                default = PlannerSettings().gc_threshold
                _alternate(rate, args, Path(tmp) / str(rate), ("gc700", {"gc_threshold": 700}),
                           (f"gc{default}", {"gc_threshold": default}))
                continue
            if args.compare_ahead:  # docs/workers.md, "Start ahead"
                _alternate(rate, args, Path(tmp) / str(rate), ("now", {"ahead": 0}),
                           (f"ahead{args.compare_ahead}", {"ahead": args.compare_ahead}))
                continue
            if args.compare_window:  # docs/operations.md, "Overload": the start window
                _alternate(rate, args, Path(tmp) / str(rate), ("nowindow", {"start_window": 10_000_000}),
                           ("window", {"start_window": 0}))
                continue
            if args.compare_reserve:  # docs/keyspace.md, "Reserved first attempt"
                _alternate(rate, args, Path(tmp) / str(rate), ("written", {"reserve": False}),
                           ("reserved", {"reserve": True}))
                continue
            runs = [asyncio.run(run_rate(rate, args, Path(tmp) / str(rate)))]
            if args.secure:
                runs.append(asyncio.run(run_rate(rate, args, Path(tmp) / str(rate), secure=True)))
            for r, label in zip(runs, ("", " mTLS+auth"), strict=False):
                print(f"{r.rate:>9} {r.materialized_per_s:>14.0f} {r.completed_per_s:>11.0f} {r.lag_p50:>10.0f} "
                      f"{r.lag_p99:>7.0f} {r.lag_max:>7.0f} {r.etcd_requests_per_exec:>13.2f} "
                      f"{r.ceiling_keys_per_s:>14.0f} {r.materialized_per_s / r.ceiling_keys_per_s:>11.3f} "
                      f"{sum(r.cpu_us):>9.0f} = {r.cpu_us[0]:.0f} + {r.cpu_us[1]:.0f} + {r.cpu_us[2]:.0f}{label}")
            if args.secure:
                plain, sec = runs
                done = sec.completed_per_s / plain.completed_per_s
                p50, p99 = sec.lag_p50 / max(plain.lag_p50, 1), sec.lag_p99 / max(plain.lag_p99, 1)
                print(f"{rate:>9} secure / plaintext: completed/s {done:.3f}, lag p50 {p50:.2f}, p99 {p99:.2f}")


if __name__ == "__main__":
    main()
