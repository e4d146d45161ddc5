"""scheduler/topology.py: deterministic names, etcd spread, validation, and that it stays on floor 1."""

from __future__ import annotations

import ast
import subprocess
import sys

import pytest

from chaos.scenario import Cluster
from scheduler.errors import InvalidArgument
from scheduler.topology import Role, Topology


def test_names_and_order_from_counts() -> None:
    t = Topology.from_counts(["r1", "r2"], planners_per_region=2, workers_per_region=1)
    assert t.region_names == ("r1", "r2")
    assert [n.name for n in t.nodes] == ["r1-e1", "r1-p1", "r1-p2", "r1-w1", "r2-e1", "r2-p1", "r2-p2", "r2-w1"]
    assert [n.name for n in t.planners] == ["r1-p1", "r1-p2", "r2-p1", "r2-p2"]
    p = t.node("r2-p2")
    assert (p.role, p.region, p.index) == (Role.PLANNER, "r2", 2)
    assert t.region("r2").workers[0].name == "r2-w1"
    assert Topology.from_counts(2) == t.__class__.from_counts(["r1", "r2"], planners_per_region=2, workers_per_region=2)


def test_etcd_total_is_spread_round_robin_majority_first() -> None:
    t = Topology.from_counts(3, etcd_total=5, planners_per_region=0, workers_per_region=0)
    assert [len(r.etcd) for r in t.regions] == [2, 2, 1]
    t = Topology.from_counts(2, etcd_total=3)
    assert [n.name for n in t.etcd_members] == ["r1-e1", "r1-e2", "r2-e1"]
    assert [len(r.etcd) for r in Topology.from_counts(2, etcd_per_region=3).regions] == [3, 3]


@pytest.mark.parametrize(("kwargs", "field"), [
    ({"regions": ["r1", "r1"]}, "regions"),
    ({"regions": ["R1"]}, "regions[0]"),
    ({"regions": []}, "regions"),
    ({"regions": 1, "etcd_total": 0}, "etcd_total"),
    ({"regions": 1, "etcd_total": 1, "etcd_per_region": 1}, "etcd_total"),
    ({"regions": 1, "workers_per_region": -1}, "workers_per_region"),
])
def test_refuses_bad_counts_naming_the_field(kwargs: dict[str, object], field: str) -> None:
    regions = kwargs.pop("regions")
    with pytest.raises(InvalidArgument) as e:
        Topology.from_counts(regions, **kwargs)  # type: ignore[arg-type]
    assert e.value.field == field


def test_scenario_cluster_is_built_on_it() -> None:
    c = Cluster(regions=("r1", "r2"), planners_per_region=2, workers_per_region=1)
    t = c.topology()
    assert c.planners() == [n.name for n in t.planners] == ["r1-p1", "r1-p2", "r2-p1", "r2-p2"]
    assert c.workers() == ["r1-w1", "r2-w1"]
    assert c.etcd_members() == ["r1-e1", "r2-e1"]


def test_floor_one_imports_nothing_above() -> None:
    code = ("import sys, scheduler.topology; print(sorted(m for m in sys.modules "
            "if m.startswith(('scheduler', 'chaos'))))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert set(ast.literal_eval(r.stdout)) <= {"scheduler", "scheduler.errors", "scheduler.topology"}
