"""Worker processes for drills: `schedctl worker` (the product's worker with its `shell` and `http`
executors) started, crashed and stopped by pid.

A crash (F7, F5) kills the worker *and every process it started* (shell jobs lead their own process
groups, so a SIGKILL of the worker alone would leave them running): a worker host or container that
dies takes its jobs with it. The tree is frozen first (SIGSTOP) so that nothing forks while it is
collected, then SIGKILLed. A job that outlived its worker would report `end` to the sink while the
planner's retry runs, which I1 rightly calls two attempts at once (docs/drills.md, I1).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from chaos.infra.planners import schedctl_binary
from chaos.infra.procs import forget, spawn

__all__ = ["WorkerProcess", "descendants", "kill_tree"]


def _children(pid: int) -> list[int]:
    out: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                out += [int(x) for x in f.read().split()]
        except OSError:
            continue
    return out


def descendants(pid: int) -> list[int]:
    """Every process below `pid` (children, their children, ...), from /proc: Linux only."""
    seen: list[int] = []
    todo = _children(pid)
    while todo:
        p = todo.pop()
        if p in seen:
            continue
        seen.append(p)
        todo += _children(p)
    return seen


def kill_tree(pid: int) -> int:
    """SIGSTOP `pid` and its descendants (none can fork any more), then SIGKILL them all. Returns how many
    descendants were killed. Processes are named by pid only, never by name."""
    try:
        os.kill(pid, signal.SIGSTOP)
    except ProcessLookupError:
        return 0
    tree = descendants(pid)
    for p in tree:
        with contextlib.suppress(ProcessLookupError):
            os.kill(p, signal.SIGSTOP)
    tree = list(dict.fromkeys(tree + descendants(pid)))  # anything forked before its parent stopped
    for p in [pid, *tree]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(p, signal.SIGKILL)
    return len(tree)


@dataclass
class WorkerProcess:
    """One `schedctl worker`; `name` is its worker id and the sink's `X-Worker` (CHAOS_WORKER)."""

    name: str
    region: str
    planners: Sequence[str]
    log_path: Path
    pool: str = "default"
    settings: Mapping[str, str] = field(default_factory=dict)  # flag name (underscores) -> value
    env: Mapping[str, str] = field(default_factory=dict)
    prefix: Sequence[str] = ()  # argv in front (chaos/netns.py `prefix(node)`: inside its namespace; it execs)
    process: subprocess.Popen[bytes] | None = None
    paused: bool = False
    started_at: float = 0.0

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    @property
    def pid(self) -> int:
        assert self.process is not None, f"worker {self.name} was never started"
        return self.process.pid

    def argv(self) -> list[str]:
        args = [*self.prefix, schedctl_binary(), "worker", "--worker-id", self.name, "--pool", self.pool,
                "--region", self.region, "--planners", ",".join(self.planners), "--metrics-address", "127.0.0.1:0",
                # The drills' load runs shell commands (chaos/load.py); shell is opt-in per worker.
                "--allow-shell", "true"]
        for k, v in self.settings.items():
            args += ["--" + k.replace("_", "-"), v]
        return args

    def start(self) -> WorkerProcess:
        if self.running:
            raise RuntimeError(f"worker {self.name} is already running (pid {self.pid})")
        run_env = {k: v for k, v in os.environ.items() if not k.startswith("SCHED_")}
        run_env.update(self.env)
        run_env["CHAOS_WORKER"] = self.name  # the shell effects name their worker (chaos/sink.py)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.process = spawn(self.argv(), self.log_path, env=run_env)
        self.paused = False
        self.started_at = time.monotonic()
        return self

    def crash(self) -> int:
        """SIGKILL the worker and the jobs it started (see the module docstring); returns the jobs killed."""
        if not self.running:
            return 0
        n = kill_tree(self.pid)
        assert self.process is not None
        self.process.wait()
        forget(self.pid)
        self.paused = False
        return n

    def pause(self) -> None:
        os.kill(self.pid, signal.SIGSTOP)
        self.paused = True

    def resume(self) -> None:
        os.kill(self.pid, signal.SIGCONT)
        self.paused = False

    async def stop(self, timeout: float = 10.0) -> int | None:
        """SIGTERM (the worker drains: finishes or hands back its attempts), SIGKILL of the tree if it hangs."""
        if self.process is None:
            return None
        if self.process.poll() is None:
            if self.paused:
                self.resume()
            os.kill(self.pid, signal.SIGTERM)
            deadline = time.monotonic() + timeout
            while self.process.poll() is None and time.monotonic() < deadline:  # noqa: ASYNC110 (a child's exit)
                await asyncio.sleep(0.05)
            if self.process.poll() is None:
                self.crash()
        forget(self.pid)
        return self.process.poll()
