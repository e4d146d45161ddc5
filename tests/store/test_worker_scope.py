"""A worker reports only on its own pool's executions of tenants its pool serves (scheduler/dispatch/scope.py).

Real etcd, the real WorkerService behind the real interceptor on a mutual-TLS loopback port: the worker is
identified by its client certificate (`spiffe://test/worker/payments-pool` -> `payments-pool:worker`; pool
`payments-pool` serves tenant `payments` only). It names, in every message a worker sends back, a billing
run of its own pool and a payments run of another pool: a re-attach on Hello, start requests, results, a
heartbeat and a drain's hand-back. Each is refused and logged, and both records are byte-for-byte and
revision-for-revision unchanged in etcd, while its own pool's run in the same messages is re-attached and
recorded (so the refusals are not the stream failing as a whole).

Shown to fail with each protection removed: without the scope check (Scope.refusal answering "") the
foreign runs are re-attached; without it on the result path (record_result's `check`) both foreign results
are RECORDED and their records change; without it on the start path the starts are refused only for another
reason (the fencing token), which the test tells apart.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from chaos.infra.etcd import EtcdCluster
from scheduler._gen.scheduler.v1 import execution_pb2
from scheduler._gen.scheduler.v1 import worker_service_pb2 as wpb
from scheduler._gen.scheduler.v1 import worker_service_pb2_grpc as wgrpc
from scheduler.clock import SYSTEM_CLOCK
from scheduler.dispatch.results import ResultRecorder
from scheduler.dispatch.starts import StartRecorder
from scheduler.execution import ExecState
from scheduler.ids import ExecutionId
from scheduler.store.etcd import EtcdClient
from scheduler.worker.protocol import CAPABILITIES
from tests.store.authz_env import AuthEnv, issue, make_ca, start_auth_env, start_tls_server

pytestmark = pytest.mark.etcd

HOUR = 3_600_000


@pytest.fixture
async def kv(etcd_server: EtcdCluster) -> AsyncIterator[EtcdClient]:
    async with EtcdClient(etcd_server.config(timeout=0.5)) as c:
        yield c


@pytest.fixture
async def env(kv: EtcdClient, key_prefix: str, tmp_path: Path) -> AsyncIterator[AuthEnv]:
    async for e in start_auth_env(kv, key_prefix, tmp_path):
        yield e


def ref(eid: str) -> wpb.RunningAttempt:
    return wpb.RunningAttempt(execution_id=eid, attempt=1)


Call = grpc.aio.StreamStreamCall[wpb.WorkerMessage, wpb.PlannerMessage]


async def next_of(call: Call, kind: str) -> wpb.PlannerMessage:
    """The next message of `kind`, skipping others (assignments, cancels: none are expected here)."""
    async with asyncio.timeout(10):
        while True:
            msg = await call.read()
            assert isinstance(msg, wpb.PlannerMessage), f"the stream ended waiting for {kind}"
            if msg.WhichOneof("body") == kind:
                return msg


async def test_a_worker_cannot_touch_another_pools_or_tenants_execution(
        env: AuthEnv, caplog: pytest.LogCaptureFixture) -> None:
    ca, ca_key, ca_cert = make_ca()
    server_pem = issue(ca_key, ca_cert, "planner", server=True)
    worker_pem = issue(ca_key, ca_cert, "worker", uri="spiffe://test/worker/payments-pool")
    server, address = await start_tls_server(env, ca, server_pem, workers=True)
    now = SYSTEM_CLOCK.wall_ms()
    own = await env.in_flight("pay-1", "payments", "payments-pool", now - HOUR)
    other_tenant = await env.in_flight("bill-1", "billing", "payments-pool", now - HOUR)
    other_pool = await env.in_flight("pay-2", "payments", "other-pool", now - HOUR)
    foreign = [other_tenant, other_pool]

    async def records() -> dict[str, tuple[bytes, int]]:
        out = {}
        for eid in foreign:
            x = ExecutionId.parse(eid)
            e = await env.node.ledger.get(env.kv, x.schedule_id, x.planned_ms)
            assert e is not None
            got = await env.kv.get(env.node.ledger.key(e))
            assert got is not None
            out[eid] = (got.value, got.mod_revision)
        return out

    before = await records()
    creds = grpc.ssl_channel_credentials(ca.cert, worker_pem.key, worker_pem.cert)
    caplog.set_level(logging.WARNING, logger="scheduler.dispatch.scope")
    d = env.node.dispatcher
    assert isinstance(d.recorder, ResultRecorder) and isinstance(d.starts, StartRecorder)  # type: ignore[attr-defined]
    try:
        async with grpc.aio.secure_channel(address, creds) as ch:
            call = wgrpc.WorkerServiceStub(ch).Connect()
            await call.write(wpb.WorkerMessage(hello=wpb.Hello(
                worker_id="w-real", pool="payments-pool", task_types=["t"], capacity=4,
                running=[ref(own), ref(other_tenant), ref(other_pool)], capabilities=CAPABILITIES)))
            await next_of(call, "welcome")
            re = (await next_of(call, "reattached")).reattached
            assert [a.execution_id for a in re.accepted] == [own]
            why = {r.execution_id: r.reason for r in re.rejected}
            assert set(why) == set(foreign)
            assert "tenant 'billing'" in why[other_tenant] and "pool 'other-pool'" in why[other_pool], why

            await call.write(wpb.WorkerMessage(started=wpb.Started(starts=[
                wpb.StartRequest(execution_id=eid, attempt=1) for eid in foreign])))
            acks = (await next_of(call, "start_ack")).start_ack.acks
            assert {a.execution_id: a.disposition for a in acks} == {
                eid: wpb.START_DISPOSITION_REFUSED for eid in foreign}
            assert all("pool" in a.reason for a in acks), [a.reason for a in acks]

            await call.write(wpb.WorkerMessage(heartbeat=wpb.Heartbeat(running=[ref(eid) for eid in foreign])))
            await call.write(wpb.WorkerMessage(results=wpb.Results(results=[
                wpb.Result(execution_id=eid, attempt=1, outcome=execution_pb2.ATTEMPT_OUTCOME_SUCCEEDED)
                for eid in [*foreign, own]])))
            got: dict[str, int] = {}
            while len(got) < 3:
                got |= {a.execution_id: a.disposition for a in (await next_of(call, "result_ack")).result_ack.acks}
            # The worker lets go of a refused result (stale) instead of re-sending it on every stream.
            assert got == {own: wpb.RESULT_DISPOSITION_RECORDED, other_tenant: wpb.RESULT_DISPOSITION_STALE,
                           other_pool: wpb.RESULT_DISPOSITION_STALE}

            await call.write(wpb.WorkerMessage(drain=wpb.Drain(reason="test", returned=[
                wpb.AttemptRef(execution_id=eid, attempt=1) for eid in foreign])))
            acks2 = (await next_of(call, "result_ack")).result_ack.acks
            assert {a.execution_id for a in acks2} == set(foreign)
            call.cancel()
    finally:
        await server.stop(None)

    assert await records() == before  # read back from etcd: nothing written for the foreign runs
    mine = await env.node.ledger.get(env.kv, "pay-1", ExecutionId.parse(own).planned_ms)
    assert mine is not None and mine.state is ExecState.SUCCEEDED
    assert d.recorder.refused == 4  # type: ignore[attr-defined]  # two results, two hand-backs
    assert d.starts.refused == 2  # type: ignore[attr-defined]
    logged = [r for r in caplog.records if getattr(r, "event", "") == "worker_report_refused"]
    assert {getattr(r, "what", "") for r in logged} == {"re-attach", "start", "result"}
    assert all(getattr(r, "principal", "") == "cert:spiffe://test/worker/payments-pool" for r in logged)
