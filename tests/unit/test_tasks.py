"""cancel_and_wait absorbs the stopped task's cancellation but never the caller's own."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from scheduler.tasks import cancel_and_wait


async def test_the_tasks_cancellation_is_absorbed() -> None:
    t = asyncio.create_task(asyncio.sleep(10))
    await asyncio.sleep(0)
    await cancel_and_wait(t)
    assert t.cancelled()


async def test_the_callers_cancellation_is_not_swallowed() -> None:
    """The old `suppress(CancelledError): await task` let a stopper cancelled mid-wait carry on."""
    release = asyncio.Event()

    async def stubborn() -> None:  # takes a while to stop (cleans up after its cancellation)
        try:
            await asyncio.sleep(10)
        finally:
            await release.wait()

    inner = asyncio.create_task(stubborn())
    carried_on = False

    async def stopper() -> None:
        nonlocal carried_on
        await cancel_and_wait(inner)
        carried_on = True

    outer = asyncio.create_task(stopper())
    await asyncio.sleep(0.01)
    outer.cancel()  # a shutdown asks the stopper itself to stop while it waits
    release.set()
    with pytest.raises(asyncio.CancelledError):
        await outer
    assert not carried_on


async def test_other_errors_propagate() -> None:
    async def broken() -> None:
        try:
            await asyncio.sleep(10)
        finally:
            raise RuntimeError("cleanup failed")

    t = asyncio.create_task(broken())
    await asyncio.sleep(0)
    with pytest.raises(RuntimeError):
        await cancel_and_wait(t)
    with contextlib.suppress(BaseException):
        await t
