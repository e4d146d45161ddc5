"""`schedctl dev`'s supervisor stops its children in dependency order, whatever their number."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from scheduler.cli.dev import Supervisor

# A child that records its name when SIGTERM arrives, then exits. It says it is ready once its trap
# is installed: a signal before that would kill it with the default action.
CHILD = 'trap "echo $0 >> {log}; exit 0" TERM; echo $0 >> {ready}; while :; do sleep 0.02; done'


@pytest.mark.parametrize("workers", [0, 1, 2, 3])
def test_stop_all_signals_workers_then_the_planner_then_etcd(tmp_path: Path, workers: int) -> None:
    # With one worker, the planner and etcd were never signalled: they died of the parent-death
    # signal after `schedctl dev` exited, without handing their partitions back.
    log = tmp_path / "stopped.txt"
    ready = tmp_path / "ready.txt"
    sup = Supervisor(tmp_path, "info")
    names = ["etcd", "planner", *(f"worker-{i}" for i in range(1, workers + 1))]
    try:
        for name in names:
            sup.spawn(name, ["sh", "-c", CHILD.format(log=log, ready=ready), name])
        _wait_ready(ready, names)
        sup.stop_all()
    finally:
        for c in sup.children:
            if c.proc.poll() is None:
                c.proc.kill()
                c.proc.wait()
    stopped = log.read_text().split()
    assert sorted(stopped[:workers]) == sorted(names[2:]) and stopped[workers:] == ["planner", "etcd"], stopped
    assert all(c.proc.returncode == 0 for c in sup.children), "each exited on its SIGTERM, none was killed"


def _wait_ready(ready: Path, names: list[str]) -> None:
    """Until each shell has installed its trap. Each writes its name then; the first version looked
    for a `sleep` child in /proc, which a loaded CI machine once failed to show within 10 s."""
    deadline = time.monotonic() + 60
    while not (ready.exists() and sorted(ready.read_text().split()) == sorted(names)):
        assert time.monotonic() < deadline, f"not all started: {ready.read_text() if ready.exists() else ''}"
        time.sleep(0.02)
