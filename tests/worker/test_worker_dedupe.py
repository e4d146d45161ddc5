"""The worker runs an assignment delivered twice once (drill fault F9, docs/drills.md): by execution id +
attempt, whether the repeat arrives while the first delivery runs or after it finished. The planner's
start confirmation does not stop a repeat (it accepts a Started repeated by the same worker), so this is
the worker's promise. `unsafe_disable_dedupe` (test mode only) turns it off, for the drill that shows
the I1 check catches a second run.
"""

from __future__ import annotations

import asyncio

import pytest

from scheduler.config import TEST_MODE_ENV
from scheduler.errors import InvalidArgument
from scheduler.worker import ExecutionContext, WorkerSettings
from tests.worker.conftest import WorkerFactory
from tests.worker.fake_planner import FakePlanner, assignment


async def _runs_of(planner: FakePlanner, make_worker: WorkerFactory, **settings: object) -> tuple[list[str], int]:
    """One assignment delivered, finished and acknowledged, then delivered again (same id and attempt), and
    a second one delivered twice in one message. Returns the handler's runs and the slots still busy
    afterwards (0: a repeat must not keep one)."""
    w = make_worker([planner.address], concurrency=4, **settings)
    runs: list[str] = []

    @w.task("t")
    async def handler(ctx: ExecutionContext, payload: bytes) -> None:
        runs.append(f"{ctx.execution_id}#{ctx.attempt}")

    await w.start()
    conn = await planner.conn()
    await planner.wait_for(lambda: conn.credits >= 1, what="credits")
    first = assignment(1)
    conn.assign(first)
    await planner.wait_for(lambda: len(conn.results) == 1, what="the first run's result")
    await planner.wait_for(lambda: len(w.outbox) == 0, what="the result acknowledged")
    await planner.wait_for(lambda: conn.credits >= 1, what="the slot granted again")
    conn.assign(first)  # delivered again after it ended: a replayed message
    await planner.wait_for(lambda: conn.credits >= 2, what="two credits")
    second = assignment(2)
    conn.assign(second, second)  # twice in one message
    await asyncio.sleep(0.3)  # the repeats would have run by now
    await planner.wait_for(lambda: not w.attempts_held, what="nothing held")
    return runs, w.book.busy


async def test_a_repeated_assignment_runs_once(planner: FakePlanner, make_worker: WorkerFactory) -> None:
    runs, busy = await _runs_of(planner, make_worker)
    assert sorted(runs) == sorted({f"{assignment(1).execution_id}#1", f"{assignment(2).execution_id}#1"})
    assert busy == 0


async def test_the_next_attempt_of_an_execution_still_runs(planner: FakePlanner, make_worker: WorkerFactory) -> None:
    """Dedupe is by id *and* attempt: a retry (same execution id, next attempt) is new work."""
    w = make_worker([planner.address], concurrency=2)
    runs: list[int] = []

    @w.task("t")
    async def handler(ctx: ExecutionContext, payload: bytes) -> None:
        runs.append(ctx.attempt)

    await w.start()
    conn = await planner.conn()
    await planner.wait_for(lambda: conn.credits >= 1, what="credits")
    conn.assign(assignment(1, attempt=1))
    await planner.wait_for(lambda: len(conn.results) == 1, what="attempt 1")
    await planner.wait_for(lambda: conn.credits >= 1, what="credit back")
    conn.assign(assignment(1, attempt=2))
    await planner.wait_for(lambda: len(conn.results) == 2, what="attempt 2")
    assert runs == [1, 2]
    assert w.metrics.duplicates_ignored == 0


async def test_without_dedupe_a_repeat_runs_twice(planner: FakePlanner, make_worker: WorkerFactory,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """The test-only switch does what the drill's meta-test needs: every delivery runs."""
    monkeypatch.setenv(TEST_MODE_ENV, "1")
    runs, busy = await _runs_of(planner, make_worker, unsafe_disable_dedupe=True)
    assert len(runs) == 4 and busy == 0  # and no slot leaked by the copies


def test_disabling_dedupe_is_refused_outside_test_mode(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(TEST_MODE_ENV, raising=False)
    with pytest.raises(InvalidArgument, match=r"unsafe_disable_dedupe.*test mode"):
        WorkerSettings(unsafe_disable_dedupe=True).validate()
    monkeypatch.setenv(TEST_MODE_ENV, "1")
    WorkerSettings(unsafe_disable_dedupe=True).validate()
