"""Worker liveness by heartbeat, as real processes: a `schedctl planner` with a short heartbeat timeout,
effect-worker processes (tests/integration/effect_worker.py) and a real etcd. The execution timeout is
120 s, so only the heartbeat can explain a retry within the test's time.

- A worker SIGKILLed mid-task: its stream drops, nobody re-attaches the attempt within the heartbeat
  timeout, the planner times it out (TIMEOUT, "stopped heartbeating or disconnected") and it is retried
  with the same execution id on the other worker, long before its recorded deadline.
- A worker SIGSTOPped mid-task (frozen, TCP open): the planner ends its silent stream, and the same. When
  it is SIGCONTed, a handler that finishes reports a late result that changes nothing (STALE), and a
  still-running one is rejected on re-attach and stopped: no effect from it.
- A worker whose connection blips (a TCP proxy cut) re-dials and re-attaches its attempt within the
  timeout: no retry, exactly one effect, by attempt 1.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from collections.abc import AsyncIterator

import pytest

from chaos.infra.etcd import EtcdCluster
from scheduler.clock import SYSTEM_CLOCK
from scheduler.execution import ErrorClass, Execution
from scheduler.ids import execution_id
from scheduler.model import Policies, RetryPolicy
from scheduler.planner.partition import LOST_MESSAGE
from scheduler.store.etcd import EtcdClient
from scheduler.store.keyspace import partition_for
from tests.integration.engine import (
    Engine,
    connected,
    final,
    kill_process,
    lines,
    next_second_ms,
    once,
    started,
    wait_until,
)
from tests.integration.tcp_proxy import TcpProxy

pytestmark = pytest.mark.etcd

HEARTBEAT = {"heartbeat_interval": "0.2", "heartbeat_timeout": "2.0"}
SHORT_HOLD_S = 10.0  # see test_frozen_worker_is_retried_and_its_late_work_is_refused
LONG = Policies(execution_timeout_ms=120_000,
                retry=RetryPolicy(max_attempts=3, initial_backoff_ms=100, max_backoff_ms=200))


@pytest.fixture
async def engine(etcd_server: EtcdCluster, tmp_path: os.PathLike[str], key_prefix: str) -> AsyncIterator[Engine]:
    async with EtcdClient(etcd_server.config(timeout=2.0)) as kv:
        eng = Engine(etcd_server, tmp_path, kv, prefix=key_prefix.rstrip("/"))  # type: ignore[arg-type]
        try:
            eng.start_planner("p1", **HEARTBEAT)
            yield eng
        finally:
            eng.close()


def assert_retried_by_heartbeat(e: Execution, eid: str, lost_by: str, retried_by: str) -> None:
    assert e.id == eid and e.attempt == 2, f"expected attempt 2 to succeed: {e}"
    first, second = e.attempts
    assert first.error_class is ErrorClass.TIMEOUT and first.message == LOST_MESSAGE, first
    # Ledger timestamps, not the test's clock: the timeout came ~100 s before the recorded deadline.
    assert first.finished_ms < first.deadline_ms - 100_000, f"timed out by the heartbeat, not the deadline: {first}"
    assert second.dispatched_ms >= first.finished_ms and second.succeeded and second.worker == retried_by, second
    # No result came for attempt 1, but its start was recorded (start confirmation): who and since when.
    assert first.worker == lost_by and first.started_ms >= first.dispatched_ms, first


async def test_killed_worker_is_retried_long_before_the_deadline(engine: Engine) -> None:
    eng = engine
    w1 = eng.start_worker("w1")
    await connected(eng, "w1")
    t = next_second_ms(2)
    await eng.create(once("killed", t, {"hold_s": 300, "hold_attempts": 1}, LONG))
    eid = execution_id("killed", t)
    await started(eng, eid, 1, "w1")
    eng.start_worker("w2")
    await connected(eng, "w2")
    kill_process(w1)  # kill -9: no result, no drain, the connection just drops

    e = await final(eng, "killed", t)
    assert_retried_by_heartbeat(e, eid, "w1", "w2")
    assert [ln for ln in lines(eng.effects) if ln[0] == eid] == [[eid, "2", "w2"]], "the effect happened once"


async def test_frozen_worker_is_retried_and_its_late_work_is_refused(engine: Engine) -> None:
    eng = engine
    w1 = eng.start_worker("w1")
    await connected(eng, "w1")
    t = next_second_ms(2)
    # `short` is still running when w1 freezes and done sleeping by the time it thaws; `long` is not.
    # Starting w2 takes seconds on a loaded machine, so `short` holds long enough to outlast that,
    # and w1 stays frozen until its hold is over (a thawed w1 re-attaches what still runs).
    await eng.create(once("short", t, {"hold_s": SHORT_HOLD_S, "hold_attempts": 1}, LONG),
                     once("long", t, {"hold_s": 300, "hold_attempts": 1}, LONG))
    short, long_ = execution_id("short", t), execution_id("long", t)
    await started(eng, short, 1, "w1")
    short_ends = time.monotonic() + SHORT_HOLD_S  # at the latest: it started before we saw it
    await started(eng, long_, 1, "w1")
    eng.start_worker("w2")
    await connected(eng, "w2")
    assert time.monotonic() < short_ends - 1.0, "w2 took so long to start that `short` may be over already"
    os.kill(w1.pid, signal.SIGSTOP)
    try:
        done_short = await final(eng, "short", t)
        done_long = await final(eng, "long", t)
        await asyncio.sleep(max(0.0, short_ends + 0.5 - time.monotonic()))
    finally:
        os.kill(w1.pid, signal.SIGCONT)
    assert_retried_by_heartbeat(done_short, short, "w1", "w2")
    assert_retried_by_heartbeat(done_long, long_, "w1", "w2")
    assert any(e.get("event") == "worker_silent" and e.get("worker") == "w1"
               for e in eng.planners["p1"].events("worker_silent")), "the planner ended the silent stream"

    # Thawed: `short` finishes and reports attempt 1 late; the record does not change (STALE).
    async def late_effect() -> bool:
        return [short, "1", "w1"] in lines(eng.effects)
    await wait_until(late_effect, 30, "the thawed worker to finish its old attempt")
    await connected(eng, "w1", 2)  # re-dialled after the planner ended its stream

    async def rejected() -> bool:
        log = (eng.base / "w1.log").read_text(errors="replace")
        return "re-attach rejected" in log and long_ in log
    await wait_until(rejected, 30, "w1's re-attach of the long attempt to be rejected")
    await asyncio.sleep(1.0)  # time for the late result to be recorded, were it not stale
    assert await eng.record("short", t) == done_short, "the late result of attempt 1 changed nothing"
    assert await eng.record("long", t) == done_long
    assert [ln for ln in lines(eng.effects) if ln[0] == long_] == [[long_, "2", "w2"]], \
        "the rejected attempt was stopped: no effect from it"


async def test_worker_that_blips_keeps_its_attempt(engine: Engine) -> None:
    eng = engine
    proxy = await TcpProxy(int(eng.addresses[0].rsplit(":", 1)[1])).start()
    try:
        eng.start_worker("w1", planners=[proxy.address])
        await connected(eng, "w1")
        t = next_second_ms(2)
        await eng.create(once("blip", t, {"hold_s": 4, "hold_attempts": 1}, LONG))
        eid = execution_id("blip", t)
        await started(eng, eid, 1, "w1")
        assert proxy.cut() >= 1  # the connection resets; the worker re-dials and re-attaches at once
        e = await final(eng, "blip", t)
    finally:
        await proxy.close()
    assert proxy.accepted >= 2, "the worker came back through the proxy"
    assert e.attempt == 1 and len(e.attempts) == 1 and e.attempts[0].succeeded, f"kept, not retried: {e}"
    assert e.attempts[0].worker == "w1", "the result records the worker that ran it"
    assert [ln for ln in lines(eng.effects) if ln[0] == eid] == [[eid, "1", "w1"]], "exactly one effect"
    assert [ln for ln in lines(eng.starts) if ln[0] == eid] == [[eid, "1", "w1"]], "and one start"


# A dead worker's attempt across handovers: each new owner takes up the attempts in flight at its claim as
# orphans, and on the old rule gave each up only `heartbeat_timeout` + one interval after its own claim, so
# two handovers made the wait three times as long (a game day saw 23-66 s against a 16 s bound).
HANDOVER = {"heartbeat_interval": "0.5", "heartbeat_timeout": "10", "start_timeout_ms": "1000"}
HANDOVER_TIMEOUT_S = 10.0


async def owner_of(eng: Engine, partition: int) -> str | None:
    got = await eng.kv.get(eng.ks.owner(partition), timeout=2.0)
    return None if got is None else str(json.loads(got.value)["node"])


async def hand_over(eng: Engine, partition: int) -> str:
    """SIGTERM the partition's owner (it drains: hands its partitions over) and wait for a new owner."""
    old = await owner_of(eng, partition)
    assert old is not None
    await eng.planners[old].stop()

    async def moved() -> bool:
        now = await owner_of(eng, partition)
        return now is not None and now != old
    await wait_until(moved, 30, f"partition {partition} to move off {old}")
    new = await owner_of(eng, partition)
    assert new is not None
    return new


