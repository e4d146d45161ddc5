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
  I6  one owner per partition per revision (chaos/history.py), and with a region policy only planners of
      the planning region claim (chaos/regions.py);
  I7  liveness after heal: start lag back under its bound within `lag.liveness_s` of each fault's end,
      and every partition owned 3 x TTL after the last one;
  I8  no unexpected error in the given logs (ERROR/CRITICAL, `UNEXPECTED`, tracebacks), minus the
      scenario's `checks.allowed_errors`;
  I9  the overlap policy respected: under skip/buffer_one/buffer_all no two of a schedule's own runs have
      effects under way at once, but for the documented cases (chaos/overlap.py).

Validity, apart from pass/fail (etcd robustness's rule): too little load, a fault that exercised
nothing (no takeover after a kill/pause/cut/region loss; no refused stale write after a pause or cut
beyond the TTL: I4c), a cluster never healthy again, or an incomplete history make a run *invalid*.
A violation fails the run whatever its validity: a duplicate is a bug even in a thin run.

Exit codes (`Verdict.exit_code`): 0 pass, 1 fail, 3 invalid (2 is the CLI's bad input).
"""

from __future__ import annotations

import dataclasses
import re
import statistics
from pathlib import Path
from typing import Any

from chaos.fencing import FencingChecks
from chaos.lag import LagChecks, percentile
from chaos.once import OnceChecks
from chaos.overlap import OverlapChecks
from chaos.owed import OwedChecks, fixed_period_ms, independent_times, planned_times
from chaos.record import Run, RunError
from chaos.regions import RegionChecks
from chaos.scenario import Scenario, loads
from chaos.validity import ValidityChecks
from chaos.verdict import EXIT, FaultRow, Invariant, Verdict
from scheduler import __version__

__all__ = ["EXIT", "FaultRow", "Invariant", "Verdict", "check_run", "fixed_period_ms", "independent_times",
           "planned_times"]

_ERROR_LEVELS = ('"level": "error"', '"level": "critical"', '"level":"error"', '"level":"critical"')


def _is_error(line: str) -> bool:
    return "UNEXPECTED" in line or line.startswith("Traceback") or any(x in line for x in _ERROR_LEVELS)


class _Checker(OnceChecks, FencingChecks, OwedChecks, LagChecks, ValidityChecks, RegionChecks, OverlapChecks):
    """One check of one run: each base fills its invariants; the order in `verdict` matters (I3/I7 and
    validity read the planned times I2 computed)."""

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

    def verdict(self) -> Verdict:
        self.i1()
        self.i4_i5_i6()
        self.i2()
        self.i3_i7()
        self.i8()
        self.i9()
        self.validity()
        self.regions()
        failed = any(i.count for i in self.inv.values())
        result = "fail" if failed else "invalid" if self.invalid else "pass"
        stats = self.stats()
        lanes = [(c.partition, c.node, self.idx.time_of(c.token), None if c.end is None else self.idx.time_of(c.end))
                 for c in self.idx.claims()]
        meta = dict(self.meta.__dict__)
        meta["lag_bounds"] = dict(self.s.lag.__dict__)
        meta["checker"] = f"sched {__version__}"  # which checker judged it (the run's own versions are above)
        return Verdict(result, self.meta.scenario, self.meta.seed, self.inv, list(dict.fromkeys(self.invalid)),
                       self.rows, stats, meta, sorted(self.lag_points), lanes)

    def stats(self) -> dict[str, Any]:
        def summary(xs: list[int]) -> dict[str, float | int]:
            if not xs:
                return {"n": 0}
            return {"n": len(xs), "p50_s": percentile(xs, 50) / 1000, "p99_s": percentile(xs, 99) / 1000,
                    "max_s": max(xs) / 1000}

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
            "stale_txns_refused_by_etcd": sum(1 for t in self.run.wire if t.refused_by_fence),
            "claims": len(self.idx.claims()),
            "faults_per_type": per_type,
            "lag": {k: summary(v) for k, v in self.phases.items()},
            "rto": rto,
            "operations": len(self.run.ops),
            "operations_failed": sum(1 for o in self.run.ops if not o.ok),
            "region_changes": self.region_changes(),
        }


# How far before its last recorded event a history that stopped short is trusted: events etcd committed
# just before the watch died may not have reached it (a lagging watch is seconds behind on 2 cores).
HISTORY_MARGIN_MS = 5_000


def judged_part(run: Run) -> tuple[Run, str]:
    """The part of `run` its history can judge, and why it is cut ("" when it is whole).

    A history that stopped short (the harness's watch died or fell behind: `history_complete` false) holds
    nothing after its last event, so every check that reads etcd would see the rest as lost: acknowledged
    operations missing, planned times never run, faults that no ownership change followed. Those are the
    harness's failure, not the cluster's. The run is judged up to the last event less a margin, moved back
    to the start of a fault still under way there (its window would be judged half-seen), with only the
    faults, operations and attempts begun before that point. The run stays invalid (its harness error says
    so); a violation inside the judged part still fails it."""
    if run.meta.history_complete:
        return run, ""
    last = max((w.t_ms for w in run.watch), default=run.meta.start_ms)
    cut = min(run.meta.end_ms, last - HISTORY_MARGIN_MS)
    for f in sorted(run.faults, key=lambda f: f.start_ms, reverse=True):
        if f.start_ms < cut and (f.end_ms is None or f.end_ms > cut):
            cut = f.start_ms
    cut = max(cut, run.meta.start_ms)
    begun = {(e.exec_id, e.attempt) for e in run.effects if e.phase == "start" and e.t_ms <= cut}
    part = dataclasses.replace(
        run, meta=dataclasses.replace(run.meta, end_ms=cut),
        effects=[e for e in run.effects if (e.exec_id, e.attempt) in begun],
        ops=[o for o in run.ops if o.t_ms <= cut], faults=[f for f in run.faults if f.start_ms < cut])

    def rel(t: int) -> str:
        return f"t+{(t - run.meta.start_ms) / 1000:.1f}s"

    return part, (f"the etcd history stops at {rel(last)}: the run was judged up to {rel(cut)} only, with "
                  f"{len(run.faults) - len(part.faults)} of {len(run.faults)} faults and "
                  f"{len(run.ops) - len(part.ops)} of {len(run.ops)} operations after it left out")


def check_run(run: Run, scenario: Scenario | None = None) -> Verdict:
    """Judge `run`. The scenario defaults to the run's own scenario.toml (its bounds and thresholds)."""
    if scenario is None:
        if not run.scenario_toml:
            raise RunError(f"{Path(run.directory) / 'scenario.toml'}: missing; pass the scenario explicitly")
        scenario = loads(run.scenario_toml, str(run.directory / "scenario.toml"))
    part, cut = judged_part(run)
    checker = _Checker(part, scenario)
    if cut:
        checker.invalid.append(cut)
    return checker.verdict()
