"""Issue 5, metrics and logs: the `/metrics` endpoints of a real `schedctl planner` and `schedctl worker`
(processes, against a real etcd) move as executions run; the start-lag cardinality guard holds; a bad
`metrics_address` is refused naming the field; execution event log lines are JSON with their ids."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import time
import urllib.request
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from chaos.infra.etcd import EtcdCluster
from chaos.infra.planners import PlannerSet, schedctl_binary
from chaos.infra.procs import forget, spawn
from scheduler.clock import SYSTEM_CLOCK
from scheduler.metrics.core import OTHER
from scheduler.model import Policies, RetryPolicy, Schedule
from scheduler.store.etcd import EtcdClient
from scheduler.store.keyspace import Keyspace
from scheduler.store.schedules import ScheduleStore

P = 4
CLEAN_ENV = {k: v for k, v in os.environ.items() if not k.startswith("SCHED_")}

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(port: int) -> Samples:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        text = r.read().decode()
    out: Samples = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


def series(samples: Samples, name: str) -> dict[frozenset[tuple[str, str]], float]:
    return {labels: v for (n, labels), v in samples.items() if n == name}


async def until(port: int, pred: Callable[[Samples], bool], what: str, timeout: float = 45.0) -> Samples:
    deadline = time.monotonic() + timeout
    last: Samples = {}
    while time.monotonic() < deadline:
        try:
            last = await asyncio.to_thread(scrape, port)
        except OSError:
            last = {}
        if last and pred(last):
            return last
        await asyncio.sleep(0.25)
    interesting = {k: v for k, v in last.items() if not k[0].startswith(("process_", "python_"))}
    raise AssertionError(f"timed out waiting for {what}; last scrape: {interesting}")


def json_lines(path: Path) -> list[dict[str, object]]:
    out = []
    for line in path.read_text(errors="replace").splitlines():
        if line.startswith("{"):
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
    return out


def _logged_port(log: Path, event: str) -> int | None:
    for r in json_lines(log) if log.exists() else []:
        if r.get("event") == event and r.get("address"):
            return int(str(r["address"]).rpartition(":")[2])
    return None


def _tail(log: Path) -> str:
    return log.read_text(errors="replace")[-2000:] if log.exists() else "(no log)"


async def logged_port(log: Path, proc: subprocess.Popen[bytes], event: str, timeout: float = 60.0) -> int:
    """The port of the first `event` line (e.g. `metrics_serving`) a process logged: it was told port 0."""
    deadline = time.monotonic() + timeout
    while (port := _logged_port(log, event)) is None:
        assert proc.poll() is None, f"exited ({proc.returncode}) before logging {event!r}:\n{_tail(log)}"
        assert time.monotonic() < deadline, f"no {event!r} line within {timeout:g}s:\n{_tail(log)}"
        await asyncio.sleep(0.05)
    return port


def stop(proc: subprocess.Popen[bytes], timeout: float = 15.0) -> None:
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
    forget(proc.pid)


@pytest.mark.etcd
async def test_planner_and_worker_metrics_move_as_executions_run(etcd_server: EtcdCluster, tmp_path: Path) -> None:
    prefix = f"/metrics-{uuid.uuid4().hex[:8]}"
    planners = PlannerSet(tmp_path / "planners", etcd_server.endpoints, prefix, partitions=P)
    worker: subprocess.Popen[bytes] | None = None
    worker_log = tmp_path / "worker.log"
    async with EtcdClient(etcd_server.config(timeout=2.0)) as kv:
        store = ScheduleStore(kv, Keyspace(prefix), P)
        policies = Policies(retry=RetryPolicy(max_attempts=2, initial_backoff_ms=100, max_backoff_ms=200))
        now = SYSTEM_CLOCK.wall_ms()
        # Four schedules, a guard of two: two get their own start-lag series, the others share _other.
        for i in range(3):
            await store.create(Schedule(id=f"ok-{i}", tenant="t", spec="* * * * * *", worker_pool="default",
                                        task_type="shell", payload=b'{"command": "true"}', policies=policies), now)
        # Exit 64 (EX_USAGE) is a permanent failure: dead-lettered at once.
        await store.create(Schedule(id="bad", tenant="t", spec="* * * * * *", worker_pool="default",
                                    task_type="shell", payload=b'{"command": "exit 64"}', policies=policies), now)
        try:
            # Every port of the processes' own choosing (0), read back from their logs.
            planner = planners.start("m1", log_level="debug", settings={
                "api_port": "0", "metrics_address": "127.0.0.1:0", "metrics_schedule_limit": "2"})
            api = await planner.serving()
            planner_metrics = int((await planner.serving(event="metrics_serving")).rpartition(":")[2])
            s = await until(planner_metrics, lambda s: value(s, "scheduler_partitions_owned") == P,
                            "the planner to own every partition")
            assert value(s, "scheduler_connected_workers", pool="default") == 0
            assert value(s, "execution_attempts_total", status="succeeded") == 0
            worker = spawn([schedctl_binary(), "worker", "--planners", api, "--worker-id", "w1",
                            "--metrics-address", "127.0.0.1:0", "--log-level", "debug",
                            "--heartbeat-interval", "0.2", "--allow-shell", "true"], worker_log, env=CLEAN_ENV)
            worker_metrics = await logged_port(worker_log, worker, "metrics_serving")

            def planner_moved(s: Samples) -> bool:
                lag = series(s, "scheduler_start_lag_seconds_count")
                return (value(s, "scheduler_connected_workers", pool="default") == 1
                        and value(s, "execution_attempts_total", status="succeeded") >= 6
                        and value(s, "execution_attempts_total", status="failed") >= 2
                        and value(s, "dead_letter_total", task_type="shell") >= 1
                        and frozenset({("schedule", OTHER)}) in lag and sum(lag.values()) >= 8)

            s = await until(planner_metrics, planner_moved, "attempts, workers and start lag on the planner")
            # The guard: exactly two schedules by name, everything else under _other.
            named = {dict(k)["schedule"] for k in series(s, "scheduler_start_lag_seconds_count")}
            assert len(named - {OTHER}) == 2 and OTHER in named, named
            assert named - {OTHER} <= {"ok-0", "ok-1", "ok-2", "bad"}
            assert value(s, "due_jobs_enqueued_total") >= sum(series(s, "scheduler_start_lag_seconds_count").values())
            assert value(s, "execution_attempts_total", status="timeout") == 0
            assert set(dict(k)["partition"] for k in series(s, "scheduler_lag_seconds")) == {str(p) for p in range(P)}
            assert len(series(s, "scheduler_checkpoint_watermark_timestamp_seconds")) == P
            assert value(s, "scheduler_lease_renew_latency_seconds_count") > 0
            assert value(s, "scheduler_fenced_txns_total") > 0
            assert value(s, "scheduler_fencing_rejections_total") == 0
            assert value(s, "scheduler_planner_rounds_total") > 0
            assert value(s, "process_cpu_seconds_total") > 0

            w = await until(worker_metrics, lambda w: (
                value(w, "execution_duration_ms_count", task_type="shell", status="succeeded") >= 6
                and value(w, "execution_duration_ms_count", task_type="shell", status="failed") >= 2),
                "execution durations on the worker")
            assert value(w, "scheduler_worker_connected_planners") == 1
            assert value(w, "scheduler_worker_assignments_received_total") >= 8

            stop(worker)
            s = await until(planner_metrics, lambda s: value(s, "scheduler_connected_workers", pool="default") == 0,
                            "the worker to disconnect")
            await planner.stop()
        finally:
            if worker is not None:
                stop(worker)
            planners.close()

    # --- logs: execution events are JSON lines with their ids -----------------------------------------
    records = planner.log_records()
    by_event: dict[str, list[dict[str, object]]] = {}
    for r in records:
        if "event" in r:
            by_event.setdefault(str(r["event"]), []).append(r)
    for event in ("dispatch", "result", "dead_letter"):
        assert by_event.get(event), f"no {event!r} line in the planner log:\n{planner.log_tail()}"
        for r in by_event[event]:
            assert {"execution_id", "schedule_id", "partition", "token"} <= r.keys(), r
            assert isinstance(r["partition"], int) and str(r["token"]).startswith(f"{r['partition']}:"), r
            assert str(r["execution_id"]).startswith(f"{r['schedule_id']}@"), r
    assert all(r["level"] == "info" and r["schedule_id"] == "bad" for r in by_event["dead_letter"])
    assert all(r["level"] == "debug" for r in by_event["dispatch"])
    finished = [r for r in json_lines(worker_log) if r.get("msg") == "execution finished"]
    assert finished, worker_log.read_text()[-2000:]
    for r in finished:
        assert {"execution_id", "schedule_id", "partition", "token"} <= r.keys(), r
        assert str(r["token"]).startswith(f"{r['partition']}:"), r


@pytest.mark.parametrize("command", ["planner", "worker"])
@pytest.mark.parametrize(("address", "message"), [
    ("nowhere", "metrics_address: 'nowhere' is not host:port"),
    ("127.0.0.1:99999", "metrics_address: '127.0.0.1:99999' is not host:port"),
])
def test_bad_metrics_address_exits_2_naming_the_field(command: str, address: str, message: str) -> None:
    r = subprocess.run([schedctl_binary(), command, "--metrics-address", address], env=CLEAN_ENV,
                       capture_output=True, text=True, timeout=30, check=False)
    assert r.returncode == 2, r.stderr
    assert r.stderr.startswith(f"schedctl: {message}"), r.stderr


@pytest.mark.parametrize("command", ["planner", "worker"])
def test_metrics_address_in_use_exits_2_naming_the_field(command: str) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        # Nothing reaches etcd or a planner before the endpoint is bound: the dead addresses never matter.
        extra = ["--etcd-endpoints", "127.0.0.1:1"] if command == "planner" else ["--planners", "127.0.0.1:1"]
        r = subprocess.run([schedctl_binary(), command, "--metrics-address", f"127.0.0.1:{port}", *extra],
                           env={**CLEAN_ENV, "SCHED_METRICS_ADDRESS": "off"}, capture_output=True, text=True,
                           timeout=30, check=False)
    assert r.returncode == 2, r.stderr
    assert f"schedctl: metrics_address: cannot listen on 127.0.0.1:{port}" in r.stderr, r.stderr
