"""The planner's test-only duplicate delivery (dispatch/duplicate.py, drill fault F9): switched by a control
file at runtime, each repeat sent alone on the same stream within the delay and paid for with a credit,
counted in the state file the nemesis reads; and refused outside test mode like every unsafe_ switch."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from scheduler._gen.scheduler.v1 import worker_service_pb2 as wpb
from scheduler.clock import SYSTEM_CLOCK
from scheduler.config import TEST_MODE_ENV
from scheduler.dispatch.conn import Conn
from scheduler.dispatch.duplicate import POLL_S, DuplicateDelivery, DuplicateParams
from scheduler.dispatch.service import Dispatcher
from scheduler.errors import InvalidArgument
from scheduler.planner.settings import PlannerSettings
from scheduler.store.keyspace import Keyspace
from scheduler.store.ledger import Ledger
from scheduler.store.memory.client import MemoryKV


def _conn(credits: int) -> Conn:
    return Conn("w1", "default", "r1", frozenset(), asyncio.Queue(), credits=credits)


def _batch(n: int) -> list[wpb.Assignment]:
    return [wpb.Assignment(execution_id=f"s@{i}", attempt=1) for i in range(n)]


def _drain(c: Conn) -> list[wpb.Assignment]:
    out: list[wpb.Assignment] = []
    while not c.out.empty():
        msg = c.out.get_nowait()
        assert msg is not None
        out.extend(msg.assignments.assignments)
    return out


def _state(d: DuplicateDelivery) -> dict[str, object]:
    return dict(json.loads(d.state_path.read_text()))


async def test_off_without_the_file_on_with_it(tmp_path: Path) -> None:
    sent: list[tuple[Conn, wpb.Assignment]] = []

    def resend(c: Conn, a: wpb.Assignment) -> bool:
        sent.append((c, a))
        return True

    d = DuplicateDelivery(tmp_path / "p1.json", resend)
    d.start()
    c = _conn(100)
    d.sent(c, _batch(50))
    assert not d.on and d.dispatched == 0 and _state(d)["on"] is False
    d.path.write_text(json.dumps({"probability": 0.2, "delay_ms": 200, "seed": 7}))
    await asyncio.sleep(POLL_S * 3)
    assert d.on
    d.sent(c, _batch(500))
    await asyncio.sleep(0.4)  # every repeat is due within delay_ms
    assert 60 <= len(sent) <= 140, len(sent)  # about 20% of 500
    assert d.duplicated == len(sent) and d.dispatched == 500
    d.path.unlink()
    await asyncio.sleep(POLL_S * 3)
    d.sent(c, _batch(50))
    st = _state(d)
    assert (st["on"], st["duplicated"], st["pending"], st["dispatched"]) == (False, len(sent), 0, 500)
    await d.close()


def test_parameters_are_bounded() -> None:
    assert DuplicateParams.parse('{"probability": 0.05, "delay_ms": 0}') == DuplicateParams(0.05, 0)
    for bad in ('{"probability": 1.5}', '{"delay_ms": -1}', '{"delay_ms": 60000}'):
        with pytest.raises(ValueError, match="must be in"):
            DuplicateParams.parse(bad)


async def test_the_dispatcher_repeats_on_the_same_stream_with_a_credit(tmp_path: Path) -> None:
    control = tmp_path / "p1.json"
    control.write_text(json.dumps({"probability": 1.0, "delay_ms": 50}))
    disp = Dispatcher(node_id="p1", region="r1", kv=MemoryKV(), ledger=Ledger(Keyspace("/t"), 4),
                      clock=SYSTEM_CLOCK, planners=lambda: [], duplicate_file=str(control))
    assert disp.duplicate is not None
    disp.duplicate.start()
    c = _conn(3)
    disp.conns[0] = c
    d = disp.duplicate
    d.sent(c, _batch(2))
    await asyncio.sleep(0.2)
    repeats = _drain(c)
    assert sorted(a.execution_id for a in repeats) == ["s@0", "s@1"] and c.credits == 1  # each took a credit
    d.sent(c, _batch(2))  # one credit left: one repeat goes, the other is skipped, never sent beyond credit
    await asyncio.sleep(0.2)
    assert len(_drain(c)) == 1 and c.credits == 0 and (d.duplicated, d.skipped) == (3, 1)
    del disp.conns[0]
    c.credits = 5
    d.sent(c, _batch(1))  # the stream ended before the delay was up: skipped
    await asyncio.sleep(0.2)
    assert _drain(c) == [] and d.skipped == 2
    await d.close()


def test_the_switch_is_refused_outside_test_mode(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(TEST_MODE_ENV, raising=False)
    with pytest.raises(InvalidArgument, match=r"unsafe_duplicate_delivery_file.*test mode"):
        PlannerSettings(unsafe_duplicate_delivery_file="/tmp/x.json").validate()
    monkeypatch.setenv(TEST_MODE_ENV, "1")
    PlannerSettings(unsafe_duplicate_delivery_file="/tmp/x.json").validate()
