"""The drill checker: a verdict on a recorded run, from its history alone.

Invariants (names from ../shared/research/drills.md, C3; docs/drills.md says how each is judged here):

  I1  at most one effect per execution id (plus one per operator rerun/replay), and no two attempts
      of one id running at once: from the effect sink's log;
  I2  every planned time after an activation and inside the window ran, or has a skip record whose
      reason its policy justifies, or is accounted for by its record (dead letter, cancel); planned
      times recomputed with the production time engine and, for fixed-period specs, a second,
      independent computation (the two must agree);
  I3  start lag (first accepted start - planned time) within the scenario's bounds, split before /
      during / after fault windows;
  I4  fencing: accepted tokens never decrease per partition (sink log); every checkpoint and every
      dispatch landed under the claim current at its revision (etcd history, chaos/history.py);
  I5  watermarks never go back (chaos/history.py);
  I6  one owner per partition per revision (chaos/history.py);
  I7  liveness after heal: start lag back under its bound within `lag.liveness_s` of each fault's end,
      and every partition owned 3 x TTL after the last one;
  I8  no unexpected error in the given logs (ERROR/CRITICAL, `UNEXPECTED`, tracebacks), minus the
      scenario's `checks.allowed_errors`.

Validity, apart from pass/fail (etcd robustness's rule): too little load, a fault that exercised
nothing (no takeover after a kill/pause/cut/region loss; no refused stale write after a pause or cut
beyond the TTL: I4c), a cluster never healthy again, or an incomplete history make a run *invalid*.
A violation fails the run whatever its validity: a duplicate is a bug even in a thin run.

Exit codes (`Verdict.exit_code`): 0 pass, 1 fail, 3 invalid (2 is the CLI's bad input).
"""

from __future__ import annotations

import bisect
import json
import re
import statistics
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from chaos import faults as catalogue
from chaos.index import Activation, Attempt, HistoryIndex, build
from chaos.record import FaultRecord, Run, RunError
from chaos.scenario import Scenario, loads
from scheduler.execution import ExecState, Trigger
from scheduler.ids import execution_id
from scheduler.timeplan import CronPlan, EveryPlan, MissedRuns, Overlap, Plan

__all__ = ["EXIT", "FaultRow", "Invariant", "Verdict", "check_run"]

EXIT = {"pass": 0, "fail": 1, "invalid": 3}
INVARIANTS = {
    "I1": "at most one effect per execution id",
    "I2": "no planned time missed silently",
    "I3": "start lag within bounds",
    "I4": "fencing rejects stale planners",
    "I5": "watermarks monotone",
    "I6": "one owner per partition per revision",
    "I7": "liveness after heal",
    "I8": "no unexpected errors in the logs",
}
EXAMPLES = 20  # counterexamples kept per invariant (all are counted)
SLACK_MS = 300  # the watcher sees a revision a little after it committed; the sink a little after a start
IN_FLIGHT = (ExecState.SCHEDULED, ExecState.DISPATCHED, ExecState.RUNNING, ExecState.RETRY_WAIT)
ENDED = (ExecState.DEAD_LETTER, ExecState.FAILED, ExecState.CANCELLED)
MISSED_REASONS = ("policy_skip", "outside_catchup_window", "over_cap")


@dataclass
class Invariant:
    id: str
    name: str
    checked: int = 0
    count: int = 0
    examples: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def fail(self, text: str) -> None:
        self.count += 1
        if len(self.examples) < EXAMPLES:
            self.examples.append(text)

    @property
    def status(self) -> str:
        if self.count:
            return "fail"
        return "pass" if self.checked else "n/a"

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "status": self.status, "checked": self.checked, "violations": self.count,
                "counterexamples": self.examples, "notes": self.notes}


@dataclass
class FaultRow:
    index: int
    type: str
    name: str
    target: str
    start_s: float  # from the run's start
    duration_s: float | None
    healthy_after_s: float | None  # from the fault's end until healthy again
    planned_inside: int = 0
    takeovers: int = 0
    stale_rejected: int = 0
    rto_s: float | None = None
    late_runs: int = 0


