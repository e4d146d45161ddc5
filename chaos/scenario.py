"""Drill scenarios: TOML files in chaos/scenarios/ loaded into frozen dataclasses.

A scenario says what cluster to build, what load to put on it, which API operations to make during the
run, which faults to inject (fixed ones and a seeded random mix), how long it lasts, what counts as
healthy before and after, and the lag bounds the checker holds the run to. docs/drills.md documents
every field; `loads()`/`load()` read them (the reader is chaos/scenario_toml.py), and every error names the field to fix
(`faults.fixed[2].type: unknown fault type 'F14' ...`) so a typo never turns into a silently
different drill. Unknown keys are refused for the same reason.

Durations are seconds (`*_s`, floats allowed) or milliseconds (`*_ms`, integers); fault durations may
also be given as multiples of the lease TTL (`duration_ttl`), which keeps a scenario meaningful when
the TTL changes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from scheduler.errors import InvalidArgument
from scheduler.timeplan import MissedRuns, Overlap
from scheduler.topology import Topology

__all__ = [
    "CANCEL_REASON",
    "SCENARIO_DIR",
    "Cluster",
    "CommandTarget",
    "FaultCommand",
    "FaultCommands",
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
OPS = ("create", "update", "pause", "resume", "delete", "trigger", "backfill", "rerun", "cancel", "replay")
CANCEL_REASON = "drill cancel"  # the reason the drill's cancel ops give (chaos/owed.py judges cancels by it)
# Operations on the cluster, not on a schedule (target: a region), in [[operations]] only: a random mix of
# switchovers would turn a drill about schedules into one about regions.
CLUSTER_OPS = ("switchover",)
STEADY_CHECKS = ("etcd_healthy", "partitions_owned", "workers_connected", "lag_under_bound", "no_backlog")
TIERS = ("ci", "game-day", "regression", "manual")
# What a fault command's `{...}` may name besides its target's variables (chaos/fault_commands.py fills them).
COMMAND_PLACEHOLDERS = ("target", "type", "index", "role", "duration_s", "duration_ms")
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
    # The region policy the runner writes before any planner starts (issue 11): `primary` plans, the other
    # regions stand by in the order of `regions`; None writes no policy, so every planner plans wherever
    # it runs (an active-active cluster). `failover_grace_s` None: 3 x the lease TTL.
    primary: str | None = None
    failover_grace_s: float | None = None

    def standby(self) -> tuple[str, ...]:
        return tuple(r for r in self.regions if r != self.primary)

    def failover_grace_ms(self) -> int:
        grace = self.failover_grace_s if self.failover_grace_s is not None else 3 * self.lease_ttl_s
        return int(grace * 1000)

    def topology(self) -> Topology:
        """The nodes this cluster runs (scheduler/topology.py: one description shared with the regions
        feature); one etcd member per region until scenarios can say otherwise."""
        return Topology.from_counts(self.regions, etcd_per_region=1, planners_per_region=self.planners_per_region,
                                    workers_per_region=self.workers_per_region)

    def planners(self) -> list[str]:
        return [n.name for n in self.topology().planners]

    def workers(self) -> list[str]:
        return [n.name for n in self.topology().workers]

    def etcd_members(self) -> list[str]:
        return [n.name for n in self.topology().etcd_members]

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
    # I3 for outages (F5, F4 with quorum lost), from the window's end: every process restarts and the whole
    # backlog drains through the workers, so it is at least fault_max_s and usually set higher.
    outage_max_s: float = 6.0
    # I3 for a run whose attempt was out on a worker a fault killed (F5, F7), from the kill: nobody may run
    # it again until the worker is known gone (its planner's heartbeat_timeout, 10 s by default, plus one
    # heartbeat interval), and the owner may have died with it (a claim, up to the lease TTL): a retry
    # sooner could run it twice (docs/workers.md, "Liveness").
    worker_loss_s: float = 16.0
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
    # Every effect fails permanently once whole (chaos/sink.py): each run ends a dead letter, for `replay`.
    fail: bool = False

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
class FaultCommand:
    """How one fault type is made on a cluster the harness did not start (`[faults.commands.F1]`).
    Each command is a TOML string split with shlex into argv *before* its placeholders are filled in,
    and run without a shell (chaos/fault_commands.py): a target or variable is always one argument,
    whatever it holds."""

    inject: str
    heal: str | None = None  # None: the fault heals on its own (a deleted pod is restarted)
    timeout_s: float | None = None  # None: FaultCommands.timeout_s


@dataclass(frozen=True)
class CommandTarget:
    """A staging node that fault commands may be aimed at (`[faults.commands.targets.<name>]`). Its name
    is the node id the cluster's planners claim partitions as (the checker finds a target's partitions
    by it); `vars` are extra placeholders for its commands (a pod name, a pid, a host)."""

    role: str
    vars: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class FaultCommands:
    """`[faults.commands]`: the observer (`drill observe`) makes the plan's faults with these commands."""

    per_type: Mapping[str, FaultCommand]
    health: str | None = None  # exit 0 = healthy; None: healthy as soon as the heal returned
    timeout_s: float = 60.0  # each command's own bound (a hung kubectl must not hang the drill)
    health_interval_s: float = 1.0  # between two tries of the health command
    targets: Mapping[str, CommandTarget] = field(default_factory=dict)  # empty: the cluster's topology names

    def target_names(self, role: str) -> list[str]:
        return [n for n, t in self.targets.items() if t.role == role]


@dataclass(frozen=True)
class FaultsSpec:
    fixed: tuple[FixedFault, ...] = ()
    random: RandomFaults | None = None
    allow_overlap: bool = False
    min_gap_s: float = 2.0  # between one fault's end and the next one's start (health is waited for too)
    health_timeout_s: float = 60.0  # a cluster not healthy again within this makes the run invalid
    warmup_s: float = 10.0  # no fault before this (steady-state traffic first, as etcd robustness does)
    cooldown_s: float = 20.0  # no fault in the last stretch: I7 needs a healed tail
    commands: FaultCommands | None = None  # set: a staging scenario, its faults made by these commands


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

    def fault_targets(self, role: str) -> list[str]:
        """Names a fault of `role` may hit: the staging targets of `faults.commands.targets` when the
        scenario names any (they are the observed cluster's nodes), else the cluster's own."""
        cmds = self.faults.commands
        if cmds is not None and cmds.targets:
            return cmds.target_names(role)
        return self.cluster.targets(role)


# ---- reading (the TOML reader is chaos/scenario_toml.py) ------------------------------------------


def loads(text: str, source: str = "<string>") -> Scenario:
    """Parse and validate a scenario from TOML text (ScenarioError naming the field)."""
    from chaos.scenario_toml import parse  # the reader imports these dataclasses: import it when used

    return parse(text, source)


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
