"""Next-fire cost: our engine vs croniter's get_next, same expressions, zones and start times, same run.

Two access patterns, both measured for every case:
  successive  n next-fires in a row from 2026-01-01 (iteration; covers many years for monthly specs);
  scattered   one next-fire from each of n start instants spread over 2026-2027, the planner's pattern
              (one next-fire per execution, near "now"); croniter reuses one object via set_current,
              so neither side pays for parsing.
Prints per-case microseconds and the ratio (croniter / ours), then the geometric mean of the ratios.
The issue's target is a ratio of at least 5. Absolute numbers vary with the machine's load;
the ratio is what to compare, since both run interleaved in one process.

    python bench/bench_nextfire.py            # full: 20,000 successive next-fires per case, 5 rounds
    python bench/bench_nextfire.py --quick    # CI smoke: 2,000 per case, 1 round
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

from croniter import croniter

from scheduler.timeplan import parse_spec

CASES: list[tuple[str, str]] = [
    ("*/5 * * * *", "UTC"),
    ("0 9 * * 1-5", "UTC"),
    ("*/5 * * * *", "America/New_York"),
    ("0 9 * * 1-5", "America/New_York"),
    ("30 2 * * *", "Europe/London"),
    ("0 0 1,15 * *", "Asia/Kolkata"),
    ("15 10 L * *", "Australia/Lord_Howe"),
    ("0 12 * * 1#2", "Europe/Berlin"),
    ("*/10 * * * * *", "UTC"),
    ("0 */2 * JAN-JUN MON-FRI", "America/Santiago"),
]
START = datetime(2026, 1, 1, tzinfo=UTC)


def _time(fn: Callable[[], None]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def run_case(expr: str, tz: str, n: int, scattered: bool) -> tuple[float, float]:
    """Seconds per next-fire (ours, croniter)."""
    plan = parse_spec(expr, tz=tz)
    zone = ZoneInfo(tz)
    six = len(expr.split()) == 6
    rng = random.Random(42)
    span = 2 * 365 * 86400
    starts = [START + timedelta(seconds=rng.randrange(span)) for _ in range(n)]
    starts_local = [s.astimezone(zone) for s in starts]
    plan.next_after(START)  # warm the zone table over the whole range, as a long-running planner has it
    plan.next_after(max(starts))

    def ours() -> None:
        if scattered:
            for s in starts:
                plan.next_after(s)
            return
        t = START
        for _ in range(n):
            nxt = plan.next_after(t)
            assert nxt is not None
            t = nxt

    def theirs() -> None:
        it = croniter(expr, START.astimezone(zone), second_at_beginning=six)
        if scattered:
            for s in starts_local:
                it.set_current(s, force=True)
                it.get_next(datetime)
            return
        for _ in range(n):
            it.get_next(datetime)

    return _time(ours) / n, _time(theirs) / n


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    n, rounds = (2_000, 1) if args.quick else (20_000, 5)
    for scattered in (True, False):
        mode = "scattered" if scattered else "successive"
        ratios = []
        print(f"\n[{mode}] {'expression':<28} {'zone':<20} {'ours µs':>8} {'croniter µs':>12} {'ratio':>6}")
        for expr, tz in CASES:
            samples = [run_case(expr, tz, n, scattered) for _ in range(rounds)]
            ours = statistics.median(s[0] for s in samples) * 1e6
            theirs = statistics.median(s[1] for s in samples) * 1e6
            ratios.append(theirs / ours)
            print(f"{'':<{len(mode) + 3}}{expr:<28} {tz:<20} {ours:8.2f} {theirs:12.2f} {theirs / ours:6.1f}x")
        gmean = math.exp(sum(math.log(r) for r in ratios) / len(ratios))
        print(f"[{mode}] geometric mean ratio (croniter / ours): {gmean:.1f}x (min {min(ratios):.1f}x; target >= 5x)")


if __name__ == "__main__":
    main()
