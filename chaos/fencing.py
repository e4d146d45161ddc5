"""I4 (fencing), I5 (watermarks) and I6 (one owner per revision): the sink's accepted tokens never
decrease per partition; every checkpoint and every dispatch landed under the claim current at its
revision; chaos/history.py's replay of owners/ and checkpoints/ filed by what each finding breaks."""

from __future__ import annotations

from chaos.context import Context
from scheduler.execution import ExecState

__all__ = ["FencingChecks"]


class FencingChecks(Context):
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
                # A written dispatch, or the start of a reserved attempt its owner handed out unwritten (the
                # attempt's first record is RUNNING: the start CAS is fenced by the same owner key).
                if att.attempt != rec.attempt or rec.state not in (ExecState.DISPATCHED, ExecState.RUNNING):
                    continue
                i4.checked += 1
                owner = self.idx.owner_at_rev(att.token.partition, rev)
                if owner is None or owner.token != att.token.revision:
                    who = "nobody" if owner is None else f"{owner.node} (token {owner.token})"
                    i4.fail(f"[stale-dispatch] rev {rev}: {eid} attempt {att.attempt} dispatched by {att.planner} "
                            f"with token {att.token} while {who} owned partition {att.token.partition}")
