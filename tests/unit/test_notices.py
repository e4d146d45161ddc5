"""Notice keys (scheduler.store.notices): what the owner parses back out of a watch event."""

from __future__ import annotations

from scheduler.store.keyspace import Keyspace, partition_for
from scheduler.store.notices import Notice, notice_op, parse_notice

KS = Keyspace("/t/x")


def test_one_execution_round_trips() -> None:
    op = notice_op(KS, 16, "s.1:a-b", 1_767_225_600_000)
    p = partition_for("s.1:a-b", 16)
    assert op.key == KS.notice(p, "s.1:a-b", 1_767_225_600_000, 1_767_225_600_000)
    assert op.key.startswith(KS.notices(p)) and op.key.startswith(KS.notices())
    assert op.value == b"", "a plain notice costs only its key"
    assert parse_notice(op.key, op.value) == Notice(p, "s.1:a-b", 1_767_225_600_000, 1_767_225_600_000)


def test_a_range_and_a_cancel_round_trip() -> None:
    op = notice_op(KS, 4, "s", 1_000, 61_000, cancel_attempt=3, reason="operator: stop")
    n = parse_notice(op.key, op.value)
    assert n == Notice(partition_for("s", 4), "s", 1_000, 61_000, 3, "operator: stop")


def test_junk_is_not_a_notice_and_does_not_raise() -> None:
    for key, value in [(b"/t/x/notices/00001/s/nonsense", b""), (b"x", b""),
                       (KS.notice(1, "s", 1, 1), b"{not json"), (b"/t/x/notices/abc/s/1-1", b"")]:
        assert parse_notice(key, value) is None
