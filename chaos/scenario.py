"""Drill scenarios: TOML files in chaos/scenarios/ loaded into frozen dataclasses.

A scenario says what cluster to build, what load to put on it, which API operations to make during the
run, which faults to inject (fixed ones and a seeded random mix), how long it lasts, what counts as
healthy before and after, and the lag bounds the checker holds the run to. docs/drills.md documents
every field; `load()` is the one reader, and every error it raises names the field to fix
(`faults.fixed[2].type: unknown fault type 'F13' ...`) so a typo never turns into a silently
different drill. Unknown keys are refused for the same reason.

Durations are seconds (`*_s`, floats allowed) or milliseconds (`*_ms`, integers); fault durations may
also be given as multiples of the lease TTL (`duration_ttl`), which keeps a scenario meaningful when
the TTL changes.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from chaos import faults
from scheduler.errors import InvalidArgument
from scheduler.model import parse_rfc3339
from scheduler.timeplan import MissedRuns, Overlap, parse_spec

__all__ = [
    "SCENARIO_DIR",
    "Cluster",
    "FaultsSpec",
    "FixedFault",
    "LagBounds",
    "LoadGroup",
    "Operation",
    "OpsMix",
    "RandomFaults",
    "Scenario",
    "ScenarioError",
    "SteadyState",
    "Validity",
    "find",
    "list_scenarios",
    "load",
    "loads",
]

SCENARIO_DIR = Path(__file__).with_name("scenarios")

EXECUTORS = ("http", "shell")
OPS = ("create", "update", "pause", "resume", "delete", "trigger", "backfill", "rerun")
STEADY_CHECKS = ("etcd_healthy", "partitions_owned", "workers_connected", "lag_under_bound", "no_backlog")
TIERS = ("ci", "game-day", "regression", "manual")
MAX_DURATION_S = 24 * 3600.0


class ScenarioError(InvalidArgument):
    """A scenario that cannot be run as written; `field` is the dotted TOML path (`load.schedules[0].spec`)."""

    def __init__(self, field: str, reason: str, source: str = "") -> None:
        super().__init__(field, reason)
        self.source = source

    def __str__(self) -> str:
        base = super().__str__()
        return f"{self.source}: {base}" if self.source else base


# ---- the dataclasses -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Cluster:
    regions: tuple[str, ...] = ("r1",)
    planners_per_region: int = 2
    workers_per_region: int = 2
    partitions: int = 16
    lease_ttl_s: float = 2.0
    renew_interval_s: float = 0.5
    # Start the cluster's wall clock here (the runner's faketime offset) to put a DST transition inside the
    # window; None: real time. The checker adds the recorded offset back (run.json `clock_offset_ms`).
    wall_clock_start: str | None = None
    planner: Mapping[str, str | int | float | bool] = field(default_factory=dict)  # passed to `schedctl planner`

    def planners(self) -> list[str]:
        return [f"{r}-p{i + 1}" for r in self.regions for i in range(self.planners_per_region)]

    def workers(self) -> list[str]:
        return [f"{r}-w{i + 1}" for r in self.regions for i in range(self.workers_per_region)]

    def etcd_members(self) -> list[str]:
        return [f"{r}-etcd" for r in self.regions]

    def links(self) -> list[str]:
        return [f"{p}->etcd" for p in self.planners()]

    def targets(self, role: str) -> list[str]:
        """Concrete target names of a role, in a fixed order (what seeded picks index into)."""
        by_role: dict[str, list[str]] = {
            "planner": self.planners(), "worker": self.workers(), "etcd": self.etcd_members(),
            "link": self.links(), "region": list(self.regions), "cluster": ["cluster"],
        }
        return by_role[role]


@dataclass(frozen=True)
class SteadyState:
    before: tuple[str, ...] = ("etcd_healthy", "partitions_owned", "workers_connected")
    after: tuple[str, ...] = ("etcd_healthy", "partitions_owned", "lag_under_bound", "no_backlog")
    timeout_s: float = 60.0


@dataclass(frozen=True)
class LagBounds:
    """Start-lag bounds (I3) and the liveness allowance (I7), in seconds."""

    steady_p99_s: float = 1.0  # outside fault windows: p99 of lag
    steady_max_s: float = 2.0  # outside fault windows: max; also "back under bound" for the RTO
    fault_max_s: float = 6.0  # inside a fault window (+ settle): max (T + renew + 2 s for an ownership change)
    settle_s: float = 6.0  # after a window ends, times still count as "during" this long (takeover after it)
    liveness_s: float = 10.0  # I7: lag back under steady_max_s within this long after a fault ends
    judge_grace_s: float = 5.0  # planned times this close to the end are not judged (still in flight)


@dataclass(frozen=True)
class Validity:
    min_executions: int = 100  # accepted effects in the whole run
    min_planned_per_fault: int = 20  # planned times inside each fault window
    require_takeover: bool = True  # F1/F2/F3/F5 must show an ownership change
    require_stale_reject: bool = True  # F2/F3 beyond the TTL must show a refused stale write (I4c)


@dataclass(frozen=True)
class LoadGroup:
    """`count` schedules `<name>-000`.. sharing a spec. Policy fields given as lists are cycled over the
    instances (instance i takes element i % len), which is how a group mixes policies deterministically."""

    name: str
    count: int
    spec: str
    tz: str = "UTC"
    executor: str = "http"
    hold_ms: int = 0  # how long each effect lasts (the sink holds its answer / the shell sleeps)
    pool: str = "default"
    missed_runs: tuple[MissedRuns, ...] = (MissedRuns.ALL,)
    overlap: tuple[Overlap, ...] = (Overlap.ALLOW_ALL,)
    catchup_cap: int = 1000
    catchup_window_s: float = 600.0
    max_attempts: int = 3
    jitter_ms: int = 0

    def ids(self) -> list[str]:
        return [f"{self.name}-{i:03d}" for i in range(self.count)]


@dataclass(frozen=True)
class Operation:
    at_s: float
    op: str
    target: str  # a schedule id (`sec-003`), a group name (seeded pick among its instances), or `*` (any)
    params: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class OpsMix:
    """API operations drawn at random (seeded): on average `rate_per_min`, weighted by kind."""

    rate_per_min: float = 0.0
    weights: Mapping[str, float] = field(default_factory=dict)
    from_s: float = 0.0
    until_s: float | None = None
    targets: tuple[str, ...] = ("*",)


@dataclass(frozen=True)
class FixedFault:
    type: str
    at_s: float
    duration_s: float | None = None  # None: duration_ttl, else drawn from the catalogue's range
    duration_ttl: float | None = None
    target: str | None = None  # a role (seeded pick), a concrete name (`r1-p2`), or None: the type's role
    params: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class RandomFaults:
    """Jepsen-style mix: one fault at a time, the next `interval_s` (uniform) after the previous ended,
    +- `jitter_s`, types drawn by weight."""

    weights: Mapping[str, float]
    interval_s: tuple[float, float] = (5.0, 15.0)
    jitter_s: float = 1.0
    from_s: float = 0.0
    until_s: float | None = None
    min_count: int = 0  # the plan is refused when the window cannot hold this many
    max_count: int | None = None
    params: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)  # per type: fixed params


@dataclass(frozen=True)
class FaultsSpec:
    fixed: tuple[FixedFault, ...] = ()
    random: RandomFaults | None = None
    allow_overlap: bool = False
    min_gap_s: float = 2.0  # between one fault's end and the next one's start (health is waited for too)
    health_timeout_s: float = 60.0  # a cluster not healthy again within this makes the run invalid
    warmup_s: float = 10.0  # no fault before this (steady-state traffic first, as etcd robustness does)
    cooldown_s: float = 20.0  # no fault in the last stretch: I7 needs a healed tail


@dataclass(frozen=True)
class Scenario:
    name: str
    description: str
    duration_s: float
    seed: int = 1
    tier: str = "manual"
    regression: str = ""  # the audit finding this scenario guards (kept for ever)
    cluster: Cluster = field(default_factory=Cluster)
    steady_state: SteadyState = field(default_factory=SteadyState)
    lag: LagBounds = field(default_factory=LagBounds)
    validity: Validity = field(default_factory=Validity)
    load: tuple[LoadGroup, ...] = ()
    operations: tuple[Operation, ...] = ()
    ops_mix: OpsMix | None = None
    faults: FaultsSpec = field(default_factory=FaultsSpec)
    allowed_errors: tuple[str, ...] = ()  # I8: regexes of ERROR log lines that are expected
    source: str = ""

    def schedule_ids(self) -> list[str]:
        return [i for g in self.load for i in g.ids()]


# ---- reading ---------------------------------------------------------------------------------------

T = TypeVar("T")


class _Table:
    """One TOML table being read: typed getters that name the dotted path, and a check that every key
    was used (a misspelt key is an error, not a default)."""

    def __init__(self, data: Any, path: str, source: str) -> None:
        if not isinstance(data, dict):
            raise ScenarioError(path, f"must be a table, not {type(data).__name__}", source)
        self.data: dict[str, Any] = data
        self.path, self.source = path, source
        self.used: set[str] = set()

    def at(self, key: str) -> str:
        return f"{self.path}.{key}" if self.path else key

    def err(self, key: str, reason: str) -> ScenarioError:
        return ScenarioError(self.at(key), reason, self.source)

    def has(self, key: str) -> bool:
        return key in self.data

    def raw(self, key: str) -> Any:
        self.used.add(key)
        return self.data.get(key)

    def get(self, key: str, typ: type[T] | tuple[type, ...], default: T) -> T:
        if key not in self.data:
            self.used.add(key)
            return default
        v = self.raw(key)
        types = typ if isinstance(typ, tuple) else (typ,)
        if float in types and isinstance(v, int) and not isinstance(v, bool):
            v = float(v)
        if isinstance(v, bool) and bool not in types:
            raise self.err(key, f"must be {_names(types)}, not a boolean")
        if not isinstance(v, types):
            raise self.err(key, f"must be {_names(types)}, not {type(v).__name__} {v!r}")
        return v  # type: ignore[return-value]

    def opt(self, key: str, typ: type[T]) -> T | None:
        if key not in self.data:
            self.used.add(key)
            return None
        return self.get(key, typ, typ())

    def req(self, key: str, typ: type[T]) -> T:
        if key not in self.data:
            raise self.err(key, "is required")
        return self.get(key, typ, typ())  # present: the default is never used

    def positive(self, key: str, default: float, *, zero: bool = False) -> float:
        v = self.get(key, float, default)
        if v < 0 or (v == 0 and not zero):
            raise self.err(key, f"must be {'>= 0' if zero else '> 0'}, not {v:g}")
        return v

    def count(self, key: str, default: int, lo: int = 1, hi: int = 1_000_000) -> int:
        v = self.get(key, int, default)
        if not lo <= v <= hi:
            raise self.err(key, f"must be in {lo}..{hi}, not {v}")
        return v

    def sub(self, key: str) -> _Table:
        return _Table(self.raw(key) if key in self.data else {}, self.at(key), self.source)

    def items(self, key: str) -> list[_Table]:
        v = self.raw(key)
        if v is None:
            return []
        if not isinstance(v, list):
            raise self.err(key, "must be an array of tables ([[...]])")
        return [_Table(x, f"{self.at(key)}[{i}]", self.source) for i, x in enumerate(v)]

    def strs(self, key: str, default: tuple[str, ...]) -> tuple[str, ...]:
        v = self.get(key, list, list(default))
        if not all(isinstance(x, str) for x in v):
            raise self.err(key, "must be an array of strings")
        return tuple(v)

    def done(self) -> None:
        extra = sorted(set(self.data) - self.used)
        if extra:
            raise self.err(extra[0], f"unknown key (known here: {', '.join(sorted(self.used))})")


def _names(types: tuple[type, ...]) -> str:
    n = {str: "a string", int: "an integer", float: "a number", bool: "a boolean", list: "an array",
         dict: "a table"}
    return " or ".join(n.get(t, t.__name__) for t in types)


def _choice(t: _Table, key: str, allowed: tuple[str, ...], default: str) -> str:
    v = t.get(key, str, default)
    if v not in allowed:
        raise t.err(key, f"{v!r} is not one of {', '.join(allowed)}")
    return v


def _enum_list(t: _Table, key: str, enum: type[MissedRuns] | type[Overlap], default: Any) -> tuple[Any, ...]:
    v = t.get(key, (str, list), default.value)
    vals = [v] if isinstance(v, str) else v
    if not vals:
        raise t.err(key, "must not be empty")
    out = []
    for i, x in enumerate(vals):
        try:
            out.append(enum(x))
        except ValueError:
            where = key if isinstance(v, str) else f"{key}[{i}]"
            raise t.err(where, f"{x!r} is not one of {', '.join(m.value for m in enum)}") from None
    return tuple(out)


def _cluster(t: _Table) -> Cluster:
    regions = t.strs("regions", ("r1",))
    if not regions or len(set(regions)) != len(regions):
        raise t.err("regions", "must name at least one region, each once")
    c = Cluster(
        regions=regions,
        planners_per_region=t.count("planners_per_region", 2, 1, 16),
        workers_per_region=t.count("workers_per_region", 2, 1, 64),
        partitions=t.count("partitions", 16, 1, 4096),
        lease_ttl_s=t.positive("lease_ttl_s", 2.0),
        renew_interval_s=t.positive("renew_interval_s", 0.5),
        wall_clock_start=t.opt("wall_clock_start", str),
        planner=dict(t.get("planner", dict, {})),
    )
    if c.renew_interval_s >= c.lease_ttl_s:
        raise t.err("renew_interval_s", f"{c.renew_interval_s:g} must be below lease_ttl_s {c.lease_ttl_s:g}")
    if c.wall_clock_start is not None:
        try:
            parse_rfc3339(c.wall_clock_start, t.at("wall_clock_start"))
        except InvalidArgument as e:
            raise ScenarioError(e.field, e.reason, t.source) from None
    t.done()
    return c


def _load_group(t: _Table, names: set[str]) -> LoadGroup:
    name = t.req("name", str)
    if not name or not name.replace("-", "").isalnum() or name in names:
        raise t.err("name", f"{name!r} must be a unique name of letters, digits and '-'")
    names.add(name)
    spec = t.req("spec", str)
    tz = t.get("tz", str, "UTC")
    try:
        parse_spec(spec, schedule_id=f"{name}-000", tz=tz)
    except InvalidArgument as e:
        field_ = "tz" if e.field in ("tz", "time_zone") else "spec"
        raise t.err(field_, str(e)) from None
    g = LoadGroup(
        name=name, count=t.count("count", 1, 1, 100_000), spec=spec, tz=tz,
        executor=_choice(t, "executor", EXECUTORS, "http"),
        hold_ms=int(t.count("hold_ms", 0, 0, 3_600_000)),
        pool=t.get("pool", str, "default"),
        missed_runs=_enum_list(t, "missed_runs", MissedRuns, MissedRuns.ALL),
        overlap=_enum_list(t, "overlap", Overlap, Overlap.ALLOW_ALL),
        catchup_cap=t.count("catchup_cap", 1000, 1, 100_000),
        catchup_window_s=t.positive("catchup_window_s", 600.0),
        max_attempts=t.count("max_attempts", 3, 1, 100),
        jitter_ms=t.count("jitter_ms", 0, 0, 3_600_000),
    )
    t.done()
    return g


def _operation(t: _Table, duration: float, groups: set[str], ids: set[str]) -> Operation:
    at = t.positive("at_s", 0.0, zero=True)
    if at > duration:
        raise t.err("at_s", f"{at:g} is after the end of the run ({duration:g} s)")
    op = _choice(t, "op", OPS, "")
    target = t.req("target", str)
    params = dict(t.get("params", dict, {}))
    if op == "create":  # a schedule made during the run (its activation is what I2 checks from)
        if target in ids or target in groups or target == "*":
            raise t.err("target", f"{target!r}: a create names a new schedule id")
        if params.get("like") not in groups:
            raise t.err("params.like", f"a create copies a load group; one of: {', '.join(sorted(groups))}")
        ids.add(target)
    elif target != "*" and target not in groups and target not in ids:
        raise t.err("target", f"{target!r} is neither a load group, a schedule id of the load, nor '*'")
    if op == "update" and not params:
        raise t.err("params", "an update needs at least one field to change (spec, overlap, ...)")
    if op == "backfill":
        for k in ("from_s", "until_s"):
            if not isinstance(params.get(k), int | float):
                raise t.err(f"params.{k}", "is required for a backfill (seconds relative to the run's start)")
    t.done()
    return Operation(at, op, target, params)


def _weights(t: _Table, key: str, allowed: tuple[str, ...] | None) -> dict[str, float]:
    w = t.sub(key)
    out: dict[str, float] = {}
    for k in list(w.data):
        if allowed is not None and k not in allowed:
            raise w.err(k, f"unknown; allowed: {', '.join(allowed)}")
        if allowed is None:
            try:
                faults.kind(k)
            except KeyError as e:
                raise w.err(k, str(e.args[0])) from None
        out[k] = w.positive(k, 0.0, zero=True)
    if not out or not any(out.values()):
        raise t.err(key, "needs at least one positive weight")
    return out


def _ops_mix(t: _Table, duration: float) -> OpsMix:
    m = OpsMix(rate_per_min=t.positive("rate_per_min", 0.0, zero=True), weights=_weights(t, "weights", OPS),
               from_s=t.positive("from_s", 0.0, zero=True), until_s=t.opt("until_s", float),
               targets=t.strs("targets", ("*",)))
    if m.until_s is not None and not m.from_s < m.until_s <= duration:
        raise t.err("until_s", f"must be after from_s and at most the duration ({duration:g} s)")
    t.done()
    return m


def _fault_params(t: _Table, key: str, fid: str) -> dict[str, Any]:
    p = t.sub(key)
    spec = faults.kind(fid).params
    out: dict[str, Any] = {}
    for k in list(p.data):
        allowed = spec.get(k)
        if allowed is None:
            raise p.err(k, f"{fid} takes no parameter {k!r}; it takes: {', '.join(spec) or 'none'}")
        v = p.raw(k)
        if isinstance(allowed, tuple):
            if v not in allowed:
                raise p.err(k, f"{v!r} is not one of {', '.join(map(str, allowed))}")
        elif allowed is float:
            if not isinstance(v, int | float) or isinstance(v, bool):
                raise p.err(k, f"must be a number, not {v!r}")
            v = float(v)
        elif not isinstance(v, allowed) or (allowed is int and isinstance(v, bool)):
            raise p.err(k, f"must be {_names((allowed,))}, not {v!r}")
        out[k] = v
    return out


def _fault_type(t: _Table) -> str:
    fid = t.req("type", str)
    try:
        faults.kind(fid)
    except KeyError as e:
        raise t.err("type", str(e.args[0])) from None
    return fid


def _fixed_fault(t: _Table, c: Cluster, duration: float) -> FixedFault:
    fid = _fault_type(t)
    at = t.positive("at_s", 0.0, zero=True)
    if at >= duration:
        raise t.err("at_s", f"{at:g} is not before the end of the run ({duration:g} s)")
    d_s = t.opt("duration_s", float)
    d_t = t.opt("duration_ttl", float)
    if d_s is not None and d_t is not None:
        raise t.err("duration_ttl", "give duration_s or duration_ttl, not both")
    for k, v in (("duration_s", d_s), ("duration_ttl", d_t)):
        if v is not None and v < 0:
            raise t.err(k, f"must be >= 0, not {v:g}")
    target = t.opt("target", str)
    kind = faults.kind(fid)
    if target is not None and target not in kind.roles and not any(target in c.targets(r) for r in kind.roles):
        names = [n for r in kind.roles for n in c.targets(r)]
        raise t.err("target", f"{target!r} is neither a role {fid} may target ({', '.join(kind.roles)}) "
                              f"nor one of the cluster's {', '.join(names)}")
    f = FixedFault(fid, at, d_s, d_t, target, _fault_params(t, "params", fid))
    t.done()
    return f


def _random_faults(t: _Table, duration: float) -> RandomFaults:
    weights = _weights(t, "weights", None)
    iv = t.get("interval_s", list, [5.0, 15.0])
    if len(iv) != 2 or not all(isinstance(x, int | float) for x in iv) or not 0 <= iv[0] <= iv[1]:
        raise t.err("interval_s", f"must be [low, high] seconds with 0 <= low <= high, not {iv!r}")
    per = t.sub("params")
    params = {fid: _fault_params(per, fid, fid) for fid in list(per.data) if fid in weights}
    for fid in per.data:
        if fid not in weights:
            raise per.err(fid, "params given for a fault type without a weight")
    r = RandomFaults(weights=weights, interval_s=(float(iv[0]), float(iv[1])),
                     jitter_s=t.positive("jitter_s", 1.0, zero=True), from_s=t.positive("from_s", 0.0, zero=True),
                     until_s=t.opt("until_s", float),
                     min_count=t.count("min_count", 0, 0), max_count=t.opt("max_count", int),
                     params=params)
    if r.until_s is not None and not r.from_s < r.until_s <= duration:
        raise t.err("until_s", f"must be after from_s and at most the duration ({duration:g} s)")
    t.done()
    return r


def _faults(t: _Table, c: Cluster, duration: float) -> FaultsSpec:
    fixed = tuple(_fixed_fault(x, c, duration) for x in t.items("fixed"))
    rnd = _random_faults(t.sub("random"), duration) if t.has("random") else None
    spec = FaultsSpec(fixed=fixed, random=rnd, allow_overlap=t.get("allow_overlap", bool, False),
                      min_gap_s=t.positive("min_gap_s", 2.0, zero=True),
                      health_timeout_s=t.positive("health_timeout_s", 60.0),
                      warmup_s=t.positive("warmup_s", 10.0, zero=True),
                      cooldown_s=t.positive("cooldown_s", 20.0, zero=True))
    if spec.warmup_s + spec.cooldown_s >= duration:
        raise t.err("cooldown_s", f"warmup_s + cooldown_s ({spec.warmup_s + spec.cooldown_s:g} s) leave no time "
                                  f"for faults in a {duration:g} s run")
    for i, f in enumerate(fixed):
        if not spec.warmup_s <= f.at_s <= duration - spec.cooldown_s:
            raise ScenarioError(f"{t.at('fixed')}[{i}].at_s", f"{f.at_s:g} is outside the fault window "
                                f"[warmup_s {spec.warmup_s:g}, duration - cooldown_s {duration - spec.cooldown_s:g}]",
                                t.source)
    t.done()
    return spec


def loads(text: str, source: str = "<string>") -> Scenario:
    """Parse and validate a scenario from TOML text."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ScenarioError("", f"not valid TOML: {e}", source) from None
    root = _Table(data, "", source)
    s = root.sub("scenario")
    name = s.req("name", str)
    duration = s.positive("duration_s", 60.0)
    if duration > MAX_DURATION_S:
        raise s.err("duration_s", f"{duration:g} is more than a day")
    seed = s.get("seed", int, 1)
    scen_tbl = s
    cluster = _cluster(root.sub("cluster"))
    st = root.sub("steady_state")
    steady = SteadyState(before=st.strs("before", SteadyState.before), after=st.strs("after", SteadyState.after),
                         timeout_s=st.positive("timeout_s", 60.0))
    for k in ("before", "after"):
        for i, x in enumerate(getattr(steady, k)):
            if x not in STEADY_CHECKS:
                raise st.err(f"{k}[{i}]", f"unknown check {x!r}; known: {', '.join(STEADY_CHECKS)}")
    st.done()
    lt = root.sub("lag")
    lag = LagBounds(**{f: lt.positive(f, getattr(LagBounds, f)) for f in LagBounds.__dataclass_fields__})
    if lag.steady_max_s < lag.steady_p99_s:
        raise lt.err("steady_max_s", f"{lag.steady_max_s:g} is below steady_p99_s {lag.steady_p99_s:g}")
    lt.done()
    vt = root.sub("validity")
    validity = Validity(min_executions=vt.count("min_executions", 100, 0),
                        min_planned_per_fault=vt.count("min_planned_per_fault", 20, 0),
                        require_takeover=vt.get("require_takeover", bool, True),
                        require_stale_reject=vt.get("require_stale_reject", bool, True))
    vt.done()
    ld = root.sub("load")
    names: set[str] = set()
    groups = tuple(_load_group(x, names) for x in ld.items("schedules"))
    if not groups:
        raise ld.err("schedules", "a drill needs load: at least one [[load.schedules]]")
    ld.done()
    ids = {i for g in groups for i in g.ids()}
    ops = tuple(sorted((_operation(x, duration, names, ids) for x in root.items("operations")),
                       key=lambda o: o.at_s))
    mix = _ops_mix(root.sub("operations_mix"), duration) if root.has("operations_mix") else None
    fs = _faults(root.sub("faults"), cluster, duration)
    ck = root.sub("checks")
    allowed = ck.strs("allowed_errors", ())
    for i, rx in enumerate(allowed):
        try:
            re.compile(rx)
        except re.error as e:
            raise ck.err(f"allowed_errors[{i}]", f"not a regular expression: {e}") from None
    ck.done()
    scen = Scenario(
        name=name, description=scen_tbl.get("description", str, ""), duration_s=duration, seed=seed,
        tier=_choice(scen_tbl, "tier", TIERS, "manual"), regression=scen_tbl.get("regression", str, ""),
        cluster=cluster, steady_state=steady, lag=lag, validity=validity, load=groups, operations=ops,
        ops_mix=mix, faults=fs, allowed_errors=allowed, source=source,
    )
    if scen.tier == "regression" and not scen.regression:
        raise scen_tbl.err("regression", "a regression scenario names the finding it guards")
    scen_tbl.done()
    root.done()
    return scen


def load(path: str | Path) -> Scenario:
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as e:
        raise ScenarioError("", f"cannot read: {e.strerror}", str(p)) from None
    return loads(text, str(p))


def find(name_or_path: str) -> Path:
    """A scenario by path, or by name in chaos/scenarios/ (`smoke` -> chaos/scenarios/smoke.toml)."""
    p = Path(name_or_path)
    if p.suffix == ".toml" and p.exists():
        return p
    q = SCENARIO_DIR / f"{name_or_path.removesuffix('.toml')}.toml"
    if q.exists():
        return q
    known = ", ".join(x.stem for x in sorted(SCENARIO_DIR.glob("*.toml")))
    raise ScenarioError("scenario", f"{name_or_path!r} is neither a file nor a scenario name; known: {known}")


def list_scenarios(directory: Path = SCENARIO_DIR) -> list[Scenario]:
    """Every scenario in `directory`, loaded (and so validated), by name."""
    return sorted((load(p) for p in directory.glob("*.toml")), key=lambda s: s.name)