@dataclass
class Verdict:
    result: str  # pass | fail | invalid
    scenario: str
    seed: int
    invariants: dict[str, Invariant]
    invalid: list[str]
    faults: list[FaultRow]
    stats: dict[str, Any]
    meta: dict[str, Any]
    # For the picture: (planned ms, lag ms) per run; ownership lanes (partition, node, from ms, to ms).
    lag_points: list[tuple[int, int]] = field(default_factory=list)
    lanes: list[tuple[int, str, int, int | None]] = field(default_factory=list)

    @property
    def exit_code(self) -> int:
        return EXIT[self.result]

    def to_json(self) -> dict[str, Any]:
        return {"verdict": self.result, "exit_code": self.exit_code, "scenario": self.scenario, "seed": self.seed,
                "invalid_because": self.invalid, "invariants": {k: v.to_json() for k, v in self.invariants.items()},
                "faults": [f.__dict__ for f in self.faults], "stats": self.stats, "meta": self.meta}


# ---- planned times ---------------------------------------------------------------------------------


def fixed_period_ms(spec: str) -> tuple[int, int] | None:
    """(period, phase) of specs whose planned times are plain multiples: `@every Ns [phase Ms]` and
    `*/k * * * * *` with k dividing 60 (and `* * * * * *`), in any zone (whole seconds are the same in
    every zone). None for anything else: those are checked by the production engine only."""
    s = " ".join(spec.split())
    m = re.fullmatch(r"@every (\d+)s(?: phase (\d+)s)?", s)
    if m:
        return int(m[1]) * 1000, int(m[2] or 0) * 1000
    m = re.fullmatch(r"(\*|\*/(\d+)) \* \* \* \* \*", s)
    if m:
        k = int(m[2] or 1)
        return (k * 1000, 0) if 60 % k == 0 else None
    return None


