"""Synthetic recorded runs for the checker's tests: a small cluster's etcd watch history, effect log,
operation log and fault windows, written as a run directory exactly as the runner will write one.

`clean_run()` is a run that keeps every invariant and is valid: 2 planners, 4 partitions, every-second
schedules with the http executor, one planner paused beyond its lease (F2, a takeover, and its stale
dispatch refused by the sink), a pause/resume of one schedule, an overlap skip that a real run in
progress justifies. Tests then break one thing and check the verdict names it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from chaos.record import FaultRecord, OpRecord, Run, RunMeta, WatchRecord
from chaos.sink import EffectRecord
from scheduler.execution import ExecState, Execution, Trigger, dispatch, new_execution, result, started
from scheduler.ids import ExecutionId, FencingToken, execution_id
from scheduler.model import Policies, RetryPolicy, Schedule, ScheduleState
from scheduler.store.codec import encode_execution, encode_schedule
from scheduler.store.keyspace import Keyspace, partition_for
from scheduler.timeplan import MissedRuns, Overlap

T0 = 1_796_126_400_000  # 2026-12-01T12:00:00Z, the run's start (harness clock)
PREFIX = "/drill"
KS = Keyspace(PREFIX)
P = 4
TTL_MS = 2000
SCENARIO = """
[scenario]
name = "synthetic"
description = "a synthetic history"
duration_s = 60
[cluster]
planners_per_region = 2
partitions = 4
[lag]
steady_p99_s = 1.0
steady_max_s = 2.0
fault_max_s = 6.0
settle_s = 4.0
liveness_s = 10.0
judge_grace_s = 5.0
[validity]
min_executions = 100
min_planned_per_fault = 10
[[load.schedules]]
name = "s"
count = 12
spec = "* * * * * *"
[faults]
warmup_s = 5
cooldown_s = 10
[[faults.fixed]]
type = "F2"
at_s = 20
duration_s = 6
target = "r1-p1"
"""


@dataclass
class Synth:
    start_ms: int = T0
    duration_ms: int = 60_000
    rev: int = 1
    watch: list[WatchRecord] = field(default_factory=list)
    effects: list[EffectRecord] = field(default_factory=list)
    ops: list[OpRecord] = field(default_factory=list)
    faults: list[FaultRecord] = field(default_factory=list)
    created: dict[str, int] = field(default_factory=dict)  # key -> create revision
    owners: dict[int, tuple[str, int]] = field(default_factory=dict)  # partition -> (node, token)
    leases: dict[str, int] = field(default_factory=lambda: {"r1-p1": 0xA1, "r1-p2": 0xB2})
    seq: int = 0

    # ---- etcd -----------------------------------------------------------------------------------

    def put(self, key: bytes, value: bytes, t_ms: int, lease: int = 0) -> int:
        self.rev += 1
        create = self.created.setdefault(key.decode(), self.rev)
        self.watch.append(WatchRecord(self.rev, "PUT", key.decode(), value, create, self.rev, lease, t_ms + 5))
        return self.rev

    def delete(self, key: bytes, t_ms: int) -> int:
        self.rev += 1
        self.created.pop(key.decode(), None)
        self.watch.append(WatchRecord(self.rev, "DELETE", key.decode(), t_ms=t_ms + 5))
        return self.rev

    def claim(self, p: int, node: str, t_ms: int) -> int:
        lease = self.leases[node]
        tok = self.put(KS.owner(p), json.dumps({"node": node, "lease": f"{lease:x}"}).encode(), t_ms, lease)
        self.owners[p] = (node, tok)
        return tok

    def expire(self, p: int, t_ms: int) -> None:
        self.delete(KS.owner(p), t_ms)
        self.owners.pop(p, None)

    def checkpoint(self, p: int, wm: int, t_ms: int) -> None:
        node, tok = self.owners[p]
        self.put(KS.checkpoint(p), json.dumps({"watermark_ms": wm, "writer": node, "token": tok,
                                               "sched_rev": 0}).encode(), t_ms)

    def schedule(self, s: Schedule, activated_ms: int, t_ms: int) -> None:
        p = partition_for(s.id, P)
        self.put(KS.schedule(p, s.id), encode_schedule(s, activated_ms=activated_ms), t_ms)

    def record(self, e: Execution, t_ms: int) -> int:
        return self.put(KS.execution(partition_for(e.schedule_id, P), e.schedule_id, e.planned_ms),
                        encode_execution(e), t_ms)

    def skip_range(self, sid: str, after: int, through: int, reason: str, t_ms: int) -> None:
        self.put(KS.skip(partition_for(sid, P), sid, after, through), json.dumps({"reason": reason}).encode(), t_ms)

    # ---- the sink -------------------------------------------------------------------------------

    def effect(self, eid: str, attempt: int, token: FencingToken, worker: str, start: int, end: int | None,
               *, accepted: bool = True, aborted: bool = False) -> None:
        """`aborted`: the effect was cut short at `end` (its worker killed), as the sink records it."""
        parsed = ExecutionId.parse(eid)
        sid, planned = parsed.schedule_id, parsed.planned_ms
        self.seq += 1
        self.effects.append(EffectRecord(self.seq, "start", eid, sid, planned, attempt, token.partition,
                                         token.revision, worker, start, accepted,
                                         "" if accepted else "stale fencing token"))
        if accepted and end is not None:
            self.seq += 1
            self.effects.append(EffectRecord(self.seq, "abort" if aborted else "end", eid, sid, planned, attempt,
                                             token.partition,
                                             token.revision, worker, end, True))

    def build(self, directory: Path, scenario: str = SCENARIO, **meta: Any) -> Run:
        m = RunMeta(scenario="synthetic", seed=7, prefix=PREFIX, partitions=P, lease_ttl_s=TTL_MS / 1000,
                    start_ms=self.start_ms, end_ms=self.start_ms + self.duration_ms, plan_fingerprint="synthetic",
                    versions={"sched": "0.1.0", "etcd": "3.5.x"}, late_grace_ms=2000, lookahead_ms=1000,
                    nodes={"r1-p1": {"role": "planner", "region": "r1"}, "r1-p2": {"role": "planner", "region": "r1"},
                           "r1-w1": {"role": "worker", "region": "r1"}, "r1-w2": {"role": "worker", "region": "r1"}})
        m = replace(m, **meta)
        return Run(directory, m, list(self.effects), sorted(self.watch, key=lambda w: w.rev), list(self.ops),
                   list(self.faults), [], scenario)


POLICIES = Policies(missed_runs=MissedRuns.ALL, catchup_cap=1000, catchup_window_ms=600_000,
                    overlap=Overlap.ALLOW_ALL, retry=RetryPolicy(max_attempts=3))


def sched(sid: str, *, overlap: Overlap = Overlap.ALLOW_ALL, state: ScheduleState = ScheduleState.ACTIVE) -> Schedule:
    return Schedule(id=sid, tenant="t", spec="* * * * * *", worker_pool="default", task_type="http",
                    state=state, policies=replace(POLICIES, overlap=overlap))


def run_one(x: Synth, s: Schedule, t: int, node_token: tuple[str, int], dispatch_at: int, worker: str,
            hold_ms: int = 80) -> None:
    """A planned time run the ordinary way: record written ahead, dispatched, started, effect, result."""
    e = new_execution(id=execution_id(s.id, t), schedule_id=s.id, tenant="t", pool="default", task_type="http",
                      planned_ms=t, due_ms=t, trigger=Trigger.SCHEDULED, retry=s.policies.retry, timeout_ms=30_000)
    node, tok = node_token
    p = partition_for(s.id, P)
    x.record(e, min(dispatch_at, t) - 1000)
    token = FencingToken(p, tok)
    e = dispatch(e, worker="", planner=node, token=token, now_ms=max(dispatch_at, t))
    x.record(e, dispatch_at)
    e = started(e, 1, dispatch_at + 20, worker)
    x.record(e, dispatch_at + 20)
    x.effect(e.id, 1, token, worker, dispatch_at + 40, dispatch_at + 40 + hold_ms)
    e, _ = result(e, 1, succeeded=True, error_class=None, message="", now_ms=dispatch_at + 60 + hold_ms, worker=worker)
    x.record(e, dispatch_at + 60 + hold_ms)


def clean_run(directory: Path, policies: Sequence[tuple[int, bytes]] = ()) -> tuple[Synth, Run]:
    """`policies`: region policy records (encoded) put at their times, in revision order with the rest."""
    x = Synth()
    pending = sorted(policies)

    def policies_until(t: int) -> None:
        while pending and pending[0][0] <= t:
            at, value = pending.pop(0)
            x.put(KS.region_policy, value, at)

    policies_until(T0 - 6000)
    ids = [f"s-{i:03d}" for i in range(12)]
    schedules = {sid: sched(sid) for sid in ids}
    slow = sched("slow-000", overlap=Overlap.SKIP)
    schedules[slow.id] = slow
    for p in range(P):
        x.claim(p, "r1-p1" if p < 2 else "r1-p2", T0 - 6000)
    for s in schedules.values():
        x.schedule(s, T0 - 5000, T0 - 5000)
    pause_from, pause_to = T0 + 20_000, T0 + 26_000  # F2 on r1-p1
    takeover = pause_from + TTL_MS + 500
    stale = True
    for sec in range(-4, 61):
        t = T0 + sec * 1000
        policies_until(t)
        # Ownership changes due now: r1-p1's keys expire during its pause; r1-p2 claims them.
        if t == takeover - 500:
            for p in (0, 1):
                x.expire(p, takeover - 100)
                x.claim(p, "r1-p2", takeover)
        for s in schedules.values():
            if s.id == "s-005" and T0 + 30_000 < t <= T0 + 35_000:
                continue  # paused: recorded below as a skip range
            if s.id == slow.id and sec % 2 == 1:
                continue  # the slow schedule's odd seconds: skipped as overlaps below
            p = partition_for(s.id, P)
            node_tok = x.owners[p]
            at = t
            if p < 2 and pause_from <= t < takeover + 100:
                at, node_tok = takeover + 100, x.owners[p]  # caught up by the new owner
            hold = 1500 if s.id == slow.id else 80
            run_one(x, s, t, node_tok, at, "r1-w1" if sec % 2 else "r1-w2", hold)
        for p in range(P):
            if p in x.owners and not (p < 2 and pause_from <= t < takeover):
                x.checkpoint(p, t + 1000, t + 50)
        if stale and t >= pause_to:
            stale = False  # r1-p1 wakes up, its stale dispatch reaches the sink, which refuses it
            x.effect(execution_id("s-000", pause_from), 2, FencingToken(partition_for("s-000", P), 2), "r1-w1",
                     pause_to + 30, None, accepted=False)
    # The slow schedule: its odd seconds were skipped while its previous run (1.5 s) was in progress.
    for sec in range(-3, 61, 2):
        t = T0 + sec * 1000
        e = new_execution(id=execution_id(slow.id, t), schedule_id=slow.id, tenant="t", pool="default",
                          task_type="http", planned_ms=t, due_ms=t, trigger=Trigger.SCHEDULED,
                          retry=slow.policies.retry, timeout_ms=30_000)
        x.record(replace(e, state=ExecState.SKIPPED, skip_reason="overlap_skip"), t + 10)
    # Pause and resume of s-005, and the skip range the owner wrote for the paused stretch.
    s5 = schedules["s-005"]
    x.schedule(replace(s5, state=ScheduleState.PAUSED), T0 + 30_000, T0 + 30_000)
    x.ops.append(OpRecord(T0 + 29_990, "pause", "s-005", True, T0 + 30_010))
    x.schedule(s5, T0 + 35_000, T0 + 35_000)
    x.ops.append(OpRecord(T0 + 34_990, "resume", "s-005", True, T0 + 35_010))
    x.skip_range("s-005", T0 + 30_000, T0 + 35_000, "paused", T0 + 35_100)
    x.faults.append(FaultRecord(0, "F2", "r1-p1", pause_from, pause_to, {"ttl_multiple": 3.0}, "planner",
                                "planner pause", healthy_ms=pause_to + 1500))
    return x, x.build(directory)


# ---- a general small simulation: several planners and faults --------------------------------------


@dataclass
class Plan:
    """What happens to ownership in a simulated run (times are seconds after T0)."""

    nodes: tuple[str, ...] = ("r1-p1", "r1-p2", "r1-p3")
    down: dict[str, list[tuple[float, float]]] = field(default_factory=dict)  # node -> stretches it serves nothing
    moves: list[tuple[float, int, str]] = field(default_factory=list)  # (time, partition, new owner): expiry + claim
    stale: list[tuple[float, str, int]] = field(default_factory=list)  # (time, node, partition): a refused write


def simulate(directory: Path, plan: Plan, faults: list[FaultRecord], *, schedules: int = 16,
             duration_s: int = 90, scenario: str = SCENARIO) -> Run:
    """Every-second schedules served by the owner of their partition; while the owner serves nothing,
    a planned time waits for the next claim of its partition or the owner's return, whichever is first."""
    x = Synth(duration_ms=duration_s * 1000)
    x.leases = {n: 0xA0 + i for i, n in enumerate(plan.nodes)}
    ss = [sched(f"s-{i:03d}") for i in range(schedules)]
    claims: dict[int, list[tuple[int, str]]] = {p: [(T0 - 6000, plan.nodes[p % len(plan.nodes)])] for p in range(P)}
    for move_s, p, node in sorted(plan.moves):
        claims[p].append((T0 + int(move_s * 1000), node))
    down = {n: [(T0 + int(a * 1000), T0 + int(b * 1000)) for a, b in v] for n, v in plan.down.items()}

    def is_down(node: str, t: int) -> bool:
        return any(a <= t < b for a, b in down.get(node, []))

    def owner_at(p: int, t: int) -> tuple[int, str]:
        return [c for c in claims[p] if c[0] <= t][-1]

    def served(p: int, t: int) -> tuple[str, int]:
        """(node, when) that serves partition p's planned time t."""
        _since, node = owner_at(p, t)
        if not is_down(node, t):
            return node, t
        later = [c for c in claims[p] if c[0] > t]
        back = min((b for a, b in down[node] if a <= t < b), default=None)
        options = [(c[0] + 100, c[1]) for c in later[:1]]
        if back is not None and (not later or later[0][0] > back):
            options.append((back + 100, node))
        when, who = min(options)
        return who, when

    events: list[tuple[int, int, Any]] = []  # (time, order, action)
    n = 0

    def at(t: int, action: Any) -> None:
        nonlocal n
        n += 1
        events.append((t, n, action))

    for p in range(P):
        for i, (t_claim, node) in enumerate(claims[p]):
            if i:
                at(t_claim - 100, lambda p=p, t=t_claim: x.expire(p, t - 100))
            at(t_claim, lambda p=p, node=node, t=t_claim: x.claim(p, node, t))
    for s in ss:
        at(T0 - 5000, lambda s=s: x.schedule(s, T0 - 5000, T0 - 5000))
    for sec in range(-4, duration_s + 1):
        t = T0 + sec * 1000
        for s in ss:
            p = partition_for(s.id, P)
            node, when = served(p, t)
            at(when, lambda s=s, t=t, node=node, when=when, w="r1-w1" if sec % 2 else "r1-w2":
               run_one(x, s, t, (node, x.owners[partition_for(s.id, P)][1]), when, w))
        for p in range(P):
            _, node = owner_at(p, t)
            if not is_down(node, t):
                at(t + 50, lambda p=p, t=t: x.checkpoint(p, t + 1000, t + 50) if p in x.owners else None)
    for stale_s, node, p in plan.stale:
        t = T0 + int(stale_s * 1000)
        old = next(c for c in claims[p] if c[1] == node)

        def refused(p: int = p, t: int = t, old: tuple[int, str] = old) -> None:
            token = next(w.create_rev for w in x.watch if w.key == KS.owner(p).decode() and w.t_ms == old[0] + 5)
            x.effect(execution_id("s-000", t - 1000), 2, FencingToken(p, token), "r1-w1", t, None, accepted=False)

        at(t, refused)
    for _, _, action in sorted(events, key=lambda e: (e[0], e[1])):
        action()
    x.faults.extend(faults)
    return x.build(directory, scenario=scenario, nodes={
        **{nd: {"role": "planner", "region": "r1"} for nd in plan.nodes},
        "r1-w1": {"role": "worker", "region": "r1"}, "r1-w2": {"role": "worker", "region": "r1"}})


