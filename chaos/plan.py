"""Seeded planning: (scenario, seed) -> one fully determined drill plan.

The plan is everything a run does that is not a reaction to what the cluster does: the fault windows
(type, target, earliest start, duration, parameters), the schedules of the load and the API
operations with their times. Same scenario and seed, same plan, byte for byte (`Plan.fingerprint`),
so a failed run can be replayed and a report names what it ran.

Randomness comes from one `random.Random` per concern, each seeded with (scenario, seed, concern):
adding an operation to a scenario does not move its faults, and the other way round.

Plan semantics the runner keeps (docs/drills.md, "The plan"):
- a fault's `start_s` is its *earliest* start, relative to the run's start. Before each fault the runner
  waits until the cluster is healthy (etcd healthy, every partition owned); if that takes longer the
  fault and every later one start late (the recorded windows are the truth, never the plan), and a
  cluster not healthy within `health_timeout_s` makes the run invalid;
- faults never overlap unless the scenario says `allow_overlap`, and at least `min_gap_s` lies
  between one fault's end and the next one's start;
- operations happen at their offsets whatever the faults are doing (they are part of the load).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import random
from dataclasses import asdict, dataclass, field
from typing import Any

from chaos import faults
from chaos.scenario import Cluster, FixedFault, LoadGroup, Scenario, ScenarioError

__all__ = ["FaultWindow", "Plan", "PlannedOp", "PlannedSchedule", "make_plan"]

# Random update ops flip one of these (a policy change keeps the schedule's planned times), or, one in
# three, change the spec to one of these (a new activation: the old spec's runs written ahead and not planned
# by the new one are withdrawn; docs/time.md). Fixed periods: the checker computes their times twice.
_UPDATE_OVERLAPS = ("skip", "allow_all", "buffer_one")
_UPDATE_SPECS = ("* * * * * *", "*/2 * * * * *", "@every 3s phase 1s", "*/5 * * * * *")
# A random pause is resumed this many seconds later, so a long run keeps its load.
_RESUME_AFTER_S = (2.0, 10.0)


@dataclass(frozen=True)
class FaultWindow:
    index: int
    type: str
    name: str
    role: str
    target: str
    start_s: float  # earliest start after the run's start (the runner waits for health first)
    duration_s: float
    params: dict[str, Any] = field(default_factory=dict)
    origin: str = "fixed"  # fixed | random
    aimed_from: str = ""  # the planned target, when the runner moved the fault (chaos/aim.py)

    @property
    def end_s(self) -> float:
        return self.start_s + self.duration_s


@dataclass(frozen=True)
class PlannedSchedule:
    id: str
    group: str
    spec: str
    tz: str
    executor: str
    hold_ms: int
    pool: str
    missed_runs: str
    overlap: str
    catchup_cap: int
    catchup_window_ms: int
    max_attempts: int
    jitter_ms: int
    fail: bool = False  # every effect fails permanently (chaos/sink.py)


@dataclass(frozen=True)
class PlannedOp:
    at_s: float
    op: str
    schedule_id: str
    params: dict[str, Any] = field(default_factory=dict)
    origin: str = "fixed"


@dataclass(frozen=True)
class Plan:
    scenario: str
    seed: int
    duration_s: float
    lease_ttl_s: float
    health_timeout_s: float
    faults: tuple[FaultWindow, ...]
    schedules: tuple[PlannedSchedule, ...]
    operations: tuple[PlannedOp, ...]

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def fingerprint(self) -> str:
        """sha256 of the plan's canonical JSON: equal plans, equal fingerprints."""
        text = json.dumps(self.to_json(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def faults_per_type(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for f in self.faults:
            out[f.type] = out.get(f.type, 0) + 1
        return dict(sorted(out.items(), key=lambda kv: int(kv[0][1:])))


def _rng(scenario: Scenario, seed: int, concern: str) -> random.Random:
    # A string seed is hashed (sha512) by random.seed: stable across runs and Python versions >= 3.2.
    return random.Random(f"{scenario.name}\x00{seed}\x00{concern}")


def _round(x: float) -> float:
    return round(x, 3)


# ---- faults ----------------------------------------------------------------------------------------


def _target(rng: random.Random, s: Scenario, fid: str, target: str | None) -> tuple[str, str]:
    """(role, concrete target) for a fault: a concrete name stays, a role (or nothing: the type's own
    role) is a seeded pick among the scenario's targets of that role (the cluster's nodes, or the
    staging nodes its fault commands name)."""
    kind = faults.kind(fid)
    if target is not None and target not in faults.ROLES:
        role = next(r for r in kind.roles if target in s.fault_targets(r))
        return role, target
    role = target or kind.role
    return role, rng.choice(s.fault_targets(role))


def _params(rng: random.Random, c: Cluster, fid: str, given: dict[str, Any], *, draw: bool) -> dict[str, Any]:
    """The fault's parameters: the given ones, plus for unset choices the first listed value (fixed
    faults) or a seeded draw (random faults). Choices the cluster cannot honour are refused or left out."""
    spec = faults.kind(fid).params
    out = dict(given)
    for k, allowed in spec.items():
        if k in out or not isinstance(allowed, tuple):
            continue
        choices = allowed
        if fid == "F5" and k == "mode":
            continue  # a cut's, given or dropped below: never drawn
        if fid == "F5" and k == "variant":
            choices = ("multi-region", "single-region")  # a cut only when asked for (it needs namespaces)
        if fid == "F4" and k == "members":
            choices = tuple(m for m in allowed if m <= len(c.etcd_members()))
        out[k] = rng.choice(choices) if draw else choices[0]
    if fid == "F4" and int(out.get("members", 1)) > len(c.etcd_members()):
        raise ScenarioError("params.members", f"{out['members']} is more than the cluster's "
                                              f"{len(c.etcd_members())} etcd member(s)")
    if fid == "F5" and "variant" not in given:
        out["variant"] = "single-region" if len(c.regions) == 1 else "multi-region"
    if fid == "F5" and out["variant"] == "cut":
        if len(c.regions) < 2:
            raise ScenarioError("params.variant", "a region cut needs at least 2 regions")
        out.setdefault("mode", "drop")
    elif fid == "F5" and "mode" in given:
        raise ScenarioError("params.mode", "only a region cut (variant = \"cut\") takes a mode")
    if fid == "F2" and draw and "ttl_multiple" not in given:
        out["ttl_multiple"] = rng.choice((0.5, 1.5, 3.0))  # drills.md: d in {0.5T, 1.5T, 3T}
    if fid == "F9" and draw and "probability" not in given:
        out["probability"] = rng.choice((0.05, 0.1, 0.2))  # drills.md: 5-20% of dispatches
    return out


def _duration(rng: random.Random, ttl: float, fid: str, params: dict[str, Any],
              d_s: float | None = None, d_ttl: float | None = None) -> float:
    if d_s is not None:
        return _round(d_s)
    if d_ttl is not None:
        return _round(d_ttl * ttl)
    if fid == "F2" and "ttl_multiple" in params:
        return _round(float(params["ttl_multiple"]) * ttl)
    lo, hi = faults.kind(fid).duration_ttl
    return _round(rng.uniform(lo, hi) * ttl)


def _fixed_windows(s: Scenario, rng: random.Random) -> list[FaultWindow]:
    out: list[FaultWindow] = []
    ttl = s.cluster.lease_ttl_s
    for i, f in enumerate(s.faults.fixed):
        try:
            out.append(_fixed_window(s, rng, ttl, i, f))
        except ScenarioError as e:
            raise ScenarioError(f"faults.fixed[{i}].{e.field}", e.reason, s.source) from None
    out.sort(key=lambda w: w.start_s)
    if not s.faults.allow_overlap:
        for a, b in itertools.pairwise(out):
            if b.start_s < a.end_s + s.faults.min_gap_s:
                raise ScenarioError(f"faults.fixed[{b.index}].at_s",
                                    f"{b.type} at {b.start_s:g} s overlaps {a.type} ({a.start_s:g}-{a.end_s:g} s, "
                                    f"plus min_gap_s {s.faults.min_gap_s:g}); set faults.allow_overlap = true "
                                    "if that is meant", s.source)
    return out


def _fixed_window(s: Scenario, rng: random.Random, ttl: float, i: int, f: FixedFault) -> FaultWindow:
    params = _params(rng, s.cluster, f.type, dict(f.params), draw=False)
    role, target = _target(rng, s, f.type, f.target)
    d = _duration(rng, ttl, f.type, params, f.duration_s, f.duration_ttl)
    return FaultWindow(i, f.type, faults.kind(f.type).name, role, target, _round(f.at_s), d, params, "fixed")


def _random_windows(s: Scenario, rng: random.Random, fixed: list[FaultWindow]) -> list[FaultWindow]:
    r = s.faults.random
    if r is None:
        return []
    ttl, gap = s.cluster.lease_ttl_s, s.faults.min_gap_s
    start_lo = max(r.from_s, s.faults.warmup_s)
    until = min(r.until_s if r.until_s is not None else s.duration_s, s.duration_s - s.faults.cooldown_s)
    types = sorted(r.weights, key=lambda k: int(k[1:]))
    weights = [r.weights[k] for k in types]
    busy = sorted((w.start_s, w.end_s) for w in fixed)
    out: list[FaultWindow] = []
    t = start_lo
    first = True
    while r.max_count is None or len(out) < r.max_count:
        fid = rng.choices(types, weights)[0]
        params = _params(rng, s.cluster, fid, dict(r.params.get(fid, {})), draw=True)
        role, target = _target(rng, s, fid, None)
        d = _duration(rng, ttl, fid, params)
        wait = 0.0 if first else rng.uniform(*r.interval_s) + rng.uniform(-r.jitter_s, r.jitter_s)
        start = _round(t + max(gap if not first else 0.0, wait))
        first = False
        if not s.faults.allow_overlap:  # slide past fixed faults instead of colliding with them
            moved = True
            while moved:
                moved = False
                for a, b in busy:
                    if start < b + gap and start + d + gap > a:
                        start, moved = _round(b + gap), True
        if start + d > until:
            break
        out.append(FaultWindow(0, fid, faults.kind(fid).name, role, target, start, d, params, "random"))
        t = start + d
    if len(out) < r.min_count:
        raise ScenarioError("faults.random.min_count",
                            f"the plan holds only {len(out)} faults between {start_lo:g} s and {until:g} s, "
                            f"fewer than {r.min_count}: shorten interval_s or lengthen the run", s.source)
    return out


# ---- load and operations -----------------------------------------------------------------------------


def _schedules(s: Scenario) -> list[PlannedSchedule]:
    out = []
    for g in s.load:
        out += [_instance(g, i, sid) for i, sid in enumerate(g.ids())]
    return out


def _instance(g: LoadGroup, i: int, sid: str) -> PlannedSchedule:
    return PlannedSchedule(
        id=sid, group=g.name, spec=g.spec, tz=g.tz, executor=g.executor, hold_ms=g.hold_ms, pool=g.pool,
        missed_runs=g.missed_runs[i % len(g.missed_runs)].value, overlap=g.overlap[i % len(g.overlap)].value,
        catchup_cap=g.catchup_cap, catchup_window_ms=int(g.catchup_window_s * 1000), max_attempts=g.max_attempts,
        jitter_ms=g.jitter_ms, fail=g.fail,
    )


def _pick(rng: random.Random, s: Scenario, target: str) -> str:
    if target == "*":
        return rng.choice(s.schedule_ids())
    group = next((g for g in s.load if g.name == target), None)
    return target if group is None else rng.choice(group.ids())


def _random_params(rng: random.Random, op: str, at: float) -> dict[str, Any]:
    if op == "update":
        if rng.random() < 1 / 3:
            return {"spec": rng.choice(_UPDATE_SPECS)}
        return {"overlap": rng.choice(_UPDATE_OVERLAPS)}
    if op == "backfill":
        return {"from_s": _round(max(0.0, at - 30.0)), "until_s": _round(max(0.0, at - 10.0))}
    if op == "rerun":
        return {"which": "latest_finished"}
    if op == "cancel":
        return {"which": "latest_in_flight"}
    if op == "replay":
        return {"which": "latest_dead_letter"}
    return {}


def _operations(s: Scenario, rng: random.Random) -> list[PlannedOp]:
    out = [PlannedOp(o.at_s, o.op, _pick(rng, s, o.target), dict(o.params), "fixed") for o in s.operations]
    m = s.ops_mix
    if m is not None and m.rate_per_min > 0:
        kinds = sorted(m.weights)
        weights = [m.weights[k] for k in kinds]
        until = m.until_s if m.until_s is not None else s.duration_s - s.faults.cooldown_s
        t = m.from_s
        while True:
            t += rng.expovariate(m.rate_per_min / 60.0)
            if t >= until:
                break
            op = rng.choices(kinds, weights)[0]
            sid = _pick(rng, s, rng.choice(m.targets))
            out.append(PlannedOp(_round(t), op, sid, _random_params(rng, op, t), "random"))
            if op == "pause":
                back = _round(t + rng.uniform(*_RESUME_AFTER_S))
                if back < s.duration_s:
                    out.append(PlannedOp(back, "resume", sid, {}, "random"))
    out.sort(key=lambda o: (o.at_s, o.op, o.schedule_id))
    return out


def make_plan(s: Scenario, seed: int | None = None) -> Plan:
    """The plan of `s` under `seed` (default: the scenario's own). Raises ScenarioError naming the
    field when the scenario cannot be planned (overlapping fixed faults, too few random faults fit)."""
    seed = s.seed if seed is None else seed
    fixed = _fixed_windows(s, _rng(s, seed, "fixed-faults"))
    rnd = _random_windows(s, _rng(s, seed, "random-faults"), fixed)
    windows = sorted(fixed + rnd, key=lambda w: (w.start_s, w.type))
    windows = [FaultWindow(i, w.type, w.name, w.role, w.target, w.start_s, w.duration_s, w.params, w.origin)
               for i, w in enumerate(windows)]
    if s.faults.commands is not None:
        from chaos.fault_commands import render  # it needs FaultWindow from here

        for w in windows:
            render(s, w)  # a variable a target lacks is refused now, not at the fault's time on staging
    return Plan(scenario=s.name, seed=seed, duration_s=s.duration_s, lease_ttl_s=s.cluster.lease_ttl_s,
                health_timeout_s=s.faults.health_timeout_s, faults=tuple(windows),
                schedules=tuple(_schedules(s)), operations=tuple(_operations(s, _rng(s, seed, "operations"))))
