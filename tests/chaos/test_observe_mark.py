"""`drill mark` (chaos/observe.py `mark`): the operator's fault windows in an observed run's faults.jsonl,
without a cluster (the observed drill that uses it end to end runs in full mode:
tests/integration/test_drill_observe.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from chaos.observe import mark
from chaos.record import FaultRecord


def windows(d: Path) -> dict[int, FaultRecord]:
    rows = [FaultRecord.from_json(json.loads(x)) for x in (d / "faults.jsonl").read_text().splitlines()]
    return {r.index: r for r in rows}  # the last line of each window is its state


def test_start_and_end_windows_in_order(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no fault window is open"):
        mark(tmp_path, "end")
    assert mark(tmp_path, "start", "F1", "s-p2") == 0
    assert mark(tmp_path, "start", "F3", "s-p1->etcd") == 1
    assert mark(tmp_path, "end") == 1  # the latest window still open
    w = windows(tmp_path)
    assert (w[0].type, w[0].target, w[0].end_ms, w[0].role) == ("F1", "s-p2", None, "planner")
    assert w[1].end_ms is not None and w[1].healthy_ms == w[1].end_ms >= w[1].start_ms
    assert mark(tmp_path, "end", index=0) == 0 and windows(tmp_path)[0].end_ms is not None
    with pytest.raises(ValueError, match="no fault window #7"):
        mark(tmp_path, "end", index=7)
