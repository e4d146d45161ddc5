"""Backup and restore of etcd (docs/deploy.md, "Backup and restore") on a real etcd 3.5 with real planners
and a worker: a snapshot of the running cluster, more work, the loss of etcd, `etcdutl snapshot restore`,
planners and worker started again.

Fencing tokens are etcd revisions (the claim revision of a partition's owner key), and sinks compare them.
A restore rewinds revisions to the snapshot's: claims made after the snapshot (here: planner p2 restarted
after it) handed out tokens that the restored etcd will hand out again, to other claims.
- With `--bump-revision` (and `--mark-compacted`), every token after the restore is above every token a
  sink saw before it: the planners resume, and no planned time after the restore runs twice. The runs of
  the window between snapshot and loss are unknown to the restored etcd: those already written down before
  the snapshot may run again, under the same execution id (the idempotency key) and a higher token.
- Without the bump, the restored cluster's tokens are lower than tokens sinks have seen: a sink that
  refuses a lower token refuses the restored cluster's work (and could not tell it from a stale planner's).
- Quiesced (planners and workers stopped before the snapshot, as for a planned move of etcd): nothing runs
  twice at all.

Serial: real processes (about 25 s per case on the 2-core machine).
"""

from __future__ import annotations

import json
import subprocess
import time
from collections import defaultdict
from pathlib import Path

import pytest

from chaos.infra.etcd import EtcdCluster, EtcdFactory, find_binary
from scheduler.ids import ExecutionId, FencingToken
from scheduler.model import Schedule
from scheduler.store.etcd import EtcdClient
from scheduler.store.keyspace import partition_for
from tests.integration.engine import Engine, stop_process, wait_until

pytestmark = pytest.mark.etcd
PARTITIONS = 4
BUMP = 1_000_000_000  # far more revisions than a cluster writes between a snapshot and its restore


def schedule_ids() -> list[str]:
    """One every-second schedule per partition, so that every owner's token reaches the sink."""
    ids: dict[int, str] = {}
    n = 0
    while len(ids) < PARTITIONS:
        ids.setdefault(partition_for(f"tick-{n}", PARTITIONS), f"tick-{n}")
        n += 1
    return sorted(ids.values())


def tick(sid: str, effects: Path) -> Schedule:
    # The sink: one appended line per run, with the execution id and the token the run carried.
    command = f'echo "$SCHED_EXECUTION_ID $SCHED_FENCING_TOKEN $(date +%s%3N)" >> {effects}'
    return Schedule(id=sid, tenant="t", spec="* * * * * *", worker_pool="pool", task_type="shell",
                    payload=json.dumps({"command": command}).encode())


def effects(path: Path) -> list[tuple[str, FencingToken, int]]:
    out = []
    for line in path.read_text().splitlines() if path.exists() else []:
        eid, token, wall = line.split()
        out.append((eid, FencingToken.parse(token), int(wall)))
    return out


def now_ms() -> int:
    return time.time_ns() // 1_000_000


async def until_effects(path: Path, n: int, since_ms: int, timeout: float = 60) -> None:
    async def check() -> bool:
        return len([e for e in effects(path) if e[2] >= since_ms]) >= n
    await wait_until(check, timeout, f"{n} effects after {since_ms}")


