"""The drill tests' scenarios, built from shared parts so that a change of the common bounds or load is
made once (they were copied from test to test: `duplicates` found five copies).

Each part is a TOML fragment; a scenario is their concatenation (`scenario()`), read by
`chaos.scenario.loads` like any file in chaos/scenarios/.
"""

from __future__ import annotations

import json


def header(name: str, description: str, duration_s: int, seed: int | None = None) -> str:
    seed_line = f"seed = {seed}\n" if seed is not None else ""
    return f'[scenario]\nname = "{name}"\ndescription = "{description}"\nduration_s = {duration_s}\n{seed_line}'


def cluster(planners: int, workers: int, *, regions: tuple[str, ...] = (), late_grace_ms: int = 500) -> str:
    """Small clusters with a 2 s lease: faults beyond the TTL fit in a short window."""
    region_line = f"regions = {json.dumps(list(regions))}\n" if regions else ""
    return (f"[cluster]\n{region_line}planners_per_region = {planners}\nworkers_per_region = {workers}\n"
            f"partitions = 8\nlease_ttl_s = 2.0\nrenew_interval_s = 0.5\n"
            f"planner = {{ lookahead_ms = 1000, late_grace_ms = {late_grace_ms} }}\n")


# Bounds for a shared 2-core machine: looser than the shipped scenarios' steady state, the same fault bound.
LAG = """[lag]
steady_p99_s = 1.5
steady_max_s = 3.0
fault_max_s = 8.0
settle_s = 6.0
liveness_s = 15.0
judge_grace_s = 5.0
"""


def validity(min_executions: int, min_planned_per_fault: int = 20) -> str:
    return f"[validity]\nmin_executions = {min_executions}\nmin_planned_per_fault = {min_planned_per_fault}\n"


def every_second(name: str, count: int, extra: str = "") -> str:
    return f'[[load.schedules]]\nname = "{name}"\ncount = {count}\nspec = "* * * * * *"\n{extra}'


# Three shell schedules (curl to the sink) every 2 s, each effect held 200 ms.
SHELL = """[[load.schedules]]
name = "sh"
count = 3
spec = "@every 2s"
executor = "shell"
hold_ms = 200
"""

PAUSE_RESUME = """[[operations]]
at_s = 6
op = "pause"
target = "sec-001"
[[operations]]
at_s = 14
op = "resume"
target = "sec-001"
"""


def faults(warmup_s: int, cooldown_s: int, min_gap_s: int | None = None, health_timeout_s: int | None = None) -> str:
    out = f"[faults]\nwarmup_s = {warmup_s}\ncooldown_s = {cooldown_s}\n"
    if min_gap_s is not None:
        out += f"min_gap_s = {min_gap_s}\n"
    if health_timeout_s is not None:
        out += f"health_timeout_s = {health_timeout_s}\n"
    return out


def scenario(*parts: str) -> str:
    return "\n" + "".join(parts)


def runner_meta(*, late_grace_ms: int = 500, late_schedules: bool = True) -> str:
    """F1 and F2 beyond the TTL on two planners, a pause and a resume (40 s): the runner's meta-tests and
    the namespace run."""
    late = every_second("late", 8, 'missed_runs = "skip"\n') if late_schedules else ""
    return scenario(
        header("runner-meta", "F1 and F2 beyond the lease on two planners; a pause and a resume", 40, 3),
        cluster(2, 1, late_grace_ms=late_grace_ms), LAG, validity(300),
        every_second("sec", 12), late, SHELL, PAUSE_RESUME,
        faults(5, 10, 3, 40),
        '[[faults.fixed]]\ntype = "F1"\nat_s = 8\nduration_s = 2\n',
        '[[faults.fixed]]\ntype = "F2"\nat_s = 18\nparams = { ttl_multiple = 2.5 }\n',
    )
