"""The region policy's codec, validation and decisions (scheduler/region/policy.py), as tables."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from scheduler.errors import InvalidArgument
from scheduler.region import policy as rp
from scheduler.region.policy import Change, ChangeKind, Failback, RegionPolicy, RegionView

A = RegionPolicy(primary="a", standby=("b", "c"), failover_grace_ms=3000)


def view(now: int, live: dict[str, int], last_seen: int = 0, healthy: dict[str, int] | None = None) -> RegionView:
    return RegionView(now_ms=now, live=live, primary_last_seen_ms=last_seen, healthy_since_ms=healthy or {})


def test_codec_round_trip() -> None:
    p = replace(rp.moved(A, "b", ChangeKind.FAILOVER, by="b-p1", now_ms=5, reason=""), failback=Failback.AUTO)
    assert rp.decode(rp.encode(p)) == p


def test_decode_reads_the_pre_regions_record() -> None:
    old = json.dumps({"primary": "eu", "reason": "drill", "updated_ms": 42}).encode()
    p = rp.decode(old)
    assert (p.primary, p.standby, p.failover_grace_ms, p.failback) == ("eu", (), rp.DEFAULT_FAILOVER_GRACE_MS,
                                                                        Failback.MANUAL)
    assert p.history == (Change(42, ChangeKind.SWITCHOVER, "", "eu", "", "drill"),)
    assert (p.reason, p.updated_ms) == ("drill", 42)


@pytest.mark.parametrize(("change", "field"), [
    ({"primary": ""}, "primary"),
    ({"standby": ("a",)}, "standby"),
    ({"standby": ("b", "b")}, "standby"),
    ({"standby": ("",)}, "standby"),
    ({"failover_grace_ms": 0}, "failover_grace"),
    ({"failover_grace_ms": -5}, "failover_grace"),
    ({"failback_stable_ms": 0}, "failback_stable"),
    ({"history": tuple(Change(i, ChangeKind.SWITCHOVER, "a", "b", "x") for i in range(rp.HISTORY_MAX + 1))},
     "history"),
])
def test_validation_names_the_field(change: dict[str, object], field: str) -> None:
    with pytest.raises(InvalidArgument) as e:
        rp.validate(replace(A, **change))  # type: ignore[arg-type]
    assert e.value.field == field


@pytest.mark.parametrize(("policy", "region", "ok"), [
    (None, "anything", True),  # no policy: today's behaviour
    (A, "a", True),
    (A, "b", False),
    (A, "c", False),
])
def test_eligible_region(policy: RegionPolicy | None, region: str, ok: bool) -> None:
    assert rp.eligible_region(policy, region) is ok


@pytest.mark.parametrize(("start", "to", "standby"), [
    (A, "b", ("a", "c")),  # the old primary takes the new one's place in the order
    (A, "c", ("b", "a")),
    (RegionPolicy("a", ("b",)), "z", ("a", "b")),  # an unlisted region: the old primary goes first
])
def test_moved_keeps_a_permutation(start: RegionPolicy, to: str, standby: tuple[str, ...]) -> None:
    p = rp.moved(start, to, ChangeKind.SWITCHOVER, by="n", now_ms=7, reason="why")
    assert (p.primary, p.standby) == (to, standby)
    assert p.last == Change(7, ChangeKind.SWITCHOVER, start.primary, to, "n", "why")
    assert p.previous_primary == start.primary


def test_history_is_bounded() -> None:
    p = A
    for i in range(rp.HISTORY_MAX + 5):
        p = rp.moved(p, "b" if p.primary == "a" else "a", ChangeKind.SWITCHOVER, by="n", now_ms=i)
    assert len(p.history) == rp.HISTORY_MAX and p.history[-1].at_ms == rp.HISTORY_MAX + 4
    rp.validate(p)


def test_initial_policy() -> None:
    p = rp.initial("b", ("c", "a", "b"), by="n", now_ms=1)
    assert (p.primary, p.standby, p.last and p.last.kind) == ("b", ("a", "c"), ChangeKind.SWITCHOVER)


@pytest.mark.parametrize(("v", "target"), [
    (view(10_000, {"a": 1, "b": 2}, last_seen=10_000), None),  # the primary is live
    (view(10_000, {"b": 2}, last_seen=8_000), None),  # gone for 2 s < grace 3 s
    (view(10_000, {"b": 2}, last_seen=7_000), "b"),  # gone for the grace: first standby
    (view(10_000, {"c": 1}, last_seen=0), "c"),  # the first standby has no live planner: the next
    (view(10_000, {}, last_seen=0), None),  # nobody to take over
    (view(10_000, {"z": 3}, last_seen=0), None),  # a region outside the policy never takes over
])
def test_failover_target(v: RegionView, target: str | None) -> None:
    assert rp.failover_target(A, v) == target


AFTER_FAILOVER = replace(rp.moved(A, "b", ChangeKind.FAILOVER, by="b-p1", now_ms=100_000),
                         failback=Failback.AUTO, failback_stable_ms=60_000)


@pytest.mark.parametrize(("policy", "v", "target"), [
    (AFTER_FAILOVER, view(200_000, {"a": 2, "b": 2}, healthy={"a": 130_000}), "a"),  # stable 70 s
    (AFTER_FAILOVER, view(200_000, {"a": 2, "b": 2}, healthy={"a": 150_000}), None),  # 50 s: not yet
    # healthy since before the failover: counted from the failover itself (100 s + 60 s > 150 s)
    (AFTER_FAILOVER, view(150_000, {"a": 2, "b": 2}, healthy={"a": 0}), None),
    (AFTER_FAILOVER, view(200_000, {"b": 2}, healthy={}), None),  # down again (a flap resets healthy_since)
    (replace(AFTER_FAILOVER, failback=Failback.MANUAL), view(200_000, {"a": 2}, healthy={"a": 0}), None),
    # the last move was an operator's: never undone automatically
    (replace(rp.moved(A, "b", ChangeKind.SWITCHOVER, by="op", now_ms=1), failback=Failback.AUTO),
     view(200_000, {"a": 2}, healthy={"a": 0}), None),
])
def test_failback_target(policy: RegionPolicy, v: RegionView, target: str | None) -> None:
    assert rp.failback_target(policy, v) == target


@pytest.mark.parametrize(("policy", "v", "me", "move"), [
    (None, view(10_000, {}), "b", None),
    (A, view(10_000, {"b": 1, "c": 1}), "b", ("b", ChangeKind.FAILOVER)),
    (A, view(10_000, {"b": 1, "c": 1}), "c", None),  # not the first standby: it does not race b
    (A, view(10_000, {"b": 1, "c": 1}), "a", None),
    (AFTER_FAILOVER, view(200_000, {"a": 2, "b": 2}, healthy={"a": 0}), "a", ("a", ChangeKind.FAILBACK)),
    (AFTER_FAILOVER, view(200_000, {"a": 2, "b": 2}, healthy={"a": 0}), "b", None),
])
def test_decide(policy: RegionPolicy | None, v: RegionView, me: str, move: tuple[str, ChangeKind] | None) -> None:
    assert rp.decide(policy, v, me) == move
