"""Validity, apart from pass/fail (etcd robustness's rule): a run that could not have caught a bug
says so. Too little load, a fault never healed or a cluster never healthy again, a kill/pause/cut with
no ownership change, a pause or cut beyond the TTL with no refused stale write (I4c), a duplicate
delivery (F9) that delivered nothing twice."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

from chaos import faults as catalogue
from chaos.context import SLACK_MS, Context
from chaos.record import FaultRecord

__all__ = ["ValidityChecks", "membership_change_missing"]


def _log_ms(line: str) -> int | None:
    """The `ts` of a JSON log line, as epoch ms (None if the line has none)."""
    try:
        ts = json.loads(line).get("ts")
        return int(datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp() * 1000)
    except (ValueError, AttributeError, TypeError):
        return None


def membership_change_missing(f: FaultRecord) -> str:
    """Why an F12 window did not change the membership ("" if it did): the nemesis records the member it
    removed and the one it added (a voter that caught up with the leader) in the window's `detail`."""
    removed, added = f.detail.get("removed"), f.detail.get("added")
    if not removed:
        return "no etcd member was removed: the membership never changed"
    if not added:
        return f"member {removed.get('name')} was removed but none was added in its place"
    if added.get("id") == removed.get("id"):
        return f"the member added ({added.get('id')}) is the one removed: the membership never changed"
    if not added.get("voting", False):
        return f"the member added ({added.get('name')}) is a learner, not a voting member"
    if int(added.get("applied_index", 0)) < int(added.get("leader_index", 1)):
        return f"the member added ({added.get('name')}) never caught up with the leader"
    return ""


