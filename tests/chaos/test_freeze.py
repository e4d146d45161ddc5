"""freeze(): SIGSTOP that returns only once every thread of the process has stopped."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from chaos.infra.procs import _all_stopped, freeze

# Four threads spinning: the case kill(SIGSTOP) alone leaves running for a moment on another core.
_SPIN = "import threading\nfor _ in range(4): threading.Thread(target=lambda: [0 for _ in iter(int, 1)]).start()\n"


@pytest.mark.skipif(sys.platform != "linux", reason="reads /proc")
def test_freeze_returns_with_every_thread_stopped() -> None:
    p = subprocess.Popen([sys.executable, "-c", _SPIN])
    try:
        deadline = time.monotonic() + 10
        while len(os.listdir(f"/proc/{p.pid}/task")) < 5 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not _all_stopped(p.pid)
        freeze(p.pid)
        assert _all_stopped(p.pid)
        os.kill(p.pid, signal.SIGCONT)
        deadline = time.monotonic() + 5
        while _all_stopped(p.pid) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not _all_stopped(p.pid), "running again after SIGCONT"
    finally:
        p.kill()
        p.wait()
    assert _all_stopped(p.pid), "a process that is gone counts as stopped"
