"""The state one check of a run shares between its parts (chaos/check.py composes them): the run,
its scenario, the history index, the invariants being filled, and the helpers every part needs (which
fault killed a worker, which window a planned time falls in, who a fault's target is)."""

from __future__ import annotations

import bisect
from pathlib import Path

from chaos import faults as catalogue
from chaos.index import Activation, Attempt, HistoryIndex, build
from chaos.record import FaultRecord, Run
from chaos.scenario import Scenario
from chaos.verdict import INVARIANTS, FaultRow, Invariant
from scheduler.execution import ExecState, Trigger
from scheduler.region.policy import ChangeKind

__all__ = ["SLACK_MS", "Context"]

SLACK_MS = 300  # the watcher sees a revision a little after it committed; the sink a little after a start
# What a planner's bounded planning clock may be off by under an F6 skew (the planners' `max_clock_skew`,
# default 1 s; docs/time.md, "Clock skew"): the times it stamps on a record are, and with them the end an
# overlap decision reads from that record.
SKEW_BOUND_MS = 1000
RECORD_STAMP_MS = 10_000  # how far before the watch saw a record its own dispatch stamp may move a run's start


class Context:
    """The shared state; each check module is a subclass adding its own methods (chaos/check.py joins them)."""

    def __init__(self, run: Run, scenario: Scenario) -> None:
        self.run, self.s, self.meta = run, scenario, run.meta
        self.idx: HistoryIndex = build(run)
        self.inv = {k: Invariant(k, v) for k, v in INVARIANTS.items()}
        self.invalid: list[str] = []
        self.ttl_ms = int(self.meta.lease_ttl_s * 1000)
        self.faults = sorted(run.faults, key=lambda f: f.start_ms)
        self.fault_starts = [f.start_ms for f in self.faults]
        self.rows = [FaultRow(f.index, f.type, f.name or catalogue.kind(f.type).name, f.target,
                              (f.start_ms - self.meta.start_ms) / 1000,
                              None if f.end_ms is None else (f.end_ms - f.start_ms) / 1000,
                              None if f.healthy_ms is None or f.end_ms is None else (f.healthy_ms - f.end_ms) / 1000)
                     for f in self.faults]
        self.reruns: dict[str, int] = {}
        self.cancels: set[str] = set()  # executions the drill's cancel ops named (acknowledged or perhaps applied)
        for o in run.ops:
            # (A failed op whose unanswered try may have been applied counts too: chaos/ops.py.)
            if not (o.ok or o.result.get("maybe_applied")):
                continue
            if o.op == "cancel" and o.result.get("execution_id"):
                self.cancels.add(str(o.result["execution_id"]))
            if o.op in ("rerun", "replay"):
                eid = str(o.result.get("execution_id") or o.params.get("execution_id") or "")
                if eid:
                    self.reruns[eid] = self.reruns.get(eid, 0) + 1
        self.lag_points: list[tuple[int, int]] = []
        self.judged_until = self.idx.cluster_ms(self.meta.end_ms - int(self.s.lag.judge_grace_s * 1000))
        self.window_from = self.idx.cluster_ms(self.meta.start_ms)
        self.counts: dict[str, int] = {}
        self.owed_list: list[tuple[str, int, Activation]] = []
        self.owed_of: dict[str, list[int]] = {}
        self.phases: dict[str, list[int]] = {"before": [], "during": [], "after": []}
        self._exposures: dict[int, list[tuple[int, int]]] = {}
        self._fenced_out: dict[Path, list[int]] = {}  # log -> times of its fenced_out events
        self._failed_over: dict[int, bool] = {}  # fault index -> a standby's failover answered it

    def bump(self, k: str, n: int = 1) -> None:
        self.counts[k] = self.counts.get(k, 0) + n

    def node_region(self, node: str) -> str:
        info = self.meta.nodes.get(node, {})
        return info.get("region", node.split("-", 1)[0])

    def worker_name(self, worker: str) -> str:
        for name, info in self.meta.nodes.items():
            if info.get("address") == worker:
                return name
        return worker

    def crash_of(self, a: Attempt) -> int | None:
        """When the attempt's worker was killed by a fault after the attempt started (F7, F5), else None."""
        w = self.worker_name(a.worker)
        for f in self.faults:
            # A start the sink logged just after the kill was sent before it (a killed job's request still in
            # flight): the crash still cut that attempt short.
            if f.start_ms < a.start_ms - SLACK_MS:
                continue
            # A worker run.json does not name (no address mapping) could be any: any worker crash may be its.
            unknown = w not in self.meta.nodes
            hit = (f.type == "F7" and (f.target == w or unknown)) or (
                f.type == "F5" and (unknown or self.node_region(w) == f.target))
            if hit:
                return f.start_ms
        return None

    def _late_overlap(self, a: Attempt, t: int, t_cluster: int) -> bool:
        """Attempt `a` is the first start of a run planned before `t` that started after it, late, and that
        would have been running at `t` had it started at its planned time (for as long as it ran): the
        product judges a late run as if it had run on time (docs/time.md, "What counts as overlap")."""
        if a.end_ms is None or a.aborted or not a.planned_ms <= t_cluster or a.start_ms <= t:
            return False
        first = min((b.start_ms for b in self.idx.attempts_of.get(a.schedule_id, []) if b.exec_id == a.exec_id),
                    default=a.start_ms)
        if first != a.start_ms:
            return False  # a retry is the same run: only its first start says how late it was
        recs = self.idx.records.get(a.exec_id) or []
        if recs and recs[0][2].trigger is not Trigger.SCHEDULED:
            return False
        return t_cluster < a.planned_ms + (a.end_ms - a.start_ms) + SLACK_MS

    def _stamped_skewed(self, a: Attempt) -> bool:
        """Attempt `a`'s record was stamped by a planner an F6 fault skewed then: the end an overlap decision
        reads from it (its dispatch stamp plus what the worker measured) may be late by the skew bound. A game
        day (session 18) saw a +30 s F6, held to about +1 s by the planning clock, stamp a dispatch 1 s late, and
        the next owner skip the run due 0.95 s after the real end: within the documented bound, not a miss."""
        recs = self.idx.records.get(a.exec_id) or []
        planners = {x.planner for _, _, rec in recs for x in rec.attempts if x.attempt == a.attempt}
        return any(f.type == "F6" and f.target in planners
                   and f.start_ms - SLACK_MS <= a.start_ms <= (f.end_ms or self.meta.end_ms) + SLACK_MS
                   for f in self.faults)

    def running_at(self, sid: str, eid: str, t_cluster: int) -> bool:
        """Another run of `sid` was really in progress at that instant: an accepted effect spanning it,
        or a record the watch history shows RUNNING/DISPATCHED from before it until after it."""
        t = self.idx.harness_ms(t_cluster)
        for a in self.idx.attempts_of.get(sid, []):
            if a.exec_id == eid:
                continue
            if self._late_overlap(a, t, t_cluster):
                return True
            end = a.end_ms if a.end_ms is not None else (self.crash_of(a) or self.meta.end_ms)
            if a.start_ms - SLACK_MS <= t < end + SLACK_MS:
                return True
            if a.start_ms <= t < end + SLACK_MS + SKEW_BOUND_MS and self._stamped_skewed(a):
                return True
        for other in self.idx.records_of.get(sid, []):
            if other == eid:
                continue
            since = None
            for _, seen, rec in self.idx.records[other]:
                busy = rec.state in (ExecState.DISPATCHED, ExecState.RUNNING, ExecState.CANCELLING)
                if busy and since is None:
                    since = seen
                    cur = rec.current
                    if cur is not None and cur.dispatched_ms:
                        # From when the record says its attempt went out (the planner's clock, which the clock
                        # guard keeps near the others'), not only from when the watch delivered it: a game day's
                        # watch delivered a RUNNING record 5.3 s after its start, past the next run's due time
                        # (an etcd member loss), and its overlap skip read as manufactured. Bounded, so that a
                        # skewed stamp cannot reach far back.
                        since = min(since, max(self.idx.harness_ms(cur.dispatched_ms), seen - RECORD_STAMP_MS))
                elif not busy and since is not None:
                    if since - SLACK_MS <= t < seen + SLACK_MS:
                        return True
                    since = None
            if since is not None and since - SLACK_MS <= t:
                return True
        return False

    def in_flight_at_end(self, a: Attempt) -> bool:
        return a.start_ms >= self.meta.end_ms - int(self.s.lag.judge_grace_s * 1000) - SLACK_MS

    def rel(self, harness_ms: int) -> str:
        return f"t+{(harness_ms - self.meta.start_ms) / 1000:.3f}s"

    def window_of(self, harness_t: int) -> FaultRecord | None:
        """The fault whose window (plus the settle time; for an outage, its lag bound) holds `harness_t`: the
        latest one started by then
        (faults are one at a time; with allow_overlap the latest started is the one named)."""
        settle = int(self.s.lag.settle_s * 1000)
        # After an outage the backlog drains for up to its own bound: times planned then are still its.
        outage = max(settle, int(max(self.s.lag.fault_max_s, self.s.lag.outage_max_s) * 1000))
        i = bisect.bisect_right(self.fault_starts, harness_t) - 1
        while i >= 0:
            f = self.faults[i]
            end = f.end_ms if f.end_ms is not None else self.meta.end_ms
            if harness_t <= end + (outage if self.outage(f) else settle):
                return f
            if not self.s.faults.allow_overlap:
                return None
            i -= 1
        return None

    def failed_over(self, f: FaultRecord) -> bool:
        """An F5 on the planning region that an automatic failover to a standby answered within its window
        (and settle time): the policy history shows the move away from the lost region (chaos/regions.py)."""
        if f.type != "F5":
            return False
        if f.index not in self._failed_over:  # asked per planned time by window_of and I3: once per fault
            end = (f.end_ms if f.end_ms is not None else self.meta.end_ms) + int(self.s.lag.settle_s * 1000)
            self._failed_over[f.index] = any(
                f.start_ms < t <= end and p.last is not None and p.last.kind is ChangeKind.FAILOVER
                and p.last.from_region == f.target for _, t, p in self.idx.policies)
        return self._failed_over[f.index]

    def outage(self, f: FaultRecord) -> bool:
        """Nothing can start while the fault lasts (quorum loss, the only planning region lost), so lag is
        counted from its end. A region loss a standby took over from is not one: runs start in the standby
        during the window, and their lag counts from their planned times."""
        return catalogue.is_outage(f.type, f.params) and not self.failed_over(f)

    def target_nodes(self, f: FaultRecord) -> set[str]:
        if f.role == "region" or f.type == "F5":
            nodes = {n for n, info in self.meta.nodes.items() if info.get("region") == f.target}
            return nodes or {c.node for c in self.idx.claims() if c.node.startswith(f.target + "-")}
        return {f.target.split("->", 1)[0]}
