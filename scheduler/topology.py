"""A cluster's topology: its regions, in order, and the nodes of each (etcd members, planners, workers).

Shared by the regions feature (issue 11: `schedctl dev --regions`) and the drill harness (chaos/: the
scenario's `Cluster` builds one, the runner starts and faults processes by these names). Floor 1: it
imports only the standard library and `scheduler.errors`, so the CLI and chaos/ can both use it without
pulling in anything above.

Names are deterministic, `<region>-<letter><i>` with i counted from 1 within its region and role:
`r1-e1` (etcd), `r1-p1` (planner), `r1-w1` (worker). Fault targets, logs and run.json use them, so the
same counts always give the same names in the same order (seeded picks index into these lists).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from scheduler.errors import InvalidArgument

__all__ = ["Node", "Region", "Role", "Topology"]

# Region names become parts of node names, process names and Linux namespace names: keep them plain.
_REGION_NAME = re.compile(r"^[a-z0-9][a-z0-9-]{0,19}$")


class Role(StrEnum):
    ETCD = "etcd"
    PLANNER = "planner"
    WORKER = "worker"

    @property
    def letter(self) -> str:
        return {Role.ETCD: "e", Role.PLANNER: "p", Role.WORKER: "w"}[self]


@dataclass(frozen=True)
class Node:
    name: str  # r1-p2
    role: Role
    region: str
    index: int  # 1-based within (region, role)


@dataclass(frozen=True)
class Region:
    name: str
    etcd: tuple[Node, ...] = ()
    planners: tuple[Node, ...] = ()
    workers: tuple[Node, ...] = ()

    @property
    def nodes(self) -> tuple[Node, ...]:
        """etcd members first (they start first), then planners, then workers."""
        return (*self.etcd, *self.planners, *self.workers)


@dataclass(frozen=True)
class Topology:
    regions: tuple[Region, ...]

    def __post_init__(self) -> None:
        names = [r.name for r in self.regions]
        if not names:
            raise InvalidArgument("regions", "at least one region")
        if len(set(names)) != len(names):
            raise InvalidArgument("regions", f"region names must be unique: {names}")
        nodes = [n.name for n in self.nodes]
        if len(set(nodes)) != len(nodes):
            raise InvalidArgument("nodes", f"node names must be unique: {nodes}")

    @classmethod
    def from_counts(
        cls,
        regions: Sequence[str] | int,
        *,
        etcd_per_region: int | None = None,
        etcd_total: int | None = None,
        planners_per_region: int = 2,
        workers_per_region: int = 2,
    ) -> Topology:
        """Regions by name (or a count: `r1`..`rN`); etcd members per region or in total (spread over the
        regions in order, round robin: 3 over 2 regions is 2 + 1, so the first region holds the majority);
        neither given: one per region."""
        names = [f"r{i + 1}" for i in range(regions)] if isinstance(regions, int) else list(regions)
        for i, name in enumerate(names):
            if not _REGION_NAME.match(name):
                raise InvalidArgument(f"regions[{i}]", f"{name!r}: lower-case letters, digits and '-', "
                                                       "at most 20, starting with a letter or digit")
        if not names:
            raise InvalidArgument("regions", "at least one region")
        if etcd_per_region is not None and etcd_total is not None:
            raise InvalidArgument("etcd_total", "give etcd_per_region or etcd_total, not both")
        for field, value in (("etcd_per_region", etcd_per_region), ("etcd_total", etcd_total),
                             ("planners_per_region", planners_per_region),
                             ("workers_per_region", workers_per_region)):
            if value is not None and value < 0:
                raise InvalidArgument(field, f"must be >= 0, got {value}")
        if etcd_total is not None:
            etcd_counts = [etcd_total // len(names) + (1 if i < etcd_total % len(names) else 0)
                           for i in range(len(names))]
        else:
            etcd_counts = [1 if etcd_per_region is None else etcd_per_region] * len(names)
        if sum(etcd_counts) < 1:
            raise InvalidArgument("etcd_total" if etcd_total is not None else "etcd_per_region",
                                  "a cluster needs at least one etcd member")

        def make(region: str, role: Role, count: int) -> tuple[Node, ...]:
            return tuple(Node(f"{region}-{role.letter}{i}", role, region, i) for i in range(1, count + 1))

        return cls(tuple(
            Region(name, make(name, Role.ETCD, e), make(name, Role.PLANNER, planners_per_region),
                   make(name, Role.WORKER, workers_per_region))
            for name, e in zip(names, etcd_counts, strict=True)
        ))

    # ---- lookups ----------------------------------------------------------------------------------

    @property
    def region_names(self) -> tuple[str, ...]:
        return tuple(r.name for r in self.regions)

    @property
    def nodes(self) -> tuple[Node, ...]:
        """Every node, region by region (each region: etcd, planners, workers)."""
        return tuple(n for r in self.regions for n in r.nodes)

    def with_role(self, role: Role) -> tuple[Node, ...]:
        return tuple(n for n in self.nodes if n.role is role)

    @property
    def etcd_members(self) -> tuple[Node, ...]:
        return self.with_role(Role.ETCD)

    @property
    def planners(self) -> tuple[Node, ...]:
        return self.with_role(Role.PLANNER)

    @property
    def workers(self) -> tuple[Node, ...]:
        return self.with_role(Role.WORKER)

    def region(self, name: str) -> Region:
        for r in self.regions:
            if r.name == name:
                return r
        raise KeyError(f"no region {name!r}; regions: {', '.join(self.region_names)}")

    def node(self, name: str) -> Node:
        for n in self.nodes:
            if n.name == name:
                return n
        raise KeyError(f"no node {name!r}; nodes: {', '.join(n.name for n in self.nodes)}")
