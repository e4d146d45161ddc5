"""Vouching (dispatch/vouch.py): a planner that no longer owns a partition tells its owner that a worker it
still hears runs an attempt that came on its stream; the owner keeps that orphan instead of giving it up.
Pure decisions, the rate limit, the notice's value, the owner's renewal, and the worker marking the origin
stream in each heartbeat. The end-to-end case over real etcd and gRPC is tests/store/test_vouch.py."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any, cast

from scheduler._gen.scheduler.v1 import worker_service_pb2 as wpb
from scheduler.clock import FakeClock
from scheduler.dispatch.conn import AttemptKey
from scheduler.dispatch.vouch import Vouches, to_vouch
from scheduler.store.etcd.ops import Compare, Op, PutOp
from scheduler.store.keyspace import Keyspace, partition_for
from scheduler.store.notices import notice_op, parse_notice
from scheduler.worker import protocol
from scheduler.worker.attempt import Attempt, State
from tests.unit.test_dispatch_liveness import EID, OTHER, Env, end, in_flight, running_on
from tests.worker.conftest import make_ctx

KS = Keyspace("/v")


def ra(eid: str, attempt: int = 1, origin: bool = True) -> wpb.RunningAttempt:
    return wpb.RunningAttempt(execution_id=eid, attempt=attempt, origin=origin)


def test_vouched_for_only_when_listed_as_from_this_stream_held_here_and_owned_elsewhere() -> None:
    held = {(EID, 1), (OTHER, 1)}
    listed = [ra(EID), ra(OTHER, origin=False), ra("third@2026-01-01T00:00:02.000Z")]
    assert to_vouch(listed, held, lambda eid: False) == [(EID, 1)], "not the origin; not held here"
    assert to_vouch(listed, held, lambda eid: True) == [], "this node owns it: its heartbeat adopts it instead"


class Txns:
    def __init__(self, fail: bool = False) -> None:
        self.ops: list[list[Op]] = []
        self.fail = fail

    async def txn(self, compare: Sequence[Compare], success: Sequence[Op] = (), failure: Sequence[Op] = (), *,
                  timeout: float | None = None) -> object:
        if self.fail:
            from scheduler.store.etcd.errors import EtcdError
            raise EtcdError("unavailable")
        self.ops.append(list(success))
        return object()


async def test_one_vouch_per_attempt_per_period_written_as_a_notice_for_the_owner() -> None:
    clock, kv = FakeClock(), Txns()
    v = Vouches(kv=cast(Any, kv), ks=KS, partitions=4, clock=clock, owns=lambda eid: False, every=1.0, timeout=1.0)
    held: set[AttemptKey] = {(EID, 1)}
    v.heard("w1", [ra(EID)], held)
    v.heard("w1", [ra(EID)], held)  # the next heartbeat, within the period: nothing more
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert len(kv.ops) == 1 and len(kv.ops[0]) == 1 and v.sent == 1
    put = kv.ops[0][0]
    assert isinstance(put, PutOp)
    n = parse_notice(put.key, put.value)
    assert n is not None and (n.schedule_id, n.held_attempt, n.worker) == ("s1", 1, "w1")
    assert n.partition == partition_for("s1", 4) and n.cancel_attempt == 0
    clock.advance(1.0)
    v.heard("w1", [ra(EID)], held)
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert len(kv.ops) == 2, "again once the period has passed, while the worker still lists it"


async def test_a_vouch_that_could_not_be_written_is_tried_again_at_the_next_heartbeat() -> None:
    clock, kv = FakeClock(), Txns(fail=True)
    v = Vouches(kv=cast(Any, kv), ks=KS, partitions=4, clock=clock, owns=lambda eid: False, every=1.0, timeout=1.0)
    v.heard("w1", [ra(EID)], {(EID, 1)})
    await asyncio.sleep(0)
    assert v.failed == 1 and v.sent == 0
    kv.fail = False
    v.heard("w1", [ra(EID)], {(EID, 1)})  # no period to wait: the last one never reached etcd
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert v.sent == 1


def test_a_vouch_notice_round_trips_and_a_cancel_notice_is_unchanged() -> None:
    put = notice_op(KS, 4, "s1", 5_000, held_attempt=3, worker="w9")
    n = parse_notice(put.key, put.value)
    assert n is not None and (n.held_attempt, n.worker, n.cancel_attempt, n.from_ms) == (3, "w9", 0, 5_000)
    cancel = notice_op(KS, 4, "s1", 5_000, cancel_attempt=2, reason="r")
    c = parse_notice(cancel.key, cancel.value)
    assert c is not None and (c.cancel_attempt, c.held_attempt, c.reason) == (2, 0, "r")
    assert parse_notice(put.key, b'{"h": "x"}') is None, "junk is no notice (a watch must go on)"


async def test_the_owner_keeps_a_vouched_orphan_past_its_wait_and_ignores_vouches_for_what_it_holds() -> None:
    env = Env({EID: in_flight()})
    env.live.expect([(EID, 1)])  # at its claim: nobody here holds it
    give_up = env.live.orphans[(EID, 1)]
    env.clock.advance(0.9)
    env.live.vouched((EID, 1), "w1")
    assert env.live.orphans[(EID, 1)] > give_up and env.live.orphans_vouched == 1
    env.clock.advance(0.5)  # past the first give-up time
    env.live.check(env.clock.monotonic())
    assert env.lost == [], "kept: its worker runs it, heard by another planner"
    env.clock.advance(1.2)  # no vouch for longer than the wait: the worker is gone after all
    env.live.check(env.clock.monotonic())
    assert env.lost == [[(EID, 1)]]
    env.live.vouched((OTHER, 1), "w1")
    assert (OTHER, 1) not in env.live.orphans and env.live.orphans_vouched == 1, "not an orphan: nothing to keep"


def test_a_worker_marks_the_attempts_whose_origin_each_stream_is() -> None:
    here = Attempt(make_ctx(execution_id=EID, attempt=1), b"", None, "p1:1", timeout=None)
    there = Attempt(make_ctx(execution_id=OTHER, attempt=1), b"", None, "p2:1", timeout=None)
    for a in (here, there):
        a.state, a.started_ms = State.RUNNING, 1
    listed = protocol.heartbeat_message([here, there], [], 0, origin="p1:1").heartbeat.running
    assert [(x.execution_id, x.origin) for x in listed] == [(EID, True), (OTHER, False)]
    assert not any(x.origin for x in protocol.running_pb([here, there])), "a Hello's list marks none"


async def test_a_vouch_seen_before_the_claim_gives_the_whole_wait_despite_an_old_end_here() -> None:
    env = Env({EID: running_on("w1")})
    end(env, env.conn("w1"))  # w1's stream here ended (cut from us) ...
    env.clock.advance(5.0)  # ... long before the claim
    env.live.vouched((EID, 1), "w1")  # the old owner's vouch, seen before we own the partition
    env.live.expect([(EID, 1)])
    assert env.live.orphans[(EID, 1)] == env.clock.monotonic() + 1.1, "the whole wait from the claim"
    other = Env({EID: running_on("w1")})
    end(other, other.conn("w1"))
    other.clock.advance(5.0)
    other.live.expect([(EID, 1)])  # no vouch: the old end counts, but a vouch on its way gets two intervals
    assert other.live.orphans[(EID, 1)] == other.clock.monotonic() + 0.2
