"""The TOML reader of drill scenarios: typed getters that name the dotted field of every error and
refuse unknown keys, and one function per table. `chaos.scenario.loads` is its front door; the
dataclasses it fills live in chaos/scenario.py.
"""

from __future__ import annotations

import re
import shlex
import string
import tomllib
from collections.abc import Callable
from typing import Any, TypeVar

from chaos import faults
from chaos.scenario import (
    CLUSTER_OPS,
    COMMAND_PLACEHOLDERS,
    EXECUTORS,
    MAX_DURATION_S,
    OPS,
    STEADY_CHECKS,
    TIERS,
    Cluster,
    CommandTarget,
    FaultCommand,
    FaultCommands,
    FaultsSpec,
    FixedFault,
    LagBounds,
    LoadGroup,
    Operation,
    OpsMix,
    RandomFaults,
    Scenario,
    ScenarioError,
    SteadyState,
    Validity,
)
from scheduler.errors import InvalidArgument
from scheduler.model import parse_rfc3339
from scheduler.timeplan import MissedRuns, Overlap, parse_spec

__all__ = ["parse"]


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
        primary=t.opt("primary", str),
        failover_grace_s=t.positive("failover_grace_s", 0.0) if "failover_grace_s" in t.data else None,
    )
    if c.primary is not None and c.primary not in regions:
        raise t.err("primary", f"{c.primary!r} is not one of the regions ({', '.join(regions)})")
    if c.failover_grace_s is not None and c.primary is None:
        raise t.err("failover_grace_s", "needs `primary`: without a region policy nothing fails over")
    try:
        c.topology()  # region names become node, process and network-namespace names: refuse odd ones here
    except InvalidArgument as e:
        raise t.err(e.field, e.reason) from None
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
        fail=t.get("fail", bool, False),
    )
    t.done()
    return g


def _operation(t: _Table, duration: float, groups: set[str], ids: set[str], regions: tuple[str, ...]) -> Operation:
    at = t.positive("at_s", 0.0, zero=True)
    if at > duration:
        raise t.err("at_s", f"{at:g} is after the end of the run ({duration:g} s)")
    op = _choice(t, "op", OPS + CLUSTER_OPS, "")
    target = t.req("target", str)
    params = dict(t.get("params", dict, {}))
    if op in CLUSTER_OPS:
        if target not in regions:
            raise t.err("target", f"{target!r}: a {op} names a region of the cluster ({', '.join(regions)})")
        t.done()
        return Operation(at, op, target, params)
    if op == "create" and target in ids and "like" not in params:
        pass  # the schedule of that id created again as planned (after a delete of it: the same execution ids)
    elif op == "create":  # a schedule made during the run (its activation is what I2 checks from)
        if target in ids or target in groups or target == "*":
            raise t.err("target", f"{target!r}: a create names a new schedule id, or an existing one without "
                                  f"params.like (created again, after a delete of it)")
        if params.get("like") not in groups:
            raise t.err("params.like", f"a create copies a load group; one of: {', '.join(sorted(groups))}")
        ids.add(target)
    elif target != "*" and target not in groups and target not in ids:
        raise t.err("target", f"{target!r} is neither a load group, a schedule id of the load, nor '*'")
    if op == "update" and not params:
        raise t.err("params", "an update needs at least one field to change (spec, overlap, fail)")
    if op == "update" and "fail" in params and not isinstance(params["fail"], bool):
        raise t.err("params.fail", "must be true or false (whether the schedule's effects fail from now on)")
    if op == "replay" and not isinstance(params.get("with_current_schedule", False), bool):
        raise t.err("params.with_current_schedule", "must be true or false")
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


def _fixed_fault(t: _Table, names: Callable[[str], list[str]], duration: float) -> FixedFault:
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
    if target is not None and target not in kind.roles and not any(target in names(r) for r in kind.roles):
        known = [n for r in kind.roles for n in names(r)]
        raise t.err("target", f"{target!r} is neither a role {fid} may target ({', '.join(kind.roles)}) "
                              f"nor one of the cluster's {', '.join(known) or '(none)'}")
    role = target if target in faults.ROLES else kind.role if target is None else None
    if role is not None and not names(role):  # only staging targets can leave a role empty
        raise t.err("target", f"a {role} is picked for this {fid}, but faults.commands.targets names no {role}")
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


def _placeholders(t: _Table, key: str, arg: str) -> set[str]:
    try:
        parts = list(string.Formatter().parse(arg))
    except ValueError as e:
        raise t.err(key, f"bad placeholder in {arg!r}: {e} (write {{{{ and }}}} for literal braces)") from None
    out = set()
    for _text, name, spec, conv in parts:
        if name is None:
            continue
        # Plain names only: str.format's `{x.attr}` and `{x[0]}` would reach into Python objects.
        if not name.isidentifier() or spec or conv:
            raise t.err(key, f"{{{name}{'!' + conv if conv else ''}{':' + spec if spec else ''}}}: a placeholder is a "
                             "plain name such as {target} (write {{ and }} for literal braces)")
        out.add(name)
    return out


