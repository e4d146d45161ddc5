"""The spliced execution encoder produces exactly the bytes of the plain json.dumps encoder, and the
state peek agrees with a full decode, for arbitrary records (ids and messages with quotes, escapes,
non-ASCII text and the `,"st":"` pattern itself)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.execution import Attempt, ErrorClass, ExecState, Execution, Trigger, new_execution
from scheduler.ids import ExecutionId, FencingToken
from scheduler.model import RetryPolicy
from scheduler.store.codec import _encode_execution_slow, decode_execution, encode_execution, peek_state
from scheduler.store.keyspace import Keyspace
from scheduler.timeplan import Overlap

_text = st.lists(st.sampled_from(['a', 'Z', '"', '\\', ',', ':', 'é', '\n', '€', '"st":"', ',"st":"x']),
                max_size=6).map("".join)
_ms = st.integers(min_value=0, max_value=2**45)

_attempts = st.builds(
    Attempt, attempt=st.integers(1, 9), worker=_text, planner=_text,
    token=st.builds(FencingToken, st.integers(0, 65_535), st.integers(1, 2**40)), dispatched_ms=_ms,
    deadline_ms=_ms, started_ms=_ms, finished_ms=_ms, error_class=st.none() | st.sampled_from(ErrorClass),
    message=_text, succeeded=st.booleans(), trigger=st.none() | st.sampled_from(Trigger),
    start_by_ms=_ms, never_started=st.booleans(), stdout_tail=_text, stderr_tail=_text,
    exit_code=st.none() | st.integers(-255, 255), stop_requested_ms=_ms, ran_ms=_ms).map(
    # the stored form keeps `succeeded` only for a finished attempt
    lambda a: a if a.finished_ms else Attempt(**{**a.__dict__, 'succeeded': False}))

_executions = st.builds(
    Execution, id=_text, schedule_id=st.sampled_from(["s1", "s2", 'q"uote', "é"]), tenant=_text, pool=_text,
    task_type=_text, planned_ms=_ms, due_ms=_ms, trigger=st.sampled_from(Trigger),
    retry=st.builds(RetryPolicy, st.integers(1, 20), st.integers(1, 10_000), st.integers(1, 100_000),
                    st.sampled_from([1.0, 2.0, 1.5, 3.25]), st.integers(0, 5)),
    timeout_ms=_ms, state=st.sampled_from(ExecState), attempt=st.integers(0, 9),
    attempts=st.lists(_attempts, max_size=3).map(tuple), next_attempt_ms=_ms, skip_reason=_text,
    # operator overrides (scheduler.api.operations): written only when set
    overlap=st.none() | st.sampled_from(Overlap), payload=st.none() | st.binary(max_size=40),
    attempt_base=st.integers(0, 9), run_trigger=st.none() | st.sampled_from(Trigger),
    reserved=st.none() | st.builds(FencingToken, st.integers(0, 65_535), st.integers(1, 2**40)))


@settings(max_examples=200, deadline=None)
@given(_executions)
def test_fast_encoder_matches_the_reference(e: Execution) -> None:
    # The same schedule id with other static fields must not reuse a stale cached fragment.
    assert encode_execution(e) == _encode_execution_slow(e)
    assert decode_execution(encode_execution(e)) == e


@settings(max_examples=200, deadline=None)
@given(_executions)
def test_peek_state_agrees_with_decode(e: Execution) -> None:
    assert peek_state(encode_execution(e)) is e.state


@settings(max_examples=100, deadline=None)
@given(_executions)
def test_new_execution_equals_the_dataclass_constructor(e: Execution) -> None:
    kw = dict(id=e.id, schedule_id=e.schedule_id, tenant=e.tenant, pool=e.pool, task_type=e.task_type,
              planned_ms=e.planned_ms, due_ms=e.due_ms, trigger=e.trigger, retry=e.retry, timeout_ms=e.timeout_ms)
    fast, slow = new_execution(**kw), Execution(**kw)  # type: ignore[arg-type]
    assert fast == slow and fast.__dict__ == slow.__dict__ and hash(fast) == hash(slow)


@given(st.sampled_from(["s1", "a/b", "x-y_z.9", "é/ü"]), st.integers(0, 2**40), st.sampled_from(["/sched", "/a/b"]))
def test_execution_and_dead_letter_keys_name_their_execution(sid: str, planned_ms: int, prefix: str) -> None:
    ks = Keyspace(prefix)
    assert ks.execution_id_of(ks.execution(3, sid, planned_ms)) == ExecutionId(sid, planned_ms)
    assert ks.dead_letter_of(ks.dead_letter(3, sid, planned_ms)) == ExecutionId(sid, planned_ms)
