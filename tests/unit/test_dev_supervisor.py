"""`schedctl dev`'s supervisor stops its children in dependency order, whatever their number."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from scheduler.cli.dev import Supervisor

# A child that records its name when SIGTERM arrives, then exits.
CHILD = 'trap "echo $0 >> {log}; exit 0" TERM; while :; do sleep 0.02; done'


@pytest.mark.parametrize("workers", [0, 1, 2, 3])
def test_stop_all_signals_workers_then_the_planner_then_etcd(tmp_path: Path, workers: int) -> None:
    # With one worker, the planner and etcd were never signalled: they died of the parent-death
    # signal after `schedctl dev` exited, without handing their partitions back.
    log = tmp_path / "stopped.txt"
    sup = Supervisor(tmp_path, "info")
    names = ["etcd", "planner", *(f"worker-{i}" for i in range(1, workers + 1))]
    try:
        for name in names:
            sup.spawn(name, ["sh", "-c", CHILD.format(log=log), name])
        _wait_started(sup)
        sup.stop_all()
    finally:
        for c in sup.children:
            if c.proc.poll() is None:
                c.proc.kill()
                c.proc.wait()
    stopped = log.read_text().split()
    assert sorted(stopped[:workers]) == sorted(names[2:]) and stopped[workers:] == ["planner", "etcd"], stopped
    assert all(c.proc.returncode == 0 for c in sup.children), "each exited on its SIGTERM, none was killed"


def _wait_started(sup: Supervisor) -> None:
    """Until each shell has installed its trap (it sleeps in its loop by then)."""
    deadline = time.monotonic() + 10
    for c in sup.children:
        while "sleep" not in _children_cmdlines(c.proc.pid):
            assert time.monotonic() < deadline, f"{c.name} did not start"
            time.sleep(0.02)


def _children_cmdlines(pid: int) -> str:
    out = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        for child in (task / "children").read_text().split():
            try:
                out.append(Path(f"/proc/{child}/cmdline").read_bytes().decode(errors="replace"))
            except OSError:
                continue
    return " ".join(out)