def _command(t: _Table, key: str, allowed: set[str], *, required: bool = False) -> str | None:
    """A command line: split with shlex here, so a line that cannot be split (an open quote) is refused
    at load time, and its placeholders checked against `allowed`."""
    text = t.req(key, str) if required else t.opt(key, str)
    if text is None:
        return None
    try:
        argv = shlex.split(text)
    except ValueError as e:
        raise t.err(key, f"cannot be split into arguments ({e}): {text!r}") from None
    if not argv:
        raise t.err(key, "is empty: give a command, or leave the key out")
    used = set().union(*(_placeholders(t, key, a) for a in argv))
    unknown = sorted(used - allowed)
    if unknown:
        raise t.err(key, f"unknown placeholder {{{unknown[0]}}}; known here: "
                         f"{', '.join('{' + x + '}' for x in sorted(allowed)) or 'none'}")
    return text


def _command_targets(t: _Table) -> dict[str, CommandTarget]:
    out: dict[str, CommandTarget] = {}
    for name in list(t.data):
        if not name or any(ch.isspace() for ch in name):
            raise t.err(name, "a target is named by its node id: no spaces")
        x = t.sub(name)
        role = _choice(x, "role", faults.ROLES, "planner")
        vars_: dict[str, str] = {}
        for k in list(x.data):
            if k == "role":
                continue
            if not k.isidentifier() or k in COMMAND_PLACEHOLDERS:
                raise x.err(k, f"a variable is a plain name other than {', '.join(COMMAND_PLACEHOLDERS)}")
            v = x.get(k, (str, int), "")
            vars_[k] = str(v)
        x.done()
        out[name] = CommandTarget(role, vars_)
    t.used.update(t.data)
    return out


def _fault_commands(t: _Table) -> FaultCommands:
    targets = _command_targets(t.sub("targets"))
    allowed = set(COMMAND_PLACEHOLDERS).union(*(x.vars for x in targets.values()))
    per_type: dict[str, FaultCommand] = {}
    for key in list(t.data):
        if not re.fullmatch(r"F\d+", key):
            continue
        try:
            faults.kind(key)
        except KeyError as e:
            raise t.err(key, str(e.args[0])) from None
        x = t.sub(key)
        timeout = x.opt("timeout_s", float)
        if timeout is not None and timeout <= 0:
            raise x.err("timeout_s", f"must be > 0, not {timeout:g}")
        inject = _command(x, "inject", allowed, required=True)
        assert inject is not None
        per_type[key] = FaultCommand(inject, _command(x, "heal", allowed), timeout)
        x.done()
    if not per_type:
        raise t.err("F1", "[faults.commands] makes no fault: add a [faults.commands.F1] (or another type) with inject")
    cmds = FaultCommands(per_type=per_type, health=_command(t, "health", set()),
                         timeout_s=t.positive("timeout_s", 60.0),
                         health_interval_s=t.positive("health_interval_s", 1.0), targets=targets)
    t.done()
    return cmds


def _faults(t: _Table, c: Cluster, duration: float) -> FaultsSpec:
    cmds = _fault_commands(t.sub("commands")) if t.has("commands") else None

    def names(role: str) -> list[str]:
        return cmds.target_names(role) if cmds is not None and cmds.targets else c.targets(role)

    fixed = tuple(_fixed_fault(x, names, duration) for x in t.items("fixed"))
    rnd = _random_faults(t.sub("random"), duration) if t.has("random") else None
    spec = FaultsSpec(fixed=fixed, random=rnd, allow_overlap=t.get("allow_overlap", bool, False),
                      min_gap_s=t.positive("min_gap_s", 2.0, zero=True),
                      health_timeout_s=t.positive("health_timeout_s", 60.0),
                      warmup_s=t.positive("warmup_s", 10.0, zero=True),
                      cooldown_s=t.positive("cooldown_s", 20.0, zero=True), commands=cmds)
    if cmds is not None:
        # The observer makes every planned fault with a command or not at all: a fault type without one
        # would silently become a different drill (or, worse, a local nemesis aimed at staging).
        planned = [(f"fixed[{i}].type", f.type) for i, f in enumerate(fixed)]
        planned += [("random.weights", k) for k, w in (rnd.weights.items() if rnd else ()) if w > 0]
        for where, fid in planned:
            if fid not in cmds.per_type:
                raise ScenarioError(f"{t.at(where)}", f"{fid}: no [faults.commands.{fid}] makes it on the observed "
                                    "cluster (the observer never uses a local nemesis)", t.source)
            role = faults.kind(fid).role
            if where == "random.weights" and not names(role):
                raise ScenarioError(t.at("commands.targets"), f"names no {role} for the random {fid} faults",
                                    t.source)
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


def parse(text: str, source: str = "<string>") -> Scenario:
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
    ops = tuple(sorted((_operation(x, duration, names, ids, cluster.regions) for x in root.items("operations")),
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
