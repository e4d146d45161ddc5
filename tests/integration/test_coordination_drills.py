"""Coordination drills with real processes (issue 3, "Tests that break things").

Real etcd (chaos/infra/etcd.py), real `schedctl planner` processes (chaos/infra/planners.py),
real signals. Every drill ends by replaying etcd's history of the run (chaos/history.py): no two
planners on one partition at any revision, every checkpoint write carried the token of the claim
current at its revision, watermarks never went back.

Timings are the drills' fast ones (lease TTL 2 s, renew 0.5 s, RPC timeout 0.4 s, safety margin
0.3 s, planner loop interval 0.05 s). Measurements (handover times, fenced-out counts) are printed
and written as JSON under the test's tmp dir, and also into $SCHED_DRILL_OUT when that names a
directory.
`SCHED_DRILL_ROUNDS` sets the number of SIGKILL rounds (default 3); `SCHED_DRILL_SLACK` the seconds
allowed on top of TTL + renew interval for the survivors' claim RPCs (default 1.0).
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import json
import os
import statistics
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from chaos.history import CheckpointWrite, HistoryReport, read_and_check
from chaos.infra.etcd import EtcdCluster, EtcdFactory
from chaos.infra.planners import (
    FAST,
    OwnersView,
    PlannerSet,
    all_owned_by,
    balanced,
    describe,
    none_owned_by,
    wait_checkpoints_advance,
)
from scheduler.store.etcd import EtcdClient
from scheduler.store.keyspace import Keyspace

pytestmark = [pytest.mark.etcd, pytest.mark.timeout(240)]

P = 32
TTL = float(FAST["lease_ttl"])
RENEW = float(FAST["renew_interval"])
SLACK = float(os.environ.get("SCHED_DRILL_SLACK", "1.0"))
ROUNDS = int(os.environ.get("SCHED_DRILL_ROUNDS", "3"))
STARTUP = 15.0  # seconds a planner process may take to start on a loaded machine (imports, grpc)
TEST_MODE = {"SCHED_TEST_MODE": "1"}


@dataclass
class Drill:
    name: str
    cluster: EtcdCluster
    kv: EtcdClient
    ks: Keyspace
    planners: PlannerSet
    view: OwnersView
    out_dir: Path

    async def converge(self, nodes: list[str], what: str, timeout: float = STARTUP + 4 * TTL) -> float:
        """Wait until `nodes` split every partition evenly; return the monotonic time they did."""
        try:
            return await self.view.wait_for(balanced(self.planners.partitions, nodes), timeout, what)
        except AssertionError as e:
            raise AssertionError(f"{e}\n{self.planners.logs()}") from None

    async def history(self) -> HistoryReport:
        """Stop every planner (gracefully) and check the run's history."""
        await asyncio.gather(*(p.stop() for p in self.planners.planners.values() if p.running))
        return await read_and_check(self.kv, self.ks, partitions=self.planners.partitions)

    def record(self, what: str, data: dict[str, Any]) -> Path:
        text = json.dumps(data, indent=2, sort_keys=True)
        print(f"\n[{self.name}] {what}: {text}")
        path = self.out_dir / f"{what}.json"
        path.write_text(text + "\n")
        extra = os.environ.get("SCHED_DRILL_OUT")
        if extra:
            Path(extra).mkdir(parents=True, exist_ok=True)
            (Path(extra) / f"{what}-{int(time.time() * 1000)}.json").write_text(text + "\n")
        return path


DrillFactory = Callable[..., Awaitable[Drill]]


@pytest.fixture
async def drills(tmp_path: Path) -> AsyncIterator[DrillFactory]:
    """Make drills on a cluster: a unique key prefix, a client, an owners view and a PlannerSet.
    Every planner is SIGKILLed by pid in the finalizer, whatever happened."""
    sets: list[PlannerSet] = []
    stack = AsyncExitStack()

    async def make(cluster: EtcdCluster, name: str = "drill", partitions: int = P) -> Drill:
        prefix = f"/drill-{uuid.uuid4().hex[:10]}"
        out = tmp_path / name
        planners = PlannerSet(out / "planners", cluster.endpoints, prefix, partitions)
        sets.append(planners)
        kv = await stack.enter_async_context(EtcdClient(cluster.config(timeout=2.0)))
        ks = Keyspace(prefix)
        view = await stack.enter_async_context(OwnersView(kv, ks))
        return Drill(name, cluster, kv, ks, planners, view, out)

    try:
        yield make
    finally:
        for s in sets:
            s.close()
        await stack.aclose()