SHOWCASE_SCENARIO = SCENARIO.replace("duration_s = 60", "duration_s = 90").replace(
    "planners_per_region = 2", "planners_per_region = 3")


def showcase(directory: Path) -> Run:
    """Three planners, 90 s: F1 kills r1-p1 (its partitions move to r1-p2 and r1-p3 a TTL later, it is
    restarted and takes one back), F2 pauses r1-p2 beyond its lease (r1-p3 takes over, r1-p2's stale
    write is refused when it wakes), F3 cuts r1-p3 off for 1.5 s (below the TTL: no takeover)."""
    plan = Plan(
        down={"r1-p1": [(15.0, 19.0)], "r1-p2": [(40.0, 46.0)], "r1-p3": [(65.0, 66.5)]},
        moves=[(17.2, 0, "r1-p2"), (17.3, 3, "r1-p3"), (30.0, 3, "r1-p1"), (42.5, 1, "r1-p3"), (42.6, 0, "r1-p1")],
        stale=[(46.05, "r1-p2", 1)],
    )
    faults = [
        FaultRecord(0, "F1", "r1-p1", T0 + 15_000, T0 + 19_000, {"restart": True}, "planner", "planner crash",
                    healthy_ms=T0 + 20_000),
        FaultRecord(1, "F2", "r1-p2", T0 + 40_000, T0 + 46_000, {"ttl_multiple": 3.0}, "planner", "planner pause",
                    healthy_ms=T0 + 47_000),
        FaultRecord(2, "F3", "r1-p3", T0 + 65_000, T0 + 66_500, {"direction": "both"}, "link",
                    "planner-etcd partition", healthy_ms=T0 + 67_000),
    ]
    return simulate(directory, plan, faults, scenario=SHOWCASE_SCENARIO)
