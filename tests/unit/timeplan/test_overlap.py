"""Overlap decisions for each policy (Temporal's vocabulary), from the ledger's running/buffered view."""

from __future__ import annotations

import pytest

from scheduler.timeplan import Overlap
from scheduler.timeplan.overlap import OverlapAction, OverlapDecision, decide_overlap, next_buffered

A, B = "s@2026-01-01T00:00:00.000Z", "s@2026-01-01T00:01:00.000Z"


@pytest.mark.parametrize(
    ("policy", "running", "buffered", "expected"),
    [
        pytest.param(p, (), (), OverlapDecision(OverlapAction.START), id=f"{p.value}-idle") for p in Overlap
    ]
    + [
        pytest.param(Overlap.SKIP, (A,), (), OverlapDecision(OverlapAction.SKIP), id="skip-running"),
        pytest.param(Overlap.BUFFER_ONE, (A,), (), OverlapDecision(OverlapAction.BUFFER), id="buffer-one-first"),
        pytest.param(Overlap.BUFFER_ONE, (A,), (B,), OverlapDecision(OverlapAction.SKIP), id="buffer-one-full"),
        pytest.param(Overlap.BUFFER_ALL, (A,), (B,), OverlapDecision(OverlapAction.BUFFER), id="buffer-all"),
        pytest.param(
            Overlap.CANCEL_OTHER, (A,), (B,),
            OverlapDecision(OverlapAction.CANCEL_THEN_START, cancel=(A, B)), id="cancel-other",
        ),
        pytest.param(Overlap.ALLOW_ALL, (A,), (), OverlapDecision(OverlapAction.START), id="allow-all"),
    ],
)
def test_decide_overlap(
    policy: Overlap, running: tuple[str, ...], buffered: tuple[str, ...], expected: OverlapDecision
) -> None:
    assert decide_overlap(policy, running, buffered) == expected


def test_buffered_start_when_running_ends() -> None:
    assert next_buffered(Overlap.BUFFER_ALL, (), (A, B)) == A
    assert next_buffered(Overlap.BUFFER_ONE, (), (B,)) == B
    assert next_buffered(Overlap.BUFFER_ALL, (A,), (B,)) is None
    assert next_buffered(Overlap.SKIP, (), (B,)) is None
