"""Worker affinity per pool: the record field's codec and validation (scheduler/region/affinity.py,
region/policy.py) and the per-pool decision with a fake clock (scheduler/dispatch/affinity.py)."""

from __future__ import annotations

import json

import pytest

from scheduler._gen.scheduler.v1 import admin_service_pb2 as apb
from scheduler.api.admin_service import affinity_request
from scheduler.dispatch.affinity import AffinityGate
from scheduler.errors import InvalidArgument
from scheduler.region import affinity as ra
from scheduler.region import policy as rp
from scheduler.region.affinity import Affinity, AffinityPolicy, Mode
from scheduler.region.policy import ChangeKind, RegionPolicy
from scheduler.timeconv import ms_to_duration

A = RegionPolicy(primary="a", standby=("b",))
STRICT, ANY = Affinity(Mode.STRICT), Affinity(Mode.ANY)


def test_codec_round_trip_with_affinity() -> None:
    p = rp.with_affinity(A, "gpu", STRICT, by="n1", now_ms=7, reason="data stays in a")
    p = rp.with_affinity(p, None, Affinity(Mode.PREFER, 500), by="n1", now_ms=8)
    assert rp.decode(rp.encode(p)) == p
    assert p.affinity.for_pool("gpu") == STRICT
    assert p.affinity.for_pool("other") == Affinity(Mode.PREFER, 500)


def test_a_record_without_the_field_decodes_to_the_default() -> None:
    old = json.loads(rp.encode(A))
    del old["affinity"]
    p = rp.decode(json.dumps(old).encode())
    assert p.affinity == AffinityPolicy()
    assert p.affinity.for_pool("x") == Affinity(Mode.PREFER, ra.DEFAULT_PREFER_WAIT_MS)


def test_an_affinity_change_is_a_history_entry_that_is_not_a_move() -> None:
    moved = rp.moved(A, "b", ChangeKind.FAILOVER, by="b1", now_ms=1)
    p = rp.with_affinity(moved, "gpu", STRICT, by="n1", now_ms=2, reason="why")
    c = p.history[-1]
    assert (c.kind, c.from_region, c.to_region) == (ChangeKind.AFFINITY, "b", "b")
    assert "pool gpu: strict (was prefer (2000 ms))" in c.reason and c.reason.endswith("why")
    assert p.previous_primary == "a"  # failback still goes back to where the failover came from
    assert p.last_move is not None and p.last_move.kind is ChangeKind.FAILOVER
    cleared = rp.with_affinity(p, "gpu", None, by="n1", now_ms=3)
    assert cleared.affinity.pools == () and "the default" in cleared.history[-1].reason


def test_history_stays_bounded_but_keeps_the_last_move() -> None:
    p = rp.moved(A, "b", ChangeKind.FAILOVER, by="b1", now_ms=1)
    for i in range(rp.HISTORY_MAX + 5):
        p = rp.with_affinity(p, f"p{i}", ANY, by="n1", now_ms=10 + i)
    assert len(p.history) == rp.HISTORY_MAX
    assert p.previous_primary == "a"
    rp.validate(p)


@pytest.mark.parametrize(("aff", "field"), [
    (AffinityPolicy(default=Affinity(Mode.PREFER, 0)), "affinity.default.prefer_wait"),
    (AffinityPolicy(pools=(("p", Affinity(Mode.PREFER, -5)),)), "affinity.pools[p].prefer_wait"),
    (AffinityPolicy(pools=(("", STRICT),)), "pool"),
])
def test_validate_names_the_field(aff: AffinityPolicy, field: str) -> None:
    with pytest.raises(InvalidArgument) as e:
        rp.validate(RegionPolicy("a", affinity=aff))
    assert e.value.field == field


@pytest.mark.parametrize(("req", "field"), [
    (apb.SetWorkerAffinityRequest(pool="p", mode="sometimes"), "mode"),
    (apb.SetWorkerAffinityRequest(pool="p", mode=""), "mode"),
    (apb.SetWorkerAffinityRequest(pool="", mode="strict"), "pool"),
    (apb.SetWorkerAffinityRequest(pool="p", mode="prefer", prefer_wait=ms_to_duration(0)), "prefer_wait"),
    (apb.SetWorkerAffinityRequest(pool="p", mode="prefer", prefer_wait=ms_to_duration(-1000)), "prefer_wait"),
    (apb.SetWorkerAffinityRequest(pool="p", mode="strict", prefer_wait=ms_to_duration(1000)), "prefer_wait"),
    (apb.SetWorkerAffinityRequest(pool="p", default_affinity=True, mode="any"), "pool"),
    (apb.SetWorkerAffinityRequest(default_affinity=True, clear=True), "clear"),
])
def test_bad_requests_name_the_field(req: apb.SetWorkerAffinityRequest, field: str) -> None:
    with pytest.raises(InvalidArgument) as e:
        affinity_request(req)
    assert e.value.field == field


def test_good_requests() -> None:
    assert affinity_request(apb.SetWorkerAffinityRequest(pool="p", mode="strict")) == ("p", STRICT)
    assert affinity_request(apb.SetWorkerAffinityRequest(default_affinity=True, mode="prefer",
                                                         prefer_wait=ms_to_duration(300))) == (
        None, Affinity(Mode.PREFER, 300))
    assert affinity_request(apb.SetWorkerAffinityRequest(pool="p", clear=True)) == ("p", None)


class FakeClock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def gate(policy: AffinityPolicy) -> tuple[AffinityGate, FakeClock]:
    clk = FakeClock()
    g = AffinityGate("a", clk)
    g.configure("a", policy)
    return g, clk


POLICY = AffinityPolicy(default=Affinity(Mode.PREFER, 2000), pools=(("s", STRICT), ("y", ANY)))


def test_local_workers_always_qualify_and_strict_never_goes_abroad() -> None:
    g, clk = gate(POLICY)
    clk.t += 3600
    assert g.allows("a", "s", "x") and g.allows("a", "p", "x") and g.allows("a", "y", "x")
    assert not g.allows("b", "s", "x")
    assert g.wait_left("s", "x") == float("inf")
    assert g.allows("b", "y", "x")


def test_prefer_falls_over_only_after_no_local_credit_for_the_wait() -> None:
    g, clk = gate(POLICY)
    assert not g.allows("b", "p", "x")  # just started: local workers get prefer_wait to show up
    clk.t += 1.9
    assert not g.allows("b", "p", "x")
    clk.t += 0.1
    assert g.allows("b", "p", "x")
    g.local_credit("p")  # a local worker has credit again: home first, the count restarts
    assert not g.allows("b", "p", "x") and g.wait_left("p", "x") == pytest.approx(2.0)
    clk.t += 1.5
    assert g.wait_left("p", "x") == pytest.approx(0.5)
    g.local_credit("other")  # another pool's local credit says nothing about this one
    clk.t += 0.5
    assert g.allows("b", "p", "x")


def test_a_new_planning_region_restarts_the_count() -> None:
    g, clk = gate(POLICY)
    clk.t += 10
    assert g.allows("b", "p", "x")
    g.configure("b", POLICY)  # switchover to b: now a is the remote region
    assert g.allows("b", "p", "x") and g.allows("b", "s", "x")
    assert not g.allows("a", "p", "x") and not g.allows("a", "s", "x")
    clk.t += 2
    assert g.allows("a", "p", "x")
    g.configure(None, AffinityPolicy())  # the record is gone: this planner's own region, the defaults
    assert g.planning_region == "a" and g.allows("b", "s", "x") is False
