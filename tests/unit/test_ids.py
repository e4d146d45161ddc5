"""Execution ids, fencing tokens and dead-letter index entries: their text is a compatibility contract
(etcd keys and values, idempotency keys, `X-Fencing-Token`), pinned here byte for byte."""

from __future__ import annotations

import json
from dataclasses import replace
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from scheduler._gen.scheduler.v1 import execution_pb2 as epb
from scheduler._gen.scheduler.v1 import worker_service_pb2 as wpb
from scheduler.clock import SYSTEM_CLOCK
from scheduler.dispatch.starts import StartRecorder
from scheduler.errors import InvalidArgument
from scheduler.execution import ExecState, Execution, Trigger, dispatch, new_execution
from scheduler.ids import (
    MAX_EXECUTION_ID_LEN,
    ExecutionId,
    FencingToken,
    execution_id,
    format_rfc3339_ms,
    schedule_of,
)
from scheduler.model import RetryPolicy
from scheduler.store.etcd.ops import Compare, PutOp
from scheduler.store.keyspace import Keyspace, partition_for
from scheduler.store.ledger import DeadLetterEntry, Ledger
from scheduler.store.memory import MemoryKV

_sids = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,20}", fullmatch=True)
_planned = st.integers(0, 253_402_300_799_999)  # 1970-01-01 .. 9999-12-31T23:59:59.999Z
T = 1_795_946_400_123  # 2026-11-29T10:00:00.123Z


def test_the_execution_id_text_is_pinned() -> None:
    eid = ExecutionId("billing-eu.daily", T)
    assert str(eid) == execution_id("billing-eu.daily", T) == "billing-eu.daily@2026-11-29T10:00:00.123Z"
    assert str(ExecutionId("a:b_c", 0)) == "a:b_c@1970-01-01T00:00:00.000Z"
    assert format_rfc3339_ms(253_402_300_799_999) == "9999-12-31T23:59:59.999Z"
    assert len(format_rfc3339_ms(T)) == 24
    assert schedule_of(str(eid)) == "billing-eu.daily"


@given(_sids, _planned)
def test_execution_ids_round_trip(sid: str, planned_ms: int) -> None:
    eid = ExecutionId(sid, planned_ms)
    assert ExecutionId.parse(str(eid)) == eid
    assert schedule_of(str(eid)) == sid
    assert len(str(eid)) <= MAX_EXECUTION_ID_LEN


@given(_sids, st.lists(st.integers(0, 10**13 - 1), min_size=2, max_size=8, unique=True),
       st.sampled_from([4, 65_535]))
def test_ids_and_keys_of_one_schedule_sort_by_planned_time(sid: str, times: list[int], partitions: int) -> None:
    """Keys hold 13 digits of epoch ms: they sort by time until 2286 (keyspace._MS_WIDTH); ids until 9999."""
    ks = Keyspace()
    p = partition_for(sid, partitions)
    by_time = sorted(times)
    assert sorted(times, key=lambda t: str(ExecutionId(sid, t))) == by_time
    assert sorted(times, key=lambda t: ExecutionId(sid, t)) == by_time
    assert sorted(times, key=lambda t: ks.execution(p, sid, t)) == by_time
    assert sorted(times, key=lambda t: ks.dead_letter(p, sid, t)) == by_time


@pytest.mark.parametrize(("text", "reason"), [
    ("", "is required"),
    ("job", "must look like <schedule_id>@2026-11-29T10:00:00.000Z"),
    ("job@", "time '' is not like 2026-11-29T10:00:00.000Z"),
    ("@2026-11-29T10:00:00.000Z", "is required"),
    ("j b@2026-11-29T10:00:00.000Z", "'j b' may only contain A-Z a-z 0-9 . _ : - and must start alphanumeric"),
    ("-job@2026-11-29T10:00:00.000Z", "'-job' may only contain"),
    ("job\n@2026-11-29T10:00:00.000Z", "may only contain"),  # "$" let a trailing newline through
    ("j" * 129 + "@2026-11-29T10:00:00.000Z", f"is 154 characters; the limit is {MAX_EXECUTION_ID_LEN}"),
    ("j" * 129 + "@2026-11-29T10:00Z", "is 129 characters; the limit is 128"),
    ("job@yesterday", "time 'yesterday' is not like 2026-11-29T10:00:00.000Z"),
    ("job@2026-11-29T10:00:00.000", "is not like"),  # no offset
    ("job@2026-11-29T10:00:00Z", "time '2026-11-29T10:00:00Z' is not canonical; expected 2026-11-29T10:00:00.000Z"),
    ("job@2026-11-29T11:00:00.000+01:00", "is not canonical; expected 2026-11-29T10:00:00.000Z"),
    ("job@2026-11-29t10:00:00.000z", "is not canonical"),
])
def test_bad_execution_ids_name_the_field_and_the_reason(text: str, reason: str) -> None:
    with pytest.raises(InvalidArgument) as e:
        ExecutionId.parse(text)
    assert e.value.field == "execution_id" and reason in e.value.reason, e.value
    with pytest.raises(InvalidArgument) as e:
        ExecutionId.parse(text, "ids[3]")
    assert e.value.field == "ids[3]"