def independent_times(period_ms: int, phase_ms: int, after: int, through: int) -> list[int]:
    """phase + n * period in (after, through]: the second computation, sharing no code with timeplan."""
    first = phase_ms + ((after - phase_ms) // period_ms + 1) * period_ms
    return list(range(first, through + 1, period_ms))


def planned_times(plan: Plan, spec: str, after: int, through: int, cross: list[str]) -> list[int]:
    times = list(plan.between_ms(after, through))
    fp = fixed_period_ms(spec)
    if fp is not None and isinstance(plan, EveryPlan | CronPlan) and (plan.start_ms is None and plan.end_ms is None):
        other = independent_times(fp[0], fp[1], after, through)
        if other != times:
            diff = sorted(set(times) ^ set(other))[:5]
            cross.append(f"{spec!r} in ({after}, {through}]: the time engine and the independent computation "
                         f"disagree on {len(set(times) ^ set(other))} planned times, e.g. {diff}")
    return times


# ---- the checker -----------------------------------------------------------------------------------


class _Checker:
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
        for o in run.ops:
            if o.ok and o.op in ("rerun", "replay"):
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

    # ---- helpers ---------------------------------------------------------------------------------

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
            if f.start_ms < a.start_ms:
                continue
            hit = (f.type == "F7" and f.target == w) or (f.type == "F5" and self.node_region(w) == f.target) or (
                f.type in ("F7", "F5") and w not in self.meta.nodes and not w.startswith(f.target))
            if hit:
                return f.start_ms
        return None

    def in_flight_at_end(self, a: Attempt) -> bool:
        return a.start_ms >= self.meta.end_ms - int(self.s.lag.judge_grace_s * 1000) - SLACK_MS

    # ---- I1 --------------------------------------------------------------------------------------

    def i1(self) -> None:
        inv = self.inv["I1"]
        for eid, atts in self.idx.attempts.items():
            inv.checked += 1
            limit = 1 + self.reruns.get(eid, 0)
            counted, spans = [], []
            for a in atts:
                crash = None if a.end_ms is not None else self.crash_of(a)
                if a.end_ms is not None or (crash is None and not self.in_flight_at_end(a)):
                    counted.append(a)
                end = a.end_ms if a.end_ms is not None else crash
                spans.append((a.start_ms, end, a))
            if len(counted) > limit:
                self.bump("duplicates")
                inv.fail(f"[duplicate] {eid}: {len(counted)} effects accepted (attempts "
                         f"{[a.attempt for a in counted]}, workers {sorted({a.worker for a in counted})}); "
                         f"allowed {limit} ({limit - 1} operator reruns)")
            spans.sort(key=lambda x: x[0])
            for i, (s1, e1, a1) in enumerate(spans):
                for s2, _, a2 in spans[i + 1:]:
                    if e1 is None or s2 < e1:
                        inv.fail(f"[two-at-once] {eid}: attempt {a2.attempt} started while attempt {a1.attempt} "
                                 f"ran ({self.rel(s1)}-{self.rel(e1) if e1 else 'never ended'}, "
                                 f"then {self.rel(s2)})")
        self.bump("effects_accepted", sum(len(v) for v in self.idx.attempts.values()))
        self.bump("effects_refused", len(self.idx.refused))

    def rel(self, harness_ms: int) -> str:
        return f"t+{(harness_ms - self.meta.start_ms) / 1000:.3f}s"

    # ---- I4, I5, I6 --------------------------------------------------------------------------------

    def i4_i5_i6(self) -> None:
        i4, i5, i6 = self.inv["I4"], self.inv["I5"], self.inv["I6"]
        h = self.idx.history
        i4.checked += len(h.writes)
        i5.checked += len(h.writes)
        i6.checked += len(h.claims)
        for kind, text in h.findings:
            if kind == "fencing":
                i4.fail(f"[stale-write] {text}")
            elif kind == "watermark":
                i5.fail(f"[watermark] {text}")
            elif kind == "ownership":
                i6.fail(f"[two-owners] {text}")
            else:
                self.invalid.append(f"the etcd history is incomplete or unreadable: {text}")
        # (a) accepted tokens never decrease per partition, in the order the sink accepted them.
        best: dict[int, tuple[int, str]] = {}
        for e in sorted(self.run.effects, key=lambda r: r.seq):
            if e.phase != "start" or not e.accepted:
                continue
            i4.checked += 1
            prev = best.get(e.partition)
            if prev is not None and e.revision < prev[0]:
                i4.fail(f"[stale-accepted] partition {e.partition}: {e.exec_id} attempt {e.attempt} accepted with "
                        f"token {e.partition}:{e.revision} after {prev[1]} was accepted with {e.partition}:{prev[0]}")
            if prev is None or e.revision > prev[0]:
                best[e.partition] = (e.revision, e.exec_id)
        # (b) every dispatch (a new attempt recorded) landed under the claim current at its revision.
        for eid, recs in self.idx.records.items():
            seen = 0
            for rev, _, rec in recs:
                if rec.attempt <= seen or not rec.attempts:
                    continue
                seen = rec.attempt
                att = rec.attempts[-1]
                if att.attempt != rec.attempt or rec.state is not ExecState.DISPATCHED:
                    continue
                i4.checked += 1
                owner = self.idx.owner_at_rev(att.token.partition, rev)
                if owner is None or owner.token != att.token.revision:
                    who = "nobody" if owner is None else f"{owner.node} (token {owner.token})"
                    i4.fail(f"[stale-dispatch] rev {rev}: {eid} attempt {att.attempt} dispatched by {att.planner} "
                            f"with token {att.token} while {who} owned partition {att.token.partition}")

    # ---- I2 --------------------------------------------------------------------------------------

    def owed(self) -> Iterator[tuple[str, int, Activation]]:
        """(schedule id, planned ms, its activation) for every planned time owed inside the judged window."""
        cross: list[str] = []
        for sid, acts in self.idx.activations.items():
            for a in acts:
                if a.state != "active" or a.schedule is None:
                    continue
                lo = max(a.activated_ms, self.window_from)
                hi = min(a.until_ms if a.until_ms is not None else self.judged_until, self.judged_until)
                if hi <= lo:
                    continue
                plan = a.plan()
                assert plan is not None
                for t in planned_times(plan, a.schedule.spec, lo, hi, cross):
                    yield sid, t, a
        for c in dict.fromkeys(cross):
            self.inv["I2"].fail(f"[time-engine] {c}")

    def i2(self) -> None:
        inv = self.inv["I2"]
        self.owed_list = list(self.owed())
        for sid, t, _ in self.owed_list:
            self.owed_of.setdefault(sid, []).append(t)
        for sid, t, act in self.owed_list:
            inv.checked += 1
            eid = execution_id(sid, t)
            atts = self.idx.attempts.get(eid, [])
            final = self.idx.final_record(eid)
            rec = final[2] if final else None
            covering = self.idx.skip_covering(sid, t)
            if atts:
                self.bump("ran")
                if rec is not None and rec.state is ExecState.SKIPPED:
                    inv.fail(f"[ran-and-skipped] {eid}: an effect was accepted, yet its record says skipped "
                             f"({rec.skip_reason})")
                continue
            if rec is not None and rec.state is ExecState.SKIPPED:
                self.judge_skip(inv, sid, eid, t, rec.skip_reason, self.idx.time_of(final[0]) if final else 0)
                continue
            if rec is not None and rec.state is ExecState.SUCCEEDED:
                inv.fail(f"[no-effect] {eid}: its record says succeeded but the sink accepted no effect for it")
                continue
            if rec is not None and rec.state in ENDED:
                self.bump(f"ended_{rec.state.value}")
                continue
            if rec is not None and rec.state in IN_FLIGHT:
                self.bump("pending")
                if self.idx.harness_ms(rec.due_ms) < self.meta.end_ms - 3 * self.ttl_ms - 10_000:
                    inv.fail(f"[stuck] {eid}: still {rec.state.value} (attempt {rec.attempt}) at the end of the "
                             f"history, {(self.meta.end_ms - self.idx.harness_ms(t)) / 1000:.0f}s after it was due")
                continue
            if covering:
                for sk in covering:
                    self.judge_skip(inv, sid, eid, t, sk.reason, sk.seen_ms)
                continue
            if self.held(sid, t):
                self.bump("held")
                continue
            p = self.idx.partition_of.get(sid, -1)
            wm = self.idx.final_watermark(p)
            if wm is not None and t > wm:
                self.bump("beyond_watermark")
                continue
            self.bump("gaps")
            inv.fail(f"[gap] {eid}: owed since the activation at {act.activated_ms} ({act.state}), no effect, no "
                     f"execution record and no skip record (missed silently)")

    def held(self, sid: str, t: int) -> bool:
        """A hold (its pool had no worker with capacity) still in place at the end covers `t`."""
        return any(frm < t and deleted is None for frm, _, deleted in self.idx.holds.get(sid, []))

    def running_at(self, sid: str, eid: str, t_cluster: int) -> bool:
        """Another run of `sid` was really in progress at that instant: an accepted effect spanning it,
        or a record the watch history shows RUNNING/DISPATCHED from before it until after it."""
        t = self.idx.harness_ms(t_cluster)
        for a in self.idx.attempts_of.get(sid, []):
            if a.exec_id == eid:
                continue
            end = a.end_ms if a.end_ms is not None else (self.crash_of(a) or self.meta.end_ms)
            if a.start_ms - SLACK_MS <= t < end + SLACK_MS:
                return True
        for other in self.idx.records_of.get(sid, []):
            if other == eid:
                continue
            since = None
            for _, seen, rec in self.idx.records[other]:
                busy = rec.state in (ExecState.DISPATCHED, ExecState.RUNNING, ExecState.CANCELLING)
                if busy and since is None:
                    since = seen
                elif not busy and since is not None:
                    if since - SLACK_MS <= t < seen + SLACK_MS:
                        return True
                    since = None
            if since is not None and since - SLACK_MS <= t:
                return True
        return False

    def exposures(self, sid: str) -> list[tuple[int, int]]:
        """Cluster-time stretches in which planned times of `sid` may have been missed: behind every claim
        of its partition (from the last watermark before it to the claim plus the late grace), around
        every fault window, and under every hold."""
        p = self.idx.partition_of.get(sid, -1)
        if p in self._exposures:
            return self._exposures[p] + self.hold_spans(sid)
        out: list[tuple[int, int]] = []
        grace = self.meta.late_grace_ms + SLACK_MS
        for c in self.idx.claims():
            if c.partition != p:
                continue
            at = self.idx.time_of(c.token)
            wm = self.idx.watermark_before(p, at)
            lo = wm if wm is not None else self.idx.cluster_ms(self.meta.start_ms) - 3_600_000
            out.append((lo, self.idx.cluster_ms(at) + grace))
        for f in self.faults:
            end = f.end_ms if f.end_ms is not None else self.meta.end_ms
            lo = self.idx.cluster_ms(f.start_ms) - self.meta.late_grace_ms - self.meta.lookahead_ms
            out.append((lo, self.idx.cluster_ms(end) + self.ttl_ms + grace + int(self.s.lag.settle_s * 1000)))
        self._exposures[p] = out
        return out + self.hold_spans(sid)

    def hold_spans(self, sid: str) -> list[tuple[int, int]]:
        return [(frm, self.idx.cluster_ms(deleted if deleted is not None else self.meta.end_ms) + SLACK_MS)
                for frm, _, deleted in self.idx.holds.get(sid, [])]

    def judge_skip(self, inv: Invariant, sid: str, eid: str, t: int, reason: str, written_harness: int) -> None:
        written = self.idx.cluster_ms(written_harness)
        why = self.skip_unjustified(sid, eid, t, reason, written)
        if why is None:
            self.bump(f"skipped_{reason or 'unknown'}")
        else:
            inv.fail(f"[bad-skip] {eid}: skipped as {reason!r}, {why}")

    def skip_unjustified(self, sid: str, eid: str, t: int, reason: str, written: int) -> str | None:
        v_written = self.idx.version_at(sid, written + SLACK_MS)
        v_t = self.idx.version_at(sid, t)
        state_w = v_written.state if v_written else "none"
        if reason == "paused":
            ok = state_w in ("paused", "deleted") or (v_t is not None and v_t.state == "paused")
            return None if ok else f"but it was {state_w} when the skip was written"
        if reason in ("schedule_deleted", "deleted"):
            return None if state_w == "deleted" else f"but it was {state_w} when the skip was written"
        if reason == "schedule_changed":
            changed = any(t - SLACK_MS <= a.activated_ms <= written + SLACK_MS
                          for a in self.idx.activations.get(sid, []))
            return None if changed else "but no spec change came between the planned time and the skip"
        pol = v_written.schedule.policies if v_written and v_written.schedule else None
        if pol is None:
            return "and the schedule's policy at that time is unknown"
        if reason in ("overlap_skip", "overlap"):
            if pol.overlap not in (Overlap.SKIP, Overlap.BUFFER_ONE, Overlap.CANCEL_OTHER):
                return f"but its overlap policy is {pol.overlap.value}, which never skips"
            if not self.running_at(sid, eid, t):
                return "but no other run of it was in progress at that planned time (a manufactured overlap)"
            return None
        if reason in MISSED_REASONS:
            spans = [x for x in self.exposures(sid) if x[0] < t <= x[1]]
            if not spans:
                return "but nothing was missed then: no takeover, fault or hold around that planned time"
            if reason == "policy_skip" and pol.missed_runs is MissedRuns.ALL:
                return "but its missed-run policy is all, which runs missed times (over_cap beyond the cap)"
            if reason == "over_cap":
                if pol.missed_runs is not MissedRuns.ALL:
                    return f"but over_cap applies to missed_runs=all, not {pol.missed_runs.value}"
                later = [u for u in self.owed_of.get(sid, []) if u > t and any(a < u <= b for a, b in spans)]
                ran = sum(1 for u in later if self.idx.attempts.get(execution_id(sid, u)))
                if ran < min(pol.catchup_cap, len(later)):
                    return (f"but only {ran} of the {len(later)} later missed times ran; the cap is "
                            f"{pol.catchup_cap} (a catch-up cut short)")
            if reason == "outside_catchup_window" and t > written - pol.catchup_window_ms + SLACK_MS + \
                    self.meta.late_grace_ms:
                return (f"but it was only {(written - t) / 1000:.1f}s old when skipped; the window is "
                        f"{pol.catchup_window_ms / 1000:g}s")
            return None
        return "an unknown skip reason"

    # ---- I3 and RTO ---------------------------------------------------------------------------------

    def window_of(self, harness_t: int) -> FaultRecord | None:
        """The fault whose window (plus the settle time) holds `harness_t`: the latest one started by then
        (faults are one at a time; with allow_overlap the latest started is the one named)."""
        settle = int(self.s.lag.settle_s * 1000)
        i = bisect.bisect_right(self.fault_starts, harness_t) - 1
        while i >= 0:
            f = self.faults[i]
            end = f.end_ms if f.end_ms is not None else self.meta.end_ms
            if harness_t <= end + settle:
                return f
            if not self.s.faults.allow_overlap:
                return None
            i -= 1
        return None

    def i3_i7(self) -> None:
        i3, i7 = self.inv["I3"], self.inv["I7"]
        lag = self.s.lag
        phases: dict[str, list[int]] = {"before": [], "during": [], "after": []}
        first_fault = self.faults[0].start_ms if self.faults else None
        per_fault: dict[int, list[tuple[int, int, int]]] = {f.index: [] for f in self.faults}  # (planned, start, lag)
        starts = sorted(self.faults, key=lambda f: f.start_ms)
        fault_starts = [f.start_ms for f in starts]
        for sid, t, _ in self.owed_list:
            eid = execution_id(sid, t)
            atts = self.idx.attempts.get(eid)
            final = self.idx.final_record(eid)
            if not atts or (final is not None and final[2].trigger is not Trigger.SCHEDULED):
                continue
            due = final[2].due_ms if final is not None else t
            started = min(a.start_ms for a in atts)
            planned_h = self.idx.harness_ms(due)
            raw = started - planned_h
            self.lag_points.append((planned_h, raw))
            f = self.window_of(planned_h)
            i3.checked += 1
            if f is None:
                phase = "before" if first_fault is None or planned_h < first_fault else "after"
                phases[phase].append(raw)
            else:
                eff = raw
                if catalogue.is_outage(f.type, f.params):
                    eff = started - max(planned_h, f.end_ms if f.end_ms is not None else self.meta.end_ms)
                phases["during"].append(eff)
                if eff > lag.fault_max_s * 1000:
                    i3.fail(f"[lag-during] {eid}: started {eff / 1000:.2f}s late in/after fault #{f.index} {f.type} "
                            f"(bound {lag.fault_max_s:g}s)")
            # Attribute to the fault whose span [start, next start) holds the planned time (for RTO/I7).
            k = bisect.bisect_right(fault_starts, planned_h) - 1
            if k >= 0:
                per_fault[starts[k].index].append((planned_h, started, raw))
        for phase in ("before", "after"):
            xs = phases[phase]
            if not xs:
                continue
            p99 = _pct(xs, 99)
            if p99 > lag.steady_p99_s * 1000:
                i3.fail(f"[lag-{phase}] p99 start lag {p99 / 1000:.2f}s outside fault windows ({phase}) exceeds "
                        f"{lag.steady_p99_s:g}s")
            worst = max(xs)
            if worst > lag.steady_max_s * 1000:
                n = sum(1 for x in xs if x > lag.steady_max_s * 1000)
                i3.fail(f"[lag-{phase}] {n} runs outside fault windows ({phase}) started more than "
                        f"{lag.steady_max_s:g}s late (worst {worst / 1000:.2f}s)")
        self.phases = phases
        bound = lag.steady_max_s * 1000
        owed_times = sorted(t for _, t, _ in self.owed_list)
        for row, f in zip(self.rows, self.faults, strict=True):
            pts = per_fault.get(f.index, [])
            end = f.end_ms if f.end_ms is not None else self.meta.end_ms
            row.planned_inside = (bisect.bisect_right(owed_times, self.idx.cluster_ms(end))
                                  - bisect.bisect_left(owed_times, self.idx.cluster_ms(f.start_ms)))
            late = [(p, s) for p, s, lg in pts
                    if (s - max(p, end) if catalogue.is_outage(f.type, f.params) else lg) > bound]
            row.late_runs = len(late)
            recovered = max((s for _, s in late), default=f.start_ms)
            row.rto_s = (recovered - f.start_ms) / 1000
            i7.checked += 1
            if recovered > end + lag.liveness_s * 1000:
                i7.fail(f"[slow-recovery] fault #{f.index} {f.type} on {f.target}: start lag back under "
                        f"{lag.steady_max_s:g}s only {(recovered - end) / 1000:.1f}s after the fault ended "
                        f"(allowed {lag.liveness_s:g}s)")
            after_end = [s for p, s, _ in pts if p > end]
            nxt = next((g.start_ms for g in starts if g.start_ms > f.start_ms), self.meta.end_ms)
            if not after_end and nxt - end > lag.liveness_s * 1000 and f.end_ms is not None:
                i7.fail(f"[no-progress] fault #{f.index} {f.type}: no run started in the "
                        f"{(nxt - end) / 1000:.0f}s between its end and the next fault/the end of the run")
        if self.faults:
            last_end = max((f.end_ms or self.meta.end_ms) for f in self.faults)
            probe = min(last_end + 3 * self.ttl_ms + SLACK_MS, self.meta.end_ms)
            rev = self.idx.rev_at(probe)
            owned = {c.partition for c in self.idx.claims() if c.held_at(rev)}
            missing = sorted(set(range(self.meta.partitions)) - owned)
            i7.checked += 1
            if missing and rev:
                i7.fail(f"[unowned] partitions {missing[:10]} had no owner 3 x TTL after the last fault ended")

    # ---- I8 --------------------------------------------------------------------------------------

    def i8(self) -> None:
        inv = self.inv["I8"]
        allowed = [re.compile(x) for x in self.s.allowed_errors]
        for path in self.run.logs:
            inv.checked += 1
            for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
                if not _is_error(line) or any(rx.search(line) for rx in allowed):
                    continue
                inv.fail(f"[log] {path.name}:{n}: {line[:300]}")
        if not self.run.logs:
            inv.notes.append("no logs recorded: nothing to scan")

    # ---- validity --------------------------------------------------------------------------------

    def validity(self) -> None:
        v, m = self.s.validity, self.meta
        if not m.steady_before:
            self.invalid.append("the steady-state checks never held before the first fault")
        if not m.steady_after:
            self.invalid.append("the cluster never became healthy again after the run (steady state after)")
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
            row.stale_rejected = self.stale_rejects(f)
            if v.require_stale_reject and kind.expects_stale_reject_beyond_ttl and duration > self.ttl_ms \
                    and row.stale_rejected == 0:
                self.invalid.append(f"{label} lasted {duration / 1000:.1f}s > TTL, yet no stale write was refused "
                                    "(sink 409 or a fenced_out in its log): fencing was not exercised (I4c)")

    def target_nodes(self, f: FaultRecord) -> set[str]:
        if f.role == "region" or f.type == "F5":
            nodes = {n for n, info in self.meta.nodes.items() if info.get("region") == f.target}
            return nodes or {c.node for c in self.idx.claims() if c.node.startswith(f.target + "-")}
        return {f.target.split("->", 1)[0]}

    def owned_by_target(self, f: FaultRecord) -> int:
        rev = self.idx.rev_at(f.start_ms)
        nodes = self.target_nodes(f)
        return sum(1 for c in self.idx.claims() if c.node in nodes and c.held_at(rev))

    def takeovers(self, f: FaultRecord) -> int:
        """Claims made after the fault started (until T + settle after it ended) on partitions its
        target owned when it started."""
        rev0 = self.idx.rev_at(f.start_ms)
        nodes = self.target_nodes(f)
        parts = {c.partition for c in self.idx.claims() if c.node in nodes and c.held_at(rev0)}
        end = (f.end_ms or self.meta.end_ms) + self.ttl_ms * 3 + int(self.s.lag.settle_s * 1000)
        return sum(1 for c in self.idx.claims() if c.partition in parts and c.token > rev0
                   and self.idx.time_of(c.token) <= end)

    def stale_rejects(self, f: FaultRecord) -> int:
        end = (f.end_ms or self.meta.end_ms) + self.ttl_ms + int(self.s.lag.settle_s * 1000)
        n = sum(1 for e in self.idx.refused if f.start_ms <= e.t_ms <= end)
        for path in self.run.logs:
            if path.stem not in self.target_nodes(f):
                continue
            for line in path.read_text(errors="replace").splitlines():
                if '"fenced_out"' not in line:
                    continue
                ts = _log_ms(line)
                if ts is not None and f.start_ms <= ts <= end:
                    n += 1
        return n

    # ---- all -------------------------------------------------------------------------------------

    def verdict(self) -> Verdict:
        self.i1()
        self.i4_i5_i6()
        self.i2()
        self.i3_i7()
        self.i8()
        self.validity()
        failed = any(i.count for i in self.inv.values())
        result = "fail" if failed else "invalid" if self.invalid else "pass"
        stats = self.stats()
        lanes = [(c.partition, c.node, self.idx.time_of(c.token), None if c.end is None else self.idx.time_of(c.end))
                 for c in self.idx.claims()]
        meta = dict(self.meta.__dict__)
        meta["lag_bounds"] = dict(self.s.lag.__dict__)
        return Verdict(result, self.meta.scenario, self.meta.seed, self.inv, list(dict.fromkeys(self.invalid)),
                       self.rows, stats, meta, sorted(self.lag_points), lanes)

    def stats(self) -> dict[str, Any]:
        def summary(xs: list[int]) -> dict[str, float | int]:
            if not xs:
                return {"n": 0}
            return {"n": len(xs), "p50_s": _pct(xs, 50) / 1000, "p99_s": _pct(xs, 99) / 1000, "max_s": max(xs) / 1000}

        rto: dict[str, dict[str, float]] = {}
        for typ in sorted({r.type for r in self.rows}, key=lambda k: int(k[1:])):
            xs = [r.rto_s for r in self.rows if r.type == typ and r.rto_s is not None]
            if xs:
                rto[typ] = {"n": len(xs), "min_s": min(xs), "median_s": statistics.median(xs), "max_s": max(xs)}
        per_type: dict[str, int] = {}
        for r in self.rows:
            per_type[r.type] = per_type.get(r.type, 0) + 1
        return {
            "planned_times_checked": len(self.owed_list),
            "outcomes": dict(sorted(self.counts.items())),
            "duplicates": self.counts.get("duplicates", 0),
            "silent_misses": self.counts.get("gaps", 0),
            "stale_writes_rejected": len(self.idx.refused),
            "claims": len(self.idx.claims()),
            "faults_per_type": per_type,
            "lag": {k: summary(v) for k, v in self.phases.items()},
            "rto": rto,
            "operations": len(self.run.ops),
            "operations_failed": sum(1 for o in self.run.ops if not o.ok),
        }


def _pct(xs: Iterable[int], q: float) -> float:
    s = sorted(xs)
    if not s:
        return 0.0
    k = min(len(s) - 1, max(0, round(q / 100 * len(s) + 0.5) - 1))
    return float(s[k])


_ERROR_LEVELS = ('"level": "error"', '"level": "critical"', '"level":"error"', '"level":"critical"')


def _is_error(line: str) -> bool:
    return "UNEXPECTED" in line or line.startswith("Traceback") or any(x in line for x in _ERROR_LEVELS)


def _log_ms(line: str) -> int | None:
    try:
        ts = json.loads(line).get("ts")
        return int(datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp() * 1000)
    except (ValueError, AttributeError, TypeError):
        return None


def check_run(run: Run, scenario: Scenario | None = None) -> Verdict:
    """Judge `run`. The scenario defaults to the run's own scenario.toml (its bounds and thresholds)."""
    if scenario is None:
        if not run.scenario_toml:
            raise RunError(f"{Path(run.directory) / 'scenario.toml'}: missing; pass the scenario explicitly")
        scenario = loads(run.scenario_toml, str(run.directory / "scenario.toml"))
    return _Checker(run, scenario).verdict()
