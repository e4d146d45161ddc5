"""The worker-scope rule on the paths that decide from the owner's memory, without a ledger read
(dispatch/scope.py): a fast-path result and a heartbeat's re-attach of an owned attempt. The etcd + mTLS
test of every message kind is tests/store/test_worker_scope.py."""

from __future__ import annotations

import dataclasses

from scheduler._gen.scheduler.v1 import worker_service_pb2 as wpb
from scheduler.dispatch.results import Recorded
from scheduler.dispatch.scope import Scope
from tests.unit.test_dispatch_liveness import EID, in_flight
from tests.unit.test_dispatch_liveness import Env as LiveEnv
from tests.unit.test_result_recorder import Env as RecEnv
from tests.unit.test_result_recorder import res

PAYMENTS = Scope("cert:w", "p", frozenset({"payments"}))


def test_the_scope_names_the_pool_or_the_tenant_it_refuses() -> None:
    e = dataclasses.replace(in_flight(), pool="p", tenant="payments")
    assert PAYMENTS.refusal(e) == ""
    assert "pool 'q'" in PAYMENTS.refusal(dataclasses.replace(e, pool="q"))
    assert "tenant 'billing'" in PAYMENTS.refusal(dataclasses.replace(e, tenant="billing"))
    assert Scope("cert:w", "p", None).refusal(dataclasses.replace(e, tenant="billing")) == ""  # unrestricted pool


async def test_a_fast_path_result_of_another_tenant_is_refused_without_a_write() -> None:
    env = RecEnv()  # its executions are tenant "t", pool "p"
    mine, theirs = await env.out("mine"), await env.out("theirs")
    env.memory[theirs.id] = dataclasses.replace(env.memory[theirs.id], tenant="billing")
    scope = Scope("cert:w", "p", frozenset({"t"}))
    before = env.kv.server.revision
    report = await env.rec.record_now("w1", [res(mine), res(theirs)], scope)
    assert [(x.execution_id.split("@")[0], x.recorded) for x in report.entries] == [
        ("theirs", Recorded.REFUSED), ("mine", Recorded.FINISHED)]
    assert {a.execution_id.split("@")[0]: a.disposition for a in report.acks}["theirs"] == \
        wpb.RESULT_DISPOSITION_STALE
    assert env.kv.server.revision == before + 1, "one txn, for `mine` only"
    stored = await env.ledger.get(env.kv, "theirs", theirs.planned_ms)
    assert stored is not None and stored.mod_revision == theirs.mod_revision
    assert env.rec.refused == 1


def test_a_heartbeat_does_not_reattach_another_pools_attempt() -> None:
    env = LiveEnv({EID: in_flight()})  # pool "pool"
    c = env.conn("w2")
    c.scope = Scope("cert:w", "elsewhere", None)
    env.live.adopt(c, [wpb.RunningAttempt(execution_id=EID, attempt=1)])
    assert c.out.empty() and (EID, 1) not in c.running
    assert c.refused == {(EID, 1)}  # not looked at (nor logged) again on the next heartbeats
    other = env.conn("w3")
    other.scope = Scope("cert:w", "pool", None)
    env.live.adopt(other, [wpb.RunningAttempt(execution_id=EID, attempt=1)])
    assert (EID, 1) in other.running


