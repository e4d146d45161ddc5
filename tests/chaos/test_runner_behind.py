"""The runner falls behind its fault plan when faults take longer than planned; it never lets one run into the
cooldown, the healed tail I7 judges (a game day 120 s behind at its end had its last faults there, and was invalid)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from chaos import runner
from chaos.plan import FaultWindow
from scheduler.clock import SYSTEM_CLOCK


def _window(index: int, start_s: float, duration_s: float) -> FaultWindow:
    return FaultWindow(index, "F1", "planner crash", "planner", "r1-p1", start_s, duration_s)


async def test_a_fault_that_would_reach_the_cooldown_is_not_injected(monkeypatch: pytest.MonkeyPatch) -> None:
    injected: list[int] = []

    async def aim(w: FaultWindow, live: Any, say: Any) -> FaultWindow:
        return w

    async def one(w: FaultWindow, *_: Any) -> None:
        injected.append(w.index)

    async def healthy(timeout: float) -> tuple[int, str]:
        return 1, ""

    monkeypatch.setattr(runner, "aim", aim)
    monkeypatch.setattr(runner, "_one", one)
    # A 1 s window whose last 0.5 s is the cooldown: #0 fits, #1 (0.2 s + 0.5 s) would end inside the cooldown,
    # and #2 after it too.
    plan = SimpleNamespace(faults=[_window(0, 0.0, 0.1), _window(1, 0.2, 0.5), _window(2, 0.3, 0.1)])
    scenario = SimpleNamespace(duration_s=1.0, faults=SimpleNamespace(cooldown_s=0.5, health_timeout_s=1.0))
    said: list[str] = []
    await runner._faults(plan, scenario, SYSTEM_CLOCK.wall_ms(), SimpleNamespace(wait_healthy=healthy),  # type: ignore[arg-type]
                         None, None, said.append)  # type: ignore[arg-type]
    assert injected == [0]
    assert said and "#1 F1 and the 1 after it not injected" in said[-1] and "cooldown" in said[-1]
