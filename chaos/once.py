"""I1, at most one effect per execution id, from the effect sink's log: accepted effects per id at most
one plus the operator's reruns of it (an attempt cut short by a recorded worker crash or by its caller
going away, or started at the very end, is not counted; nor is a completed one whose result died with
its crashed worker and was retried), and no two attempts of one id running at once."""

from __future__ import annotations

from chaos.context import Context
from chaos.index import Attempt

__all__ = ["OnceChecks"]


class OnceChecks(Context):
    def i1(self) -> None:
        inv = self.inv["I1"]
        for eid, atts in self.idx.attempts.items():
            inv.checked += 1
            limit = 1 + self.reruns.get(eid, 0)
            counted, spans = [], []
            for i, a in enumerate(atts):
                crash = None if a.end_ms is not None else self.crash_of(a)
                completed = a.end_ms is not None and not a.aborted
                if completed and self.result_lost_with_worker(eid, a, atts[i + 1:]):
                    self.bump("results_lost_with_worker")
                    continue
                if completed or (a.end_ms is None and crash is None and not self.in_flight_at_end(a)):
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

    def result_lost_with_worker(self, eid: str, a: Attempt, later: list[Attempt]) -> bool:
        """A completed effect whose worker was killed by a recorded fault (F7, F5) before its result could
        land, followed by a retry: the product's at-least-once step under a crash (the retry carries the
        same idempotency key), not a duplicate. Only when etcd's history never recorded that attempt's
        success: a retry after a recorded success would be a real duplicate, and is counted."""
        if not later:
            return False
        crash = self.crash_of(a)
        if crash is None or crash > later[0].start_ms:
            return False
        for _, _, rec in self.idx.records.get(eid, []):
            for x in rec.attempts:
                if x.attempt == a.attempt and x.finished_ms and x.succeeded:
                    return False
        return True
        self.bump("effects_refused", len(self.idx.refused))