async def test_restarted_worker_frees_its_lost_attempt_through_two_handovers(
        etcd_server: EtcdCluster, tmp_path: os.PathLike[str], key_prefix: str) -> None:
    async with EtcdClient(etcd_server.config(timeout=2.0)) as kv:
        eng = Engine(etcd_server, tmp_path, kv, prefix=key_prefix.rstrip("/"))  # type: ignore[arg-type]
        try:
            for node in ("p1", "p2", "p3"):
                eng.start_planner(node, **HANDOVER)
            w1 = eng.start_worker("w1")
            await connected(eng, "w1")
            t = next_second_ms(2)
            await eng.create(once("handed", t, {"hold_s": 300, "hold_attempts": 1}, LONG))
            eid = execution_id("handed", t)
            await started(eng, eid, 1, "w1")
            part = partition_for("handed", eng.partitions)

            killed_ms = SYSTEM_CLOCK.wall_ms()
            kill_process(w1)  # its attempt is now held by nobody
            eng.start_worker("w1")  # back under the same id, with an empty outbox
            owners = [await hand_over(eng, part), await hand_over(eng, part)]
            e = await final(eng, "handed", t, timeout=60)
        finally:
            eng.close()
    first, second = e.attempts
    assert first.error_class is ErrorClass.TIMEOUT and first.message == LOST_MESSAGE, first
    # The old rule cannot free it before heartbeat_timeout after the last claim, that is at least 10 s after
    # the kill; the restarted worker's heartbeats, not listing it, let the new owner free it in a few.
    waited = (second.dispatched_ms - killed_ms) / 1000
    assert waited < HANDOVER_TIMEOUT_S, f"retried {waited:.1f}s after the kill (owners {owners}): {e}"
    assert e.attempt == 2 and second.succeeded and second.worker == "w1", e
    assert [ln for ln in lines(eng.effects) if ln[0] == eid] == [[eid, "2", "w1"]], "the effect happened once"