def assert_clean(report: HistoryReport, drill: Drill) -> None:
    assert report.ok, f"history of {drill.name} broke an invariant:\n{report.summary(20)}"
    assert report.writes, f"no checkpoint was written in {drill.name}: {report.summary()}"


def lost_reasons(records: list[dict[str, Any]]) -> dict[int, str]:
    """partition -> reason of the first `lost` event for it in `records`."""
    out: dict[int, str] = {}
    for r in records:
        if r.get("event") == "lost":
            out.setdefault(int(r["partition"]), str(r["reason"]))
    return out


# ---- 1. even split, join, leave -------------------------------------------------------------------


async def test_planners_split_evenly_and_follow_joins_and_leaves(etcd_server: EtcdCluster,
                                                                  drills: DrillFactory) -> None:
    d = await drills(etcd_server, "split")
    timings: dict[str, float] = {}

    t0 = time.monotonic()
    d.planners.start("p1")
    d.planners.start("p2")
    timings["two_planners_split_s"] = await d.converge(["p1", "p2"], "p1 and p2 to split 32 partitions") - t0

    t0 = time.monotonic()
    d.planners.start("p3")
    timings["third_joins_s"] = await d.converge(["p1", "p2", "p3"], "p3 to join and take its share") - t0

    # SIGTERM: p2 drains, releasing every partition at once (not after its lease expires). What it
    # holds is read after the log offset (see _pause_beyond_ttl: a balanced split may still move one).
    p2 = d.planners["p2"]
    before = len(p2.log_records())
    held = sorted(p for p, n in (await d.view.read())[0].items() if n == "p2")
    t_term = time.monotonic()
    stop = asyncio.create_task(p2.stop())
    t_gone = await d.view.wait_for(none_owned_by("p2"), 3 * TTL, "p2 to release its partitions on SIGTERM")
    rc = await stop
    timings["sigterm_release_s"] = t_gone - t_term
    timings["leaver_share_moved_s"] = await d.converge(["p1", "p3"], "p1 and p3 to take p2's share") - t_term

    report = await d.history()
    d.record("split_join_leave", {"partitions": P, "lease_ttl": TTL, **timings, "history": report.summary(0)})

    assert rc == 0, f"p2 exited with {rc} after SIGTERM:\n{p2.log_tail()}"
    reasons = lost_reasons(p2.log_records()[before:])
    assert {p: reasons.get(p) for p in held} == dict.fromkeys(held, "released"), (
        f"p2 should have released each of its partitions {held} on SIGTERM; lost events: {reasons}")
    assert timings["sigterm_release_s"] < TTL, (
        f"p2's partitions took {timings['sigterm_release_s']:.2f}s to free: that is lease expiry, not a release")
    assert_clean(report, d)


# ---- 2. SIGKILL: survivors take over within TTL + renew ---------------------------------------------


async def test_sigkill_survivors_own_everything_within_ttl_plus_renew(etcd_server: EtcdCluster,
                                                                      drills: DrillFactory) -> None:
    d = await drills(etcd_server, "sigkill")
    live = ["k1", "k2", "k3"]
    for n in live:
        d.planners.start(n)
    await d.converge(live, "three planners to split")
    bound = TTL + RENEW + SLACK
    rounds: list[dict[str, Any]] = []
    for i in range(ROUNDS):
        victim, survivors = live[0], live[1:]
        await asyncio.sleep(0.1 + 0.37 * i % RENEW)  # vary the kill's phase against the keepalive period
        held = sum(1 for n in d.view.owners.values() if n == victim)
        t_kill = time.monotonic()
        d.planners[victim].kill()
        t_expired = await d.view.wait_for(none_owned_by(victim), bound + 10,
                                          f"{victim}'s owner keys to expire after SIGKILL")
        t_done = await d.view.wait_for(all_owned_by(P, survivors), bound + 10,
                                       f"{survivors} to own every partition after {victim}'s SIGKILL")
        rounds.append({"round": i + 1, "victim": victim, "victim_partitions": held,
                       "lease_expired_s": round(t_expired - t_kill, 3),
                       "full_reownership_s": round(t_done - t_kill, 3)})
        newcomer = f"k{4 + i}"  # a new planner joins and takes its share
        d.planners.start(newcomer)
        live = [*survivors, newcomer]
        await d.converge(live, f"{newcomer} to join after round {i + 1}")

    report = await d.history()
    times = [r["full_reownership_s"] for r in rounds]
    d.record("sigkill_reownership", {
        "lease_ttl_s": TTL, "renew_interval_s": RENEW, "safety_margin_s": float(FAST["safety_margin"]),
        "partitions": P, "planners": 3, "bound_s": bound, "rounds": rounds,
        "median_full_reownership_s": statistics.median(times), "max_full_reownership_s": max(times),
        "history": report.summary(0),
    })
    slow = [r for r in rounds if r["full_reownership_s"] > bound]
    assert not slow, f"re-ownership slower than TTL + renew + {SLACK}s slack = {bound}s: {slow}"
    assert_clean(report, d)


