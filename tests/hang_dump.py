"""When a test has run for most of its pytest-timeout, print every asyncio task's stack to stderr.

pytest-timeout dumps the threads' stacks, and a hung asyncio test is a main thread idle in select():
what waits on what is only in the tasks. A timer thread sends SIGUSR1 to the process shortly before
the timeout; the handler (run by Python in the main thread) prints `asyncio.all_tasks()` with stacks.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import threading
from collections.abc import Iterator
from types import FrameType

DUMP_AFTER_S = float(os.environ.get("SCHED_TEST_DUMP_AFTER", "240"))


def dump_tasks(_signum: int = 0, _frame: FrameType | None = None) -> None:
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        loop = None
    tasks = asyncio.all_tasks(loop) if loop is not None else set()
    print(f"\n===== {len(tasks)} asyncio tasks (test running for {DUMP_AFTER_S:.0f} s) =====", file=sys.stderr)
    for t in tasks:
        print(f"--- {t!r}", file=sys.stderr)
        with contextlib.suppress(Exception):
            t.print_stack(limit=25, file=sys.stderr)
    sys.stderr.flush()


def install() -> None:
    if hasattr(signal, "SIGUSR1"):
        signal.signal(signal.SIGUSR1, dump_tasks)


@contextlib.contextmanager
def watching() -> Iterator[None]:
    """Arm the dump for one test (setup, call and teardown)."""
    timer = threading.Timer(DUMP_AFTER_S, os.kill, (os.getpid(), signal.SIGUSR1))
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()
