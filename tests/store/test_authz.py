"""Who may do what, over real gRPC against real etcd: a valid token of tenant `payments` (alice) reading,
changing, deleting, listing, triggering and pausing tenant `billing`'s (bob's) schedules, executions and
dead letters is refused every time, each refusal looks exactly like a missing object, and billing's keys in
etcd are byte-for-byte unchanged afterwards. Bad credentials are UNAUTHENTICATED; roles outside the call's
rule PERMISSION_DENIED; pools serve only their tenants; the audit log records who did what."""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf.timestamp_pb2 import Timestamp

from chaos.infra.etcd import EtcdCluster
from scheduler._gen.scheduler.v1 import admin_service_pb2 as apb
from scheduler._gen.scheduler.v1 import execution_pb2 as epb
from scheduler._gen.scheduler.v1 import schedule_pb2 as pb
from scheduler._gen.scheduler.v1 import schedule_service_pb2 as spb
from scheduler._gen.scheduler.v1 import worker_service_pb2 as wpb
from scheduler.api import schedule_service
from scheduler.clock import SYSTEM_CLOCK
from scheduler.store.etcd import EtcdClient
from scheduler.worker.protocol import CAPABILITIES
from tests.store.authz_env import AuthEnv, start_auth_env

pytestmark = pytest.mark.etcd

YEARLY = "0 0 1 1 *"
HOUR = 3_600_000


@pytest.fixture
async def kv(etcd_server: EtcdCluster) -> AsyncIterator[EtcdClient]:
    async with EtcdClient(etcd_server.config(timeout=0.5)) as c:
        yield c


@pytest.fixture
async def env(kv: EtcdClient, key_prefix: str, tmp_path: Path) -> AsyncIterator[AuthEnv]:
    async for e in start_auth_env(kv, key_prefix, tmp_path):
        yield e


def sched(sid: str, tenant: str, pool: str = "default") -> pb.Schedule:
    return pb.Schedule(id=sid, tenant=tenant, spec=YEARLY, worker_pool=pool, task_type="t")


def ts(ms: int) -> Timestamp:
    t = Timestamp()
    t.FromMilliseconds(ms)
    return t


async def status_of(aw: Awaitable[Any]) -> tuple[grpc.StatusCode, str]:
    try:
        r = aw
        if hasattr(r, "__aiter__"):
            async for _ in r:
                pass
        else:
            await r
    except grpc.aio.AioRpcError as e:
        return e.code(), e.details() or ""
    return grpc.StatusCode.OK, ""


