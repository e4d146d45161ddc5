"""Processes that tests start: spawned so that nothing outlives the test run.

Finalizers stop them by pid; as backstops, an atexit hook SIGKILLs any still registered, and on
Linux each is started under `setpriv --pdeathsig KILL` so that even a SIGKILLed pytest leaves no
etcd, planner or worker behind. Nothing is ever stopped by name.
"""

from __future__ import annotations

import atexit
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from scheduler.pdeathsig import with_pdeathsig

_LIVE: dict[int, subprocess.Popen[bytes]] = {}  # pid -> process, for the atexit backstop


def _kill_leftovers() -> None:
    for pid, proc in list(_LIVE.items()):
        if proc.poll() is None:
            os.kill(pid, signal.SIGKILL)
            proc.wait()
        _LIVE.pop(pid, None)


atexit.register(_kill_leftovers)


def spawn(argv: Sequence[str], log_path: Path, *, env: Mapping[str, str] | None = None,
          stderr_to_log: bool = True) -> subprocess.Popen[bytes]:
    """Start argv with stdout (and stderr) appended to log_path, registered for the backstops."""
    args, pre = with_pdeathsig(argv)
    with log_path.open("ab") as log:
        proc = subprocess.Popen(args, stdout=log, stderr=log if stderr_to_log else subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, env=None if env is None else dict(env), preexec_fn=pre)
    _LIVE[proc.pid] = proc
    return proc


def forget(pid: int) -> None:
    """The process was stopped and reaped by its owner."""
    _LIVE.pop(pid, None)


def _all_stopped(pid: int) -> bool:
    """Every thread of `pid` is in the stopped state (or the process is gone)."""
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except FileNotFoundError:
        return True
    for tid in tids:
        try:
            stat = Path(f"/proc/{pid}/task/{tid}/stat").read_text()
        except (FileNotFoundError, ProcessLookupError):
            continue  # the thread ended
        if stat[stat.rindex(")") + 2] not in "Tt":  # the state field follows the parenthesised name
            return False
    return True


def freeze(pid: int, timeout: float = 1.0) -> None:
    """SIGSTOP `pid` and return once every thread of it has stopped. kill() only queues the stop: a
    multi-threaded process (etcd's Go runtime, a planner's gRPC threads) still runs on the other core
    for a moment, and CI saw a write to an etcd "paused" this way succeed (test_etcd_errors). Not on
    Linux, or past `timeout`, it returns anyway: the stop is under way."""
    os.kill(pid, signal.SIGSTOP)
    if sys.platform != "linux":
        return
    deadline = time.monotonic() + timeout
    while not _all_stopped(pid) and time.monotonic() < deadline:
        time.sleep(0.001)