# ---- 3. SIGSTOP beyond the TTL, takeover, SIGCONT ---------------------------------------------------

VARIANTS = {
    # (a) default: the resumed planner's local deadline has passed: it self-fences and drops everything.
    "self_fence": {},
    # (b) without the local deadline, etcd's create_revision compare is the only guard.
    "etcd_fence_only": {"unsafe_disable_self_fence": "true"},
    # (c) no guard at all: stale writes land, and the history check must catch them.
    "no_fencing": {"unsafe_disable_self_fence": "true", "unsafe_disable_fencing": "true"},
}
PAUSES = {"self_fence": 1, "etcd_fence_only": 2, "no_fencing": 6}  # (c): pause until a stale write lands


@dataclass
class PauseCycle:
    held: list[int]  # a's partitions when it was paused
    rev_paused: int  # an owners/ revision at which a held them
    paused_s: float
    takeover_s: float
    reasons: dict[int, str]  # how a dropped each of them after SIGCONT
    fenced_out: int


async def _pause_beyond_ttl(d: Drill) -> PauseCycle:
    """SIGSTOP a until b owns everything (so a's lease has expired), SIGCONT, wait for a to drop
    its old partitions."""
    a = d.planners["a"]
    await d.converge(["a", "b"], "a and b to split")
    split = sorted(p for p, n in d.view.owners.items() if n == "a")
    await wait_checkpoints_advance(d.kv, d.ks, split, timeout=10)  # a is writing each of its partitions
    # What a holds when paused is read after the log offset, straight from etcd: a split of 17/15 is
    # balanced but still moves one partition, and a release logged before the offset (CI, 2026-12-06:
    # partition 12 released to b during the checkpoint wait) must not count as held.
    before = len(a.log_records())
    owners, rev_paused = await d.view.read()
    held = sorted(p for p, n in owners.items() if n == "a")
    t_stop = time.monotonic()
    a.pause()
    t_takeover = await d.view.wait_for(all_owned_by(P, ["b"]), TTL + RENEW + 10,
                                       "b to take over every partition from the paused a")
    paused_s = time.monotonic() - t_stop
    a.resume()
    # a notices (self-fence, fenced-out write, or its owners/members watch) and drops them.
    deadline = time.monotonic() + 10
    while not set(lost_reasons(a.log_records()[before:])) >= set(held) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    after = a.log_records()[before:]
    reasons = lost_reasons(after)
    assert set(reasons) >= set(held), (
        f"a did not drop all of its old partitions after SIGCONT: dropped {sorted(reasons)}, held {held}\n"
        f"{d.planners.logs()}")
    await asyncio.sleep(0.5)  # let anything still in flight land before the history is read
    return PauseCycle(held, rev_paused, round(paused_s, 3), round(t_takeover - t_stop, 3),
                      {p: reasons[p] for p in held}, sum(1 for r in after if r.get("event") == "fenced_out"))


def _late_writes(report: HistoryReport, cycle: PauseCycle) -> list[CheckpointWrite]:
    """Writes carrying the token of a claim a held when paused that landed after that claim ended
    (its owner key deleted by the lease expiry, then re-created by b)."""
    old = {c.token: c for c in report.claims_by("a") if c.partition in cycle.held and c.held_at(cycle.rev_paused)}
    assert len(old) == len(cycle.held), f"a's claims at the pause are not in the history: {report.summary()}"
    assert all(c.end is not None for c in old.values()), f"a's claims did not end: {report.summary()}"
    return [w for w in report.writes if w.token in old and w.revision >= (old[w.token].end or 0)]


