"""The planner process's garbage-collector settings (scheduler/loop_lag.py: `tune_collector`, `collect_soon`)."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Iterator

import pytest

from scheduler import loop_lag
from scheduler.errors import InvalidArgument
from scheduler.planner.settings import PlannerSettings
from scheduler.worker import WorkerSettings


@pytest.fixture
def thresholds() -> Iterator[None]:
    before = gc.get_threshold()
    yield
    gc.set_threshold(*before)


def test_a_planner_raises_generation_0_and_keeps_the_full_collection_ratios(thresholds: None) -> None:
    loop_lag.tune_collector(PlannerSettings().gc_threshold)
    assert gc.get_threshold() == (50_000, 10, 10)


def test_zero_leaves_the_collector_as_it_is(thresholds: None) -> None:
    gc.set_threshold(1234, 5, 6)
    loop_lag.tune_collector(0)
    assert gc.get_threshold() == (1234, 5, 6)


@pytest.mark.parametrize("settings", [PlannerSettings, WorkerSettings])
@pytest.mark.parametrize("bad", [1, 699, 1_000_001, -5])
def test_a_threshold_out_of_range_is_refused_naming_the_field(settings: type[PlannerSettings | WorkerSettings],
                                                              bad: int) -> None:
    with pytest.raises(InvalidArgument) as e:
        settings(gc_threshold=bad).validate()
    assert e.value.field == "gc_threshold"


def test_schedctl_worker_and_planner_default_to_the_same_threshold() -> None:
    assert WorkerSettings().gc_threshold == PlannerSettings().gc_threshold == 50_000


async def test_dropped_partitions_ask_for_one_full_collection_at_a_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """A lost session drops every partition at once: one collection, a second later (once their tasks ended)."""
    monkeypatch.setattr(loop_lag, "_collect_at", [0.0])
    calls: list[float] = []
    loop = asyncio.get_running_loop()
    monkeypatch.setattr(loop, "call_later", lambda delay, fn: calls.append(delay))
    for _ in range(16):
        loop_lag.collect_soon()
    assert calls == [1.0]


def test_collect_soon_off_a_loop_does_nothing() -> None:
    loop_lag.collect_soon()  # a test calling the ownership listener directly: no loop, no error
