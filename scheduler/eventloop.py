"""The event loop a long-running process (planner, worker) runs on: the `event_loop` setting.

`asyncio` is the standard library's loop; `uvloop` is libuv's (MagicStack's uvloop), started with
`uvloop.run()` (its `install()` and event-loop policies are deprecated from Python 3.12). grpc.aio runs on
either. Which one is the default is decided by `bench/bench_e2e.py --compare-loops` (bench/README.md)."""

from __future__ import annotations

import asyncio
import importlib.util
from collections.abc import Coroutine
from typing import Any, TypeVar, cast

from scheduler.errors import InvalidArgument

T = TypeVar("T")

LOOPS = ("asyncio", "uvloop")


def check(field: str, kind: str) -> None:
    """At start: a known loop, and uvloop installed if it is the one asked for."""
    if kind not in LOOPS:
        raise InvalidArgument(field, f"{kind!r} is not one of {', '.join(LOOPS)}")
    if kind == "uvloop" and importlib.util.find_spec("uvloop") is None:
        raise InvalidArgument(field, "uvloop is not installed (pip install uvloop), or set it to asyncio")


def run(main: Coroutine[Any, Any, T], kind: str) -> T:
    if kind == "uvloop":
        # Imported only when asked for (the CLI's start time does not pay for it), and by name: uvloop is an
        # optional install, so neither mypy nor a clean checkout has it.
        uvloop = importlib.import_module("uvloop")
        return cast(T, uvloop.run(main))
    return asyncio.run(main)