@pytest.mark.parametrize("variant", list(VARIANTS))
async def test_sigstop_beyond_ttl_then_sigcont(etcd_server: EtcdCluster, drills: DrillFactory,
                                               variant: str) -> None:
    d = await drills(etcd_server, f"sigstop-{variant}")
    # a plans 10 s ahead, b not at all: after the takeover b leaves the checkpoints a wrote alone
    # until a's horizon has passed, so a's first writes after SIGCONT still pass the checkpoint's own
    # mod_revision compare and only the fence (or the self-fence) can stop them.
    d.planners.start("a", settings={**VARIANTS[variant], "lookahead_ms": "10000"}, env=TEST_MODE)
    d.planners.start("b", settings={"lookahead_ms": "0"})
    cycles: list[PauseCycle] = []
    for _ in range(PAUSES[variant]):
        cycles.append(await _pause_beyond_ttl(d))
        # With every guard off, a stale write is a race against a's own owners watch (which also
        # tells it that b took over): pause again until one lands.
        if variant == "no_fencing" and _late_writes(await read_and_check(d.kv, d.ks, partitions=P), cycles[-1]):
            break
    report = await d.history()
    late = [w for c in cycles for w in _late_writes(report, c)]
    reasons = Counter(r for c in cycles for r in c.reasons.values())
    fenced_out = sum(c.fenced_out for c in cycles)
    d.record(f"sigstop_{variant}", {
        "variant": variant, "settings": VARIANTS[variant], "lease_ttl_s": TTL, "pauses": len(cycles),
        "cycles": [dataclasses.asdict(c) | {"reasons": dict(Counter(c.reasons.values()))} for c in cycles],
        "lost_reasons": dict(reasons), "fenced_out_events": fenced_out, "late_writes_landed": len(late),
        "stale_writes_detected": len(report.stale_writes), "history": report.summary(5),
    })

    taken = {old.partition for old, _ in report.takeovers_from("a")}
    assert taken >= set(cycles[0].held), f"b did not take a's partitions over: {report.summary()}"
    if variant == "no_fencing":
        # The check can fail: with every guard off the resumed planner's writes land after the takeover.
        assert late, (f"no stale write landed in {len(cycles)} pauses with fencing disabled: the drill proves "
                      f"nothing\n{report.summary()}")
        assert not report.ok and {w.revision for w in late} <= {w.revision for w in report.stale_writes}, (
            f"the history check missed stale writes: {late[:5]}\n{report.summary()}")
        assert {w.writer for w in report.stale_writes} == {"a"}, report.summary(20)
        return
    assert not late, f"a's writes landed after the takeover: {late[:5]}\n{report.summary(20)}"
    assert_clean(report, d)
    if variant == "self_fence":
        assert set(reasons) == {"session_lost"}, f"a should have self-fenced: {reasons}"
        assert not fenced_out, f"a self-fenced, so it should not even have tried a write: {fenced_out}"
    else:
        # No local deadline: a keeps going until etcd refuses a write (fenced_out) or its watches
        # tell it that b re-created the owner key (owner_changed) or that its own membership is gone
        # (released), whichever it learns first.
        assert set(reasons) <= {"fenced_out", "owner_changed", "released"}, reasons


# ---- 4. etcd members die and come back ----------------------------------------------------------------


async def _leader_index(cluster: EtcdCluster) -> int:
    for i, m in enumerate(cluster.members):
        if not m.running:
            continue
        async with EtcdClient(cluster.config(endpoints=(m.endpoint,), timeout=2.0)) as c:
            st = await c.status()
        for j, other in enumerate(cluster.members):
            async with EtcdClient(cluster.config(endpoints=(other.endpoint,), timeout=2.0)) as c2:
                if (await c2.status()).header.member_id == st.leader:
                    return j
        raise AssertionError(f"member {i} names leader {st.leader:x}, which no member is")
    raise AssertionError("no etcd member is running")


async def _recovered(d: Drill, nodes: list[str], what: str, timeout: float = 20.0) -> float:
    t0 = time.monotonic()
    try:
        await d.view.wait_for(all_owned_by(d.planners.partitions, nodes), timeout, f"{what}: all partitions owned")
        await wait_checkpoints_advance(d.kv, d.ks, d.planners.partitions, timeout=timeout)
    except AssertionError as e:
        raise AssertionError(f"{e}\n{d.planners.logs()}") from None
    return time.monotonic() - t0


