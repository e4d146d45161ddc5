"""I2, no planned time missed silently: which planned times each activation owes (the production time
engine, and for fixed-period specs a second, independent computation that must agree), and whether
each ran, is accounted for by its record, or has a skip whose reason the schedule's policy justifies."""

from __future__ import annotations

import re
from collections.abc import Iterator

from chaos.context import SKEW_BOUND_MS, SLACK_MS, Context
from chaos.index import Activation
from chaos.scenario import CANCEL_REASON
from chaos.verdict import Invariant
from scheduler.execution import ExecState, Execution, Trigger
from scheduler.ids import execution_id
from scheduler.timeplan import CronPlan, EveryPlan, MissedRuns, Overlap, Plan, SkipReason

__all__ = ["OwedChecks", "fixed_period_ms", "independent_times", "planned_times"]

IN_FLIGHT = (ExecState.SCHEDULED, ExecState.DISPATCHED, ExecState.RUNNING, ExecState.RETRY_WAIT)
ENDED = (ExecState.DEAD_LETTER, ExecState.FAILED, ExecState.CANCELLED)
MISSED_REASONS = ("policy_skip", "outside_catchup_window", "over_cap")
SCHEDULE_OPS = ("create", "update", "pause", "resume", "delete")  # the ops that write the schedule's key
# Why a rerun's or replay's record may say it was skipped without running (docs/time.md).
_WITHDRAWN = (SkipReason.PAUSED.value, SkipReason.SCHEDULE_DELETED.value, SkipReason.SCHEDULE_CHANGED.value,
              SkipReason.SUPERSEDED.value)
OP_LANDED_MS = 2_000  # an acknowledged write is seen by the watcher within this long after the call returned


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
    """The planned instants of `plan` in (after, through] from the production engine; for fixed-period
    specs also recomputed independently, within the plan's start/end bounds, and any disagreement
    appended to `cross` (an I2 violation: the checker cannot trust either then)."""
    times = list(plan.between_ms(after, through))
    fp = fixed_period_ms(spec)
    if fp is not None and isinstance(plan, EveryPlan | CronPlan):
        lo, hi = max(after, plan.start_ms - 1), min(through, plan.end_ms)  # bounds are inclusive
        other = independent_times(fp[0], fp[1], lo, hi) if hi > lo else []
        if other != times:
            diff = sorted(set(times) ^ set(other))[:5]
            cross.append(f"{spec!r} in ({after}, {through}]: the time engine and the independent computation "
                         f"disagree on {len(set(times) ^ set(other))} planned times, e.g. {diff}")
    return times