async def setup_billing(env: AuthEnv) -> tuple[str, str]:
    """bob's schedule `billing-1` with a triggered execution and a dead letter; alice's `pay-1` with one
    execution. Returns (billing execution id, billing dead letter id)."""
    s = env.schedules
    await s.CreateSchedule(spb.CreateScheduleRequest(schedule=sched("billing-1", "billing")), metadata=env.md("bob"))
    trig = await s.TriggerSchedule(spb.TriggerScheduleRequest(id="billing-1"), metadata=env.md("bob"))
    await s.CreateSchedule(spb.CreateScheduleRequest(schedule=sched("pay-1", "payments")), metadata=env.md("alice"))
    await s.TriggerSchedule(spb.TriggerScheduleRequest(id="pay-1"), metadata=env.md("alice"))
    dead = await env.dead_letter("billing-1", "billing", SYSTEM_CLOCK.wall_ms() // 1000 * 1000 - HOUR)
    return trig.execution.execution_id, dead


def same_shape(got: tuple[grpc.StatusCode, str], missing: tuple[grpc.StatusCode, str], real: str,
               fake: str) -> None:
    """The refusal of another tenant's object equals the answer for an id nobody uses, ids aside."""
    assert got[0] is missing[0] is grpc.StatusCode.NOT_FOUND, (got, missing)
    assert got[1].replace(real, "ID") == missing[1].replace(fake, "ID"), (got, missing)


async def test_another_tenants_objects_look_missing_and_stay_unchanged(env: AuthEnv) -> None:
    eid, dead = await setup_billing(env)
    before = await env.snapshot()
    s, a = env.schedules, env.md("alice")
    ghost_eid = eid.replace("billing-1", "ghost-1")
    ghost_dead = dead.replace("billing-1", "ghost-1")

    async def both(call: Callable[[str], Awaitable[Any]], real: str, fake: str) -> None:
        same_shape(await status_of(call(real)), await status_of(call(fake)), real, fake)

    await both(lambda i: s.GetSchedule(spb.GetScheduleRequest(id=i), metadata=a), "billing-1", "ghost-1")
    await both(lambda i: s.UpdateSchedule(spb.UpdateScheduleRequest(
        schedule=pb.Schedule(id=i, spec="* * * * *")), metadata=a), "billing-1", "ghost-1")
    await both(lambda i: s.DeleteSchedule(spb.DeleteScheduleRequest(id=i), metadata=a), "billing-1", "ghost-1")
    await both(lambda i: s.PauseSchedule(spb.PauseScheduleRequest(id=i, reason="x"), metadata=a),
               "billing-1", "ghost-1")
    await both(lambda i: s.ResumeSchedule(spb.ResumeScheduleRequest(id=i), metadata=a), "billing-1", "ghost-1")
    await both(lambda i: s.TriggerSchedule(spb.TriggerScheduleRequest(id=i), metadata=a), "billing-1", "ghost-1")
    await both(lambda i: s.RerunExecution(spb.RerunExecutionRequest(
        schedule_id=i, planned_at=ts(SYSTEM_CLOCK.wall_ms() // 1000 * 1000 - HOUR)), metadata=a),
        "billing-1", "ghost-1")
    await both(lambda i: s.Backfill(spb.BackfillRequest(
        schedule_id=i, start_time=ts(SYSTEM_CLOCK.wall_ms() - 10 * HOUR), end_time=ts(SYSTEM_CLOCK.wall_ms() - HOUR)),
        metadata=a), "billing-1", "ghost-1")
    await both(lambda i: s.PreviewSchedule(spb.PreviewScheduleRequest(schedule_id=i), metadata=a),
               "billing-1", "ghost-1")
    await both(lambda i: s.GetExecution(spb.GetExecutionRequest(execution_id=i), metadata=a), eid, ghost_eid)
    await both(lambda i: s.CancelExecution(spb.CancelExecutionRequest(execution_id=i), metadata=a), eid, ghost_eid)
    await both(lambda i: s.ReplayDeadLetter(spb.ReplayDeadLetterRequest(execution_id=i), metadata=a),
               dead, ghost_dead)
    await both(lambda i: s.DiscardDeadLetter(spb.DiscardDeadLetterRequest(execution_id=i), metadata=a),
               dead, ghost_dead)
    # A retried delete (allow_missing) of another tenant's schedule "succeeds" as for a missing one, and
    # deletes nothing.
    await s.DeleteSchedule(spb.DeleteScheduleRequest(id="billing-1", allow_missing=True), metadata=a)

    # Lists: billing's objects are left out; asking for tenant billing is refused outright.
    listed = await s.ListSchedules(spb.ListSchedulesRequest(), metadata=a)
    assert [x.id for x in listed.schedules] == ["pay-1"]
    execs = await s.ListExecutions(spb.ListExecutionsRequest(), metadata=a)
    assert {x.schedule_id for x in execs.executions} == {"pay-1"}
    assert not (await s.ListExecutions(spb.ListExecutionsRequest(schedule_id="billing-1"), metadata=a)).executions
    assert not (await s.ListDeadLetters(spb.ListDeadLettersRequest(), metadata=a)).dead_letters
    assert not (await s.ListDeadLetters(spb.ListDeadLettersRequest(schedule_id="billing-1"), metadata=a)).dead_letters
    assert not (await s.ListSkips(spb.ListSkipsRequest(schedule_id="billing-1"), metadata=a)).skips
    for call in (s.ListSchedules(spb.ListSchedulesRequest(tenant="billing"), metadata=a),
                 s.ListExecutions(spb.ListExecutionsRequest(tenant="billing"), metadata=a),
                 s.ListDeadLetters(spb.ListDeadLettersRequest(tenant="billing"), metadata=a)):
        code, details = await status_of(call)
        assert code is grpc.StatusCode.PERMISSION_DENIED and "billing" in details

    assert await env.snapshot() == before  # byte for byte, mod_revisions included

    # bob still sees all of it, and the admin sees both tenants.
    got = await s.GetSchedule(spb.GetScheduleRequest(id="billing-1"), metadata=env.md("bob"))
    assert got.schedule.tenant == "billing"
    dl = await s.ListDeadLetters(spb.ListDeadLettersRequest(), metadata=env.md("bob"))
    assert [d.execution.execution_id for d in dl.dead_letters] == [dead]
    every = await s.ListSchedules(spb.ListSchedulesRequest(), metadata=env.md("root"))
    assert [x.id for x in every.schedules] == ["billing-1", "pay-1"]


def _token_text(token: str) -> str:
    return base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)).decode()


async def test_page_tokens_never_hold_another_tenants_keys(env: AuthEnv, monkeypatch: pytest.MonkeyPatch) -> None:
    """Across every schedule's executions, with a scan budget of 2 records a page: the pages cut among
    billing's records, yet no token names one, and alice gets exactly her own executions."""
    monkeypatch.setattr(schedule_service, "CROSS_SCHEDULE_SCAN", 2)
    s = env.schedules
    for i in range(6):
        await s.CreateSchedule(spb.CreateScheduleRequest(schedule=sched(f"billing-{i}", "billing")),
                               metadata=env.md("bob"))
        for k in range(3):
            await s.TriggerSchedule(spb.TriggerScheduleRequest(id=f"billing-{i}", trigger_time=ts(
                SYSTEM_CLOCK.wall_ms() // 1000 * 1000 - k * 1000 - 5000)), metadata=env.md("bob"))
    mine = set()
    for i in range(3):
        await s.CreateSchedule(spb.CreateScheduleRequest(schedule=sched(f"pay-{i}", "payments")),
                               metadata=env.md("alice"))
        e = await s.TriggerSchedule(spb.TriggerScheduleRequest(id=f"pay-{i}"), metadata=env.md("alice"))
        mine.add(e.execution.execution_id)
    got, token, pages = set(), "", 0
    kinds: set[str] = set()
    while True:
        r = await s.ListExecutions(spb.ListExecutionsRequest(page_size=1, page_token=token), metadata=env.md("alice"))
        got |= {x.execution_id for x in r.executions}
        assert all(x.tenant == "payments" for x in r.executions)
        token, pages = r.next_page_token, pages + 1
        if not token:
            break
        assert "billing" not in _token_text(token), _token_text(token)
        kinds.add(json.loads(_token_text(token))["p"][0])
        assert pages < 100
    assert got == mine
    assert kinds & {"a", "p"}, kinds  # some page did end among billing's records (the case that could leak)
    # bob's pages (unrestricted within his tenant? no: restricted too) hold none of alice's keys either.
    token = ""
    while True:
        r = await s.ListExecutions(spb.ListExecutionsRequest(page_size=2, page_token=token), metadata=env.md("bob"))
        token = r.next_page_token
        if not token:
            break
        assert "pay-" not in _token_text(token)


async def test_credentials_unauthenticated_and_roles_permission_denied(env: AuthEnv) -> None:
    s = env.schedules
    get = spb.ListSchedulesRequest()
    for md in ((), (("authorization", "Bearer sched_not-a-token"),), (("authorization", "Basic abc"),),
               (("authorization", "Bearer " + env.jwt(exp=1)),),  # expired
               (("authorization", "Bearer " + env.jwt(aud="another-service")),),  # wrong audience
               (("authorization", "Bearer " + env.jwt(iss="https://evil.test")),)):  # wrong issuer
        code, _ = await status_of(s.ListSchedules(get, metadata=md))
        assert code is grpc.StatusCode.UNAUTHENTICATED, md
    from cryptography.hazmat.primitives.asymmetric import ec
    other = ec.generate_private_key(ec.SECP256R1())
    code, details = await status_of(s.ListSchedules(get, metadata=(("authorization", "Bearer " + env.jwt(other)),)))
    assert code is grpc.StatusCode.UNAUTHENTICATED and "signature" in details.lower()
    # A valid JWT with payments:reader reads, and may not write.
    good = (("authorization", "Bearer " + env.jwt()),)
    await s.ListSchedules(get, metadata=good)
    code, details = await status_of(s.CreateSchedule(spb.CreateScheduleRequest(schedule=sched("p-2", "payments")),
                                                     metadata=good))
    assert code is grpc.StatusCode.PERMISSION_DENIED, details
    # The reader of payments: reads yes, writes and operations no (PERMISSION_DENIED: its own tenant).
    await s.CreateSchedule(spb.CreateScheduleRequest(schedule=sched("pay-9", "payments")), metadata=env.md("alice"))
    r = env.md("reader")
    assert (await s.GetSchedule(spb.GetScheduleRequest(id="pay-9"), metadata=r)).schedule.id == "pay-9"
    for call in (s.PauseSchedule(spb.PauseScheduleRequest(id="pay-9"), metadata=r),
                 s.TriggerSchedule(spb.TriggerScheduleRequest(id="pay-9"), metadata=r),
                 s.DeleteSchedule(spb.DeleteScheduleRequest(id="pay-9"), metadata=r)):
        code, details = await status_of(call)
        assert code is grpc.StatusCode.PERMISSION_DENIED, details
    # A "retry" of bob's create (his request_id) by alice does not hand bob's schedule over.
    await s.CreateSchedule(spb.CreateScheduleRequest(schedule=sched("b-9", "billing"), request_id="r-1"),
                           metadata=env.md("bob"))
    code, details = await status_of(s.CreateSchedule(spb.CreateScheduleRequest(
        schedule=sched("b-9", "payments"), request_id="r-1"), metadata=env.md("alice")))
    assert (code, details) == (grpc.StatusCode.ALREADY_EXISTS, "schedule 'b-9' already exists")
    # alice may create in her tenant only.
    code, details = await status_of(s.CreateSchedule(spb.CreateScheduleRequest(schedule=sched("b-2", "billing")),
                                                     metadata=env.md("alice")))
    assert code is grpc.StatusCode.PERMISSION_DENIED and "billing" in details
    # Admin calls: tenants' principals and the worker are refused, the admin is not.
    for who in ("alice", "reader", "worker", "planner"):
        code, _ = await status_of(env.admin.Switchover(apb.SwitchoverRequest(target_region="r2"),
                                                       metadata=env.md(who)))
        assert code is grpc.StatusCode.PERMISSION_DENIED, who
    code, _ = await status_of(env.admin.Switchover(apb.SwitchoverRequest(target_region="r2"), metadata=env.md("root")))
    assert code is grpc.StatusCode.FAILED_PRECONDITION  # allowed: refused only because r2 has no planner
    await env.admin.GetClusterStatus(apb.GetClusterStatusRequest(), metadata=env.md("planner"))
    await env.admin.GetTime(apb.GetTimeRequest(), metadata=env.md("reader"))
    code, _ = await status_of(env.admin.GetTime(apb.GetTimeRequest()))
    assert code is grpc.StatusCode.UNAUTHENTICATED


async def test_pools_serve_only_their_tenants(env: AuthEnv) -> None:
    s = env.schedules
    code, details = await status_of(s.CreateSchedule(spb.CreateScheduleRequest(
        schedule=sched("b-1", "billing", pool="payments-pool")), metadata=env.md("bob")))
    assert code is grpc.StatusCode.PERMISSION_DENIED and "payments-pool" in details, details
    await s.CreateSchedule(spb.CreateScheduleRequest(schedule=sched("b-1", "billing")), metadata=env.md("bob"))
    before = await env.snapshot()
    req = spb.UpdateScheduleRequest(schedule=pb.Schedule(id="b-1", worker_pool="payments-pool"))
    req.update_mask.paths.append("worker_pool")
    code, details = await status_of(s.UpdateSchedule(req, metadata=env.md("bob")))
    assert code is grpc.StatusCode.PERMISSION_DENIED and "payments-pool" in details, details
    assert await env.snapshot() == before
    await s.CreateSchedule(spb.CreateScheduleRequest(schedule=sched("p-1", "payments", pool="payments-pool")),
                           metadata=env.md("alice"))


async def _hello(env: AuthEnv, who: str | None, pool: str) -> tuple[grpc.StatusCode, str]:
    call = env.workers.Connect(metadata=env.md(who))
    try:
        # The server may refuse the stream before the hello is sent: then write raises the status.
        await call.write(wpb.WorkerMessage(hello=wpb.Hello(worker_id="w1", pool=pool, task_types=["t"],
                                                           capabilities=CAPABILITIES)))
        msg = await call.read()
        call.cancel()
        return grpc.StatusCode.OK, msg.WhichOneof("body") or ""
    except grpc.aio.AioRpcError as e:
        return e.code(), e.details() or ""


async def test_workers_authenticate_and_serve_only_their_pool(env: AuthEnv) -> None:
    assert (await _hello(env, None, "payments-pool"))[0] is grpc.StatusCode.UNAUTHENTICATED
    code, details = await _hello(env, "worker", "other-pool")
    assert code is grpc.StatusCode.PERMISSION_DENIED and "other-pool" in details
    assert await _hello(env, "worker", "payments-pool") == (grpc.StatusCode.OK, "welcome")
    code, _ = await _hello(env, "alice", "payments-pool")  # a tenant's writer is no worker
    assert code is grpc.StatusCode.PERMISSION_DENIED


async def test_dispatch_never_sends_another_tenants_execution_to_a_restricted_pool(env: AuthEnv) -> None:
    """Enforced by the planner at dispatch, whatever the schedule says (one written before the restriction)."""
    from scheduler.execution import Trigger, new_execution
    from scheduler.ids import FencingToken
    from scheduler.model import RetryPolicy

    d = env.node.dispatcher
    assert hasattr(d, "queue")

    def ex(tenant: str) -> Any:
        return new_execution(id=f"s-{tenant}@2026-01-01T00:00:00.000Z", schedule_id=f"s-{tenant}", tenant=tenant,
                             pool="payments-pool", task_type="t", planned_ms=0, due_ms=0, trigger=Trigger.SCHEDULED,
                             retry=RetryPolicy(), timeout_ms=1000)
    d.submit(ex("billing"), b"", FencingToken(0, 1))
    assert d.queue.depth("payments-pool") == 0
    assert d.refused_tenant == 1  # type: ignore[attr-defined]
    d.submit(ex("payments"), b"", FencingToken(0, 1))
    assert d.queue.depth("payments-pool") == 1


async def test_audit_log_records_who_did_what(env: AuthEnv) -> None:
    await setup_billing(env)
    await status_of(env.schedules.TriggerSchedule(spb.TriggerScheduleRequest(id="billing-1"),
                                                  metadata=env.md("alice")))
    await status_of(env.admin.DrainPlanner(apb.DrainPlannerRequest(node_id="nobody"), metadata=env.md("root")))
    await env.schedules.GetSchedule(spb.GetScheduleRequest(id="pay-1"), metadata=env.md("alice"))  # a read: not audited
    r = await env.admin.ListAuditEvents(apb.ListAuditEventsRequest(), metadata=env.md("root"))
    rows = [(e.principal, e.action, e.target, e.result) for e in r.events]
    assert rows == [
        ("token:bob", "CreateSchedule", "billing-1", "OK"),
        ("token:bob", "TriggerSchedule", "billing-1", "OK"),
        ("token:alice", "CreateSchedule", "pay-1", "OK"),
        ("token:alice", "TriggerSchedule", "pay-1", "OK"),
        ("token:alice", "TriggerSchedule", "billing-1", "NOT_FOUND"),
        ("token:root", "DrainPlanner", "nobody", "NOT_FOUND"),
    ]
    newest = await env.admin.ListAuditEvents(apb.ListAuditEventsRequest(page_size=2, newest_first=True),
                                             metadata=env.md("root"))
    assert [e.action for e in newest.events] == ["DrainPlanner", "TriggerSchedule"] and newest.next_page_token
    more = await env.admin.ListAuditEvents(apb.ListAuditEventsRequest(page_size=2, newest_first=True,
                                                                      page_token=newest.next_page_token),
                                           metadata=env.md("root"))
    assert [e.target for e in more.events] == ["pay-1", "pay-1"]
    code, _ = await status_of(env.admin.ListAuditEvents(apb.ListAuditEventsRequest(), metadata=env.md("alice")))
    assert code is grpc.StatusCode.PERMISSION_DENIED


async def test_audit_log_is_bounded_oldest_first(env: AuthEnv) -> None:
    from scheduler.auth.audit import AuditLog

    log = AuditLog(env.kv, env.ks, SYSTEM_CLOCK, "n9", max_events=10, trim_every=1)
    for i in range(25):
        await log.record("token:x", "TriggerSchedule", f"s-{i}", "OK")
    events, _ = await log.list(limit=100)
    assert [e.target for e in events] == [f"s-{i}" for i in range(15, 25)]
    assert json.loads((await env.kv.get(env.ks.audit + events[0].key.encode())).value)["who"] == "token:x"  # type: ignore[union-attr]


async def test_mtls_certificate_identity_is_the_principal(env: AuthEnv) -> None:
    """A client certificate's SAN maps to roles ([certs]); a verified certificate without an entry is known
    but allowed nothing; a certificate from another CA, an expired one, or none never gets a call through."""
    from tests.store.authz_env import issue, make_ca, start_tls_server

    ca, ca_key, ca_cert = make_ca()
    _, other_key, other_cert = make_ca("another CA")
    server, address = await start_tls_server(env, ca, issue(ca_key, ca_cert, "localhost", server=True))
    await setup_billing(env)

    def channel(client: Any) -> grpc.aio.Channel:
        creds = grpc.ssl_channel_credentials(ca.cert, client.key if client else None, client.cert if client else None)
        return grpc.aio.secure_channel(address, creds)

    try:
        async with channel(issue(ca_key, ca_cert, "ops", uri="spiffe://test/admin")) as ch:
            from scheduler._gen.scheduler.v1 import schedule_service_pb2_grpc as sgrpc
            got = await sgrpc.ScheduleServiceStub(ch).ListSchedules(spb.ListSchedulesRequest(), timeout=10)
            assert [x.id for x in got.schedules] == ["billing-1", "pay-1"]
        async with channel(issue(ca_key, ca_cert, "reader", uri="spiffe://test/payments")) as ch:
            got = await sgrpc.ScheduleServiceStub(ch).ListSchedules(spb.ListSchedulesRequest(), timeout=10)
            assert [x.id for x in got.schedules] == ["pay-1"]
        async with channel(issue(ca_key, ca_cert, "stranger")) as ch:
            code, details = await status_of(sgrpc.ScheduleServiceStub(ch).ListSchedules(
                spb.ListSchedulesRequest(), timeout=10))
            assert code is grpc.StatusCode.PERMISSION_DENIED and "cert:stranger" in details
        for bad in (issue(other_key, other_cert, "ops", uri="spiffe://test/admin"),  # another CA
                    issue(ca_key, ca_cert, "ops", uri="spiffe://test/admin", expired=True),
                    None):  # no certificate at all
            async with channel(bad) as ch:
                code, _ = await status_of(sgrpc.ScheduleServiceStub(ch).ListSchedules(
                    spb.ListSchedulesRequest(), timeout=5))
                assert code is grpc.StatusCode.UNAVAILABLE  # the handshake fails: no call reaches a handler
    finally:
        await server.stop(None)


async def test_schedctl_sends_its_token_and_says_why_it_was_refused(env: AuthEnv, tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    import asyncio

    from scheduler.cli.main import main

    monkeypatch.delenv("SCHED_TOKEN_FILE", raising=False)
    monkeypatch.setenv("SCHED_CONFIG", str(tmp_path / "none.toml"))  # no user config file
    (tmp_path / "none.toml").write_text("")
    for who in ("alice", "root"):
        (tmp_path / f"{who}.token").write_text(env.tokens[who] + "\n")

    async def schedctl(*argv: str) -> int:
        return await asyncio.to_thread(main, [*argv, "--server", env.address])

    await env.schedules.CreateSchedule(spb.CreateScheduleRequest(schedule=sched("pay-1", "payments")),
                                       metadata=env.md("alice"))
    assert await schedctl("schedule", "list", "--token-file", str(tmp_path / "alice.token")) == 0
    assert "pay-1" in capsys.readouterr().out
    assert await schedctl("schedule", "list") == 7  # no token
    assert "--token-file" in capsys.readouterr().err
    assert await schedctl("cluster", "status", "--token-file", str(tmp_path / "alice.token")) == 8
    assert "permission denied: token:alice may not call GetClusterStatus" in capsys.readouterr().err
    monkeypatch.setenv("SCHED_TOKEN_FILE", str(tmp_path / "root.token"))
    assert await schedctl("audit", "list") == 0
    out = capsys.readouterr().out
    assert "token:alice" in out and "CreateSchedule" in out
    monkeypatch.setenv("SCHED_TOKEN_FILE", str(tmp_path / "missing.token"))
    assert await schedctl("schedule", "list") == 2
    assert "token_file: cannot read" in capsys.readouterr().err


async def test_a_restricted_pool_worker_never_receives_another_tenants_execution(
        env: AuthEnv, tmp_path: Path) -> None:
    """A real planner loop and a real SDK worker of pool `payments-pool` (token `payments-pool:worker`). A
    billing schedule stored on that pool before the restriction (written past the API, which refuses it now)
    is triggered: its run never reaches the worker and is dead-lettered naming the pool, while payments' run
    on the same pool runs."""
    import asyncio
    import dataclasses

    from scheduler.execution import ExecState
    from scheduler.model import Schedule
    from scheduler.worker import ExecutionContext, Worker
    from tests.store.test_operations import WORKER

    await env.node.store.create(Schedule(id="old-billing", tenant="billing", spec=YEARLY, worker_pool="payments-pool",
                                         task_type="t"), SYSTEM_CLOCK.wall_ms() - HOUR)
    await env.schedules.CreateSchedule(spb.CreateScheduleRequest(schedule=sched("pay-w", "payments", "payments-pool")),
                                       metadata=env.md("alice"))
    (tmp_path / "worker.token").write_text(env.tokens["worker"])
    worker = Worker(settings=dataclasses.replace(WORKER, pool="payments-pool", planners=(env.address,),
                                                 token_file=str(tmp_path / "worker.token")))
    ran: list[str] = []

    @worker.task("t")
    async def handler(ctx: ExecutionContext, payload: bytes) -> None:
        ran.append(ctx.execution_id)

    node_task = asyncio.create_task(env.node.run())
    await worker.start()
    try:
        bad = await env.schedules.TriggerSchedule(spb.TriggerScheduleRequest(id="old-billing"),
                                                  metadata=env.md("bob"))
        good = await env.schedules.TriggerSchedule(spb.TriggerScheduleRequest(id="pay-w"), metadata=env.md("alice"))
        async with asyncio.timeout(20):
            while True:
                b = await env.node.ledger.get(env.kv, "old-billing", bad.execution.planned_at.ToMilliseconds())
                g = await env.node.ledger.get(env.kv, "pay-w", good.execution.planned_at.ToMilliseconds())
                if b is not None and g is not None and b.state is ExecState.DEAD_LETTER \
                        and g.state is ExecState.SUCCEEDED:
                    break
                await asyncio.sleep(0.1)
        assert ran == [good.execution.execution_id]
        assert b.current is not None and "does not serve tenant 'billing'" in b.current.message
        assert env.node.dispatcher.refused_tenant == 1  # type: ignore[attr-defined]
    finally:
        await worker.close()
        node_task.cancel()
        await asyncio.gather(node_task, return_exceptions=True)


async def test_requests_per_second_per_principal(kv: EtcdClient, key_prefix: str, tmp_path: Path) -> None:
    """Over its rate a principal gets RESOURCE_EXHAUSTED with a google.rpc.RetryInfo hint; another principal
    and planners' peer calls are not held back."""
    from google.rpc import error_details_pb2
    from grpc_status import rpc_status

    from scheduler.planner.settings import PlannerSettings

    async for env in start_auth_env(kv, key_prefix, tmp_path, PlannerSettings(rate_limit_rps=1, rate_limit_burst=3)):
        s = env.schedules
        for _ in range(3):
            await s.ListSchedules(spb.ListSchedulesRequest(), metadata=env.md("alice"))
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await s.ListSchedules(spb.ListSchedulesRequest(), metadata=env.md("alice"))
        assert e.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED and "retry in" in (e.value.details() or "")
        st = rpc_status.from_call(e.value)  # type: ignore[arg-type]
        assert st is not None
        info = error_details_pb2.RetryInfo()
        assert st.details[0].Unpack(info) and 0 < info.retry_delay.ToMilliseconds() <= 1000
        await s.ListSchedules(spb.ListSchedulesRequest(), metadata=env.md("bob"))
        for _ in range(5):
            await env.admin.GetTime(apb.GetTimeRequest(), metadata=env.md("planner"))


async def test_a_batch_create_is_checked_item_by_item_and_writes_nothing_when_one_is_refused(env: AuthEnv) -> None:
    """BatchCreateSchedules came from the scale branch after the authorization work: every item's tenant and
    pool is checked before anything is written (without the check, alice's batch created bob's schedule)."""
    s = env.schedules
    before = await env.snapshot()
    code, _ = await status_of(s.BatchCreateSchedules(spb.BatchCreateSchedulesRequest(
        schedules=[sched("p-9", "payments"), sched("b-9", "billing")]), metadata=env.md("alice")))
    assert code is grpc.StatusCode.PERMISSION_DENIED
    code, details = await status_of(s.BatchCreateSchedules(spb.BatchCreateSchedulesRequest(
        schedules=[sched("b-8", "billing", pool="payments-pool")]), metadata=env.md("bob")))
    assert code is grpc.StatusCode.PERMISSION_DENIED and "payments-pool" in details, details
    assert await env.snapshot() == before
    got = await s.BatchCreateSchedules(spb.BatchCreateSchedulesRequest(
        schedules=[sched("p-9", "payments"), sched("p-10", "payments")]), metadata=env.md("alice"))
    assert [r.schedule.id for r in got.results] == ["p-9", "p-10"]


async def test_an_id_deleted_and_used_again_by_another_tenant_leaves_the_old_records_alone(env: AuthEnv) -> None:
    """An outside audit: alice's schedule deleted, bob created one of the same id (ids are global) and reran one
    of alice's planned times: the record became bob's, alice's attempt output included, and vanished for her.
    Execution ids are schedule id + planned time, so the old records are under bob's id: his operations on them
    answer as for missing ones, and his lists leave them out."""
    from dataclasses import replace as dc_replace

    from scheduler.execution import ExecState, Trigger, new_execution
    from scheduler.ids import execution_id
    from scheduler.model import RetryPolicy

    s = env.schedules
    await s.CreateSchedule(spb.CreateScheduleRequest(schedule=sched("reuse-1", "payments")), metadata=env.md("alice"))
    hour_ago = SYSTEM_CLOCK.wall_ms() // 1000 * 1000 - HOUR
    dead = await env.dead_letter("reuse-1", "payments", hour_ago)
    skipped = new_execution(id=execution_id("reuse-1", hour_ago + 1000), schedule_id="reuse-1", tenant="payments",
                            pool="default", task_type="t", planned_ms=hour_ago + 1000, due_ms=hour_ago + 1000,
                            trigger=Trigger.SCHEDULED, retry=RetryPolicy(), timeout_ms=60_000)
    await env.kv.txn([], [env.node.ledger.create_op(dc_replace(skipped, state=ExecState.SKIPPED,
                                                               skip_reason="paused"))])
    # Her own records she sees (a restricted caller's listing decodes each record once: tenant, state, entry).
    mine = (await s.ListSkips(spb.ListSkipsRequest(schedule_id="reuse-1"), metadata=env.md("alice"))).skips
    assert [(x.execution_id, x.message) for x in mine] == [(skipped.id, "paused")], mine
    listed = await s.ListExecutions(spb.ListExecutionsRequest(
        schedule_id="reuse-1", states=[epb.EXECUTION_STATE_SKIPPED]), metadata=env.md("alice"))
    assert [x.execution_id for x in listed.executions] == [skipped.id], listed
    await s.DeleteSchedule(spb.DeleteScheduleRequest(id="reuse-1"), metadata=env.md("alice"))
    await s.CreateSchedule(spb.CreateScheduleRequest(schedule=sched("reuse-1", "billing")), metadata=env.md("bob"))
    before = await env.snapshot()
    b = env.md("bob")
    code, details = await status_of(s.RerunExecution(spb.RerunExecutionRequest(
        schedule_id="reuse-1", planned_at=ts(hour_ago)), metadata=b))
    assert code is grpc.StatusCode.NOT_FOUND and dead in details, (code, details)
    for call in (s.GetExecution(spb.GetExecutionRequest(execution_id=dead), metadata=b),
                 s.ReplayDeadLetter(spb.ReplayDeadLetterRequest(execution_id=dead), metadata=b)):
        assert (await status_of(call))[0] is grpc.StatusCode.NOT_FOUND
    assert not (await s.ListSkips(spb.ListSkipsRequest(schedule_id="reuse-1"), metadata=b)).skips
    assert not (await s.ListExecutions(spb.ListExecutionsRequest(schedule_id="reuse-1"), metadata=b)).executions
    assert await env.snapshot() == before
    # Alice still has her records.
    got = await s.GetExecution(spb.GetExecutionRequest(execution_id=dead), metadata=env.md("alice"))
    assert got.execution.tenant == "payments"