async def test_planners_ride_out_member_kills_in_a_3_member_cluster(etcd_cluster3: EtcdCluster,
                                                                    drills: DrillFactory) -> None:
    d = await drills(etcd_cluster3, "etcd3", partitions=16)
    nodes = ["e1", "e2"]
    for n in nodes:
        d.planners.start(n)
    await d.converge(nodes, "planners to split on the 3-member cluster")
    leader = await _leader_index(etcd_cluster3)
    order = [leader, *(i for i in range(3) if i != leader)]
    steps: list[dict[str, Any]] = []
    for i in order:
        was_leader = i == await _leader_index(etcd_cluster3)
        etcd_cluster3.kill(i)
        t_down = time.monotonic()
        degraded = await _recovered(d, nodes, f"member m{i} down")  # 2 of 3 still make a quorum
        await asyncio.sleep(max(0.0, TTL - (time.monotonic() - t_down)))  # stay down a full TTL at least
        etcd_cluster3.restart(i)
        back = await _recovered(d, nodes, f"member m{i} back")
        steps.append({"member": f"m{i}", "was_leader": was_leader, "progress_while_down_s": round(degraded, 3),
                      "recovered_after_restart_s": round(back, 3)})
    report = await d.history()
    sessions = {p.node_id: sum(1 for r in p.log_records() if r.get("msg") == "session started")
                for p in d.planners.planners.values()}
    d.record("etcd3_member_kills", {"steps": steps, "planner_sessions": sessions, "history": report.summary(0)})
    assert steps[0]["was_leader"], f"the first member killed should have been the leader: {steps}"
    assert_clean(report, d)


# Longer than FAST's lease, so that a lease etcd keeps until its TTL ends is told apart from one revoked as soon
# as etcd answers: renew + 2 x rpc_timeout (1.3) <= lease_ttl - safety_margin (5.7).
QUORUM_TTL = 6.0
QUORUM_SETTINGS = {**FAST, "lease_ttl": str(int(QUORUM_TTL))}


async def _old_leases_gone(d: Drill, old: set[int], timeout: float) -> float:
    """Wait until no owner key is held by a lease in `old`; return the monotonic time it was first seen."""
    give_up = time.monotonic() + timeout
    while time.monotonic() < give_up:
        try:
            r = await d.kv.range(d.ks.owners, prefix=True, timeout=1.0)
        except Exception:  # etcd still electing a leader
            await asyncio.sleep(0.05)
            continue
        if not {kv.lease for kv in r.kvs} & old:
            return time.monotonic()
        await asyncio.sleep(0.05)
    raise AssertionError(f"owner keys of the lost sessions still stand {timeout:.0f}s after the quorum came back")


async def test_a_quorum_loss_longer_than_the_lease_frees_the_partitions_as_soon_as_etcd_answers(
        etcd_cluster3: EtcdCluster, drills: DrillFactory) -> None:
    """Game day, session 28: two of three members frozen for 3 s (F4). Every planner's local deadline passed
    and it dropped its partitions, but its revoke found no leader, and a lease does not expire without one:
    the leader elected after the thaw gave it a fresh TTL, and the owner keys stood 3.1 s after the quorum was
    back (runs 8.6 s late). The planners now revoke a lost session's lease again until etcd answers."""
    d = await drills(etcd_cluster3, "quorum", partitions=16)
    nodes = ["q1", "q2"]
    for n in nodes:
        d.planners.start(n, settings=QUORUM_SETTINGS)
    await d.converge(nodes, "planners to split on the 3-member cluster", timeout=STARTUP + 4 * QUORUM_TTL)
    r = await d.kv.range(d.ks.owners, prefix=True, timeout=2.0)
    old = {kv.lease for kv in r.kvs}
    assert len(old) == 2 and 0 not in old, old
    frozen = [i for i in range(3) if i != await _leader_index(etcd_cluster3)]  # the leader loses its quorum
    for i in frozen:
        etcd_cluster3.pause(i)
    try:
        await asyncio.sleep(QUORUM_TTL + 1.5)  # past every planner's local deadline: each drops its partitions
    finally:
        for i in frozen:
            etcd_cluster3.resume(i)
    t_back = time.monotonic()
    gone = await _old_leases_gone(d, old, timeout=4 * QUORUM_TTL) - t_back
    recovered = await _recovered(d, nodes, "quorum back", timeout=30)
    revoked = {n: len(d.planners[n].events("lease_revoked_late")) for n in nodes}
    report = await d.history()
    d.record("quorum_loss_revoke", {"old_leases_gone_after_thaw_s": round(gone, 3), "revoked_late": revoked,
                                    "recovered_after_thaw_s": round(recovered, 3), "history": report.summary(0)})
    # Revoked once etcd answers (an election, then one retry interval), not when a fresh TTL ends (>= 6 s).
    assert gone < QUORUM_TTL / 2, f"the lost sessions' owner keys stood {gone:.2f}s after the thaw: {revoked}"
    assert sum(revoked.values()) >= 1, revoked
    assert_clean(report, d)


