"""The audit log tries an event's put again when etcd does not answer (scheduler/auth/audit.py): the put is
idempotent, and a done action left unaudited is an error (the game day lost one to a flaky link)."""

from __future__ import annotations

import json
import logging

import pytest

from scheduler.auth import audit
from scheduler.auth.audit import AuditLog
from scheduler.clock import FakeClock
from scheduler.store.etcd.errors import OutcomeUnknown, Unavailable
from scheduler.store.keyspace import Keyspace
from scheduler.store.memory.client import MemoryKV

KS = Keyspace("/a")


async def _events(kv: MemoryKV) -> list[dict[str, str]]:
    return [json.loads(x.value) for x in (await kv.range(KS.audit, prefix=True)).kvs]


@pytest.mark.parametrize("landed", [False, True], ids=["lost", "answer-lost"])
async def test_an_event_whose_put_etcd_did_not_answer_is_put_again(landed: bool,
                                                                   caplog: pytest.LogCaptureFixture) -> None:
    kv = MemoryKV()
    log = AuditLog(kv, KS, FakeClock(wall_ms=1_800_000_000_000), "n1")
    kv.fail_next("put", OutcomeUnknown("the answer was lost"), after_apply=landed)
    kv.fail_next("put", Unavailable("etcd did not answer"))
    with caplog.at_level(logging.WARNING, logger="scheduler.audit"):
        await log.record("alice", "PauseSchedule", "pay-1", "OK")
    events = await _events(kv)
    assert [(e["who"], e["action"], e["result"]) for e in events] == [("alice", "PauseSchedule", "OK")], events
    assert not caplog.records, "recorded on the third try: nothing lost"


async def test_an_event_etcd_takes_only_later_is_put_in_the_background(caplog: pytest.LogCaptureFixture,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Game day, session 30: a trigger's event lost 0.2 s into a quorum loss, after the call's three tries. The
    answer goes after them (the action is done), and the put goes on in the background until etcd takes it."""
    monkeypatch.setattr(audit, "AUDIT_LATE_EVERY_S", 0.001)
    kv = MemoryKV()
    log = AuditLog(kv, KS, FakeClock(wall_ms=1_800_000_000_000), "n1")
    for _ in range(3 + 5):
        kv.fail_next("put", Unavailable("etcd has no leader"))
    with caplog.at_level(logging.INFO, logger="scheduler.audit"):
        await log.record("alice", "PauseSchedule", "pay-1", "OK")
        assert not await _events(kv)  # answered before the event was in
        await log.settled()
    assert [(e["who"], e["action"], e["result"]) for e in await _events(kv)] == [("alice", "PauseSchedule", "OK")]
    assert [(r.levelno, getattr(r, "event", "")) for r in caplog.records] == [
        (logging.WARNING, "audit_delayed"), (logging.INFO, "audit_recorded_late")]


async def test_an_event_lost_after_every_try_is_logged_as_an_error(caplog: pytest.LogCaptureFixture,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(audit, "AUDIT_LATE_EVERY_S", 0.001)
    monkeypatch.setattr(audit, "AUDIT_LATE_TRIES", 4)
    kv = MemoryKV()
    log = AuditLog(kv, KS, FakeClock(wall_ms=1_800_000_000_000), "n1")
    for _ in range(3 + 4):
        kv.fail_next("put", Unavailable("etcd did not answer"))
    with caplog.at_level(logging.WARNING, logger="scheduler.audit"):
        await log.record("alice", "PauseSchedule", "pay-1", "OK")
        await log.settled()
    assert not await _events(kv)
    assert [(r.levelno, getattr(r, "event", "")) for r in caplog.records] == [
        (logging.WARNING, "audit_delayed"), (logging.ERROR, "audit_lost")]
