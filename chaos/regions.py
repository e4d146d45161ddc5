"""The region policy in a run (issue 11): who was the planning region when, judged from the etcd history.

- I6 (one owner, and the right one): a claim made while the policy named another region as primary is a
  planner planning where it must not. A claim that lands within `REGION_GRACE_TTLS` x TTL after the
  change that made its region ineligible is the race the product allows (its claim txn was in flight when
  the policy changed; it releases once its watch delivers the policy); one made later is a violation.
- Validity: an F5 on the planning region that no automatic failover followed exercised the planners'
  restart, not a failover, so it is invalid (a grace longer than the window, or standbys that never
  noticed). An F5 on a standby region owns nothing and is caught by the takeover rule already.

The report lists every policy change with its kind, regions and when it was seen (`region_changes`).
"""

from __future__ import annotations

from typing import Any

from chaos.context import Context

__all__ = ["REGION_GRACE_TTLS", "RegionChecks"]

REGION_GRACE_TTLS = 2  # how long after a move an ineligible planner's in-flight claim may still land


class RegionChecks(Context):
    def regions(self) -> None:
        pols = self.idx.policies
        if not pols:
            return
        i6 = self.inv["I6"]
        # (rev, since when its primary has planned, primary): a rewrite that kept the primary (an affinity
        # change) does not restart the count.
        changes: list[tuple[int, int, str]] = []
        for rev, t, p in pols:
            same = changes and changes[-1][2] == p.primary
            changes.append((rev, changes[-1][1] if same else t, p.primary))
        for c in self.idx.claims():
            i6.checked += 1
            region = self.node_region(c.node)
            at = [x for x in changes if x[0] <= c.token]
            if not at or at[-1][2] == region:
                continue
            since = at[-1][1]
            claimed = self.idx.time_of(c.token)
            if claimed - since > REGION_GRACE_TTLS * self.ttl_ms:
                i6.fail(f"[wrong-region] rev {c.token}: {c.node} of {region} claimed partition {c.partition} "
                        f"{(claimed - since) / 1000:.1f}s after the policy made {at[-1][2]} the planning region")
        for f in self.faults:
            if f.type != "F5" or f.end_ms is None:
                continue
            before = [p for rev, t, p in pols if t <= f.start_ms]
            if not before or before[-1].primary != f.target:
                continue
            if not self.failed_over(f):
                self.invalid.append(f"fault #{f.index} F5 on {f.target}: the planning region was lost and no "
                                    "automatic failover followed (failover_grace longer than the window?)")

    def region_changes(self) -> list[dict[str, Any]]:
        out = []
        for rev, t, p in self.idx.policies:
            last = p.last
            out.append({"rev": rev, "t_s": round((t - self.meta.start_ms) / 1000, 3), "primary": p.primary,
                        "kind": str(last.kind) if last else "", "from": last.from_region if last else "",
                        "by": last.by if last else "", "reason": last.reason if last else ""})
        return out
