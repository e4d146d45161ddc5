"""`schedctl worker` as an operator runs it: the installed binary in a subprocess, against a fake planner."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from scheduler._gen.scheduler.v1 import execution_pb2 as epb
from tests.worker.fake_planner import FakePlanner, assignment

SCHEDCTL = str(Path(sys.executable).parent / "schedctl")
CLEAN_ENV = {k: v for k, v in os.environ.items() if not k.startswith("SCHED_")}


@pytest.mark.parametrize(
    ("args", "env", "message"),
    [
        (["--concurrency", "0"], {}, "concurrency: 0 is outside 1-10000"),
        (["--concurrency", "many"], {}, "concurrency: 'many' is not a valid int"),
        (["--planners", "10.0.0.1"], {}, "planners[0]: '10.0.0.1' is not host:port"),
        (["--planners", "a:1,b:99999"], {}, "planners[1]: 'b:99999' is not host:port"),
        ([], {"SCHED_POOL": "bad pool"}, "pool: 'bad pool' must be"),
        ([], {"SCHED_HEARTBEAT_INTERVAL": "0"}, "heartbeat_interval: must be positive"),
        (["--reconnect-backoff-min", "2", "--reconnect-backoff-max", "1"], {}, "reconnect_backoff_max: must be >="),
        (["--log-level", "chatty"], {}, "log_level: 'chatty' is not a level"),
    ],
)
def test_invalid_settings_exit_2_naming_the_field(args: list[str], env: dict[str, str], message: str) -> None:
    r = subprocess.run([SCHEDCTL, "worker", *args], env={**CLEAN_ENV, **env}, capture_output=True, text=True,
                       timeout=30, check=False)
    assert r.returncode == 2
    assert r.stderr.strip() == f"schedctl: {message}" or r.stderr.startswith(f"schedctl: {message}"), r.stderr


def test_toml_unknown_key_and_precedence(tmp_path: Path) -> None:
    cfg = tmp_path / "worker.toml"
    cfg.write_text('pool = "from-toml"\nconcurency = 4\n')
    r = subprocess.run([SCHEDCTL, "worker", "--config", str(cfg)], env=CLEAN_ENV, capture_output=True, text=True,
                       timeout=30, check=False)
    assert r.returncode == 2 and "config.concurency: unknown setting" in r.stderr


async def test_runs_shell_tasks_logs_them_and_drains_on_sigterm(planner: FakePlanner, tmp_path: Path) -> None:
    out = tmp_path / "out"
    cfg = tmp_path / "worker.toml"
    cfg.write_text('pool = "from-toml"\nconcurrency = 1\nworker_id = "toml-id"\n')
    proc = await asyncio.create_subprocess_exec(
        SCHEDCTL, "worker", "--config", str(cfg), "--planners", planner.address, "--concurrency", "2",
        "--heartbeat-interval", "0.05", "--drain-grace", "0.5", "--shell-kill-grace", "0.2", "--allow-shell", "true",
        "--log-level", "debug",  # per-execution lines are DEBUG
        env={**CLEAN_ENV, "SCHED_WORKER_ID": "cli-w", "SCHED_REGION": "eu"},
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        conn = await planner.conn(timeout=15)
        # Flags beat the environment, which beats the file.
        assert (conn.hello.worker_id, conn.hello.pool, conn.hello.region, conn.hello.capacity) == (
            "cli-w", "from-toml", "eu", 2)
        assert list(conn.hello.task_types) == ["http", "shell"]
        await planner.wait_for(lambda: conn.credits)
        quick = assignment(1, task_type="shell", partition=3, revision=17,
                           payload=json.dumps({"command": f'echo "$SCHED_FENCING_TOKEN" > {out}'}).encode())
        conn.assign(quick)
        await planner.wait_for(lambda: conn.credits, what="credit after the first assignment")
        slow = assignment(2, task_type="shell", payload=b'{"command": "sleep 30"}')
        conn.assign(slow)
        await planner.wait_for(lambda: conn.results, what="first result")
        await asyncio.sleep(0.2)
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), 10) == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.stderr is not None
    log_lines = [json.loads(line) for line in (await proc.stderr.read()).decode().splitlines() if line.strip()]
    assert out.read_text().strip() == "3:17"
    by_id = {r.execution_id: r for r in conn.results}
    assert by_id[quick.execution_id].outcome == epb.ATTEMPT_OUTCOME_SUCCEEDED
    assert (by_id[slow.execution_id].error_class, by_id[slow.execution_id].message) == (
        epb.ERROR_CLASS_TRANSIENT, "worker draining")
    assert conn.of_kind("drain")[0].reason == "SIGTERM"
    events = [x for x in log_lines if x["msg"] in ("execution started", "execution finished")]
    assert len(events) == 4
    for e in events:
        assert {"execution_id", "schedule_id", "attempt", "partition", "token"} <= e.keys()
    started = next(e for e in events if e["execution_id"] == quick.execution_id)
    assert (started["schedule_id"], started["attempt"], started["partition"], started["token"]) == (
        "sched-a", 1, 3, "3:17")
    assert any(x["msg"] == "worker closed" for x in log_lines)
