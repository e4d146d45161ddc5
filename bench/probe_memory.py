"""Bytes per held schedule on a planner, measured with tracemalloc (issue 12: goal <= 1 KiB).

Decodes N encoded schedules the way a claim does (decode_stored_schedule -> StoredSchedule ->
Materializer.track) and prints the traced bytes per schedule and the top allocation sites.

    .venv/bin/python bench/probe_memory.py --count 100000
"""

from __future__ import annotations

import argparse
import time
import tracemalloc

from scheduler.clock import SystemClock
from scheduler.model import Schedule
from scheduler.planner.materialize import Materializer
from scheduler.planner.settings import PlannerSettings
from scheduler.store.codec import decode_stored_schedule, encode_schedule
from scheduler.store.schedules import StoredSchedule


def records(n: int) -> list[bytes]:
    out = []
    for i in range(n):
        s = Schedule(id=f"s{i:07d}", tenant=f"t{i % 10}", spec="0 0 1 1 *", worker_pool="bench", task_type="noop")
        out.append(encode_schedule(s, activated_ms=1_700_000_000_000))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--count", type=int, default=100_000)
    ap.add_argument("--top", type=int, default=12)
    a = ap.parse_args()
    values = records(a.count)
    m = Materializer(0, PlannerSettings(), SystemClock(), set())
    tracemalloc.start()
    t0 = time.perf_counter()
    for i, v in enumerate(values):
        s, activated, meta = decode_stored_schedule(v, i + 1)
        m.track(StoredSchedule(s, activated, 0, meta), activated)
    dt = time.perf_counter() - t0
    snap = tracemalloc.take_snapshot()
    size, _ = tracemalloc.get_traced_memory()
    print(f"{a.count} schedules: {size / a.count:.0f} B per schedule traced, {dt / a.count * 1e6:.1f} us each "
          "(under tracemalloc)")
    for st in snap.statistics("lineno")[: a.top]:
        print(f"  {st.size / a.count:7.0f} B/schedule  {st.traceback}")


if __name__ == "__main__":
    main()
