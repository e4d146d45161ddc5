"""I3 (start lag within the scenario's bounds, split before / during / after fault windows), I7
(liveness after heal) and the RTO of each fault: from its start until start lag is back under its
bound, the start of the last late run planned before the next fault (Temporal's failover measure)."""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable

from chaos import faults as catalogue
from chaos.context import SLACK_MS, Context
from chaos.index import Attempt as IdxAttempt
from chaos.record import FaultRecord
from scheduler.execution import ExecState, Execution, Trigger
from scheduler.ids import execution_id
from scheduler.timeplan import Overlap

__all__ = ["LagChecks", "percentile"]

_WAITS = (Overlap.BUFFER_ONE, Overlap.BUFFER_ALL)  # policies whose runs wait, by design, for the one before
# Policies under which a run also waits for a run of its schedule that started after its due time (docs/time.md,
# "What counts as overlap": that run was no overlap, so it is neither skipped nor run beside it; it queues).
_QUEUES = (Overlap.SKIP, *_WAITS)
_ASKED = (Trigger.REPLAY, Trigger.RERUN)  # an operator's new run of a planned time (`LagChecks._asked_again`)


def percentile(xs: Iterable[int], q: float) -> float:
    """Nearest-rank percentile (0 for no values)."""
    s = sorted(xs)
    if not s:
        return 0.0
    return float(s[max(0, math.ceil(q / 100 * len(s)) - 1)])