def restore(etcd: EtcdCluster, snapshot: Path, base: Path, *, bump: bool) -> None:
    """What docs/deploy.md tells an operator to do, on this test's one member: restore into a new data
    directory with the member's own name and peer URL, then start it on that directory."""
    m = etcd.members[0]
    target = base / "restored.etcd"
    etcdutl = find_binary("etcdutl")
    assert etcdutl is not None, "etcdutl is installed next to etcd by scripts/setup.sh"
    peer = f"http://127.0.0.1:{m.peer_port}"
    argv = [etcdutl, "snapshot", "restore", str(snapshot), f"--data-dir={target}", f"--name={m.name}",
            f"--initial-cluster={m.name}={peer}", f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster-token={etcd._cluster_token()}"]
    if bump:
        argv += [f"--bump-revision={BUMP}", "--mark-compacted"]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode == 0, r.stderr
    m.data_dir = target
    etcd.restart(0)


@pytest.mark.parametrize("mode", ["bump-revision", "no-bump", "quiesced"])
async def test_restore_from_a_snapshot(mode: str, etcd_factory: EtcdFactory, tmp_path: Path) -> None:
    bump = mode != "no-bump"
    etcd = etcd_factory()
    sink = tmp_path / "effects.log"
    async with EtcdClient(etcd.config()) as kv:
        eng = Engine(etcd, tmp_path, kv, partitions=PARTITIONS)
        try:
            for p in ("p1", "p2"):
                eng.start_planner(p)
            eng.start_worker("w1")
            await eng.owned()
            await eng.create(*(tick(sid, sink) for sid in schedule_ids()))
            await until_effects(sink, 2 * PARTITIONS, 0)

            snapshot = tmp_path / "snapshot.db"
            if mode == "quiesced":
                for w in eng.workers.values():
                    stop_process(w)
                eng.planners.stop_all()
                stop_ms = now_ms()
                etcd.etcdctl("snapshot", "save", str(snapshot))
                snap_ms = now_ms()
            else:
                etcd.etcdctl("snapshot", "save", str(snapshot))
                snap_ms = now_ms()
                # After the snapshot: more work, and p2's partitions claimed again (tokens the snapshot lacks).
                await until_effects(sink, 2 * PARTITIONS, snap_ms)
                eng.planners["p2"].terminate()
                eng.start_planner("p2")
                await eng.owned()
                await until_effects(sink, 2 * PARTITIONS, now_ms())
                # The loss: every process stops, etcd's data is gone; then the restore, and everything again.
                for w in eng.workers.values():
                    stop_process(w)
                eng.planners.stop_all()
                stop_ms = now_ms()
            etcd.stop(0)
            restore(etcd, snapshot, tmp_path, bump=bump)
            eng.addresses.clear()
            for p in ("p1", "p2"):
                eng.start_planner(p)
            eng.start_worker("w1")
            restart_ms = now_ms()
            await eng.owned()
            await until_effects(sink, 3 * PARTITIONS, restart_ms)
            for w in eng.workers.values():
                stop_process(w)
            eng.planners.stop_all()
        finally:
            eng.close()

    runs = effects(sink)
    before = [r for r in runs if r[2] < stop_ms]
    after = [r for r in runs if r[2] >= restart_ms]
    assert before and after and len(before) + len(after) == len(runs)
    seen_before: dict[int, int] = defaultdict(int)  # the highest revision per partition a sink saw
    for _, token, _ in before:
        seen_before[token.partition] = max(seen_before[token.partition], token.revision)
    first_after = {t.partition: t.revision for _, t, _ in reversed(after)}  # each partition's first token
    assert set(first_after) == set(range(PARTITIONS)), "every partition resumed"

    if not bump:
        # The rewound revisions: some partition's new owner holds a token below one its sink has seen.
        assert any(first_after[p] <= seen_before[p] for p in first_after), (first_after, dict(seen_before))
        return

    assert all(t.revision > BUMP for _, t, _ in after)
    assert min(t.revision for _, t, _ in after) > max(seen_before.values())
    # Per partition, tokens never go down in the order the sink saw them.
    last: dict[int, int] = defaultdict(int)
    for _, token, _ in runs:
        assert token.revision >= last[token.partition], token
        last[token.partition] = token.revision
    # No planned time runs twice, but for the window between the snapshot and the loss (written down
    # before the snapshot, run after it, unknown to the restored etcd): those run again, same id.
    count: dict[str, int] = defaultdict(int)
    for eid, _, _ in runs:
        count[eid] += 1
    twice = {eid for eid, n in count.items() if n > 1}
    if mode == "quiesced":
        assert not twice, twice
    assert all(n <= 2 for n in count.values()), count
    lookahead_ms = int(eng.planner_settings.get("lookahead_ms", "2000"))
    for eid in twice:
        planned = ExecutionId.parse(eid).planned_ms
        assert snap_ms - lookahead_ms - 1_000 <= planned <= stop_ms, f"{eid} ran twice outside the window"
        assert [t for e, t, _ in runs if e == eid][1].revision > BUMP, "the second run carries a higher token"
    planned_after = [ExecutionId.parse(eid).planned_ms for eid, _, _ in after]
    assert not {eid for eid in twice if ExecutionId.parse(eid).planned_ms > stop_ms}
    print(f"restore ({mode}): {len(before)} runs before, {len(after)} after, "
          f"{len(twice)} of the snapshot window again, "
          f"first token after {min(first_after.values())}, highest before {max(seen_before.values())}, "
          f"latest planned {max(planned_after) - restart_ms} ms after restart")
