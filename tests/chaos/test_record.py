"""The run directory's etcd watcher (chaos/record.py, record_watch) against the in-memory etcd twin:
what production code writes comes back as watch lines the checker's index reads (no real etcd: the
twin passes the same contract tests)."""

from __future__ import annotations

import asyncio
import io
import json
from pathlib import Path

import pytest

from chaos.index import build
from chaos.record import Run, RunError, RunMeta, WatchRecord, load_run, record_snapshot, record_watch, write_run
from scheduler.model import Schedule
from scheduler.store.etcd.errors import Compacted
from scheduler.store.keyspace import Keyspace
from scheduler.store.memory import MemoryKV
from scheduler.store.schedules import ScheduleStore

KS = Keyspace("/rec")


async def test_every_event_under_the_prefix_is_recorded_with_its_revision() -> None:
    kv = MemoryKV()
    out = io.StringIO()
    stop = asyncio.Event()
    await kv.put(b"/other/x", b"not ours")  # outside the prefix: not recorded
    task = asyncio.create_task(record_watch(kv, KS.prefix, out, stop))
    lease = await kv.lease_grant(30)
    claim = await kv.put(KS.owner(0), json.dumps({"node": "r1-p1", "lease": f"{lease.id:x}"}).encode(), lease=lease.id)
    await ScheduleStore(kv, KS, 1).create(Schedule(id="s-1", tenant="t", spec="* * * * * *", worker_pool="default",
                                                   task_type="http"), 1_796_126_400_000)
    await kv.put(KS.checkpoint(0), json.dumps({"watermark_ms": 5, "writer": "r1-p1",
                                               "token": claim.header.revision}).encode())
    await kv.put(KS.prefix.encode() + b"/bin", b"\xff\xfe")  # not UTF-8: kept as base64
    await kv.delete(KS.owner(0))
    for _ in range(50):
        if out.getvalue().count("\n") >= 5:
            break
        await asyncio.sleep(0.01)
    stop.set()
    last = await task
    recs = [WatchRecord.from_json(json.loads(line)) for line in out.getvalue().splitlines()]
    assert [r.type for r in recs] == ["PUT", "PUT", "PUT", "PUT", "DELETE"]
    assert [r.rev for r in recs] == sorted(r.rev for r in recs) and last == recs[-1].rev
    assert recs[0].lease == lease.id and recs[0].create_rev == claim.header.revision
    assert recs[3].value == b"\xff\xfe" and "value_b64" in out.getvalue()
    assert all(r.t_ms > 0 for r in recs)
    # The checker's index reads them: one claim, ended by the delete; the schedule's activation.
    run = Run(directory=Path("."), meta=RunMeta("x", 1, KS.prefix, 1, 2.0, 0, 1), effects=[],
              watch=recs, ops=[], faults=[], logs=[])
    idx = build(run)
    assert idx.history.ok, idx.history.violations
    [c] = idx.claims()
    assert (c.node, c.token, c.end) == ("r1-p1", claim.header.revision, recs[-1].rev)
    assert idx.activations["s-1"][0].state == "active"
    await kv.close()


async def test_a_compacted_history_cannot_be_recorded() -> None:
    kv = MemoryKV()
    for i in range(3):
        r = await kv.put(KS.checkpoint(0), str(i).encode())
    await kv.compact(r.header.revision)
    with pytest.raises(Compacted):
        await record_watch(kv, KS.prefix, io.StringIO(), asyncio.Event())
    await kv.close()


async def test_an_observed_cluster_is_judged_from_a_snapshot_plus_the_watch(tmp_path: Path) -> None:
    """Staging: the harness did not start the cluster, so its history starts mid-life. The keys as
    they were (etcd-start.jsonl) are the starting state, not violations of it."""

    kv = MemoryKV()
    lease = await kv.lease_grant(30)
    old = await kv.put(KS.owner(0), json.dumps({"node": "a", "lease": f"{lease.id:x}"}).encode(), lease=lease.id)
    cp = {"watermark_ms": 10, "writer": "a", "token": old.header.revision}
    await kv.put(KS.checkpoint(0), json.dumps(cp).encode())
    snap = io.StringIO()
    rev = await record_snapshot(kv, KS.prefix, snap)
    out, stop = io.StringIO(), asyncio.Event()
    task = asyncio.create_task(record_watch(kv, KS.prefix, out, stop, start_revision=rev + 1))
    await kv.delete(KS.owner(0))  # a takeover made by the operator's fault
    lease2 = await kv.lease_grant(30)
    new = await kv.put(KS.owner(0), json.dumps({"node": "b", "lease": f"{lease2.id:x}"}).encode(), lease=lease2.id)
    cp = {"watermark_ms": 20, "writer": "b", "token": new.header.revision}
    await kv.put(KS.checkpoint(0), json.dumps(cp).encode())
    for _ in range(50):
        if out.getvalue().count("\n") >= 3:
            break
        await asyncio.sleep(0.01)
    stop.set()
    await task
    await kv.close()
    lines = [WatchRecord.from_json(json.loads(x)) for x in out.getvalue().splitlines()]
    start = [WatchRecord.from_json(json.loads(x)) for x in snap.getvalue().splitlines()]
    meta = RunMeta("x", 1, KS.prefix, 1, 2.0, 0, 1, target="observed", watch_from_rev=rev + 1)
    run = Run(tmp_path / "run", meta, [], lines, [], [], [], "", start)
    write_run(run)
    idx = build(load_run(tmp_path / "run"))
    assert idx.history.ok, idx.history.violations
    assert [(c.node, c.token) for c in idx.claims()] == [("a", old.header.revision), ("b", new.header.revision)]
    assert len(idx.history.writes) == 1  # only the watched checkpoint is judged as a write
    # Without its snapshot, such a run cannot be judged.
    (tmp_path / "run" / "etcd-start.jsonl").unlink()
    with pytest.raises(RunError, match=r"etcd-start\.jsonl: missing"):
        load_run(tmp_path / "run")
