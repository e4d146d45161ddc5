"""The quota record (scheduler/quota/record.py) and the schedules-held counter's encoding: pure."""

from __future__ import annotations

import json
import math

import pytest

from scheduler.errors import InvalidArgument
from scheduler.quota import usage
from scheduler.quota.record import UNLIMITED, Quota, decode, encode, resolve, validate
from scheduler.store.etcd.ops import CompareTarget
from scheduler.store.keyspace import Keyspace


def test_round_trip_and_absent_fields_are_unlimited() -> None:
    q = Quota(schedules=10, executions_per_second=2.5, backfill=100, labels=4, payload_bytes=1024, updated_ms=5,
              by="token:root", reason="why")
    assert decode(encode(q)) == q
    assert decode(b"{}") == UNLIMITED and UNLIMITED.unlimited
    assert "labels" not in json.loads(encode(Quota(schedules=1)))  # 0 is not written: absent means unlimited


def test_unknown_keys_and_unreadable_values_are_kept_through_a_rewrite() -> None:
    raw = {"schedules": 3, "max_cron_jobs": {"n": 7}, "labels": "many", "backfill": -1, "payload_bytes": True}
    q = decode(json.dumps(raw).encode())
    assert (q.schedules, q.labels, q.backfill, q.payload_bytes) == (3, 0, 0, 0)  # the bad ones read as unlimited
    out = json.loads(encode(Quota(**{**q.__dict__, "schedules": 4})))
    assert out["max_cron_jobs"] == {"n": 7} and out["labels"] == "many" and out["backfill"] == -1
    assert out["payload_bytes"] is True and out["schedules"] == 4
    # A field this writer sets wins over the kept text.
    out = json.loads(encode(Quota(**{**q.__dict__, "labels": 5})))
    assert out["labels"] == 5


def test_not_an_object_is_refused() -> None:
    with pytest.raises(ValueError, match="JSON object"):
        decode(b"[1]")


@pytest.mark.parametrize(("q", "field"), [
    (Quota(schedules=-1), "quota.schedules"),
    (Quota(labels=33), "quota.labels"),
    (Quota(payload_bytes=64 * 1024 + 1), "quota.payload_bytes"),
    (Quota(executions_per_second=math.inf), "quota.executions_per_second"),
    (Quota(executions_per_second=0.0001), "quota.executions_per_second"),
    (Quota(backfill=10**7), "quota.backfill"),
])
def test_validate_names_the_field(q: Quota, field: str) -> None:
    with pytest.raises(InvalidArgument) as e:
        validate(q)
    assert e.value.field == field


def test_a_tenants_record_replaces_the_default_whole() -> None:
    dflt = Quota(schedules=5, labels=3)
    assert resolve(None, dflt) == dflt
    assert resolve(Quota(backfill=1), dflt) == Quota(backfill=1)  # its schedules: unlimited, not the default's 5
    assert resolve(None, None) == UNLIMITED


def test_usage_counter_and_its_guard() -> None:
    ks = Keyspace("/x")
    assert usage.decode(usage.encode(7)) == 7 and usage.decode(b"junk") == 0
    assert usage.write(ks, usage.Usage("t", 0, 0), +1) == []  # untracked: no counter written
    fresh = usage.Usage("t", 3, 0, counted_at=100)
    cs = usage.guard(ks, fresh)
    assert cs[0].key == ks.usage("t") and cs[0].target is CompareTarget.CREATE and cs[0].operand == 0
    # No schedule created and none deleted since the scan's revision.
    assert {(c.key, c.target, c.op, c.operand) for c in cs[1:]} == {
        (ks.all_schedules, CompareTarget.CREATE, "<", 101), (ks.all_tombstones, CompareTarget.MOD, "<", 101)}
    assert usage.guard(ks, usage.Usage("t", 3, 42))[0].operand == 42
