"""The drills' effect count (tests/integration/engine.py `effects_once`): a retry after a SIGKILLed worker's
lost result is counted once; every other second effect fails, so the exception cannot hide a duplicate."""

from __future__ import annotations

from pathlib import Path

import pytest

from scheduler.execution import Attempt, ExecState, Execution, Trigger
from scheduler.ids import FencingToken
from scheduler.model import RetryPolicy
from tests.integration.engine import effects_once

EID = "job-001@2026-12-01T21:14:30.000Z"


def record(first_succeeded: bool) -> Execution:
    a1 = Attempt(1, "a-w1", "a-p1", FencingToken(3, 10), 1_000, 9_000, started_ms=1_100,
                 finished_ms=1_200 if first_succeeded else 0, succeeded=first_succeeded)
    a2 = Attempt(2, "b-w1", "b-p1", FencingToken(3, 20), 5_000, 13_000, started_ms=5_100, finished_ms=5_200,
                 succeeded=True)
    return Execution(id=EID, schedule_id="job-001", tenant="t", pool="pool", task_type="effect", planned_ms=1_000,
                     due_ms=1_000, trigger=Trigger.SCHEDULED, retry=RetryPolicy(), timeout_ms=5_000,
                     state=ExecState.SUCCEEDED, attempt=2,
                     attempts=(a1, a2))


def write(tmp_path: Path, *lines: str) -> Path:
    p = tmp_path / "effects.log"
    p.write_text("".join(f"{ln}\n" for ln in lines))
    return p


def test_a_result_lost_with_a_killed_worker_is_counted_once(tmp_path: Path) -> None:
    p = write(tmp_path, f"{EID} 1 a-w1", f"{EID} 2 b-w1")
    assert effects_once(p, frozenset({"a-w1"}), {EID: record(first_succeeded=False)})[EID] == 1


@pytest.mark.parametrize(("killed", "succeeded", "lines"), [
    (frozenset(), False, ("1 a-w1", "2 b-w1")),  # the first worker lived: its result should have landed
    (frozenset({"a-w1"}), True, ("1 a-w1", "2 b-w1")),  # retried after a recorded success
    (frozenset({"a-w1"}), False, ("1 a-w1", "1 b-w1")),  # the same attempt twice
    (frozenset({"b-w1"}), False, ("1 a-w1", "2 b-w1")),  # the killed worker made the later effect
], ids=["live-worker", "after-recorded-success", "same-attempt", "killed-one-ran-last"])
def test_every_other_second_effect_fails(tmp_path: Path, killed: frozenset[str], succeeded: bool,
                                         lines: tuple[str, ...]) -> None:
    p = write(tmp_path, *(f"{EID} {ln}" for ln in lines))
    with pytest.raises(AssertionError, match="ran twice"):
        effects_once(p, killed, {EID: record(first_succeeded=succeeded)})
