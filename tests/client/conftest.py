from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from chaos.infra.procs import forget, spawn
from scheduler.client import SchedulerClient
from tests.client.fake_server import FakeApi, start_fake


@pytest.fixture
async def fake() -> AsyncIterator[tuple[FakeApi, str]]:
    api = FakeApi()
    server, address = await start_fake(api)
    try:
        yield api, address
    finally:
        await server.stop(grace=None)


@pytest.fixture
async def client(fake: tuple[FakeApi, str]) -> AsyncIterator[SchedulerClient]:
    async with SchedulerClient(fake[1], timeout=5.0) as c:
        yield c


@pytest.fixture
def fake_server_process(tmp_path: Path) -> Iterator[str]:
    """The fake in a process of its own, for blocking callers (the sync wrapper).

    Not a thread of this process: grpc.aio on a second thread's event loop, next to the sync
    client's own loop, hung its server's stop about once in ten runs. A process shares nothing,
    and is stopped by pid."""
    log = tmp_path / "fake_server.log"
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")]))}
    proc = spawn([sys.executable, str(Path(__file__).with_name("fake_server.py"))], log, env=env)
    try:
        deadline = time.monotonic() + 60  # imports on a loaded machine
        while not (m := re.search(r"^serving (\S+)$", log.read_text(errors="replace"), re.M)):
            assert proc.poll() is None, f"the fake server exited ({proc.returncode}):\n{log.read_text()}"
            assert time.monotonic() < deadline, f"the fake server did not start within 60 s:\n{log.read_text()}"
            time.sleep(0.05)
        yield m[1]
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGTERM)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait()
        forget(proc.pid)
