"""BatchCreateSchedules and `schedctl schedule apply` against real etcd, over real gRPC (issue 12, item 4).

The service runs in this process on the in-test event loop, backed by a real etcd; `schedctl` runs as a
subprocess against it, as an operator would run it.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from chaos.infra.etcd import EtcdCluster
from scheduler._gen.scheduler.v1 import schedule_pb2 as pb
from scheduler._gen.scheduler.v1 import schedule_service_pb2 as spb
from scheduler._gen.scheduler.v1 import schedule_service_pb2_grpc as sgrpc
from scheduler.api.schedule_service import ScheduleService
from scheduler.clock import SYSTEM_CLOCK
from scheduler.model import Schedule
from scheduler.store.etcd import EtcdClient
from scheduler.store.keyspace import Keyspace
from scheduler.store.ledger import Ledger
from scheduler.store.schedules import MAX_BATCH, ScheduleStore
from tests.unit.api.test_service_inproc import FakeOps

pytestmark = pytest.mark.etcd

P = 8


@dataclass
class Env:
    stub: sgrpc.ScheduleServiceStub
    store: ScheduleStore
    kv: EtcdClient
    ks: Keyspace
    address: str


@pytest.fixture
async def env(etcd_server: EtcdCluster, key_prefix: str) -> AsyncIterator[Env]:
    async with EtcdClient(etcd_server.config(timeout=5.0)) as kv:
        ks = Keyspace(key_prefix.rstrip("/"))
        store = ScheduleStore(kv, ks, P, timeout=5.0)
        svc = ScheduleService(kv=kv, ks=ks, store=store, ledger=Ledger(ks, P), clock=SYSTEM_CLOCK, ops=FakeOps(),
                              rpc_timeout=5.0)
        server = grpc.aio.server()
        sgrpc.add_ScheduleServiceServicer_to_server(svc, server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
                yield Env(sgrpc.ScheduleServiceStub(ch), store, kv, ks, f"127.0.0.1:{port}")
        finally:
            await server.stop(None)


def sched(i: int, **kw: object) -> pb.Schedule:
    return pb.Schedule(**{"id": f"b{i}", "tenant": "t", "spec": "*/5 * * * *", "worker_pool": "p",  # type: ignore[arg-type]
                          "task_type": "x", **kw})


def bad_field(e: grpc.aio.AioRpcError) -> str:
    st = rpc_status.from_call(e)  # type: ignore[arg-type]
    assert st is not None
    br = error_details_pb2.BadRequest()
    assert st.details[0].Unpack(br)
    return str(br.field_violations[0].field)


async def count(env: Env) -> int:
    return (await env.kv.range(env.ks.all_schedules, prefix=True, count_only=True)).count


async def test_a_batch_larger_than_one_txn_creates_each_and_reports_taken_ids(env: Env) -> None:
    await env.stub.CreateSchedule(spb.CreateScheduleRequest(schedule=sched(7)))
    n = 3 * MAX_BATCH + 5  # several etcd txns
    r = await env.stub.BatchCreateSchedules(spb.BatchCreateSchedulesRequest(schedules=[sched(i) for i in range(n)]))
    assert len(r.results) == n
    assert r.results[7].already_exists and not r.results[7].HasField("schedule")
    created = [x for i, x in enumerate(r.results) if i != 7]
    assert all(x.HasField("schedule") and not x.already_exists for x in created)
    assert [x.schedule.id for x in created] == [f"b{i}" for i in range(n) if i != 7]
    assert all(x.schedule.version > 0 and x.schedule.created_at.seconds > 0 for x in created)
    assert await count(env) == n
    got = await env.store.get("b100")
    assert got.schedule.spec == "*/5 * * * *"


async def test_a_retried_batch_with_its_request_id_counts_its_own_creates(env: Env) -> None:
    req = spb.BatchCreateSchedulesRequest(schedules=[sched(i) for i in range(200)], request_id="batch-1")
    first = await env.stub.BatchCreateSchedules(req)
    again = await env.stub.BatchCreateSchedules(req)
    assert [x.schedule.id for x in again.results] == [x.schedule.id for x in first.results]
    assert not any(x.already_exists for x in again.results)
    other = await env.stub.BatchCreateSchedules(spb.BatchCreateSchedulesRequest(schedules=[sched(0)],
                                                                                request_id="batch-2"))
    assert other.results[0].already_exists


@pytest.mark.parametrize(("items", "field"), [
    ([sched(0), sched(1, spec="61 * * * *")], "schedules[1].spec"),
    ([sched(0), sched(1), sched(2, worker_pool="")], "schedules[2].worker_pool"),
    ([sched(0), sched(0)], "schedules[1].id"),
    ([], "schedules"),
])
async def test_one_invalid_item_fails_the_batch_naming_it_and_writes_nothing(
        env: Env, items: list[pb.Schedule], field: str) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await env.stub.BatchCreateSchedules(spb.BatchCreateSchedulesRequest(schedules=items))
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert bad_field(e.value).startswith(field), bad_field(e.value)
    assert await count(env) == 0


async def test_too_many_items_is_invalid(env: Env) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await env.stub.BatchCreateSchedules(spb.BatchCreateSchedulesRequest(
            schedules=[sched(i) for i in range(1001)]))
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert bad_field(e.value) == "schedules"


async def test_create_batch_in_the_store_is_one_txn_per_attempt(env: Env) -> None:
    now = SYSTEM_CLOCK.wall_ms()
    one = [Schedule(id=f"s{i}", tenant="t", spec="@hourly", worker_pool="p", task_type="x") for i in range(MAX_BATCH)]
    got = await env.store.create_batch(one, now)
    assert len({st.schedule.version for st in got if st is not None}) == 1  # one revision: one txn
    with pytest.raises(ValueError, match="at most"):
        await env.store.create_batch([*one, Schedule(id="x", tenant="t", spec="@hourly", worker_pool="p",
                                                     task_type="x")], now)


async def schedctl(*args: str) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", "from scheduler.cli.main import main; raise SystemExit(main())", *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


YAML = """
schedules:
  - id: nightly-export
    spec: "30 2 * * *"
    time_zone: Europe/Berlin
    task_type: shell
    payload: {command: "echo export"}
    labels: {team: billing}
  - id: hourly-report
    spec: "@hourly"
    task_type: shell
    policies: {overlap: OVERLAP_POLICY_BUFFER_ONE}
