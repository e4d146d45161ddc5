"""Whatever a client sends, a ScheduleService call answers with a deliberate status: never INTERNAL
(the server's "unexpected error"), and a refused create stores nothing. Property-based over the
request fields (hypothesis), handlers called directly with a context that records the abort.

Every test runs twice: with auth off, and with auth on as a principal drawn from one limited to tenant
`t` (writer and operator), a reader of `t`, and one of another tenant (issue 14): PERMISSION_DENIED is
then deliberate too, and a refused request changes nothing (every key and its mod_revision compared).

CI runs 200 examples per test, a few thousand requests. SCHED_FULL=1 (scripts/test.sh) runs FULL_EXAMPLES per
test, over 100,000 requests with auth on in all; the last test checks that count was reached and prints it."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Coroutine, Iterator
from typing import Any, TypeVar, cast

import grpc
import pytest
from google.protobuf.timestamp_pb2 import Timestamp
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scheduler._gen.scheduler.v1 import schedule_pb2 as pb
from scheduler._gen.scheduler.v1 import schedule_service_pb2 as spb
from scheduler.api.errors import Context
from scheduler.api.operations import Operations
from scheduler.api.schedule_service import ScheduleService
from scheduler.auth.access import Authz
from scheduler.auth.current import set_current
from scheduler.auth.principal import Grant, Principal, Role
from scheduler.clock import FakeClock
from scheduler.store.keyspace import Keyspace
from scheduler.store.ledger import Ledger
from scheduler.store.memory import MemoryKV
from scheduler.store.schedules import ScheduleStore

NOW = 1_795_946_400_000
FULL = os.environ.get("SCHED_FULL") == "1"
FULL_EXAMPLES = 10_000  # per test and mode: with auth on, over 100,000 requests over the module's tests
AUTH_ON_TARGET = 100_000
# Requests answered with auth on in this process, by status code name (the full mode's count and its proof
# that none was INTERNAL).
SEEN: dict[str, int] = {}
T = TypeVar("T")

# One event loop for every example of the module. A new loop per example (asyncio.run) means hundreds
# of loop teardowns in a process where grpc.aio is initialized (other tests run servers), and one CI
# run hung in a thread join during such a teardown (grpc's poller thread).
_LOOP = asyncio.new_event_loop()


def _run(aw: Coroutine[Any, Any, T]) -> T:
    return _LOOP.run_until_complete(aw)


@pytest.fixture(scope="module", autouse=True)
def _close_loop() -> Iterator[None]:
    yield
    _LOOP.close()


class Aborted(Exception):
    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(code, details)
        self.code, self.details = code, details


class Ctx:
    async def abort(self, code: grpc.StatusCode, details: str = "", trailing_metadata: Any = ()) -> None:
        raise Aborted(code, details)

    def invocation_metadata(self) -> tuple[()]:
        return ()


def ctx() -> Context:
    return cast(Context, Ctx())


FUZZER = Principal("token:fuzzer", frozenset({Grant("t", Role.WRITER), Grant("t", Role.OPERATOR)}))
READER = Principal("token:reader", frozenset({Grant("t", Role.READER)}))
OUTSIDER = Principal("token:outsider", frozenset({Grant("other", Role.WRITER), Grant("other", Role.OPERATOR)}))
ADMIN = Principal("token:admin", frozenset({Grant("system", Role.ADMIN)}))
principals = st.sampled_from([FUZZER, READER, OUTSIDER])
modes = pytest.mark.parametrize("auth", [False, True], ids=["auth-off", "auth-on"])


def service(auth: bool = False) -> tuple[ScheduleService, MemoryKV]:
    kv, ks, clock = MemoryKV(), Keyspace("/f"), FakeClock(NOW)
    store, ledger = ScheduleStore(kv, ks, 4), Ledger(ks, 4)
    ops = Operations(kv, ks, 4, store, ledger, clock, rpc_timeout=1.0)
    return ScheduleService(kv=kv, ks=ks, store=store, ledger=ledger, clock=clock, ops=ops, rpc_timeout=1.0,
                           authz=Authz(enabled=auth, pools={"p": frozenset({"t"})} if auth else {})), kv


def seen(auth: bool, code: grpc.StatusCode) -> grpc.StatusCode:
    if auth:
        SEEN[code.name] = SEEN.get(code.name, 0) + 1
    return code


async def attempt(aw: Awaitable[object], auth: bool = False) -> tuple[grpc.StatusCode, str]:
    try:
        await aw
    except Aborted as e:
        return seen(auth, e.code), e.details
    return seen(auth, grpc.StatusCode.OK), ""


async def snapshot(kv: MemoryKV) -> dict[bytes, tuple[bytes, int]]:
    r = await kv.range(b"/f/", prefix=True)
    return {x.key: (x.value, x.mod_revision) for x in r.kvs}


async def call(method: str, request: Any, auth: bool = False, who: Principal = FUZZER) -> grpc.StatusCode:
    """One request against a fresh service; a refused one must leave the store as it was (empty)."""
    svc, kv = service(auth)
    set_current(who if auth else None)
    try:
        code, _ = await attempt(getattr(svc, method)(request, ctx()), auth)
        if code is not grpc.StatusCode.OK:
            assert await snapshot(kv) == {}, f"refused {method} wrote"
        return code
    finally:
        await kv.close()


# Mostly valid names, so that generated schedules get past the id checks to the deeper fields.
valid_names = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,20}", fullmatch=True)
names = st.one_of(valid_names, valid_names, valid_names, st.text(max_size=140))
good_specs = st.sampled_from(["* * * * *", "*/5 * * * *", "0 0 L * *", "@every 90s", "H H * * *", "@daily",
                              "0 0 30 2 *", "* * * * * *"])
specs = st.one_of(good_specs, good_specs, st.text(max_size=60))
stamps = st.builds(lambda s, n: Timestamp(seconds=s, nanos=n),
                   st.integers(-10**11, 10**11), st.integers(0, 999_999_999))
enums = st.integers(0, 7)
durations = st.integers(-10**6, 10**11)


@st.composite
def schedules(draw: st.DrawFn) -> pb.Schedule:
    s = pb.Schedule(id=draw(names), tenant=draw(names), spec=draw(specs), worker_pool=draw(names),
                    task_type=draw(names), time_zone=draw(st.sampled_from(["", "UTC", "Europe/London", "Nowhere",
                                                                            "Europe", "x" * 300])),
                    # Sizes around the 64 KiB limit without making hypothesis generate that much data.
                    payload=draw(st.one_of(st.binary(max_size=100), st.sampled_from([b"x" * 65_536, b"x" * 65_537]))),
                    state=draw(enums),  # type: ignore[arg-type]
                    labels=draw(st.one_of(st.dictionaries(valid_names, st.text(max_size=20), max_size=3),
                                          st.dictionaries(st.text(max_size=70), st.text(max_size=300), max_size=40))))
    if draw(st.booleans()):
        s.start_at.CopyFrom(draw(stamps))
    if draw(st.booleans()):
        s.end_at.CopyFrom(draw(stamps))
    if draw(st.booleans()):
        return s
    p = s.policies
    p.overlap, p.dst_gap, p.dst_overlap = draw(enums), draw(enums), draw(enums)  # type: ignore[assignment]
    p.missed_runs.policy = draw(enums)  # type: ignore[assignment]
    if draw(st.booleans()):
        p.jitter.seconds = draw(durations)
    if draw(st.booleans()):
        p.retry.max_attempts = draw(st.integers(0, 2**32 - 1))
        p.retry.backoff_multiplier = draw(st.floats(allow_nan=True, allow_infinity=True))
        p.retry.initial_backoff.seconds = draw(durations)
    return s


DELIBERATE = {grpc.StatusCode.OK, grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND,
              grpc.StatusCode.PERMISSION_DENIED}
FUZZ = settings(max_examples=FULL_EXAMPLES if FULL else 200, deadline=None,
                suppress_health_check=[HealthCheck.too_slow])


@modes
@FUZZ
@given(schedules(), st.text(max_size=200), principals)
def test_create_never_internal(auth: bool, s: pb.Schedule, request_id: str, who: Principal) -> None:
    async def run() -> None:
        svc, kv = service(auth)
        set_current(who if auth else None)
        try:
            code, details = await attempt(svc.CreateSchedule(
                spb.CreateScheduleRequest(schedule=s, request_id=request_id), ctx()), auth)
            assert code in DELIBERATE, (code, details)
            if code is not grpc.StatusCode.OK:
                stored = await kv.range(b"/f/", prefix=True, count_only=True)
                assert stored.count == 0  # refused: nothing written
        finally:
            await kv.close()

    _run(run())


@modes
@FUZZ
@given(schedules(), st.lists(st.text(max_size=40), max_size=5), principals)
def test_update_never_internal(auth: bool, s: pb.Schedule, paths: list[str], who: Principal) -> None:
    async def run() -> None:
        svc, kv = service(auth)
        try:
            set_current(ADMIN if auth else None)
            base = pb.Schedule(id="fz", tenant="t", spec="* * * * *", worker_pool="p", task_type="x")
            created = await svc.CreateSchedule(spb.CreateScheduleRequest(schedule=base), ctx())
            s.id = "fz"
            req = spb.UpdateScheduleRequest(schedule=s)
            req.update_mask.paths.extend(paths)
            set_current(who if auth else None)
            before = await snapshot(kv)
            code, details = await attempt(svc.UpdateSchedule(req, ctx()), auth)
            assert code in DELIBERATE, (code, details)
            if auth and who is not FUZZER:
                assert code is not grpc.StatusCode.OK  # a reader, another tenant: never allowed to change it
            if code is not grpc.StatusCode.OK:
                set_current(ADMIN if auth else None)
                got = await svc.GetSchedule(spb.GetScheduleRequest(id="fz"), ctx())
                assert got.schedule == created.schedule  # refused: unchanged
                assert await snapshot(kv) == before
        finally:
            await kv.close()

    _run(run())


@modes
@FUZZ
@given(st.text(max_size=300), names, enums, st.integers(-5, 5000), st.text(max_size=100))
def test_list_never_internal(auth: bool, selector: str, tenant: str, state: int, size: int, token: str) -> None:
    code = _run(call("ListSchedules", spb.ListSchedulesRequest(
        label_selector=selector, tenant=tenant, state=state, page_size=size, page_token=token), auth))  # type: ignore[arg-type]
    assert code in DELIBERATE


@modes
@FUZZ
@given(st.text(max_size=200), st.lists(enums, max_size=4), st.one_of(st.none(), stamps), st.text(max_size=50))
def test_execution_reads_never_internal(auth: bool, eid: str, states: list[int], start: Any, token: str) -> None:
    assert _run(call("GetExecution", spb.GetExecutionRequest(execution_id=eid), auth)) in DELIBERATE
    req = spb.ListExecutionsRequest(schedule_id=eid[:20], states=states, page_token=token)  # type: ignore[arg-type]
    if start is not None:
        req.planned.start.CopyFrom(start)
    assert _run(call("ListExecutions", req, auth)) in DELIBERATE
    assert _run(call("ListDeadLetters", spb.ListDeadLettersRequest(task_type=eid[:70], page_token=token), auth)) \
        in DELIBERATE
    skips = spb.ListSkipsRequest(schedule_id=eid[:20], page_token=token)
    if start is not None:
        skips.planned.start.CopyFrom(start)
    assert _run(call("ListSkips", skips, auth)) in DELIBERATE


@modes
@FUZZ
@given(specs, st.sampled_from(["", "UTC", "Europe/London", "x" * 300]), st.one_of(st.none(), stamps),
       st.integers(0, 2000), names)
def test_preview_never_internal(auth: bool, spec: str, tz: str, after: Any, count: int, sid: str) -> None:
    req = spb.PreviewScheduleRequest(spec=spb.PreviewSpec(spec=spec, time_zone=tz, schedule_id=sid), count=count)
    if after is not None:
        req.after.CopyFrom(after)
    assert _run(call("PreviewSchedule", req, auth)) in DELIBERATE


# ---- a sequence of calls on one store, by every principal: a refused call changes nothing -----------------

OTHER_TENANT_ID, OWN_ID = "o-1", "t-1"
OWNER = {OWN_ID: FUZZER, OTHER_TENANT_ID: OUTSIDER}  # the one principal that may change each
MUTATING = frozenset({"PauseSchedule", "ResumeSchedule", "DeleteSchedule", "TriggerSchedule"})
ids = st.one_of(st.sampled_from([OWN_ID, OTHER_TENANT_ID, "missing"]), names)
STATEFUL = DELIBERATE | {grpc.StatusCode.ALREADY_EXISTS, grpc.StatusCode.FAILED_PRECONDITION,
                         grpc.StatusCode.ABORTED}
requests = st.one_of(
    st.builds(lambda i, r, c: ("PauseSchedule", spb.PauseScheduleRequest(id=i, reason=r, cancel_running=c)),
              ids, st.text(max_size=20), st.booleans()),
    st.builds(lambda i: ("ResumeSchedule", spb.ResumeScheduleRequest(id=i)), ids),
    st.builds(lambda i, c: ("DeleteSchedule", spb.DeleteScheduleRequest(id=i, cancel_running=c)), ids, st.booleans()),
    st.builds(lambda i: ("TriggerSchedule", spb.TriggerScheduleRequest(id=i)), ids),
    st.builds(lambda i: ("GetSchedule", spb.GetScheduleRequest(id=i)), ids),
    st.builds(lambda sc: ("CreateSchedule", spb.CreateScheduleRequest(schedule=sc)), schedules()),
    st.builds(lambda i, r: ("CancelExecution", spb.CancelExecutionRequest(execution_id=i, reason=r)),
              ids, st.text(max_size=20)),
)


@FUZZ
@given(st.lists(st.tuples(requests, principals), min_size=1, max_size=6))
def test_refused_calls_change_nothing_with_auth_on(calls: list[tuple[tuple[str, Any], Principal]]) -> None:
    """Schedules of tenant `t` and of another tenant exist; each drawn call by each drawn principal is answered
    deliberately, and every refused one leaves every key and mod_revision as they were."""
    async def run() -> None:
        svc, kv = service(True)
        try:
            set_current(ADMIN)
            for sid, tenant in ((OWN_ID, "t"), (OTHER_TENANT_ID, "other")):
                await svc.CreateSchedule(spb.CreateScheduleRequest(schedule=pb.Schedule(
                    id=sid, tenant=tenant, spec="* * * * *", worker_pool="p" if tenant == "t" else "q",
                    task_type="x")), ctx())
            for (method, request), who in calls:
                set_current(who)
                before = await snapshot(kv)
                code, details = await attempt(getattr(svc, method)(request, ctx()), True)
                assert code in STATEFUL, (method, code, details)
                if code is not grpc.StatusCode.OK:
                    assert await snapshot(kv) == before, (method, who.name, code)
                elif method in MUTATING and getattr(request, "id", "") in OWNER:
                    assert who is OWNER[request.id], (method, who.name, request.id)  # only its tenant's writer
        finally:
            await kv.close()

    _run(run())


@pytest.mark.slow
def test_the_full_mode_reached_its_request_count(capsys: pytest.CaptureFixture[str]) -> None:
    """Last in the module (SCHED_FULL=1 only): how many requests the tests above made with auth on, all
    deliberate (the tests assert that per request), and at least AUTH_ON_TARGET of them."""
    total = sum(SEEN.values())
    with capsys.disabled():
        print(f"\nfuzz, auth on: {total} requests: {dict(sorted(SEEN.items()))}")
    assert "INTERNAL" not in SEEN and "UNKNOWN" not in SEEN
    assert total >= AUTH_ON_TARGET, total