async def test_planners_recover_after_the_single_etcd_member_is_killed(etcd_factory: EtcdFactory,
                                                                       drills: DrillFactory) -> None:
    cluster = etcd_factory(size=1)
    d = await drills(cluster, "etcd1", partitions=16)
    nodes = ["s1", "s2"]
    for n in nodes:
        d.planners.start(n)
    await d.converge(nodes, "planners to split on the single member")
    await wait_checkpoints_advance(d.kv, d.ks, 16, timeout=10)
    cluster.kill(0)  # kill -9
    await asyncio.sleep(TTL + RENEW)  # every planner's local deadline passes while etcd is gone
    cluster.restart(0)
    t_back = time.monotonic()
    recovered = await _recovered(d, nodes, "single member restarted", timeout=30)
    await d.converge(nodes, "planners to split again after the restart", timeout=20)
    balanced_s = time.monotonic() - t_back
    report = await d.history()
    d.record("etcd1_kill9_restart", {"recovered_after_restart_s": round(recovered, 3),
                                     "balanced_after_restart_s": round(balanced_s, 3),
                                     "history": report.summary(0)})
    assert_clean(report, d)


# ---- 5. a run with several kills and pauses, judged from etcd's history alone ----------------------


async def test_chaos_run_history_shows_one_owner_per_partition(etcd_server: EtcdCluster,
                                                               drills: DrillFactory) -> None:
    d = await drills(etcd_server, "chaos")
    nodes = ["c1", "c2", "c3"]
    for n in nodes:
        d.planners.start(n)
    await d.converge(nodes, "three planners to split")
    pl = d.planners
    deadline = TTL + RENEW + 10

    # Pause c1 beyond its TTL: c2 and c3 take over; c1 resumes, self-fences, rejoins.
    pl["c1"].pause()
    await d.view.wait_for(all_owned_by(P, ["c2", "c3"]), deadline, "c2, c3 to take over from paused c1")
    pl["c1"].resume()
    await d.converge(nodes, "c1 to rejoin after its pause")

    # SIGKILL c2 and start it again under the same id.
    pl["c2"].kill()
    await d.view.wait_for(all_owned_by(P, ["c1", "c3"]), deadline, "c1, c3 to take over from killed c2")
    pl.start("c2")
    await d.converge(nodes, "c2 to rejoin after its restart")

    # A pause well inside the lease (its local deadline is >= 1.2 s away): nothing changes hands.
    owners, before = dict(d.view.owners), len(pl["c3"].log_records())
    pl["c3"].pause()
    await asyncio.sleep(0.4)
    pl["c3"].resume()
    await asyncio.sleep(0.5)
    assert d.view.owners == owners, f"a 0.4 s pause moved partitions: {describe(owners)} -> {d.view.owners}"
    assert not lost_reasons(pl["c3"].log_records()[before:]), pl["c3"].log_tail()

    # Kill one and pause another at once: the last one standing takes everything.
    pl["c1"].kill()
    pl["c3"].pause()
    await d.view.wait_for(all_owned_by(P, ["c2"]), deadline, "c2 to own everything")
    pl["c3"].resume()
    pl.start("c1")
    await d.converge(nodes, "everyone back")

    report = await d.history()
    d.record("chaos_run", {"claims": len(report.claims), "writes": len(report.writes),
                           "takeovers": {n: len(report.takeovers_from(n)) for n in nodes},
                           "history": report.summary(20)})
    assert report.takeovers_from("c1") and report.takeovers_from("c2"), report.summary()
    assert_clean(report, d)
    # (i) once more, from the reconstructed tenures: on each partition they follow one another.
    for p in range(P):
        tenures = sorted((c for c in report.claims if c.partition == p), key=lambda c: c.token)
        for prev, nxt in itertools.pairwise(tenures):
            assert prev.end is not None and prev.end <= nxt.token, f"partition {p}: {prev} overlaps {nxt}"
