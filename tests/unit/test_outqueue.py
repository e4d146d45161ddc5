"""Worker-stream messages queued one right behind another of the same kind are sent as one, in order."""

from __future__ import annotations

import asyncio

from scheduler._gen.scheduler.v1 import worker_service_pb2 as wpb
from scheduler.dispatch import conn
from scheduler.outqueue import MAX_JOINED_BYTES, JoiningQueue
from scheduler.worker import protocol


def _assign(eid: str, payload: bytes = b"") -> wpb.PlannerMessage:
    return wpb.PlannerMessage(assignments=wpb.Assignments(assignments=[wpb.Assignment(execution_id=eid, attempt=1,
                                                                                       payload=payload)]))


def _cancel(eid: str) -> wpb.PlannerMessage:
    return wpb.PlannerMessage(cancel=wpb.Cancel(execution_id=eid, attempt=1))


def _drain(q: asyncio.Queue[wpb.PlannerMessage | None]) -> list[wpb.PlannerMessage | None]:
    out = []
    while not q.empty():
        out.append(q.get_nowait())
    return out


def test_neighbours_of_one_kind_join_and_the_order_of_kinds_is_kept() -> None:
    q = conn.outgoing()
    for m in (_assign("a"), _assign("b"), _cancel("b"), _assign("c"),
              wpb.PlannerMessage(start_ack=wpb.StartAck(acks=[wpb.StartAckEntry(execution_id="a", attempt=1)])),
              wpb.PlannerMessage(start_ack=wpb.StartAck(acks=[wpb.StartAckEntry(execution_id="c", attempt=1)])),
              wpb.PlannerMessage(result_ack=wpb.ResultAck(acks=[wpb.ResultAckEntry(execution_id="a", attempt=1)])),
              wpb.PlannerMessage(result_ack=wpb.ResultAck(acks=[wpb.ResultAckEntry(execution_id="c", attempt=1)])),
              wpb.PlannerMessage(probe=wpb.Probe(seq=1)), wpb.PlannerMessage(probe=wpb.Probe(seq=2)), None):
        q.put_nowait(m)
    got = _drain(q)
    assert got[-1] is None, "the end of the stream is never joined"
    kinds = [m.WhichOneof("body") for m in got[:-1] if m is not None]
    assert kinds == ["assignments", "cancel", "assignments", "start_ack", "result_ack", "probe", "probe"]
    first, _, second, starts, results = got[:5]
    assert first is not None and [a.execution_id for a in first.assignments.assignments] == ["a", "b"]
    assert second is not None and [a.execution_id for a in second.assignments.assignments] == ["c"], \
        "an assignment queued after a cancel is not moved before it"
    assert starts is not None and [a.execution_id for a in starts.start_ack.acks] == ["a", "c"]
    assert results is not None and [a.execution_id for a in results.result_ack.acks] == ["a", "c"]


def test_a_message_taken_by_the_writer_is_not_joined_any_more() -> None:
    q = conn.outgoing()
    q.put_nowait(_assign("a"))
    taken = q.get_nowait()
    q.put_nowait(_assign("b"))
    assert taken is not None and [a.execution_id for a in taken.assignments.assignments] == ["a"]
    later = q.get_nowait()
    assert later is not None and [a.execution_id for a in later.assignments.assignments] == ["b"]


def test_a_joined_message_stays_within_the_byte_budget() -> None:
    q = conn.outgoing()
    payload = b"x" * 64 * 1024
    n = 100  # 6.4 MiB of payload: one message would pass gRPC's 4 MiB receive limit
    for i in range(n):
        q.put_nowait(_assign(f"e{i}", payload))
    got = [m for m in _drain(q) if m is not None]
    assert sum(len(m.assignments.assignments) for m in got) == n
    assert len(got) > 1 and all(m.ByteSize() <= MAX_JOINED_BYTES for m in got), [m.ByteSize() for m in got]
    assert [a.execution_id for m in got for a in m.assignments.assignments] == [f"e{i}" for i in range(n)]


def test_worker_messages_join_starts_results_and_credits() -> None:
    q = protocol.outgoing()
    q.put_nowait(wpb.WorkerMessage(credits=wpb.Credits(credits=2)))
    q.put_nowait(wpb.WorkerMessage(credits=wpb.Credits(credits=3)))
    q.put_nowait(wpb.WorkerMessage(started=wpb.Started(starts=[wpb.StartRequest(execution_id="a", attempt=1)])))
    q.put_nowait(wpb.WorkerMessage(started=wpb.Started(starts=[wpb.StartRequest(execution_id="b", attempt=1)])))
    q.put_nowait(protocol.results_message([wpb.Result(execution_id="a", attempt=1)]))
    q.put_nowait(protocol.results_message([wpb.Result(execution_id="b", attempt=1)]))
    q.put_nowait(wpb.WorkerMessage(heartbeat=wpb.Heartbeat()))
    q.put_nowait(wpb.WorkerMessage(heartbeat=wpb.Heartbeat()))
    got: list[wpb.WorkerMessage] = []
    while not q.empty():
        m = q.get_nowait()
        assert m is not None
        got.append(m)
    assert [m.WhichOneof("body") for m in got] == ["credits", "started", "results", "heartbeat", "heartbeat"]
    assert got[0].credits.credits == 5, "credit grants add up"
    assert [s.execution_id for s in got[1].started.starts] == ["a", "b"]
    assert [r.execution_id for r in got[2].results.results] == ["a", "b"]


async def test_a_getter_waiting_on_an_empty_queue_is_woken_by_a_put() -> None:
    q: JoiningQueue[wpb.PlannerMessage] = conn.outgoing()
    getter = asyncio.create_task(q.get())
    await asyncio.sleep(0)
    q.put_nowait(_assign("a"))
    q.put_nowait(_assign("b"))  # joins the first: the getter has been woken, not yet run
    m = await asyncio.wait_for(getter, 1)
    assert m is not None and [a.execution_id for a in m.assignments.assignments] == ["a", "b"]
    assert q.empty() and q.joined == 1


def test_results_with_output_tails_join_within_the_byte_budget() -> None:
    """A shell task's result carries up to 4 KiB of stdout and of stderr: counted, or 1,000 joined results made
    a message of 8 MiB against an estimate of a quarter of that."""
    q = protocol.outgoing()
    n = 1000
    for i in range(n):
        q.put_nowait(protocol.results_message([wpb.Result(execution_id=f"e{i}", attempt=1, stdout_tail="o" * 4096,
                                                          stderr_tail="e" * 4096)]))
    got: list[wpb.WorkerMessage] = []
    while not q.empty():
        m = q.get_nowait()
        assert m is not None
        got.append(m)
    assert sum(len(m.results.results) for m in got) == n
    assert all(m.ByteSize() <= MAX_JOINED_BYTES for m in got), max(m.ByteSize() for m in got)