def test_an_at_sign_splits_at_the_last_one() -> None:
    with pytest.raises(InvalidArgument, match="'a@b' may only contain"):
        ExecutionId.parse("a@b@2026-11-29T10:00:00.000Z")


def test_fencing_token_text_round_trips() -> None:
    t = FencingToken(12, 9001)
    assert str(t) == "12:9001" and FencingToken.parse("12:9001") == t
    assert FencingToken.parse("0:1") == FencingToken(0, 1)
    assert FencingToken.parse(str(t)) is FencingToken.parse("12:9001")  # cached: decoded with every record


@pytest.mark.parametrize("text", ["", "12", "12:", ":9", "a:b", "1:2:3", "-1:2", "1:-2", " 1:2", "1:2\n",
                                  "١:٢", "1.0:2"])
def test_bad_fencing_tokens_are_refused(text: str) -> None:
    with pytest.raises(InvalidArgument) as e:
        FencingToken.parse(text)
    assert e.value.field == "fencing_token" and "is not <partition>:<revision>" in e.value.reason


def test_a_start_is_refused_for_another_token_and_fenced_on_the_attempts() -> None:
    """The token at the protobuf edge (dispatch/starts.py): a worker's start request naming another
    claim than the attempt's is refused, naming both; the start CAS compares the owner key of the
    attempt's partition with the attempt's revision."""
    ks = Keyspace("/sched")
    rec = StartRecorder(kv=MemoryKV(), ledger=Ledger(ks, 16), ks=ks, partitions=16, clock=SYSTEM_CLOCK,
                        lookup=lambda _eid: None, on_started=lambda _e: None, notice_for=lambda _s, _p: ())
    e = new_execution(id=execution_id("s", T), schedule_id="s", tenant="t", pool="p", task_type="x", planned_ms=T,
                      due_ms=T, trigger=Trigger.SCHEDULED, retry=RetryPolicy(), timeout_ms=60_000)
    d = dispatch(e, worker="", planner="n", token=FencingToken(3, 42), now_ms=T)

    def req(partition: int, revision: int) -> Any:
        r = wpb.StartRequest(execution_id=d.id, attempt=1,
                             fencing_token=epb.FencingToken(partition=partition, revision=revision))
        return SimpleNamespace(r=r, worker="w", scope=None)

    for stale in ((3, 41), (4, 42), (0, 0)):
        assert rec._decide(req(*stale), d, T + 1) == f"fencing token {stale[0]}:{stale[1]} is not the attempt's 3:42"
    new = rec._decide(req(3, 42), d, T + 1)
    assert isinstance(new, Execution) and new.state is ExecState.RUNNING
    op = rec._op(d, new)
    assert Compare.create_revision(ks.owner(3), "==", 42) in op.compare


def test_dead_letter_index_key_and_value_are_pinned() -> None:
    ks, partitions = Keyspace("/sched"), 16
    p = partition_for("nightly", partitions)
    e = Execution(id=execution_id("nightly", T), schedule_id="nightly", tenant="acme", pool="pool",
                  task_type="shell", planned_ms=T, due_ms=T, trigger=Trigger.SCHEDULED, retry=RetryPolicy(),
                  timeout_ms=1000)
    dead = replace(e, state=ExecState.DEAD_LETTER)
    op = Ledger(ks, partitions).cas_op(dead, 7, payload=b"hi", now_ms=T + 5)
    (put,) = [x for x in op.success if isinstance(x, PutOp) and x.key.startswith(b"/sched/dead/")]
    assert put.key == f"/sched/dead/{p:05d}/nightly/1795946400123".encode() == ks.dead_letter(p, "nightly", T)
    assert put.value == (b'{"id":"nightly@2026-11-29T10:00:00.123Z","tenant":"acme","task":"shell",'
                         b'"dead_ms":1795946400128,"payload":"6869"}')
    entry = DeadLetterEntry.decode(ks, put.key, put.value)
    assert entry == DeadLetterEntry(ExecutionId("nightly", T), "acme", "shell", T + 5, b"hi")
    assert entry.execution_id == "nightly@2026-11-29T10:00:00.123Z" and entry.value() == put.value
    assert ks.dead_letters(p, "nightly") == f"/sched/dead/{p:05d}/nightly/".encode()
    assert DeadLetterEntry.payload_of(put.value) == b"hi"
    for unreadable in (b"[]", b'{"payload":"zz"}', b"not json"):
        assert DeadLetterEntry.payload_of(unreadable) is None
    assert json.loads(put.value)["id"] == dead.id


@pytest.mark.parametrize("when", ["0001-01-01T00:00:00.000Z", "1969-12-31T23:59:59.000Z"])
def test_an_execution_id_outside_the_ledgers_years_is_invalid_not_unknown(when: str) -> None:
    # An outside audit (session 36): 1969 answered NOT_FOUND, and year 1 said "expected 1-01-01T...", itself malformed.
    with pytest.raises(InvalidArgument, match="outside 1970-01-01") as e:
        ExecutionId.parse(f"a@{when}")
    assert e.value.field == "execution_id"