class ValidityChecks(Context):
    def validity(self) -> None:
        v, m = self.s.validity, self.meta
        if not m.steady_before:
            self.invalid.append("the steady-state checks never held before the first fault")
        if not m.steady_after:
            self.invalid.append("the cluster never became healthy again after the run (steady state after)")
        for err in m.harness_errors:
            self.invalid.append(f"the harness failed during the run: {err}")
        for err in m.command_errors:
            self.invalid.append(f"a fault command failed: {err}")
        accepted = self.counts.get("effects_accepted", 0)
        if accepted < v.min_executions:
            self.invalid.append(f"too little load: {accepted} effects accepted, the scenario asks for at least "
                                f"{v.min_executions}")
        if not self.run.watch:
            self.invalid.append("no etcd watch history recorded: ownership, fencing and skips cannot be judged")
        for row, f in zip(self.rows, self.faults, strict=True):
            label = f"fault #{f.index} {f.type} on {f.target}"
            if f.end_ms is None:
                self.invalid.append(f"{label} was never healed")
                continue
            if f.healthy_ms is None:
                self.invalid.append(f"{label}: the cluster never became healthy again")
            if row.planned_inside < v.min_planned_per_fault:
                self.invalid.append(f"{label}: only {row.planned_inside} planned times inside its window, "
                                    f"fewer than {v.min_planned_per_fault}")
            kind = catalogue.kind(f.type)
            duration = f.end_ms - f.start_ms
            row.takeovers = self.takeovers(f)
            if v.require_takeover and kind.expects_takeover and (f.type in ("F1", "F5") or duration > self.ttl_ms):
                if self.owned_by_target(f) == 0:
                    self.invalid.append(f"{label}: its target owned no partition when it started: it exercised "
                                        "nothing")
                elif row.takeovers == 0:
                    self.invalid.append(f"{label}: no ownership change followed it")
            if f.type == "F7" and not self.running_on(f.target, f.start_ms):
                self.invalid.append(f"{label}: no attempt was running on {f.target} when it was killed, so it "
                                    "crashed nothing mid-execution")
            if f.type == "F9" and int(f.counts.get("duplicated", 0)) == 0:
                # Nothing delivered twice: the dedupe was never asked to work, so I1 held vacuously.
                self.invalid.append(f"{label}: no assignment was delivered twice"
                                    + ("" if "duplicated" in f.counts else " (no count recorded)")
                                    + ": duplicate delivery exercised nothing")
            if f.type == "F13" and not int(f.detail.get("running_at_drain", 0)):
                # No run of the stranded worker spanned the drain: the new owners had nothing to give up.
                self.invalid.append(f"{label}: {f.target} ran nothing when its planner was drained, so no run was "
                                    "left to a new owner it cannot reach")
            if f.type == "F12" and (why := membership_change_missing(f)):
                self.invalid.append(f"{label}: {why}")
            row.stale_rejected = self.stale_rejects(f)
            if v.require_stale_reject and kind.expects_stale_reject_beyond_ttl and duration > self.ttl_ms \
                    and row.stale_rejected == 0:
                self.invalid.append(f"{label} lasted {duration / 1000:.1f}s > TTL, yet no stale write was refused "
                                    "(sink 409, etcd's refusal on the wire, or a fenced_out in its log): fencing was "
                                    "not exercised (I4c)")

    def start_rev(self, f: FaultRecord) -> int:
        """The revision the fault began at. The watcher sees a revision a little after it committed
        (SLACK_MS), so a claim made just before a kill reads as after it: a game day's F1 killed a planner
        at the write right after a claim and was judged to have "owned nothing". A crashed, frozen or cut
        planner makes no claim inside its window, so looking SLACK_MS on (never past the window's end)
        finds only what it held when the fault began."""
        end = f.end_ms if f.end_ms is not None else f.start_ms
        return self.idx.rev_at(min(f.start_ms + SLACK_MS, max(f.start_ms, end)))

    def owned_by_target(self, f: FaultRecord) -> int:
        revs = (self.idx.rev_at(f.start_ms), self.start_rev(f))
        nodes = self.target_nodes(f)
        return sum(1 for c in self.idx.claims() if c.node in nodes and any(c.held_at(r) for r in revs))

    def takeovers(self, f: FaultRecord) -> int:
        """Claims made after the fault started (until 3 x TTL + settle after it ended) on partitions its
        target owned when it started."""
        rev0 = self.start_rev(f)
        revs = (self.idx.rev_at(f.start_ms), rev0)
        nodes = self.target_nodes(f)
        parts = {c.partition for c in self.idx.claims() if c.node in nodes and any(c.held_at(r) for r in revs)}
        end = (f.end_ms or self.meta.end_ms) + self.ttl_ms * 3 + int(self.s.lag.settle_s * 1000)
        return sum(1 for c in self.idx.claims() if c.partition in parts and c.token > rev0
                   and self.idx.time_of(c.token) <= end)

    def stale_rejects(self, f: FaultRecord) -> int:
        end = (f.end_ms or self.meta.end_ms) + self.ttl_ms + int(self.s.lag.settle_s * 1000)
        n = sum(1 for e in self.idx.refused if f.start_ms <= e.t_ms <= end)
        nodes = self.target_nodes(f)
        n += sum(1 for t in self.run.wire
                 if t.refused_by_fence and t.planner in nodes and f.start_ms <= t.answered_ms <= end)
        for path in self.run.logs:
            if path.stem in nodes:
                n += sum(1 for ts in self.fenced_out_times(path) if f.start_ms <= ts <= end)
        return n

    def fenced_out_times(self, path: Path) -> list[int]:
        """When a node's log says a fenced write of it was refused (`fenced_out` events), read once per log."""
        cache = self._fenced_out
        if path not in cache:
            times = []
            for line in path.read_text(errors="replace").splitlines():
                if '"fenced_out"' in line and (ts := _log_ms(line)) is not None:
                    times.append(ts)
            cache[path] = times
        return cache[path]

    def running_on(self, worker: str, t: int) -> bool:
        """An accepted attempt of `worker` had started and not ended by harness time `t`."""
        return any(self.worker_name(a.worker) == worker and a.start_ms <= t and (a.end_ms is None or a.end_ms > t)
                   for atts in self.idx.attempts.values() for a in atts)
