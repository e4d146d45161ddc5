"""`schedctl` start time: each command run N times as a subprocess, median wall time, against
`python -c pass` run interleaved in the same session (the interpreter's own start is the floor no CLI
change can go under; the ratio is what to compare across machines and loads).

Commands run exactly as the installed `schedctl` script runs them (`from scheduler.cli.main import main`).
`preview` and `--help` need no server; `schedule --help` loads its command module (grpc included) and
shows what a server command costs to start.

    python bench/bench_cli.py            # 21 runs of each
    python bench/bench_cli.py --quick    # 3 runs of each (CI smoke: no timing asserts)
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

ENTRY = "from scheduler.cli.main import main; raise SystemExit(main())"
CASES: dict[str, list[str]] = {
    "python -c pass (baseline)": ["-c", "pass"],
    "schedctl --help": ["-c", ENTRY, "--help"],
    "schedctl preview": ["-c", ENTRY, "preview", "--cron", "30 2 * * *", "--tz", "America/New_York",
                         "--start", "2026-03-06T00:00:00Z", "--count", "4"],
    "schedctl schedule --help (loads grpc)": ["-c", ENTRY, "schedule", "--help"],
}


def once(args: list[str]) -> float:
    t0 = time.perf_counter()
    subprocess.run([sys.executable, *args], check=True, stdout=subprocess.DEVNULL, timeout=60)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="3 runs of each, for CI")
    ap.add_argument("--runs", type=int, help="runs of each command (default 21, --quick 3)")
    args = ap.parse_args()
    runs = args.runs or (3 if args.quick else 21)
    times: dict[str, list[float]] = {name: [] for name in CASES}
    for argv in CASES.values():  # warm the page cache and .pyc files once, unmeasured
        once(argv)
    for _ in range(runs):  # interleaved: A B C D A B C D ..., so load changes hit every case alike
        for name, argv in CASES.items():
            times[name].append(once(argv))
    base = statistics.median(times["python -c pass (baseline)"])
    print(f"load average {os.getloadavg()[0]:.2f}, {runs} runs each, median wall time")
    print(f"{'command':42} {'median ms':>10} {'/ baseline':>11} {'minus baseline ms':>18}")
    for name, ts in times.items():
        m = statistics.median(ts)
        print(f"{name:42} {m * 1000:10.1f} {m / base:10.2f}x {(m - base) * 1000:18.1f}")


if __name__ == "__main__":
    main()
