"""Forward compatibility of the region policy record (scheduler/region/compat.py): a record written by a
newer version, with a history kind and keys this version does not know, is read (not refused: a planner
that refuses it ignores every later switchover and failover) and written back by the CAS paths with
everything it did not understand intact."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest

from scheduler.region import policy as rp
from scheduler.region.affinity import Affinity, Mode
from scheduler.region.policy import ChangeKind, RegionPolicy

# What a newer planner might write: a history kind, and a key at every level of the record.
NEWER: dict[str, Any] = {
    "primary": "b", "standby": ["a"], "failover_grace_ms": 15000, "failback": "manual", "failback_stable_ms": 60000,
    "history": [
        {"at_ms": 1, "kind": "automatic failover", "from": "a", "to": "b", "by": "b1", "reason": ""},
        {"at_ms": 2, "kind": "quarantine", "from": "b", "to": "b", "by": "n9", "reason": "region c fenced",
         "regions": ["c"]},
    ],
    "reason": "region c fenced", "updated_ms": 2,
    "affinity": {"default": {"mode": "prefer", "prefer_wait_ms": 2000, "burst": 3},
                 "pools": {"gpu": {"mode": "strict", "allow": ["b"]}}, "per_tenant": {"t1": "any"}},
    "quarantined": {"c": {"until_ms": 99}},
}


def test_an_unknown_history_kind_and_unknown_keys_are_read() -> None:
    p = rp.decode(json.dumps(NEWER).encode())
    assert p.primary == "b" and p.history[1].kind == "quarantine"
    assert p.history[1].kind not in rp.MOVES
    # An entry of a kind it does not know is not a move: failback still goes back to where the failover came from.
    assert p.last_move is not None and p.last_move.kind is ChangeKind.FAILOVER and p.previous_primary == "a"
    assert p.reason == "region c fenced"
    assert p.affinity.for_pool("gpu") == Affinity(Mode.STRICT)
    rp.validate(p)


def test_encode_writes_back_what_it_did_not_understand() -> None:
    p = rp.decode(json.dumps(NEWER).encode())
    assert json.loads(rp.encode(p)) == NEWER


def test_the_cas_paths_keep_it_when_they_rewrite_the_record() -> None:
    p = rp.decode(json.dumps(NEWER).encode())
    # A failover back to a (planner.region_guard), then an affinity change (the API): both rewrite the record.
    p = rp.moved(p, "a", ChangeKind.FAILOVER, by="a1", now_ms=3)
    p = rp.with_affinity(p, None, Affinity(Mode.ANY), by="n1", now_ms=4)
    out = json.loads(rp.encode(p))
    assert out["quarantined"] == NEWER["quarantined"]
    assert out["history"][:2] == NEWER["history"]
    assert [h["kind"] for h in out["history"][2:]] == ["automatic failover", "affinity"]
    assert out["affinity"]["per_tenant"] == {"t1": "any"}
    assert out["affinity"]["pools"]["gpu"] == {"mode": "strict", "allow": ["b"]}  # another pool's entry: kept
    assert out["affinity"]["default"] == {"mode": "any"}  # the entry changed here: replaced as a whole
    assert rp.decode(rp.encode(p)) == p


def test_this_versions_own_record_has_no_extra_keys() -> None:
    p = rp.with_affinity(RegionPolicy("a", ("b",)), "gpu", Affinity(Mode.STRICT), by="n1", now_ms=1)
    assert set(json.loads(rp.encode(p))) == {"primary", "standby", "failover_grace_ms", "failback",
                                              "failback_stable_ms", "history", "reason", "updated_ms", "affinity"}
    assert p.extra == {} and p.history[0].extra == {}


# A newer version's values of fields this one knows: a failback mode and affinity modes it has never heard of.
NEWER_VALUES: dict[str, Any] = {
    **{k: v for k, v in NEWER.items() if k not in ("affinity", "failback")},
    "failback": "scheduled",
    "affinity": {"default": {"mode": "nearest"}, "pools": {"gpu": {"mode": "strict"}, "etl": {"mode": "pinned",
                                                                                              "prefer_wait_ms": 500}}},
}


def test_an_unknown_value_of_a_known_field_is_read_as_its_fallback() -> None:
    # Before: Failback("scheduled") raised, the record was unreadable and the planner ignored every later
    # failover and switchover until the value was gone.
    p = rp.decode(json.dumps(NEWER_VALUES).encode())
    assert p.failback is rp.Failback.MANUAL  # never moves planning on its own
    assert p.affinity.default.mode is Mode.PREFER and p.affinity.for_pool("etl") == Affinity(Mode.PREFER, 500)
    assert p.affinity.for_pool("gpu") == Affinity(Mode.STRICT)
    rp.validate(p)  # the CAS paths validate what they write: the fallbacks must pass
    assert p.unread_values() == ["failback='scheduled' (read as 'manual')",
                                 "affinity.default.mode='nearest' (read as 'prefer')",
                                 "affinity.pools[etl].mode='pinned' (read as 'prefer')"]


def test_an_unknown_value_is_written_back_unless_this_writer_changed_the_field() -> None:
    p = rp.decode(json.dumps(NEWER_VALUES).encode())
    out = json.loads(rp.encode(p))
    assert out["failback"] == "scheduled"
    assert out["affinity"]["default"]["mode"] == "nearest"
    assert out["affinity"]["pools"]["etl"] == {"mode": "pinned", "prefer_wait_ms": 500}
    # A failover rewrites the record: the values it did not change survive it.
    moved = rp.moved(p, "a", ChangeKind.FAILOVER, by="a1", now_ms=3)
    assert json.loads(rp.encode(moved))["failback"] == "scheduled"
    # Changing the pool's affinity replaces its entry as a whole; the others keep theirs.
    changed = rp.with_affinity(moved, "etl", Affinity(Mode.ANY), by="n1", now_ms=4)
    out = json.loads(rp.encode(changed))
    assert out["affinity"]["pools"]["etl"] == {"mode": "any"}
    assert out["affinity"]["default"]["mode"] == "nearest"
    # A writer that sets the field to another value wins.
    auto = rp.decode(rp.encode(replace(changed, failback=rp.Failback.AUTO)))
    assert auto.failback is rp.Failback.AUTO and auto.unread == {}


def test_a_malformed_value_is_still_refused() -> None:
    # Not a newer version's value: a record nobody can act on stays unreadable (logged, previous policy kept).
    with pytest.raises(ValueError, match="invalid literal"):
        rp.decode(json.dumps({**NEWER, "failover_grace_ms": "fifteen seconds"}).encode())