class LagChecks(Context):
    def planned_moves(self) -> list[tuple[int, int]]:
        """Harness-time spans of the acknowledged switchover ops, from the call until the settle time after
        it returned (the handover happens after the API acknowledged the new policy)."""
        settle = int(self.s.lag.settle_s * 1000)
        return [(o.t_ms, (o.t_end_ms or o.t_ms) + settle) for o in self.run.ops if o.op == "switchover" and o.ok]

    def _lost_with_worker(self, rec: Execution | None, started_h: int, after_h: int | None = None) -> int | None:
        """Harness ms at which a fault (F5, F7) killed the worker an attempt of this run was out on, before
        the run's first accepted start (the attempt left no effect, or was cut short by the kill), else None.
        `after_h`: only attempts dispatched after it (those of an operator's replay or rerun)."""
        if rec is None:
            return None
        for a in rec.attempts:
            if not a.worker or not a.dispatched_ms:
                continue
            out = self.idx.harness_ms(a.dispatched_ms)
            if out >= started_h or (after_h is not None and out < after_h):
                continue
            # An attempt that had ended before the fault began was not cut by it (a game day's run failed at once
            # as the sink refused it, was dead-lettered and replayed 5 min later; an F7 of that worker 11 s after
            # the failure was read as its loss: `lag-worker-lost`, 298.9 s).
            ended = self.idx.harness_ms(a.finished_ms) if a.finished_ms else None
            for f in self.faults:
                if not out - SLACK_MS <= f.start_ms <= started_h or (
                        ended is not None and ended < f.start_ms - SLACK_MS):
                    continue
                if (f.type == "F7" and f.target == a.worker) or (
                        f.type == "F5" and self.node_region(a.worker) == f.target):
                    # An outage (the only planning region lost) took the planners too: nothing can give the
                    # attempt up before the heal, so the worker loss counts from there (the smoke drill of
                    # session 16 read runs retried 6.5 s after an F5's heal as 27 s after the kill).
                    return (f.end_ms or self.meta.end_ms) if self.outage(f) else f.start_ms
        return None

    def _freed_by_own_run(self, sid: str, eid: str, planned_h: int, started: int) -> tuple[int, IdxAttempt] | None:
        """When the last run of `sid` that ended after this run came due and before it started ended
        (harness ms), with that run's attempt, or None if no run of its own schedule held it up."""
        freed: IdxAttempt | None = None
        for a in self.idx.attempts_of.get(sid, []):
            if a.exec_id == eid or a.end_ms is None or a.start_ms >= started:
                continue
            if planned_h < a.end_ms <= started + SLACK_MS and (freed is None or a.end_ms > (freed.end_ms or 0)):
                freed = a
        return None if freed is None or freed.end_ms is None else (min(freed.end_ms, started), freed)

    def _killed(self, a: IdxAttempt) -> int | None:
        """Harness ms of the fault (F7, F5) that cut this attempt short by killing its worker, else None."""
        if not a.aborted or a.end_ms is None:
            return None
        for f in self.faults:
            if f.start_ms - SLACK_MS <= a.end_ms <= (f.end_ms or f.start_ms) + SLACK_MS and (
                    (f.type == "F7" and f.target == a.worker)
                    or (f.type == "F5" and self.node_region(a.worker) == f.target)):
                return f.start_ms
        return None

    def _held_by_outage(self, planned_h: int, started: int) -> FaultRecord | None:
        """The outage (quorum loss; the only planning region lost) that began while this run waited for its
        start: nothing starts until it heals (a start is recorded in etcd before the handler runs), so the
        run is the outage's, its lag counted from the heal. Without this a run due a moment before a quorum
        loss was judged on the window of whatever fault it was planned in: a game day's 40 runs due 0.1-0.5
        s before an F4 quorum loss read as 8-9.5 s late "in F7"."""
        held = None
        for f in self.faults:
            if planned_h < f.start_ms < started and self.outage(f):
                held = f  # the latest one begun while it waited
        return held

    def _asked_again(self, eid: str, planned_h: int, started: int) -> int | None:
        """Harness ms of the last operator replay or rerun of this run seen after its due time and before its
        first accepted start, else None. No attempt before it had started (the first accepted start is after
        it): the run that started is the one the operator asked for, and its lag counts from the request. A
        game day's run whose only attempt the sink refused as stale was dead-lettered, replayed 1,051 s later
        and started at once; read from its planned time, with a worker kill in between, it was `lag-worker-lost`.
        """
        asked = None
        for _, seen, rec in self.idx.records.get(eid, []):
            if seen >= started:
                break
            if seen > planned_h and rec.state is ExecState.SCHEDULED and rec.run_trigger in _ASKED:
                asked = seen
        return asked

    def _resumed_while_waiting(self, sid: str, planned_h: int, started: int) -> int | None:
        """Harness ms of the resume that ended a pause of `sid` begun after this run came due and before it
        started, else None. A pause starts nothing: a run due before it that had not started (its dispatch
        never reached a worker, or its start was not confirmed) waits for the resume as a retry does (docs/
        time.md), so its lag counts from the resume. A game day's run dispatched 5 ms before its schedule's
        pause, over a stream that broke before the start was acknowledged, started 0.03 s after the resume
        10.5 s later and read as 10.5 s late."""
        paused, resumed = False, None
        for v in self.idx.versions.get(sid, []):
            if v.seen_ms >= started:
                break
            if v.seen_ms <= planned_h:
                continue
            if v.state == "paused":
                paused = True
            elif paused and v.state == "active":
                paused, resumed = False, v.seen_ms
        return resumed

    def i3_i7(self) -> None:
        i3, i7 = self.inv["I3"], self.inv["I7"]
        lag = self.s.lag
        phases: dict[str, list[int]] = {"before": [], "during": [], "after": []}
        worst: dict[str, tuple[int, str]] = {}  # phase -> (lag, execution id) of its latest run: named in a failure
        moves = self.planned_moves()
        if moves:
            phases["switchover"] = []
        first_fault = self.faults[0].start_ms if self.faults else None
        per_fault: dict[int, list[tuple[int, int, int]]] = {f.index: [] for f in self.faults}  # (planned, start, lag)
        starts = sorted(self.faults, key=lambda f: f.start_ms)
        fault_starts = [f.start_ms for f in starts]
        for sid, t, _act in self.owed_list:
            eid = execution_id(sid, t)
            atts = self.idx.attempts.get(eid)
            final = self.idx.final_record(eid)
            if not atts or (final is not None and final[2].trigger is not Trigger.SCHEDULED):
                continue
            started = min(a.start_ms for a in atts)
            # The overlap policy in force while it waited: a policy-only update is no new activation, so
            # `act.schedule` is the activation's last version, not the one at its due time.
            versions = (self.idx.version_at(sid, t), self.idx.version_at(sid, self.idx.cluster_ms(started)))
            waits = any(v is not None and v.schedule is not None and v.schedule.policies.overlap in _WAITS
                        for v in versions)
            queues = waits or any(v is not None and v.schedule is not None
                                  and v.schedule.policies.overlap in _QUEUES for v in versions)
            if waits and self.running_at(sid, eid, t):
                # Buffered by its own policy behind a run in progress at its due time: it starts when that
                # one ends, by the user's choice. Its wait is no scheduler lag (counted, not judged).
                self.bump("waited_by_policy")
                continue
            due = final[2].due_ms if final is not None else t
            planned_h = self.idx.harness_ms(due)
            raw = started - planned_h
            self.lag_points.append((planned_h, raw))
            ahead_killed: int | None = None
            # An operator's replay or rerun, looked for from the due time: the run that started is the one asked
            # for, whatever its schedule's queue did meanwhile (below; the game day above: a run of its own schedule
            # ended as the replay started, the queue's wait moved the judged instant past the request, and the
            # request was no longer seen).
            asked = self._asked_again(eid, planned_h, started)
            if asked is None and queues and (freed := self._freed_by_own_run(sid, eid, planned_h, started)) is not None:
                # It waited in its schedule's own queue (behind a catch-up run, runs queued before it, or,
                # under skip too, a run that started after its due time) and started once the run ahead of it
                # ended: the wait is the policy's. What is judged is the time from that end to its start, the
                # scheduler's share; the run ahead is judged itself.
                self.bump("waited_in_own_queue")
                planned_h = freed[0]
                raw = started - planned_h
                # The run ahead died with its worker: nothing could start behind it until that attempt was
                # given up (the heartbeat timeout), so the wait is the worker loss's, judged like that run's
                # own retry. A game day's skip run waited 13.5 s behind such a run, 10.8 s after the kill.
                ahead_killed = self._killed(freed[1])
            if asked is None and (resumed := self._resumed_while_waiting(sid, planned_h, started)) is not None:
                self.bump("waited_for_resume")
                planned_h = resumed
                raw = started - planned_h
            if asked is not None:
                self.bump("asked_again_by_operator")
                planned_h = asked
                raw = started - planned_h
            # A run still waiting when a fault began is that fault's (it was due just before the planner
            # froze or died: its planned time alone would put it outside every window).
            hit = bisect.bisect_right(fault_starts, started) - 1
            caught = starts[hit] if hit >= 0 and planned_h < starts[hit].start_ms else None
            f = self.window_of(planned_h) or caught
            if (held := self._held_by_outage(planned_h, started)) is not None:
                f = held
            i3.checked += 1
            lost = self._lost_with_worker(final[2] if final is not None else None, started, asked)
            lost = lost if lost is not None else ahead_killed
            if lost is not None:
                # Its attempt died with its worker: judged from the kill, on the bound that the heartbeat
                # timeout sets (scenario `worker_loss_s`), and left out of the RTO (it is no planner lag).
                since = "the fault at"
                if held is not None and held.start_ms < lost + lag.worker_loss_s * 1000:
                    # An outage (quorum loss, the only planning region lost) began before the attempt was owed
                    # a retry: nothing gives it up or starts a retry before the heal (every write is fenced
                    # in etcd, and every session lapses with it), so the worker loss counts from the heal.
                    # A game day's run killed with r3-w2 2.4 s before an F4 quorum loss of 7.9 s was retried
                    # 10.0 s after the heal (lease lapse, claim, orphan give-up) and read as 20.4 s late.
                    heal = held.end_ms if held.end_ms is not None else self.meta.end_ms
                    if heal > lost:
                        lost, since = heal, f"the heal of outage #{held.index} {held.type} at"
                eff = started - lost
                phases["during"].append(eff)
                self.bump("lost_with_worker")
                if eff > lag.worker_loss_s * 1000:
                    i3.fail(f"[lag-worker-lost] {eid}: started {eff / 1000:.2f}s after {since} "
                            f"{self.rel(lost)} (a fault killed the worker its attempt, or the run it queued behind, "
                            f"was on; bound {lag.worker_loss_s:g}s)")
                continue
            move = next(((a, b) for a, b in moves if a <= planned_h <= b), None) if f is None else None
            if move is not None:
                # A planned move of the planning region (a switchover op): issue 11 promises a bounded
                # pause, not none, so its runs are judged on the in-fault bound and reported on their own.
                phases["switchover"].append(raw)
                if raw > lag.fault_max_s * 1000:
                    i3.fail(f"[lag-switchover] {eid}: started {raw / 1000:.2f}s late in the switchover at "
                            f"{self.rel(move[0])} (bound {lag.fault_max_s:g}s)")
                continue
            if f is None:
                phase = "before" if first_fault is None or planned_h < first_fault else "after"
                phases[phase].append(raw)
                if raw > worst.get(phase, (-1 << 62, ""))[0]:
                    worst[phase] = (raw, eid)
                if raw < -lag.steady_max_s * 1000:  # a run long before its time is as wrong as a late one
                    i3.fail(f"[early] {eid}: started {-raw / 1000:.2f}s before its planned time, outside any "
                            f"fault window")
            else:
                eff = raw
                bound_s = lag.fault_max_s
                if catalogue.is_outage(f.type, f.params):
                    # A failed-over region loss too: failover_grace, then the standby's claims and catch-up.
                    bound_s = max(lag.fault_max_s, lag.outage_max_s)
                    if self.outage(f):  # nothing could start until the heal: lag counts from it
                        eff = started - max(planned_h, f.end_ms if f.end_ms is not None else self.meta.end_ms)
                phases["during"].append(eff)
                if eff > bound_s * 1000:
                    i3.fail(f"[lag-during] {eid}: started {eff / 1000:.2f}s late in/after fault #{f.index} {f.type} "
                            f"(bound {bound_s:g}s)")
            # Attribute to the fault whose span [start, next start) holds the planned time (for RTO/I7), or to
            # the one it was caught by.
            k = hit if caught is not None else bisect.bisect_right(fault_starts, planned_h) - 1
            if k >= 0:
                per_fault[starts[k].index].append((planned_h, started, raw))
        for phase in ("before", "after"):
            xs = phases[phase]
            if not xs:
                continue
            p99 = percentile(xs, 99)
            if p99 > lag.steady_p99_s * 1000:
                i3.fail(f"[lag-{phase}] p99 start lag {p99 / 1000:.2f}s outside fault windows ({phase}) exceeds "
                        f"{lag.steady_p99_s:g}s")
            worst_lag = max(xs)
            if worst_lag > lag.steady_max_s * 1000:
                n = sum(1 for x in xs if x > lag.steady_max_s * 1000)
                i3.fail(f"[lag-{phase}] {n} runs outside fault windows ({phase}) started more than "
                        f"{lag.steady_max_s:g}s late (worst {worst_lag / 1000:.2f}s: {worst[phase][1]})")
        self.phases = phases
        bound = lag.steady_max_s * 1000
        owed_times = sorted(t for _, t, _ in self.owed_list)
        for row, f in zip(self.rows, self.faults, strict=True):
            pts = per_fault.get(f.index, [])
            end = f.end_ms if f.end_ms is not None else self.meta.end_ms
            # A crash's reach outlasts its window: however soon the planner restarts, what it owned waits
            # for its lease to lapse (a game day's F1s of 0.001-0.8 s had "0 planned times inside").
            reach = max(end, f.start_ms + self.ttl_ms) if f.type == "F1" else end
            row.planned_inside = (bisect.bisect_right(owed_times, self.idx.cluster_ms(reach))
                                  - bisect.bisect_left(owed_times, self.idx.cluster_ms(f.start_ms)))
            late = [(p, s) for p, s, lg in pts
                    if (s - max(p, end) if self.outage(f) else lg) > bound]
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
