"""Children that die with their parent: the parent-death signal (Linux PR_SET_PDEATHSIG).

Used by `schedctl dev`'s supervisor and by the test and drill harness (chaos/infra/procs.py), so that
even a SIGKILLed parent leaves no etcd, planner or worker behind.

The signal must be set between fork and exec. util-linux's `setpriv --pdeathsig KILL` (Debian's
essential set) does it with no Python in the child, and execs (the child keeps its pid): a
`preexec_fn` is not safe in a process with threads (Python's docs), and one hung for 60 s before its
exec in a CI run under a pytest worker whose gRPC threads were live. Where setpriv is missing, a
preexec_fn that only calls prctl, resolved here in the parent (no dlopen in the child).

Left open: a parent SIGKILLed in the millisecond between setpriv's exec and its prctl leaves that
child running (the signal is not armed yet); the owners' stop-by-pid paths remain the primary stop.
"""

from __future__ import annotations

import ctypes
import shutil
import signal
import sys
import threading
from collections.abc import Callable, Sequence

_PR_SET_PDEATHSIG = 1
_SETPRIV = shutil.which("setpriv") if sys.platform == "linux" else None
_TIMEOUT = shutil.which("timeout") if sys.platform == "linux" else None
_PRCTL = ctypes.CDLL(None, use_errno=True).prctl if sys.platform == "linux" else None


def _die_with_parent() -> None:  # runs in the child between fork and exec (the fallback)
    if _PRCTL is not None:
        _PRCTL(_PR_SET_PDEATHSIG, signal.SIGKILL)


def with_pdeathsig(argv: Sequence[str]) -> tuple[list[str], Callable[[], None] | None]:
    """The argv and preexec_fn (for subprocess.Popen) that give the child SIGKILL when its parent dies.

    The kernel sends the signal when the forking *thread* exits, not the process: from any thread but
    the main one the child would die with that thread, so it is then started unchanged.
    """
    if sys.platform != "linux" or threading.current_thread() is not threading.main_thread():
        return list(argv), None
    if _SETPRIV is not None:
        return [_SETPRIV, "--pdeathsig", "KILL", "--", *argv], None
    return list(argv), _die_with_parent


def group_dies_with_parent(argv: Sequence[str], grace_s: float) -> list[str]:
    """argv for a child that leads its own process group (start it with `start_new_session=True`) and
    takes the whole group with it when the parent dies: the group gets SIGTERM, then SIGKILL after
    `grace_s`, the same escalation as a timeout or a cancel.

    For the shell executor: a worker SIGKILLed while a command ran left the command, and whatever it
    had started, running for ever, re-parented to init, while the planner gave the attempt up after the
    heartbeat timeout and retried it elsewhere: two attempts of one id running at the same time, two
    effects (an audit, `kill -9` of a `schedctl dev` worker). The parent-death signal reaches only the
    direct child, so the child is a group leader that forwards it: coreutils' `timeout` with no time
    limit (0), which on SIGTERM signals its whole group and kills it after `--kill-after`, and otherwise
    exits with the command's status or dies of the command's signal (so exit codes read as before).
    Where setpriv or timeout is missing (not Linux), argv unchanged. The signal follows the forking
    thread: an asyncio subprocess is forked by the thread running the loop, whose end is the worker's.
    """
    if _SETPRIV is None or _TIMEOUT is None:
        return list(argv)
    return [_SETPRIV, "--pdeathsig", "TERM", "--", _TIMEOUT, f"--kill-after={max(grace_s, 0.1):g}s", "0", *argv]
