"""The `event_loop` setting: checked at start, naming the field (scheduler/eventloop.py)."""

from __future__ import annotations

import importlib.util

import pytest

from scheduler import eventloop
from scheduler.errors import InvalidArgument
from scheduler.planner.settings import PlannerSettings
from scheduler.worker.settings import WorkerSettings


def test_an_unknown_loop_is_refused_naming_the_field() -> None:
    with pytest.raises(InvalidArgument) as e:
        eventloop.check("event_loop", "trio")
    assert e.value.field == "event_loop" and "asyncio, uvloop" in str(e.value)


@pytest.mark.skipif(importlib.util.find_spec("uvloop") is not None, reason="uvloop is installed here")
def test_uvloop_asked_for_but_not_installed_is_refused_at_start() -> None:
    with pytest.raises(InvalidArgument, match="uvloop is not installed"):
        PlannerSettings(event_loop="uvloop").validate()


def test_both_processes_default_to_asyncio_and_run_on_it() -> None:
    assert PlannerSettings().event_loop == WorkerSettings().event_loop == "asyncio"

    async def which() -> str:
        import asyncio
        return type(asyncio.get_running_loop()).__module__

    assert eventloop.run(which(), "asyncio").startswith("asyncio")
