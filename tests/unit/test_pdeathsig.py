"""A child started through `with_pdeathsig` dies when its parent is SIGKILLed: setpriv and the prctl fallback."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from scheduler import pdeathsig

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="PR_SET_PDEATHSIG is Linux only")

# The parent: starts `sleep` through the helper, prints the child's pid, then waits to be killed.
_PARENT = textwrap.dedent("""
    import subprocess, sys, time
    from scheduler import pdeathsig
    if sys.argv[1] == "fallback":
        pdeathsig._SETPRIV = None
    argv, pre = pdeathsig.with_pdeathsig(["sleep", "60"])
    assert (pre is None) == (sys.argv[1] == "setpriv"), (argv, pre)
    child = subprocess.Popen(argv, preexec_fn=pre)
    print(child.pid, flush=True)
    time.sleep(60)
""")


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][0] != "Z"  # a zombie waits for init to reap it: dead
    except FileNotFoundError:
        return False


def _comm(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except FileNotFoundError:
        return ""


@pytest.mark.parametrize("way", ["setpriv", "fallback"])
def test_the_child_dies_with_its_parent(way: str) -> None:
    if way == "setpriv" and pdeathsig._SETPRIV is None:
        pytest.skip("setpriv not installed")
    parent = subprocess.Popen([sys.executable, "-c", _PARENT, way], stdout=subprocess.PIPE)
    try:
        assert parent.stdout is not None
        child = int(parent.stdout.readline())
        # setpriv sets the signal after its own exec, then execs sleep: wait for sleep (a parent killed
        # before that prctl leaves the child an orphan, a window of about a millisecond at startup).
        deadline = time.monotonic() + 10
        while _comm(child) != "sleep":
            assert time.monotonic() < deadline, f"the child never became sleep: {_comm(child)!r}"
            time.sleep(0.005)
    finally:
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait()
    deadline = time.monotonic() + 10
    while _alive(child):
        if time.monotonic() > deadline:
            os.kill(child, signal.SIGKILL)  # by pid: do not leave it behind
            pytest.fail(f"child {child} outlived its SIGKILLed parent")
        time.sleep(0.02)


def test_from_another_thread_the_child_is_started_unchanged() -> None:
    """The signal follows the forking thread: from a worker thread the child would die with that thread."""
    got: list[tuple[list[str], object]] = []
    t = threading.Thread(target=lambda: got.append(pdeathsig.with_pdeathsig(["true"])))
    t.start()
    t.join()
    assert got == [(["true"], None)]
