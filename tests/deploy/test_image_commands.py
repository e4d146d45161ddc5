"""The image's commands in a plain virtualenv (no Docker engine here): a planner and a worker started as
the ENTRYPOINT starts them, with the image's environment (listen addresses moved to 127.0.0.1 and port 0),
answer the HEALTHCHECK's own command, and stop cleanly on SIGTERM, after which the check fails.

Serial (not in scripts/test.sh's PARALLEL list): it starts etcd and real processes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from chaos.infra.etcd import EtcdCluster
from chaos.infra.ports import unused_port
from chaos.infra.procs import forget, spawn
from tests.deploy import dockerfile

BIN = Path(sys.executable).parent
pytestmark = pytest.mark.etcd


def image_argv(*args: str) -> list[str]:
    """ENTRYPOINT + args, with tini (PID 1 in the image) left out and schedctl from this virtualenv."""
    ep = dockerfile.entrypoint()
    assert ep[:2] == ["/usr/bin/tini", "--"], ep
    return [str(BIN / ep[2]), *args]


def image_env(**overrides: str) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("SCHED_")}
    env = dockerfile.env()
    # The image listens on every interface; a test listens on loopback, on ports the kernel picks.
    env |= {"SCHED_API_HOST": "127.0.0.1", "SCHED_API_PORT": "0", "SCHED_HEALTH_ADDRESS": "127.0.0.1:0",
            "SCHED_METRICS_ADDRESS": "127.0.0.1:0"}
    return base | env | {"PATH": f"{BIN}:{os.environ['PATH']}"} | overrides


def logged_address(log: Path, event: str, proc: subprocess.Popen[bytes], timeout: float = 60) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for line in log.read_text(errors="replace").splitlines():
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if rec.get("event") == event:
                return str(rec["address"])
        assert proc.poll() is None, f"exited {proc.returncode}:\n{log.read_text()}"
        time.sleep(0.1)
    raise AssertionError(f"no {event!r} line in {log} within {timeout}s:\n{log.read_text()}")


def healthcheck(address: str) -> subprocess.CompletedProcess[str]:
    _, cmd = dockerfile.healthcheck()
    return subprocess.run([str(BIN / cmd[0]), *cmd[1:]], env=image_env(SCHED_HEALTHCHECK_ADDRESS=address),
                          capture_output=True, text=True, timeout=30, check=False)


@pytest.fixture
def started(tmp_path: Path) -> Iterator[list[subprocess.Popen[bytes]]]:
    procs: list[subprocess.Popen[bytes]] = []
    try:
        yield procs
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
            forget(p.pid)


def stop(proc: subprocess.Popen[bytes], timeout: float = 30) -> int:
    proc.send_signal(signal.SIGTERM)
    return proc.wait(timeout)


def test_worker_role(tmp_path: Path, started: list[subprocess.Popen[bytes]]) -> None:
    log = tmp_path / "worker.log"
    with unused_port() as nobody:  # no planner: the worker keeps trying and stays healthy
        proc = spawn(image_argv("worker"), log, env=image_env(SCHED_PLANNERS=f"127.0.0.1:{nobody}"))
        started.append(proc)
        address = logged_address(log, "health_serving", proc)
        r = healthcheck(address)
        assert r.returncode == 0, r.stderr
        assert stop(proc) == 0
    r = healthcheck(address)
    assert r.returncode == 1 and "cannot reach it" in r.stderr


def test_planner_role(tmp_path: Path, etcd_server: EtcdCluster, started: list[subprocess.Popen[bytes]]) -> None:
    log = tmp_path / "planner.log"
    proc = spawn(image_argv("planner"), log, env=image_env(
        SCHED_ETCD_ENDPOINTS=",".join(etcd_server.endpoints), SCHED_ETCD_PREFIX=f"/img-{uuid.uuid4().hex[:8]}",
        SCHED_NODE_ID="img-p1", SCHED_PARTITIONS="4"))
    started.append(proc)
    address = logged_address(log, "serving", proc)
    r = healthcheck(address)
    assert r.returncode == 0 and r.stdout == "", r.stderr  # --quiet
    assert stop(proc) == 0
    assert healthcheck(address).returncode == 1