class OwedChecks(Context):
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

    def ops_landed(self, inv: Invariant) -> None:
        """Every schedule change the API acknowledged is in etcd's history, seen while (or just after) the
        call ran: the owed planned times are computed from that history, so an acknowledged pause,
        resume, update, create or delete that never landed would silently change what is owed."""
        landed_within = OP_LANDED_MS
        for o in self.run.ops:
            if not o.ok or o.op not in SCHEDULE_OPS:
                continue
            inv.checked += 1
            versions = self.idx.versions.get(o.schedule_id, [])
            version = o.result.get("version")
            if isinstance(version, int) and version > 0:
                # The answer named the revision it is at (runs recorded since session 35): the change, or the
                # unchanged schedule a no-op pause or resume returned, must be in the history at exactly that
                # revision. Receipt times misled: the harness's watch sat on a SIGSTOPped etcd member for 5 s.
                if not any(v.rev == version for v in versions):
                    inv.fail(f"[lost-op] {o.op} of {o.schedule_id} acknowledged at {self.rel(o.t_end_ms or o.t_ms)} "
                             f"at version {version}, but etcd's history has no such version of the schedule")
                continue
            end = (o.t_end_ms or o.t_ms) + landed_within
            if not any(o.t_ms - SLACK_MS <= v.seen_ms <= end for v in versions):
                # A pause of a paused schedule (a resume of an active one) changes nothing and writes nothing:
                # acknowledged as done, rightly. The game day's random ops paused a schedule twice in a row.
                before = [v for v in versions if v.seen_ms < o.t_ms - SLACK_MS]
                if before and (o.op, before[-1].state) in (("pause", "paused"), ("resume", "active")):
                    continue
                inv.fail(f"[lost-op] {o.op} of {o.schedule_id} acknowledged at {self.rel(o.t_end_ms or o.t_ms)}, "
                         f"but etcd's history shows no change of the schedule while it ran")

    def _bad_cancel(self, eid: str, rec: Execution) -> str:
        """Why the cancel of planned run `eid` is not justified ('' if it is): a cancel loses the run, so it
        must come from the overlap policy (`cancel_other`), a delete of its schedule, or an operator's cancel
        of it (the drill's own `cancel` ops, acknowledged or perhaps applied)."""
        reason = rec.skip_reason
        if reason == "overlap":
            if any(v.schedule is not None and v.schedule.policies.overlap is Overlap.CANCEL_OTHER
                   for v in self.idx.versions.get(rec.schedule_id, [])):
                return ""
            return "by the overlap policy, but the schedule was never cancel_other"
        if reason in (SkipReason.SCHEDULE_DELETED.value, SkipReason.PAUSED.value):
            return ""  # (the withdrawn runs' checks judge the delete or pause itself)
        if reason == CANCEL_REASON:
            return "" if eid in self.cancels else "as the drill's cancel, but no cancel op named it"
        return "though neither its policy, a delete nor an operator cancelled it"

    def in_flight_from_ms(self) -> int:
        """A run may still be in flight at the end of the history only if it came due after this (a takeover
        and a start timeout's worth before the end): earlier, it is stuck."""
        return self.meta.end_ms - 3 * self.ttl_ms - 10_000

    def reruns_ran(self, inv: Invariant) -> None:
        """`[rerun-lost]`: an acknowledged rerun or replay runs its execution again: an effect starts after the
        call, unless its record says it was withdrawn (a pause, a delete or spec change, a cancel `[bad-cancel]`
        accepts: cancel_other's newer run, the drill's cancel), or it is still under way at the end. A record
        ending succeeded or failed with no effect since is the lost rerun (dead letters without an effect come
        from attempts lost with killed workers: counted, not failed)."""
        late = self.in_flight_from_ms() - int(self.s.lag.judge_grace_s * 1000)
        for o in self.run.ops:
            eid = str(o.result.get("execution_id") or "")
            if not (o.ok and o.op in ("rerun", "replay") and eid):
                continue
            inv.checked += 1
            if any(a.start_ms >= o.t_ms - SLACK_MS for a in self.idx.attempts.get(eid, [])):
                self.bump("reruns_ran")
                continue
            final = self.idx.final_record(eid)
            rec = final[2] if final else None
            if rec is not None and rec.state is ExecState.DEAD_LETTER:
                self.bump("reruns_dead_without_effect")
            elif rec is not None and ((rec.state is ExecState.CANCELLED and not self._bad_cancel(eid, rec)) or
                                      (rec.state is ExecState.SKIPPED and rec.skip_reason in _WITHDRAWN)):
                self.bump("reruns_withdrawn")
            elif rec is not None and rec.state in IN_FLIGHT and not self.pool_served(rec.pool):
                self.bump("unserved_pool")  # waits for a worker of its pool: the load's choice, as in I2 below
            elif (rec is None or rec.state in IN_FLIGHT) and o.t_end_ms >= late:
                self.bump("reruns_pending")
            else:
                inv.fail(f"[rerun-lost] {o.op} of {eid} acknowledged at {self.rel(o.t_end_ms or o.t_ms)}, but no "
                         f"effect started since; its record ends {rec.state.value if rec else 'absent'}"
                         + (f" ({rec.skip_reason})" if rec is not None and rec.skip_reason else ""))

    def i2(self) -> None:
        inv = self.inv["I2"]
        self.ops_landed(inv)
        self.reruns_ran(inv)
        self.owed_list = list(self.owed())
        for sid, t, _ in self.owed_list:
            self.owed_of.setdefault(sid, []).append(t)
        self.unowed_runs(inv)
        for sid, t, act in self.owed_list:
            inv.checked += 1
            eid = execution_id(sid, t)
            atts = self.idx.attempts.get(eid, [])
            final = self.idx.final_record(eid)
            rec = final[2] if final else None
            covering = self.idx.skip_covering(sid, t)
            if rec is not None and rec.state is ExecState.CANCELLED and (why := self._bad_cancel(eid, rec)):
                inv.fail(f"[bad-cancel] {eid}: cancelled ({rec.skip_reason!r}) {why}")
            if atts:
                self.bump("ran")
                if rec is not None and rec.state is ExecState.SKIPPED:
                    inv.fail(f"[ran-and-skipped] {eid}: an effect was accepted, yet its record says skipped "
                             f"({rec.skip_reason})")
                continue
            if rec is not None and rec.state is ExecState.SKIPPED:
                self.judge_skip(inv, sid, eid, t, rec.skip_reason, self.idx.time_of(final[0]) if final else 0,
                                final[0] if final else 0)
                continue
            if rec is not None and rec.state is ExecState.SUCCEEDED:
                inv.fail(f"[no-effect] {eid}: its record says succeeded but the sink accepted no effect for it")
                continue
            if rec is not None and rec.state in ENDED:
                self.bump(f"ended_{rec.state.value}")
                continue
            if rec is not None and rec.state in IN_FLIGHT:
                if not self.pool_served(rec.pool):
                    self.bump("unserved_pool")  # waits for a worker of its pool: the load's choice, not a stall
                    continue
                self.bump("pending")
                if self.idx.harness_ms(rec.due_ms) < self.in_flight_from_ms():
                    inv.fail(f"[stuck] {eid}: still {rec.state.value} (attempt {rec.attempt}) at the end of the "
                             f"history, {(self.meta.end_ms - self.idx.harness_ms(t)) / 1000:.0f}s after it was due")
                continue
            if covering:
                for sk in covering:
                    self.judge_skip(inv, sid, eid, t, sk.reason, sk.seen_ms, sk.rev)
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

    def unowed_runs(self, inv: Invariant) -> None:
        """`[not-owed-ran]`: a scheduled run of a planned time no activation owes (planned while paused, after
        the delete, or not a time of the spec in force then) ran: it had to be withdrawn. A change takes
        effect when the owner sees it, so a time within SLACK_MS after one may run under the version before.
        Operators' runs (trigger, backfill) are not planned times; a rerun or replay reruns a run that was."""
        owed = {sid: set(ts) for sid, ts in self.owed_of.items()}
        for eid, atts in self.idx.attempts.items():
            recs = self.idx.records.get(eid)
            if not atts or not recs or recs[0][2].trigger is not Trigger.SCHEDULED:
                continue
            # Attempts after an operator's rerun or replay of it (a withdrawn run may be rerun) are theirs.
            base = min((r.attempt_base for _, _, r in recs if r.run_trigger is not None), default=None)
            if base is not None and all(a.attempt > base for a in atts):
                continue
            sid, t = recs[0][2].schedule_id, recs[0][2].planned_ms
            if not self.window_from < t <= self.judged_until or t in owed.get(sid, ()):
                continue
            inv.checked += 1
            before = self.idx.version_at(sid, t - SLACK_MS)
            plan = before.plan() if before is not None and before.state == "active" else None
            if plan is not None and plan.next_after_ms(t - 1) == t:
                continue  # owed under the version in force just before: a change the owner had not seen yet
            if self._armed_while_owed(sid, t, recs):
                self.bump("armed_before_withdrawal")
                continue
            now = self.idx.version_at(sid, t)
            inv.fail(f"[not-owed-ran] {eid}: ran, though no activation owes that planned time (the schedule was "
                     f"{now.state if now else 'not created yet'} then, under spec "
                     f"{now.schedule.spec if now and now.schedule else '?'!r})")

    def _armed_while_owed(self, sid: str, t: int, recs: list[tuple[int, int, Execution]]) -> bool:
        """Start ahead (docs/workers.md): the run's start was recorded before its due time, within the planners'
        `start_ahead_ms` of it (and SLACK_MS for the watch), while the version then in force owed it: it counts as
        started then, and a pause, change or delete made later that its worker was not reached for in time
        leaves it to run (docs/time.md, Activation)."""
        ahead = int(self.s.cluster.planner.get("start_ahead_ms", 0) or 0)
        if not ahead:
            return False
        for rev, _, r in recs:
            cur = r.current
            if r.state is ExecState.RUNNING and cur is not None and cur.dispatched_ms < r.due_ms:
                at = self.idx.cluster_ms(self.idx.time_of(rev))
                if t - at > ahead + SLACK_MS:
                    return False
                v = self.idx.version_at(sid, at)
                plan = v.plan() if v is not None and v.state == "active" else None
                return plan is not None and plan.next_after_ms(t - 1) == t
        return False

    def pool_served(self, pool: str) -> bool:
        """Some worker of the run serves `pool` (run.json names each worker's pool). When no worker
        names one, every pool counts as served: the strict reading."""
        pools = {info["pool"] for info in self.meta.nodes.values() if info.get("role") == "worker" and "pool" in info}
        return not pools or pool in pools

    def held(self, sid: str, t: int) -> bool:
        """A hold (its pool had no worker with capacity) still in place at the end covers `t`."""
        return any(frm < t and deleted is None for frm, _, deleted in self.idx.holds.get(sid, []))

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
            # From before the watermark: the runs the dead owner wrote ahead of it (up to the lookahead) and those
            # waiting for a worker then are as missed as the times after it, and the claim applies the policy to
            # them in their own records (docs/time.md, "Missed runs").
            lo = (wm - self.meta.lookahead_ms - grace if wm is not None
                  else self.idx.cluster_ms(self.meta.start_ms) - 3_600_000)
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

    def judge_skip(self, inv: Invariant, sid: str, eid: str, t: int, reason: str, written_harness: int,
                   rev: int = 0) -> None:
        written = self.idx.cluster_ms(written_harness)
        skew = SKEW_BOUND_MS if rev and self._written_skewed(sid, rev, written_harness) else 0
        why = self.skip_unjustified(sid, eid, t, reason, written, skew)
        if why is None:
            self.bump(f"skipped_{reason or 'unknown'}")
        else:
            inv.fail(f"[bad-skip] {eid}: skipped as {reason!r}, {why}")

    def _written_skewed(self, sid: str, rev: int, written_harness: int) -> bool:
        """The write at `rev` was made by the owner of `sid`'s partition while an F6 fault skewed its clock: its
        planning clock was then within the skew bound of the cluster's, not within the slack (docs/time.md,
        "Clock skew"; a game day's planner, 0.25 s into a +30 s F6, held about 1 s ahead, found the next run of
        a cancel_other schedule due 0.9 s before it was and superseded the one before it)."""
        claim = self.idx.owner_at_rev(self.idx.partition_of.get(sid, -1), rev)
        return claim is not None and any(
            f.type == "F6" and f.target == claim.node
            and f.start_ms - SLACK_MS <= written_harness <= (f.end_ms or self.meta.end_ms) + SLACK_MS
            for f in self.faults)

    def _made_as_run(self, eid: str) -> bool:
        """An execution record was created for it (first seen scheduled), whatever became of it."""
        recs = self.idx.records.get(eid)
        return recs is not None and bool(recs) and recs[0][2].state is ExecState.SCHEDULED

    def skip_unjustified(self, sid: str, eid: str, t: int, reason: str, written: int, skew_ms: int = 0) -> str | None:
        """Why a skip of planned time `t` written at cluster time `written` is not justified (None: it is).
        `skew_ms`: how far the writer's planning clock may have been ahead (an F6 on it then)."""
        v_written = self.idx.version_at(sid, written + SLACK_MS)
        v_t = self.idx.version_at(sid, t)
        state_w = v_written.state if v_written else "none"
        if reason == "paused":
            # Paused when written, at the planned time, or at some moment between: a pause withdraws every
            # run due and not started yet, overdue ones too, also when a resume follows before the owner
            # writes the skip (docs/time.md, Activation; a half game day's pause and resume 0.14 s apart).
            ok = state_w in ("paused", "deleted") or (v_t is not None and v_t.state == "paused") or any(
                v.state == "paused" and t <= self.idx.cluster_ms(v.seen_ms) <= written + SLACK_MS
                for v in self.idx.versions.get(sid, []))
            return None if ok else f"but it was {state_w} when the skip was written"
        if reason in ("schedule_deleted", "deleted"):
            return None if state_w == "deleted" else f"but it was {state_w} when the skip was written"
        if reason == "schedule_changed":
            changed = any(t - SLACK_MS <= a.activated_ms <= written + SLACK_MS
                          for a in self.idx.activations.get(sid, []))
            return None if changed else "but no spec change came between the planned time and the skip"
        # A policy update that lands next to the skip: the owner decided on the policy it held, which may be
        # either side of the update within the watch's delay (a full game day's buffer_one skip written 20 ms
        # before an update to allow_all landed, judged on allow_all through the slack). Justified if the policy
        # of some version in force within SLACK_MS of the write justifies it; reported on the latest one.
        whys = [self._policy_unjustified(sid, eid, t, reason, written, v, skew_ms)
                for v in self._versions_near(sid, written)]
        return None if any(w is None for w in whys) else whys[-1]

    def _versions_near(self, sid: str, written: int) -> list[Activation | None]:
        """The versions of `sid` in force at some moment within SLACK_MS of `written`, oldest first."""
        first = self.idx.version_at(sid, written - SLACK_MS)
        inside = [v for v in self.idx.versions.get(sid, [])
                  if written - SLACK_MS < self.idx.cluster_ms(v.seen_ms) <= written + SLACK_MS]
        return [first, *inside] if inside else [first]

    def _policy_unjustified(self, sid: str, eid: str, t: int, reason: str, written: int,
                            version: Activation | None, skew_ms: int = 0) -> str | None:
        """Why a skip for a reason its policy decides is not justified by `version`'s policy (None: it is)."""
        pol = version.schedule.policies if version and version.schedule else None
        if pol is None:
            return "and the schedule's policy at that time is unknown"
        if reason in ("overlap_skip", "overlap"):
            if pol.overlap not in (Overlap.SKIP, Overlap.BUFFER_ONE, Overlap.CANCEL_OTHER):
                return f"but its overlap policy is {pol.overlap.value}, which never skips"
            if not self.running_at(sid, eid, t):
                return "but no other run of it was in progress at that planned time (a manufactured overlap)"
            return None
        if reason == "superseded":
            # cancel_other, newest wins: justified by a later planned time of the schedule that was due
            # when the skip was written (docs/time.md): the older run would only have been cancelled by it.
            if pol.overlap is not Overlap.CANCEL_OTHER:
                return f"but its overlap policy is {pol.overlap.value}, not cancel_other"
            if not any(t < u <= written + SLACK_MS + skew_ms for u in self.owed_of.get(sid, [])):
                return "but no later run of it was due when the skip was written"
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
                # The catch-up made a run for each of the later ones it kept: ran, or recorded as a run
                # that its overlap policy then skipped (a run still recorded in flight at its time, e.g. one
                # whose worker died with the region): the cap counts runs made, not runs that ran.
                made = sum(1 for u in later if self.idx.attempts.get(execution_id(sid, u))
                           or self._made_as_run(execution_id(sid, u)))
                if made < min(pol.catchup_cap, len(later)):
                    return (f"but only {made} of the {len(later)} later missed times were made into runs; the "
                            f"cap is {pol.catchup_cap} (a catch-up cut short)")
            if reason == "outside_catchup_window" and t > written - pol.catchup_window_ms + SLACK_MS + \
                    self.meta.late_grace_ms:
                return (f"but it was only {(written - t) / 1000:.1f}s old when skipped; the window is "
                        f"{pol.catchup_window_ms / 1000:g}s")
            return None
        return "an unknown skip reason"
