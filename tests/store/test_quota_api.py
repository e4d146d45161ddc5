"""Tenant quotas over real gRPC against real etcd, with auth on (tests/store/authz_env.py): the admin RPCs
(who may set and read, validation naming the field, the audit log), creates, batch creates, updates and
backfills refused over a quota with RESOURCE_EXHAUSTED and nothing written (read back from etcd), creates
racing at the limit (exactly the limit pass), and a quota change applying to the next call.

`QUOTA_UNPROTECTED=1` runs the race with the counter's compare removed, to show that the test catches it.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from google.protobuf.timestamp_pb2 import Timestamp

from chaos.infra.etcd import EtcdCluster
from scheduler._gen.scheduler.v1 import admin_service_pb2 as apb
from scheduler._gen.scheduler.v1 import schedule_pb2 as pb
from scheduler._gen.scheduler.v1 import schedule_service_pb2 as spb
from scheduler._gen.scheduler.v1 import schedule_service_pb2_grpc as sgrpc
from scheduler.clock import SYSTEM_CLOCK
from scheduler.model import Schedule
from scheduler.quota import usage as qusage
from scheduler.store.etcd import EtcdClient
from tests.store.authz_env import AuthEnv, start_auth_env
from tests.store.test_authz import status_of

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


def sched(sid: str, tenant: str = "payments", **labels: str) -> pb.Schedule:
    return pb.Schedule(id=sid, tenant=tenant, spec=YEARLY, worker_pool="default", task_type="t", labels=labels)


def ts(ms: int) -> Timestamp:
    t = Timestamp()
    t.FromMilliseconds(ms)
    return t


async def set_quota(env: AuthEnv, tenant: str | None, **limits: float) -> apb.TenantQuota:
    q = apb.TenantQuota(**limits)  # type: ignore[arg-type]
    req = apb.SetTenantQuotaRequest(tenant=tenant or "", default_quota=tenant is None, quota=q, reason="test")
    req.update_mask.paths.extend(limits)
    r: apb.SetTenantQuotaResponse = await env.admin.SetTenantQuota(req, metadata=env.md("root"))
    return r.quota


async def create(env: AuthEnv, s: pb.Schedule, who: str = "alice") -> tuple[grpc.StatusCode, str]:
    return await status_of(env.schedules.CreateSchedule(spb.CreateScheduleRequest(schedule=s), metadata=env.md(who)))


# ---- the admin RPCs --------------------------------------------------------------------------------------


async def test_set_get_list_delete_and_who_may(env: AuthEnv) -> None:
    a = env.admin
    q = await set_quota(env, "payments", max_schedules=10, max_labels=4)
    assert (q.tenant, q.max_schedules, q.max_labels, q.max_backfill, q.updated_by) == \
        ("payments", 10, 4, 0, "token:root")
    assert q.version > 0
    # Only the named fields change; the others keep their stored values.
    q2 = await set_quota(env, "payments", max_executions_per_second=2.5)
    assert (q2.max_schedules, q2.max_labels, q2.max_executions_per_second) == (10, 4, 2.5)
    await set_quota(env, None, max_schedules=3)  # the default
    # payments' reader reads its own; billing's is refused for it, and the default applies to billing.
    mine = await a.GetTenantQuota(apb.GetTenantQuotaRequest(tenant="payments"), metadata=env.md("reader"))
    assert mine.own_record and mine.quota.max_schedules == 10
    code, msg = await status_of(a.GetTenantQuota(apb.GetTenantQuotaRequest(tenant="billing"),
                                                 metadata=env.md("reader")))
    assert code is grpc.StatusCode.PERMISSION_DENIED, msg
    billing = await a.GetTenantQuota(apb.GetTenantQuotaRequest(tenant="billing"), metadata=env.md("root"))
    assert not billing.own_record and billing.quota.max_schedules == 3 and billing.quota.version == 0
    # Changing needs system:admin.
    for who in ("alice", "reader"):
        code, _ = await status_of(a.SetTenantQuota(apb.SetTenantQuotaRequest(
            tenant="payments", quota=apb.TenantQuota(max_schedules=1000)), metadata=env.md(who)))
        assert code is grpc.StatusCode.PERMISSION_DENIED, who
        code, _ = await status_of(a.DeleteTenantQuota(apb.DeleteTenantQuotaRequest(tenant="payments"),
                                                      metadata=env.md(who)))
        assert code is grpc.StatusCode.PERMISSION_DENIED, who
    listed = await a.ListTenantQuotas(apb.ListTenantQuotasRequest(), metadata=env.md("root"))
    assert [x.tenant for x in listed.quotas] == ["payments"] and listed.default_quota.max_schedules == 3
    seen = await a.ListTenantQuotas(apb.ListTenantQuotasRequest(), metadata=env.md("bob"))  # billing only
    assert list(seen.quotas) == []
    # expected_version: a stale one is ABORTED, nothing changes.
    code, _ = await status_of(a.SetTenantQuota(apb.SetTenantQuotaRequest(
        tenant="payments", quota=apb.TenantQuota(max_schedules=1), expected_version=q.version),
        metadata=env.md("root")))
    assert code is grpc.StatusCode.ABORTED
    gone = await a.DeleteTenantQuota(apb.DeleteTenantQuotaRequest(tenant="payments"), metadata=env.md("root"))
    assert gone.deleted
    again = await a.DeleteTenantQuota(apb.DeleteTenantQuotaRequest(tenant="payments"), metadata=env.md("root"))
    assert not again.deleted
    # The changes are in the audit log, with the tenant as target.
    events = (await a.ListAuditEvents(apb.ListAuditEventsRequest(page_size=100), metadata=env.md("root"))).events
    mine_ev = [(e.action, e.target, e.result) for e in events if "TenantQuota" in e.action]
    assert ("SetTenantQuota", "payments", "OK") in mine_ev
    assert ("DeleteTenantQuota", "payments", "OK") in mine_ev
    assert ("SetTenantQuota", "payments", "ABORTED") in mine_ev


@pytest.mark.parametrize(("request_", "field"), [
    (apb.SetTenantQuotaRequest(quota=apb.TenantQuota(max_schedules=1)), "tenant"),
    (apb.SetTenantQuotaRequest(tenant="a b", quota=apb.TenantQuota(max_schedules=1)), "tenant"),
    (apb.SetTenantQuotaRequest(tenant="x", default_quota=True, quota=apb.TenantQuota(max_schedules=1)), "tenant"),
    (apb.SetTenantQuotaRequest(tenant="x", quota=apb.TenantQuota(max_labels=33)), "quota.max_labels"),
    (apb.SetTenantQuotaRequest(tenant="x", quota=apb.TenantQuota(max_payload_bytes=70_000)),
     "quota.max_payload_bytes"),
    (apb.SetTenantQuotaRequest(tenant="x", quota=apb.TenantQuota(max_executions_per_second=-1)),
     "quota.max_executions_per_second"),
    (apb.SetTenantQuotaRequest(tenant="x", quota=apb.TenantQuota(max_executions_per_second=float("nan"))),
     "quota.max_executions_per_second"),
    (apb.SetTenantQuotaRequest(tenant="x", quota=apb.TenantQuota(max_schedules=10**12)), "quota.max_schedules"),
])
async def test_bad_quota_requests_name_the_field(env: AuthEnv, request_: apb.SetTenantQuotaRequest,
                                                 field: str) -> None:
    before = await env.snapshot()
    code, msg = await status_of(env.admin.SetTenantQuota(request_, metadata=env.md("root")))
    assert code is grpc.StatusCode.INVALID_ARGUMENT and msg.startswith(field), (code, msg)
    assert await env.snapshot() == before


async def test_bad_update_mask_path_is_named(env: AuthEnv) -> None:
    req = apb.SetTenantQuotaRequest(tenant="x", quota=apb.TenantQuota(max_schedules=1))
    req.update_mask.paths.append("tenant")
    code, msg = await status_of(env.admin.SetTenantQuota(req, metadata=env.md("root")))
    assert code is grpc.StatusCode.INVALID_ARGUMENT and msg.startswith("update_mask.paths[0]"), msg


async def test_unknown_fields_of_a_stored_record_survive_a_set(env: AuthEnv) -> None:
    """A newer version's limit in the record is written back by this version's read-modify-write."""
    key = env.ks.quota("payments")
    await env.kv.put(key, json.dumps({"schedules": 5, "max_cron_jobs": 7, "labels": "many"}).encode())
    await set_quota(env, "payments", max_backfill=9)
    got = json.loads((await env.kv.get(key)).value)  # type: ignore[union-attr]
    assert got["max_cron_jobs"] == 7 and got["labels"] == "many" and got["schedules"] == 5 and got["backfill"] == 9


# ---- enforcement ---------------------------------------------------------------------------------------


async def test_over_the_schedules_quota_is_refused_and_writes_nothing(env: AuthEnv) -> None:
    await set_quota(env, "payments", max_schedules=2)
    assert (await create(env, sched("p1")))[0] is grpc.StatusCode.OK
    assert (await create(env, sched("p2")))[0] is grpc.StatusCode.OK
    before = await env.snapshot()
    code, msg = await create(env, sched("p3"))
    assert code is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "schedules quota" in msg and "limit 2" in msg and "holds 2" in msg, msg
    # A batch that would pass the limit: refused whole, nothing written.
    code, msg = await status_of(env.schedules.BatchCreateSchedules(spb.BatchCreateSchedulesRequest(
        schedules=[sched("p4"), sched("p5")]), metadata=env.md("alice")))
    assert code is grpc.StatusCode.RESOURCE_EXHAUSTED and "limit 2" in msg, msg
    assert await env.snapshot() == before
    # Another tenant is not affected; a delete makes room (the counter moves down with it).
    assert (await create(env, sched("b1", "billing"), "bob"))[0] is grpc.StatusCode.OK
    await env.schedules.DeleteSchedule(spb.DeleteScheduleRequest(id="p1"), metadata=env.md("alice"))
    assert (await create(env, sched("p3")))[0] is grpc.StatusCode.OK
    got = await env.admin.GetTenantQuota(apb.GetTenantQuotaRequest(tenant="payments"), metadata=env.md("reader"))
    assert got.schedules_held == 2
    # A retry of a create that went through (same request_id) still answers with the schedule at the limit.
    r = spb.CreateScheduleRequest(schedule=sched("p9"), request_id="rid-1")
    await env.admin.SetTenantQuota(apb.SetTenantQuotaRequest(tenant="payments", quota=apb.TenantQuota(
        max_schedules=3)), metadata=env.md("root"))
    assert (await env.schedules.CreateSchedule(r, metadata=env.md("alice"))).schedule.id == "p9"
    assert (await env.schedules.CreateSchedule(r, metadata=env.md("alice"))).schedule.id == "p9"


async def test_a_quota_change_applies_to_the_next_call(env: AuthEnv) -> None:
    await set_quota(env, None, max_schedules=1)  # the default: tenants without a record
    assert (await create(env, sched("p1")))[0] is grpc.StatusCode.OK
    assert (await create(env, sched("p2")))[0] is grpc.StatusCode.RESOURCE_EXHAUSTED
    await set_quota(env, "payments", max_schedules=0)  # its own record: unlimited, whatever the default
    assert (await create(env, sched("p2")))[0] is grpc.StatusCode.OK
    assert (await create(env, sched("b1", "billing"), "bob"))[0] is grpc.StatusCode.OK
    assert (await create(env, sched("b2", "billing"), "bob"))[0] is grpc.StatusCode.RESOURCE_EXHAUSTED


async def test_labels_and_payload_quotas_on_create_and_update(env: AuthEnv) -> None:
    await set_quota(env, "payments", max_labels=2, max_payload_bytes=10)
    assert (await create(env, sched("p1", a="1", b="2")))[0] is grpc.StatusCode.OK
    before = await env.snapshot()
    code, msg = await create(env, sched("p2", a="1", b="2", c="3"))
    assert code is grpc.StatusCode.RESOURCE_EXHAUSTED and "labels quota" in msg and "limit 2" in msg, msg
    big = sched("p3")
    big.payload = b"x" * 11
    code, msg = await create(env, big)
    assert code is grpc.StatusCode.RESOURCE_EXHAUSTED and "payload quota" in msg, msg
    upd = spb.UpdateScheduleRequest(schedule=pb.Schedule(id="p1", labels={"a": "1", "b": "2", "c": "3"}))
    upd.update_mask.paths.append("labels")
    code, msg = await status_of(env.schedules.UpdateSchedule(upd, metadata=env.md("alice")))
    assert code is grpc.StatusCode.RESOURCE_EXHAUSTED and "labels" in msg, msg
    code, msg = await status_of(env.schedules.BatchCreateSchedules(spb.BatchCreateSchedulesRequest(
        schedules=[sched("p4"), sched("p5", a="1", b="2", c="3")]), metadata=env.md("alice")))
    assert code is grpc.StatusCode.RESOURCE_EXHAUSTED and msg.startswith("schedules[1].labels"), msg
    assert await env.snapshot() == before


async def test_a_backfill_over_its_quota_writes_nothing(env: AuthEnv) -> None:
    hourly = pb.Schedule(id="h1", tenant="payments", spec="0 * * * *", worker_pool="default", task_type="t")
    assert (await create(env, hourly))[0] is grpc.StatusCode.OK
    await set_quota(env, "payments", max_backfill=5)
    now = SYSTEM_CLOCK.wall_ms() // HOUR * HOUR
    before = await env.snapshot()
    code, msg = await status_of(env.schedules.Backfill(spb.BackfillRequest(
        schedule_id="h1", start_time=ts(now - 10 * HOUR), end_time=ts(now)), metadata=env.md("alice")))
    assert code is grpc.StatusCode.RESOURCE_EXHAUSTED and "backfill quota" in msg and "limit 5" in msg, msg
    assert await env.snapshot() == before
    ok = [m async for m in env.schedules.Backfill(spb.BackfillRequest(
        schedule_id="h1", start_time=ts(now - 5 * HOUR), end_time=ts(now)), metadata=env.md("alice"))]
    assert ok[-1].done and ok[-1].created == 5


# ---- the race at the limit -------------------------------------------------------------------------------


@pytest.mark.parametrize("counted", [False, True], ids=["counter-exists", "counted-by-scan"])
async def test_creates_racing_at_the_limit_pass_exactly_the_limit(env: AuthEnv, counted: bool,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """40 creates of one tenant at once, over 8 channels, against a limit of 10 with 3 held: exactly 7 pass.
    `counted-by-scan`: the 3 were created before any limit applied (no counter yet, as after an upgrade), so
    the first creates under the limit count them by a scan and race to create the counter."""
    if os.environ.get("QUOTA_UNPROTECTED") == "1":
        monkeypatch.setattr(qusage, "guard", lambda ks, u: [])  # the protection removed
    now = SYSTEM_CLOCK.wall_ms()
    for i in range(3):
        s = Schedule(id=f"old-{i}", tenant="payments", spec=YEARLY, worker_pool="default", task_type="t")
        await env.node.store.create(s, now)
    if not counted:
        await env.node.store.create(Schedule(id="old-3", tenant="payments", spec=YEARLY, worker_pool="default",
                                             task_type="t"), now, limit=100)  # makes the counter (4 held)
        await env.schedules.DeleteSchedule(spb.DeleteScheduleRequest(id="old-3"), metadata=env.md("alice"))
        assert (await env.kv.get(env.ks.usage("payments"))) is not None
    await set_quota(env, "payments", max_schedules=10)
    channels = [grpc.aio.insecure_channel(env.address) for _ in range(8)]
    try:
        stubs = [sgrpc.ScheduleServiceStub(c) for c in channels]
        codes = await asyncio.gather(*(status_of(stubs[i % 8].CreateSchedule(
            spb.CreateScheduleRequest(schedule=sched(f"race-{i:02d}")), metadata=env.md("alice")))
            for i in range(40)))
    finally:
        for c in channels:
            await c.close(None)
    ok = sum(1 for c, _ in codes if c is grpc.StatusCode.OK)
    refused = [m for c, m in codes if c is grpc.StatusCode.RESOURCE_EXHAUSTED]
    others = [(c, m) for c, m in codes if c not in (grpc.StatusCode.OK, grpc.StatusCode.RESOURCE_EXHAUSTED)]
    held = [x for x in (await env.kv.range(env.ks.all_schedules, prefix=True)).kvs
            if json.loads(x.value)["tenant"] == "payments"]
    counter = qusage.decode((await env.kv.get(env.ks.usage("payments"))).value)  # type: ignore[union-attr]
    print(f"race ({'counted by scan' if counted else 'counter exists'}): {ok} created, {len(refused)} refused, "
          f"{len(others)} other; {len(held)} held in etcd, counter {counter}")
    assert not others, others
    assert ok == 7 and len(held) == 10 and counter == 10


# ---- schedctl tenant -------------------------------------------------------------------------------------


async def test_schedctl_tenant_quota_set_get_and_list(env: AuthEnv, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    from scheduler.cli.main import main

    monkeypatch.setenv("SCHED_CONFIG", str(tmp_path / "none.toml"))
    (tmp_path / "none.toml").write_text("")
    for who in ("root", "reader"):
        (tmp_path / f"{who}.token").write_text(env.tokens[who] + "\n")
    monkeypatch.setenv("SCHED_TOKEN_FILE", str(tmp_path / "root.token"))

    async def schedctl(*argv: str) -> int:
        return await asyncio.to_thread(main, [*argv, "--server", env.address])

    assert await schedctl("tenant", "quota", "set", "payments", "--schedules", "5", "--executions-per-second",
                          "2.5", "--backfill", "100", "--labels", "4", "--reason", "launch") == 0
    out = capsys.readouterr().out
    assert "schedules:" in out and "5" in out and "2.5" in out and "launch" in out
    assert await schedctl("tenant", "quota", "set", "--default", "--schedules", "50") == 0
    capsys.readouterr()
    monkeypatch.setenv("SCHED_TOKEN_FILE", str(tmp_path / "reader.token"))
    assert await schedctl("tenant", "quota", "get", "payments", "--json") == 0
    got = json.loads(capsys.readouterr().out)
    assert got["max_schedules"] == "5" and got["max_labels"] == 4 and got["own_record"] is True
    assert await schedctl("tenant", "quota", "set", "payments", "--schedules", "9") == 8  # not an admin
    assert "permission denied" in capsys.readouterr().err
    monkeypatch.setenv("SCHED_TOKEN_FILE", str(tmp_path / "root.token"))
    assert await schedctl("tenant", "list") == 0
    out = capsys.readouterr().out
    assert "(default)" in out and "payments" in out and "unlimited" in out
    assert await schedctl("tenant", "quota", "set", "payments", "--labels", "-1") == 2  # checked before sending
    assert "--labels: is -1" in capsys.readouterr().err
    assert await schedctl("tenant", "quota", "set", "payments", "--labels", "40") == 2  # the server's check
    assert "quota.max_labels" in capsys.readouterr().err


async def test_a_count_by_scan_is_not_trusted_after_an_untracked_create_or_delete(env: AuthEnv) -> None:
    """The counter made from a scan at revision R is refused when a schedule was created or deleted after R
    by a writer that did not move a counter (no limit applied when it wrote): the count starts over."""
    from scheduler.store.etcd.ops import put

    store, ks = env.node.store, env.ks
    now = SYSTEM_CLOCK.wall_ms()

    def mk(i: int) -> Schedule:
        return Schedule(id=f"u{i}", tenant="payments", spec=YEARLY, worker_pool="default", task_type="t")

    await store.create(mk(0), now)
    for late in ("create", "delete"):
        u = await qusage.count(env.kv, ks, "payments", timeout=1.0)
        if late == "create":
            await store.create(mk(1), now)  # no limit: no counter moved
        else:
            await store.delete("u1", now_ms=now)
        r = await env.kv.txn(qusage.guard(ks, u), [put(ks.usage("payments"), qusage.encode(u.schedules + 1))])
        assert not r.succeeded, f"a counter from a stale scan was written after an untracked {late}"
    assert await env.kv.get(ks.usage("payments")) is None
    # Counted afresh, it is right.
    await store.create(mk(2), now, limit=10)
    assert qusage.decode((await env.kv.get(ks.usage("payments"))).value) == 2  # type: ignore[union-attr]


async def test_an_update_with_an_empty_mask_or_star_is_checked_too(env: AuthEnv) -> None:
    await set_quota(env, "payments", max_labels=1)
    assert (await create(env, sched("p1", a="1")))[0] is grpc.StatusCode.OK
    before = await env.snapshot()
    for paths in ([], ["*"]):
        s = sched("p1", a="1", b="2")
        upd = spb.UpdateScheduleRequest(schedule=s)
        upd.update_mask.paths.extend(paths)
        code, msg = await status_of(env.schedules.UpdateSchedule(upd, metadata=env.md("alice")))
        assert code is grpc.StatusCode.RESOURCE_EXHAUSTED and "labels quota" in msg, (paths, code, msg)
    assert await env.snapshot() == before


async def test_batch_creates_racing_at_the_limit(env: AuthEnv) -> None:
    """Six batches of 5 at once against a limit of 12: two pass whole, the others are refused, no partial one."""
    await set_quota(env, "payments", max_schedules=12)
    results = await asyncio.gather(*(status_of(env.schedules.BatchCreateSchedules(spb.BatchCreateSchedulesRequest(
        schedules=[sched(f"b{j}-{i}") for i in range(5)]), metadata=env.md("alice"))) for j in range(6)))
    ok = [j for j, (c, _) in enumerate(results) if c is grpc.StatusCode.OK]
    assert len(ok) == 2 and all(c is grpc.StatusCode.RESOURCE_EXHAUSTED for j, (c, _) in enumerate(results)
                                if j not in ok), results
    ids = {json.loads(x.value)["id"] for x in (await env.kv.range(env.ks.all_schedules, prefix=True)).kvs}
    assert ids == {f"b{j}-{i}" for j in ok for i in range(5)}
    assert qusage.decode((await env.kv.get(env.ks.usage("payments"))).value) == 10  # type: ignore[union-attr]


async def test_a_full_batch_of_many_tenants_fits_etcds_txn_limit(env: AuthEnv) -> None:
    """127 schedules of 10 tenants with their counters: more compares than one etcd txn takes (128), so the
    store sends them as several (bench/bench_scale.py found it)."""
    from scheduler.store.schedules import MAX_BATCH

    now = SYSTEM_CLOCK.wall_ms()
    many = [Schedule(id=f"m{i:03d}", tenant=f"t{i % 10}", spec=YEARLY, worker_pool="default", task_type="t")
            for i in range(MAX_BATCH)]
    got = await env.node.store.create_batch(many, now, limits={f"t{i}": 100 for i in range(10)})
    assert all(st is not None for st in got)
    for i in range(10):
        assert qusage.decode((await env.kv.get(env.ks.usage(f"t{i}"))).value) == len(  # type: ignore[union-attr]
            [x for x in many if x.tenant == f"t{i}"])
