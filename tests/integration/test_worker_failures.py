"""Workers failing under the engine, as real processes: a planner (`schedctl planner`), effect-worker
processes (tests/integration/effect_worker.py) and a real etcd.

- A worker SIGKILLed while its handler runs: the attempt stays in flight until its recorded deadline,
  then times out and is retried with the same execution id and the next attempt number on the other
  worker; the side effect happens once. (Here the deadline, ~6 s, comes before the default heartbeat
  timeout of 10 s after the disconnect; the heartbeat path is proved in test_worker_heartbeats.py.)
- A worker SIGTERMed while its handler runs: the running attempt finishes within the drain grace and is
  recorded, then the process exits 0; or, when the grace is shorter than the task, the attempt is
  stopped and handed back (TRANSIENT "worker draining") and runs again elsewhere at once, well before
  its deadline.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time
from collections.abc import AsyncIterator

import pytest

from chaos.infra.etcd import EtcdCluster
from chaos.infra.procs import forget
from scheduler.execution import ErrorClass, ExecState
from scheduler.ids import execution_id
from scheduler.model import Policies, RetryPolicy
from scheduler.store.etcd import EtcdClient
from tests.integration.engine import (
    Engine,
    connected,
    final,
    kill_process,
    lines,
    next_second_ms,
    once,
    started,
)

pytestmark = pytest.mark.etcd

POLICIES = Policies(execution_timeout_ms=4_000,
                    retry=RetryPolicy(max_attempts=3, initial_backoff_ms=100, max_backoff_ms=200))


@pytest.fixture
async def engine(etcd_server: EtcdCluster, tmp_path: os.PathLike[str], key_prefix: str) -> AsyncIterator[Engine]:
    async with EtcdClient(etcd_server.config(timeout=2.0)) as kv:
        eng = Engine(etcd_server, tmp_path, kv, prefix=key_prefix.rstrip("/"))  # type: ignore[arg-type]
        try:
            eng.start_planner("p1")
            yield eng
        finally:
            eng.close()


async def terminate(p: subprocess.Popen[bytes], timeout: float = 20.0) -> int:
    """SIGTERM and wait without blocking the event loop; returns the exit code (SIGKILL if it hangs)."""
    os.kill(p.pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while p.poll() is None and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    if p.poll() is None:
        kill_process(p)
        raise AssertionError(f"worker {p.pid} did not exit within {timeout}s of SIGTERM")
    forget(p.pid)
    rc = p.poll()
    assert rc is not None
    return rc


async def test_worker_killed_mid_execution_is_retried_with_the_same_id(engine: Engine) -> None:
    eng = engine
    w1 = eng.start_worker("w1")
    await connected(eng, "w1")
    t = next_second_ms(2)
    await eng.create(once("crash", t, {"hold_s": 60, "hold_attempts": 1}, POLICIES))
    eid = execution_id("crash", t)
    await started(eng, eid, 1, "w1")
    eng.start_worker("w2")
    await connected(eng, "w2")
    kill_process(w1)  # kill -9 while the handler runs: no result, no drain, no goodbye

    e = await final(eng, "crash", t)
    assert e.id == eid and e.attempt == 2, f"expected attempt 2 to succeed: {e}"
    first, second = e.attempts
    assert first.error_class is ErrorClass.TIMEOUT and not first.succeeded, first
    assert first.finished_ms >= first.deadline_ms, "timed out only once its recorded deadline passed"
    assert second.succeeded and second.dispatched_ms >= first.deadline_ms, "no second run before the deadline"
    assert [eid, "1", "w1"] in lines(eng.starts) and [eid, "2", "w2"] in lines(eng.starts)
    done = [ln for ln in lines(eng.effects) if ln[0] == eid]
    assert done == [[eid, "2", "w2"]], f"the effect must happen exactly once, by attempt 2: {done}"


async def test_sigterm_lets_the_running_attempt_finish_then_exits(engine: Engine) -> None:
    eng = engine
    w1 = eng.start_worker("w1", drain_grace=20.0)
    await connected(eng, "w1")
    t = next_second_ms(2)
    await eng.create(once("drain", t, {"hold_s": 2}, POLICIES))
    eid = execution_id("drain", t)
    await started(eng, eid, 1, "w1")
    assert not [ln for ln in lines(eng.effects) if ln[0] == eid], "still running when SIGTERM arrives"
    rc = await terminate(w1)
    assert rc == 0
    assert [ln for ln in lines(eng.effects) if ln[0] == eid] == [[eid, "1", "w1"]], "finished during the drain"
    e = await eng.record("drain", t)
    assert e is not None and e.state is ExecState.SUCCEEDED and e.attempt == 1, \
        f"the result was recorded before the process exited: {e}\n{eng.logs()}"


async def test_sigterm_hands_back_an_attempt_that_outlasts_the_grace(engine: Engine) -> None:
    eng = engine
    w1 = eng.start_worker("w1", drain_grace=0.5)
    await connected(eng, "w1")
    t = next_second_ms(2)
    await eng.create(once("handback", t, {"hold_s": 60, "hold_attempts": 1}, POLICIES))
    eid = execution_id("handback", t)
    await started(eng, eid, 1, "w1")
    eng.start_worker("w2")
    await connected(eng, "w2")
    assert await terminate(w1) == 0

    e = await final(eng, "handback", t)
    first, second = e.attempts
    assert first.error_class is ErrorClass.TRANSIENT and first.message == "worker draining", first
    assert second.succeeded and second.dispatched_ms < first.deadline_ms, \
        "handed back: retried at once, not after the deadline"
    done = [ln for ln in lines(eng.effects) if ln[0] == eid]
    assert done == [[eid, "2", "w2"]], f"the stopped attempt had no effect, the retry one: {done}"