"""


async def test_apply_creates_updates_and_leaves_equal_ones_alone(env: Env, tmp_path: Path) -> None:
    f = tmp_path / "schedules.yaml"
    f.write_text(YAML)
    srv = ("--server", env.address)
    rc, out, err = await schedctl("schedule", "apply", "-f", str(f), "--dry-run", *srv)
    assert rc == 0, err
    assert "2 would be created, 0 would be updated, 0 unchanged" in out
    assert await count(env) == 0  # a dry run writes nothing
    rc, out, err = await schedctl("schedule", "apply", "-f", str(f), *srv)
    assert rc == 0, err
    assert "2 created, 0 updated, 0 unchanged" in out
    v0 = (await env.store.get("hourly-report")).schedule.version
    rc, out, _ = await schedctl("schedule", "apply", "-f", str(f), *srv)
    assert "0 created, 0 updated, 2 unchanged" in out  # idempotent: nothing written
    assert (await env.store.get("hourly-report")).schedule.version == v0
    f.write_text(YAML.replace('"@hourly"', '"@daily"'))
    rc, out, _ = await schedctl("schedule", "apply", "-f", str(f), "--json", *srv)
    assert rc == 0
    doc = json.loads(out)
    assert doc["updated"] == ["hourly-report"] and doc["unchanged"] == ["nightly-export"] and doc["created"] == []
    st = (await env.store.get("hourly-report")).schedule
    assert st.spec == "@daily"
    assert st.policies.overlap.value == "buffer_one"  # fields the file sets, kept


async def test_apply_of_many_schedules_with_large_payloads_splits_its_calls_by_size(env: Env, tmp_path: Path) -> None:
    """600 schedules with 60 KiB payloads are 36 MiB: one BatchCreateSchedules call of them passed the 32 MiB
    either end takes, and the apply failed RESOURCE_EXHAUSTED with nothing created. Calls are now cut by
    size as well as by count."""
    n = 600
    f = tmp_path / "big.yaml"
    f.write_text("schedules:\n" + "".join(
        f'  - {{id: big-{i:03d}, spec: "@daily", task_type: shell, payload: "{chr(97 + i % 26) * 60_000}"}}\n'
        for i in range(n)))
    rc, out, err = await schedctl("schedule", "apply", "-f", str(f), "--server", env.address)
    assert rc == 0, err
    assert f"{n} created, 0 updated, 0 unchanged" in out
    assert await count(env) == n
    assert len((await env.store.get("big-599")).schedule.payload) == 60_000


async def test_apply_reads_toml_and_names_the_bad_item(env: Env, tmp_path: Path) -> None:
    f = tmp_path / "s.toml"
    f.write_text('[[schedules]]\nid = "a"\nspec = "@hourly"\ntask_type = "x"\n\n'
                 '[[schedules]]\nid = "b"\ntask_type = "x"\n')
    rc, _, err = await schedctl("schedule", "apply", "-f", str(f), "--server", env.address)
    assert rc == 2
    assert "schedules[1].spec" in err
    f.write_text('[[schedules]]\nid = "a"\nspec = "61 * * * *"\ntask_type = "x"\n')
    rc, _, err = await schedctl("schedule", "apply", "-f", str(f), "--server", env.address)
    assert rc == 2
    assert "schedules[0].spec" in err  # the server's INVALID_ARGUMENT, named per item
    assert await count(env) == 0


async def test_apply_checks_every_item_before_writing_and_is_idempotent_for_create_only_fields(
        env: Env, tmp_path: Path) -> None:
    """An outside audit: a file with a new schedule and an update with an unknown zone passed `--dry-run`, and the
    real apply created the new one, then exited 2 naming no item; a file with `version:` or a paused `state`
    applied once, then failed on every later apply; a tenant change failed the same way, naming no item."""
    srv = ("--server", env.address)
    f = tmp_path / "s.yaml"
    f.write_text("- {id: e1, spec: '@hourly', task_type: x, version: 5}\n"
                 "- {id: e2, spec: '@hourly', task_type: x, state: SCHEDULE_STATE_PAUSED}\n")
    rc, out, err = await schedctl("schedule", "apply", "-f", str(f), *srv)
    assert rc == 0 and "2 created" in out, err
    assert (await env.store.get("e2")).schedule.state.value == "paused"
    await schedctl("schedule", "resume", "e2", *srv)
    rc, out, err = await schedctl("schedule", "apply", "-f", str(f), *srv)
    assert rc == 0 and "0 created, 0 updated, 2 unchanged" in out, (out, err)
    assert "e2: schedules[1].state differs" in err and "schedctl schedule pause|resume e2" in err
    assert (await env.store.get("e2")).schedule.state.value == "active"  # apply sets state only by a create
    # One bad item among good ones: refused before anything is sent, by the dry run as by the real apply.
    f.write_text("- {id: new7, spec: '@hourly', task_type: x}\n"
                 "- {id: e1, spec: '@hourly', task_type: x, time_zone: Mars/Olympus}\n")
    for dry in (("--dry-run",), ()):
        rc, _, err = await schedctl("schedule", "apply", "-f", str(f), *dry, *srv)
        assert rc == 2 and "schedules[1].time_zone" in err, (dry, err)
    f.write_text("- {id: new7, spec: '@hourly', task_type: x}\n"
                 "- {id: e1, spec: '@hourly', task_type: x, start_at: '2026-01-02T00:00:00Z', "
                 "end_at: '2026-01-01T00:00:00Z'}\n")
    rc, _, err = await schedctl("schedule", "apply", "-f", str(f), "--dry-run", *srv)
    assert rc == 2 and "schedules[1].end_at" in err, err
    # A tenant change of an existing schedule: named, and nothing applied (new7 not created).
    f.write_text("- {id: new7, spec: '@hourly', task_type: x}\n- {id: e1, spec: '@hourly', task_type: x, tenant: qa}\n")
    rc, _, err = await schedctl("schedule", "apply", "-f", str(f), *srv)
    assert rc == 2 and "schedules[1].tenant" in err, err
    assert await count(env) == 2  # e1 and e2 only
