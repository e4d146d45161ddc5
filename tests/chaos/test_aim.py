"""The runner moves a fault that would exercise nothing to a target where it does (chaos/aim.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, cast

from chaos.aim import aim
from chaos.live import LiveCluster
from chaos.plan import FaultWindow
from scheduler.clock import SYSTEM_CLOCK


@dataclass
class Proc:
    running: bool = True


@dataclass
class Sink:
    under_way: dict[str, int] = field(default_factory=dict)
    latest: dict[str, tuple[int, str]] = field(default_factory=dict)

    def running(self, worker: str) -> int:
        return self.under_way.get(worker, 0)

    def recent(self, worker: str, since_ms: int) -> str | None:
        t, eid = self.latest.get(worker, (0, ""))
        return eid if eid and t >= since_ms else None


@dataclass
class Cluster:
    primary: str | None = "r1"


@dataclass
class Scenario:
    cluster: Cluster = field(default_factory=Cluster)


@dataclass
class Live:
    owning: set[str]
    regions: dict[str, str]
    sink: Sink = field(default_factory=Sink)
    workers: dict[str, Proc] = field(default_factory=dict)
    scenario: Scenario = field(default_factory=Scenario)

    def live_planners(self) -> list[str]:
        return sorted(self.regions)

    def region_of(self, node: str) -> str:
        return self.regions[node]

    async def wait_owning(self, planner: str, timeout: float) -> bool:
        return planner in self.owning

    async def owning_planners(self) -> set[str]:
        return set(self.owning)


def window(type_: str, target: str, role: str = "planner", index: int = 3) -> FaultWindow:
    return FaultWindow(index, type_, type_, role, target, 1.0, 2.0)


async def _aim(w: FaultWindow, live: Live) -> tuple[FaultWindow, list[str]]:
    said: list[str] = []
    out = await aim(w, cast(LiveCluster, cast(Any, live)), said.append, wait_s=0.05)
    return out, said


async def test_a_planner_fault_on_an_owning_planner_stays() -> None:
    live = Live({"p1", "p2"}, {"p1": "r1", "p2": "r1"})
    w, said = await _aim(window("F2", "p1"), live)
    assert w.target == "p1" and not w.aimed_from and not said


async def test_a_planner_fault_on_one_that_owns_nothing_moves_within_its_region() -> None:
    live = Live({"p2", "q1"}, {"p1": "r1", "p2": "r1", "q1": "r2"})
    w, said = await _aim(window("F2", "p1"), live)
    assert (w.target, w.aimed_from) == ("p2", "p1")
    assert "aimed at p2" in said[0]
    link, _ = await _aim(window("F10", "p1->etcd", role="link"), live)
    assert (link.target, link.aimed_from) == ("p2->etcd", "p1->etcd")


async def test_a_standby_planner_is_not_moved_to_the_primary() -> None:
    live = Live({"p1"}, {"p1": "r1", "s1": "r2"})
    w, said = await _aim(window("F1", "s1"), live)
    assert w.target == "s1" and "injected on it anyway" in said[0]


async def test_without_a_region_policy_a_recovering_region_hands_the_fault_to_another() -> None:
    """Active-active: r2 owns nothing only because it is back from a region loss, inside the hold-down."""
    live = Live({"p1"}, {"p1": "r1", "q1": "r2", "q2": "r2"}, scenario=Scenario(Cluster(primary=None)))
    w, _ = await _aim(window("F2", "q1"), live)
    assert (w.target, w.aimed_from) == ("p1", "q1")


async def test_a_region_loss_of_a_region_that_owns_nothing_moves_without_a_region_policy() -> None:
    regions = {"p1": "r1", "q1": "r2"}
    live = Live({"p1"}, regions, scenario=Scenario(Cluster(primary=None)))
    w, _ = await _aim(window("F5", "r2", role="region"), live)
    assert (w.target, w.aimed_from) == ("r1", "r2")
    with_policy = Live({"p1"}, regions)
    w, _ = await _aim(window("F5", "r2", role="region"), with_policy)
    assert w.target == "r2"  # a standby region's loss is meant for it


async def test_non_planner_targets_are_left_alone() -> None:
    live = Live(set(), {"p1": "r1"})
    for w0 in (window("F4", "etcd-0", role="etcd"), window("F5", "r1", role="region"),
               window("F9", "cluster", role="cluster")):
        w, _ = await _aim(w0, live)
        assert w == w0


async def test_a_worker_crash_moves_to_a_worker_with_a_run_under_way() -> None:
    live = Live(set(), {}, Sink({"w2": 1, "w3": 2}), {"w1": Proc(), "w2": Proc(), "w3": Proc(), "w4": Proc(False)})
    w, _ = await _aim(window("F7", "w1", role="worker"), live)
    assert (w.target, w.aimed_from) == ("w3", "w1")
    live.sink.under_way["w1"] = 1
    w, _ = await _aim(window("F7", "w1", role="worker"), live)
    assert w.target == "w1"
    idle = Live(set(), {}, Sink(), {"w1": Proc(), "w2": Proc()})
    w, _ = await _aim(window("F7", "w1", role="worker"), idle)
    assert w.target == "w1"  # nobody busy: the nemesis keeps waiting on its own target


async def test_a_stranded_worker_is_one_that_planners_hand_work() -> None:
    """F13 under a light load: each planner fills the stream that connected first, so one worker may run
    everything; stranding the idle one exercised nothing (three of four windows of the first drill)."""
    now = SYSTEM_CLOCK.wall_ms()
    # w2's latest effect stamped a minute ahead: recent whenever the aim looks (it waits 0.05 s per call here).
    live = Live(set(), {}, Sink(latest={"w1": (now - 60_000, "a@x"), "w2": (now + 60_000, "b@x")}),
                {"w1": Proc(), "w2": Proc()})
    w, said = await _aim(window("F13", "w1", role="worker"), live)
    assert (w.target, w.aimed_from) == ("w2", "w1") and "started no effect" in said[0]
    w, _ = await _aim(window("F13", "w2", role="worker"), live)
    assert w.target == "w2" and not w.aimed_from
