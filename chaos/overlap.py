"""I9, the overlap policy respected, from the effect sink's log: under `skip`, `buffer_one` and `buffer_all`
no two of a schedule's own scheduled runs have effects under way at once (docs/time.md, "What counts as
overlap"). F8's expectation in the catalogue (../shared/research/drills.md): the policy is applied.

Allowed, as documented:

- a run whose effect outlived its record: the owner recorded its attempt as over (timed out, lost with
  its worker) before the other started, so its decision was right on what etcd held (a worker cut off
  keeps running until it learns it lost the attempt);
- operators' runs (trigger, backfill, rerun, replay): not runs of the on-time schedule.

Two games days before this check (gd-s17b/c) had 100-132 such pairs per run, each a retry beside the
run that had been buffered behind its failed attempt. Until game day gd-s21b a retry could still start
beside a run due in its backoff gap (allowed then: nothing of it was under way at that run's due time); that
run now waits for the retry to end, and the exemption is gone."""

from __future__ import annotations

from chaos.context import SLACK_MS, Context
from chaos.index import Attempt
from scheduler.execution import IN_FLIGHT, Trigger
from scheduler.timeplan import Overlap

__all__ = ["OverlapChecks"]

HOLDS = (Overlap.SKIP, Overlap.BUFFER_ONE, Overlap.BUFFER_ALL)


class OverlapChecks(Context):
    def i9(self) -> None:
        inv = self.inv["I9"]
        for sid, atts in self.idx.attempts_of.items():
            own = sorted((a for a in atts if self._scheduled_run(a)), key=lambda a: a.start_ms)
            if not own:
                continue
            inv.checked += 1
            for i, one in enumerate(own):
                end = self._end(one)
                for two in own[i + 1:]:
                    if two.start_ms >= end - SLACK_MS:
                        break  # sorted by start: no later one starts while `one` runs either
                    if two.exec_id == one.exec_id:
                        continue  # I1's business
                    v = self.idx.version_at(sid, self.idx.cluster_ms(self._decided(two)))
                    if v is None or v.schedule is None or v.schedule.policies.overlap not in HOLDS:
                        continue
                    if self._left_flight_before(one, two.start_ms):
                        continue
                    self.bump("overlap_violations")
                    inv.fail(f"[two-runs-at-once] {sid}: {two.exec_id} (attempt {two.attempt}) started at "
                             f"{self.rel(two.start_ms)} under {v.schedule.policies.overlap.value} while "
                             f"{one.exec_id} (attempt {one.attempt}) ran ({self.rel(one.start_ms)}-"
                             f"{self.rel(end) if one.end_ms is not None else 'no end seen'})")

    def _scheduled_run(self, a: Attempt) -> bool:
        recs = self.idx.records.get(a.exec_id) or []
        if not recs or a.exec_id in self.reruns:
            return False
        first = recs[0][2]
        return first.trigger is Trigger.SCHEDULED and first.overlap is None

    def _decided(self, a: Attempt) -> int:
        """Harness time of the owner's decision to run attempt `a`, less the watch's lag: the policy it
        ran under. A change takes effect when the owner sees it (docs/time.md: a planned time handled
        between the commit and that moment goes by the previous state), and its start is confirmed after
        the dispatch: game day gd-s25 had an update to buffer_one committed 11 ms after a run's dispatch
        and 36 ms before its effect began at the sink, judged by the effect's start as a violation."""
        for _, seen, rec in self.idx.records.get(a.exec_id, []):
            if rec.attempt == a.attempt and rec.state in IN_FLIGHT:
                return seen - SLACK_MS
        return a.start_ms

    def _end(self, a: Attempt) -> int:
        if a.end_ms is not None:
            return a.end_ms
        return self.crash_of(a) or self.meta.end_ms

    def _left_flight_before(self, a: Attempt, t: int) -> bool:
        """etcd's history shows attempt `a` over (its record out of flight, or on a later attempt) before
        harness time `t`: what the owner decided on."""
        for _, seen, rec in self.idx.records.get(a.exec_id, []):
            if seen > t + SLACK_MS:
                return False
            if rec.attempt > a.attempt or (rec.attempt == a.attempt and rec.state not in IN_FLIGHT):
                return True
        return False
