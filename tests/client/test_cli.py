"""The real `schedctl` binary against the fake API over gRPC: output, --json, exit codes, messages."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from chaos.infra.ports import unused_port
from scheduler._gen.scheduler.v1 import cluster_pb2 as cpb
from scheduler._gen.scheduler.v1 import execution_pb2 as epb
from scheduler._gen.scheduler.v1 import schedule_service_pb2 as sspb
from scheduler.cli import planner as planner_cli
from scheduler.cli.main import build_parser, main
from tests.client.fake_server import FakeApi

SCHEDCTL = str(Path(sys.executable).parent / "schedctl")
CLEAN_ENV = {k: v for k, v in os.environ.items() if not k.startswith("SCHED_")} | {"XDG_CONFIG_HOME": "/nonexistent"}
T0 = 1_780_000_000_000


@dataclass
class Result:
    rc: int
    out: str
    err: str

    def json(self) -> dict[str, object]:
        value = json.loads(self.out)
        assert isinstance(value, dict)
        return value


async def schedctl(*args: str, server: str | None = None, env: dict[str, str] | None = None) -> Result:
    argv = [SCHEDCTL, *args] + (["--server", server] if server else [])
    proc = await asyncio.create_subprocess_exec(*argv, env={**CLEAN_ENV, **(env or {})},
                                                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode is not None
    return Result(proc.returncode, out.decode(), err.decode())


async def test_schedule_crud_tables_and_json(fake: tuple[FakeApi, str]) -> None:
    api, srv = fake
    r = await schedctl("schedule", "create", "--id", "hello", "--cron", "*/5 * * * * *", "--command", "echo hi",
                       "--label", "team=ops", "--max-attempts", "3", "--jitter", "2s", "--overlap", "buffer_one",
                       server=srv)
    assert r.rc == 0, r.err
    assert "hello" in r.out and "version" in r.out
    sent = api.schedules["hello"]
    assert (sent.tenant, sent.worker_pool, sent.task_type) == ("default", "default", "shell")
    assert json.loads(sent.payload) == {"command": "echo hi"}
    assert sent.policies.retry.max_attempts == 3 and sent.policies.jitter.ToMilliseconds() == 2000
    assert dict(sent.labels) == {"team": "ops"}

    r = await schedctl("schedule", "get", "hello", "--json", server=srv)
    assert r.rc == 0 and r.json()["id"] == "hello" and r.json()["version"] == "1"

    r = await schedctl("schedule", "list", server=srv)
    assert r.rc == 0
    header, row = r.out.splitlines()
    assert header.split()[:3] == ["ID", "TENANT", "STATE"] and row.split()[:3] == ["hello", "default", "active"]

    r = await schedctl("schedule", "update", "hello", "--cron", "@hourly", "--expected-version", "1", "--json",
                       server=srv)
    assert r.rc == 0, r.err
    assert r.json()["spec"] == "@hourly"
    assert list(api.calls[-1][1].update_mask.paths) == ["spec"]  # only what was given is changed

    r = await schedctl("schedule", "update", "hello", "--cron", "@daily", "--expected-version", "1", server=srv)
    assert r.rc == 4 and "version 1 is stale" in r.err and "get it again" in r.err

    r = await schedctl("schedule", "pause", "hello", "--reason", "maintenance", "--json", server=srv)
    assert r.rc == 0 and r.json()["state"] == "SCHEDULE_STATE_PAUSED"
    r = await schedctl("schedule", "trigger", "hello", server=srv)
    assert r.rc == 4 and "paused" in r.err
    r = await schedctl("schedule", "resume", "hello", server=srv)
    assert r.rc == 0 and "active" in r.out

    r = await schedctl("schedule", "preview", "hello", "--count", "3", "--json", server=srv)
    # The proto JSON mapping of PreviewScheduleResponse, as every --json prints (it was {"schedule_id", "times"}).
    assert r.rc == 0 and list(r.json()) == ["planned_times"] and len(r.json()["planned_times"]) == 3  # type: ignore[arg-type]

    r = await schedctl("schedule", "delete", "hello", server=srv)
    assert r.rc == 0 and "deleted hello" in r.out
    r = await schedctl("schedule", "get", "hello", server=srv)
    assert r.rc == 3 and "not found" in r.err
    r = await schedctl("schedule", "delete", "hello", "--allow-missing", server=srv)
    assert r.rc == 0 and "no schedule hello: nothing deleted" in r.out and "deleted hello" not in r.out
    r = await schedctl("schedule", "delete", "hello", "--allow-missing", "--json", server=srv)
    assert r.rc == 0 and r.json() == {"missing": "hello"}


async def test_errors_name_the_field_and_exit_codes_follow_the_status(fake: tuple[FakeApi, str]) -> None:
    _, srv = fake
    r = await schedctl("schedule", "create", "--id", "bad", "--cron", "61 * * * *", "--command", "true", server=srv)
    assert (r.rc, r.err.strip()) == (2, "schedctl: schedule.spec.minute: 61 is outside 0-59")
    # Caught before sending: the field and how to fix it.
    r = await schedctl("schedule", "create", "--cron", "@hourly", "--command", "true", server=srv)
    assert r.rc == 2 and "id: is required: pass --id" in r.err
    r = await schedctl("schedule", "backfill", "x", "--start", "yesterday", "--end", "2026-01-01T00:00:00Z",
                       server=srv)
    assert r.rc == 2 and "start: 'yesterday' is not an RFC3339 time" in r.err
    r = await schedctl("schedule", "update", "x", server=srv)
    assert r.rc == 2 and "nothing to update" in r.err
    r = await schedctl("schedule", "create", "--id", "dup", "--cron", "@hourly", "--command", "true", server=srv)
    assert r.rc == 0
    r = await schedctl("schedule", "create", "--id", "dup", "--cron", "@hourly", "--command", "true", server=srv)
    assert r.rc == 4 and "already exists" in r.err and "pick another id" in r.err
    r = await schedctl("schedule", "list", "--server", "127.0.0.1:notaport")
    assert r.rc == 2 and "server: '127.0.0.1:notaport' is not host:port" in r.err
    with unused_port() as nobody:  # refused, and nothing can start listening there meanwhile
        r = await schedctl("schedule", "list", "--timeout", "1", server=f"127.0.0.1:{nobody}")
    assert r.rc == 5 and "cannot reach the scheduler API" in r.err and "SCHED_SERVER" in r.err
    r = await schedctl("schedule", "get", server=srv)
    assert r.rc == 2 and "usage:" in r.err


async def test_schedule_from_toml_and_json_files(fake: tuple[FakeApi, str], tmp_path: Path) -> None:
    api, srv = fake
    toml = tmp_path / "s.toml"
    toml.write_text('id = "from-toml"\ntenant = "billing"\nspec = "0 2 * * *"\ntime_zone = "Europe/Paris"\n'
                    'worker_pool = "batch"\ntask_type = "http"\n'
                    'payload = { url = "http://127.0.0.1:9/hook", method = "POST" }\n'
                    '[policies]\noverlap = "OVERLAP_POLICY_SKIP"\nexecution_timeout = "90s"\n'
                    '[policies.retry]\nmax_attempts = 5\n')
    r = await schedctl("schedule", "create", "-f", str(toml), "--tenant", "override", server=srv)
    assert r.rc == 0, r.err
    s = api.schedules["from-toml"]
    assert (s.tenant, s.time_zone, s.worker_pool, s.task_type) == ("override", "Europe/Paris", "batch", "http")
    assert json.loads(s.payload) == {"url": "http://127.0.0.1:9/hook", "method": "POST"}
    assert s.policies.retry.max_attempts == 5 and s.policies.execution_timeout.seconds == 90

    js = tmp_path / "u.json"
    js.write_text(json.dumps({"spec": "0 3 * * *", "policies": {"retry": {"max_attempts": 2}}}))
    r = await schedctl("schedule", "update", "from-toml", "-f", str(js), server=srv)
    assert r.rc == 0, r.err
    assert sorted(api.calls[-1][1].update_mask.paths) == ["policies.retry.max_attempts", "spec"]

    bad = tmp_path / "bad.json"
    bad.write_text('{"id": "x", "spek": "@hourly"}')
    r = await schedctl("schedule", "create", "-f", str(bad), server=srv)
    assert r.rc == 2 and "file:" in r.err and "spek" in r.err


async def test_executions_backfill_and_dead_letters(fake: tuple[FakeApi, str]) -> None:
    api, srv = fake
    assert (await schedctl("schedule", "create", "--id", "s", "--cron", "* * * * *", "--command", "true",
                           server=srv)).rc == 0
    r = await schedctl("schedule", "backfill", "s", "--start", "2026-05-28T00:00:00Z", "--end",
                       "2026-05-28T00:25:00Z", server=srv)
    assert r.rc == 0, r.err
    assert "25 planned times" in r.out and "created 25" in r.out
    assert r.err == ""  # not a terminal: tqdm draws no bar, nothing but the summary
    r = await schedctl("schedule", "backfill", "s", "--start", "2026-05-28T00:00:00Z", "--end",
                       "2026-05-28T00:25:00Z", "--json", server=srv)
    assert r.rc == 0 and r.json()["existing"] == "25" and r.json()["done"] is True

    r = await schedctl("exec", "list", "--schedule", "s", "--limit", "5", "--json", server=srv)
    ex = r.json()["executions"]
    assert r.rc == 0 and isinstance(ex, list) and len(ex) == 5
    assert ex[0]["execution_id"] == "s@2026-05-28T00:24:00.000Z"  # newest first
    r = await schedctl("exec", "list", "--schedule", "s", "--state", "scheduled", "--oldest-first", server=srv)
    lines = r.out.splitlines()
    assert r.rc == 0 and len(lines) == 1 + 25 and lines[1].startswith("s@2026-05-28T00:00:00.000Z")
    eid = "s@2026-05-28T00:03:00.000Z"
    r = await schedctl("exec", "get", eid, server=srv)
    assert r.rc == 0 and "backfill" in r.out
    planned_row = next(line for line in r.out.splitlines() if line.startswith("planned_at"))
    assert planned_row.split()[1] == "2026-05-28T00:03:00.000Z", "milliseconds, as in the id (issue 9)"
    r = await schedctl("exec", "cancel", eid, "--reason", "not needed", "--json", server=srv)
    assert r.rc == 0 and r.json()["state"] == "EXECUTION_STATE_CANCELLED"
    r = await schedctl("exec", "cancel", eid, server=srv)
    assert r.rc == 4 and "terminal" in r.err
    r = await schedctl("schedule", "rerun", "s", "2026-05-28T00:03:00Z", "--json", server=srv)
    assert r.rc == 0 and r.json()["trigger"] == "TRIGGER_RERUN"
    r = await schedctl("schedule", "trigger", "s", "--at", "2026-05-28T01:00:00.5Z", "--json", server=srv)
    assert r.rc == 0 and r.json()["execution_id"] == "s@2026-05-28T01:00:00.500Z"
    # Only a non-zero digit past the milliseconds is refused (test_bad_flag_values...): trailing zeros are the
    # same instant.
    r = await schedctl("schedule", "trigger", "s", "--at", "2026-05-28T03:00:01.250000000+02:00", "--json",
                       server=srv)
    assert r.rc == 0 and r.json()["execution_id"] == "s@2026-05-28T01:00:01.250Z", r.err

    a = api.add_dead_letter("s", T0)
    b = api.add_dead_letter("s", T0 + 60_000)
    r = await schedctl("dlq", "list", server=srv)
    assert r.rc == 0 and a in r.out and b in r.out and "exit status 1" in r.out
    r = await schedctl("dlq", "replay", a, "--reason", "fixed the script", server=srv)
    assert r.rc == 0 and "scheduled" in r.out and api.executions[a].trigger == epb.TRIGGER_REPLAY
    r = await schedctl("dlq", "discard", b, "--json", server=srv)
    assert r.rc == 0 and r.json()["state"] == "EXECUTION_STATE_FAILED"
    r = await schedctl("dlq", "discard", b, server=srv)
    assert r.rc == 3 and "not a dead letter" in r.err


async def test_admin_commands(fake: tuple[FakeApi, str]) -> None:
    api, srv = fake
    r = await schedctl("cluster", "status", "--partitions", server=srv)
    assert r.rc == 0, r.err
    assert "answered by p1" in r.out and "2/2 owned" in r.out and "PLANNER" in r.out and "PARTITION" in r.out
    r = await schedctl("cluster", "status", "--json", server=srv)
    assert r.rc == 0 and r.json()["partition_count"] == 2
    r = await schedctl("region", "switchover", "default", "--reason", "drill", server=srv)
    assert r.rc == 0 and "primary region default (version 2" in r.out
    r = await schedctl("region", "switchover", "mars", server=srv)
    assert r.rc == 4 and "region 'mars': no planner has ever registered in it" in r.err, r.err
    # The only planner: refused without --force (exit 4, with what to do), then forced, then undone.
    r = await schedctl("planner", "drain", "p1", "--reason", "upgrade", server=srv)
    assert r.rc == 4 and "force" in r.err, r.err
    assert api.planners["p1"].liveness == cpb.PLANNER_LIVENESS_ALIVE
    r = await schedctl("planner", "drain", "p1", "--reason", "upgrade", "--force", server=srv)
    assert r.rc == 0 and "draining" in r.out
    assert api.planners["p1"].liveness == cpb.PLANNER_LIVENESS_DRAINING
    r = await schedctl("planner", "undrain", "p1", server=srv)
    assert r.rc == 0 and "p1 (default): alive" in r.out, r.out
    assert api.planners["p1"].liveness == cpb.PLANNER_LIVENESS_ALIVE
    r = await schedctl("planner", "drain", "p9", server=srv)
    assert r.rc == 3
    r = await schedctl("planner", "undrain", "p9", server=srv)
    assert r.rc == 3


async def test_cluster_status_without_a_region_policy(fake: tuple[FakeApi, str]) -> None:
    api, srv = fake
    api.region = cpb.RegionPolicy()
    r = await schedctl("cluster", "status", server=srv)
    assert r.rc == 0 and "no region policy set" in r.out and "version 0" not in r.out, r.out


async def test_skips_and_replay_with_the_current_schedule(fake: tuple[FakeApi, str]) -> None:
    api, srv = fake
    assert (await schedctl("schedule", "create", "--id", "s", "--cron", "* * * * *", "--command", "true",
                           server=srv)).rc == 0
    one = sspb.SkippedTime(schedule_id="s", reason=epb.SKIP_REASON_PAUSED, execution_id="s@2026-05-28T00:01:00.000Z")
    one.planned_at.FromMilliseconds(T0 + 60_000)
    rng = sspb.SkippedTime(schedule_id="s", reason=epb.SKIP_REASON_OVER_CAP)
    rng.planned_at.FromMilliseconds(T0 + 120_000)
    rng.range_after.FromMilliseconds(T0 + 60_000)
    rng.range_through.FromMilliseconds(T0 + 180_000)
    api.skips["s"] = [one, rng]
    r = await schedctl("skips", "s", server=srv)
    lines = r.out.splitlines()
    assert r.rc == 0 and lines[0].split() == ["PLANNED_AT", "REASON", "RECORDED_AS"], r.out
    assert "paused" in lines[1] and "s@2026-05-28T00:01:00.000Z" in lines[1]
    assert "over_cap" in lines[2] and "skip record (" in lines[2]
    r = await schedctl("skips", "s", "--json", "--limit", "1", server=srv)
    assert r.rc == 0 and len(r.json()["skips"]) == 1  # type: ignore[arg-type]
    r = await schedctl("skips", "", server=srv)
    assert r.rc == 2 and r.err.startswith("schedctl: schedule_id:"), r.err
    # An id with no schedule and nothing recorded: not an error (a deleted one's records stay listable), but
    # said on stderr, where a typo looked like "nothing skipped" (an outside audit).
    for args in (("skips", "nope"), ("exec", "list", "--schedule", "nope")):
        r = await schedctl(*args, server=srv)
        assert r.rc == 0 and "no schedule 'nope' (deleted, or never created)" in r.err, (args, r.err)
    r = await schedctl("skips", "s", "--since", "2030-01-01T00:00:00Z", server=srv)
    assert r.rc == 0 and not r.err  # an existing schedule with nothing in the range: no note

    dead = api.add_dead_letter("s", T0)
    api.schedules["s"].task_type = "fixed"
    r = await schedctl("dlq", "replay", dead, server=srv)
    assert r.rc == 0 and not api.calls[-1][1].use_current_schedule
    dead = api.add_dead_letter("s", T0 + 1000)
    r = await schedctl("dlq", "replay", dead, "--with-current-schedule", "--json", server=srv)
    assert r.rc == 0 and api.calls[-1][1].use_current_schedule and r.json()["task_type"] == "fixed"


async def test_exec_list_without_a_schedule_is_in_storage_order(fake: tuple[FakeApi, str]) -> None:
    api, srv = fake
    assert (await schedctl("exec", "list", server=srv)).rc == 0
    assert not api.calls[-1][1].newest_first, "newest first is only asked for within a schedule"
    assert (await schedctl("exec", "list", "--schedule", "x", server=srv)).rc == 0
    # (The last call is the GetSchedule behind the note that no schedule x exists: the listing is the one before.)
    assert [r for m, r in api.calls if m == "ListExecutions"][-1].newest_first


async def test_server_from_env_then_config_file(fake: tuple[FakeApi, str], tmp_path: Path) -> None:
    _, srv = fake
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'server = "{srv}"\nnode_id = "shared-with-a-planner"\n')
    r = await schedctl("schedule", "list", "--json", env={"SCHED_CONFIG": str(cfg)})
    assert r.rc == 0, r.err
    r = await schedctl("schedule", "list", "--json", env={"SCHED_SERVER": srv})
    assert r.rc == 0, r.err
    # The environment beats the file; the flag beats both.
    with unused_port() as nobody:
        dead = f"127.0.0.1:{nobody}"
        r = await schedctl("schedule", "list", "--timeout", "1", env={"SCHED_SERVER": dead, "SCHED_CONFIG": str(cfg)})
    assert r.rc == 5 and dead in r.err
    r = await schedctl("schedule", "list", "--server", srv, env={"SCHED_SERVER": dead})
    assert r.rc == 0
    cfg.write_text('serverr = "x:1"\n')
    r = await schedctl("schedule", "list", "--config", str(cfg))
    assert r.rc == 2 and "config.serverr: unknown setting" in r.err


async def test_completion_scripts() -> None:
    for shell, marker in (("bash", "complete"), ("zsh", "#compdef schedctl")):
        r = await schedctl("completion", shell)
        assert r.rc == 0 and marker in r.out
        for word in ("schedule", "backfill", "switchover", "drain", "--expected-version"):
            assert word in r.out, (shell, word)


def test_planner_keeps_running_as_before_and_drain_is_a_sub_action() -> None:
    # chaos/infra/planners.py invokes `schedctl planner --node-id ... --etcd-endpoints ...`.
    args = build_parser().parse_args(["planner", "--node-id", "p1", "--etcd-endpoints", "127.0.0.1:2379",
                                      "--lease-ttl", "2", "--log-level", "info"])
    assert args.func is planner_cli.run and args.node_id == "p1" and args.action is None
    args = build_parser().parse_args(["planner", "drain", "p2", "--server", "h:1"])
    assert args.action == "drain" and args.node_id == "p2" and args.server == "h:1"


@pytest.mark.parametrize("verb", [["status"], ["affinity", "--pool", "p", "--mode", "strict"]])
def test_every_region_verb_takes_the_request_timeout(verb: list[str]) -> None:
    # switchover/failback redefine --timeout as their wait; that must not take it from the other verbs.
    args = build_parser().parse_args(["region", *verb, "--timeout", "5"])
    assert args.request_timeout == 5.0
    args = build_parser().parse_args(["region", "switchover", "b", "--timeout", "7"])
    assert args.wait_timeout == 7.0 and args.request_timeout is None


@pytest.mark.parametrize("shell", ["bash", "zsh"])
def test_completion_script_is_valid_shell(shell: str, tmp_path: Path) -> None:
    import shutil
    import subprocess
    binary = shutil.which(shell)
    if binary is None:
        pytest.skip(f"{shell} not installed")
    script = subprocess.run([SCHEDCTL, "completion", shell], capture_output=True, text=True, check=True).stdout
    path = tmp_path / f"c.{shell}"
    path.write_text(script)
    r = subprocess.run([binary, "-n", str(path)], capture_output=True, text=True, check=False)
    assert r.returncode == 0, r.stderr


# An outside audit: each of these crashed with a traceback (exit 1: protobuf's "Value out of range"), or was
# silently accepted (a negative --limit listed nothing or one row, exit 0), or silently truncated (a
# sub-millisecond instant reran or triggered `...:00.000Z`, a run the operator did not name), or kept the last
# of two values (--label a=b --label a=c). Each must exit 2 naming the flag and the reason, before any call:
# the server given is one where nothing listens, so a check that came after the call would exit 5 instead.
BAD_FLAG_VALUES = [
    (["schedule", "create", "--id", "b1", "--cron", "* * * * *", "--command", "true", "--catchup-cap", "-1"],
     "--catchup-cap: is -1; must not be negative"),
    (["schedule", "update", "x", "--catchup-cap", "-1"], "--catchup-cap: is -1; must not be negative"),
    (["schedule", "update", "x", "--max-attempts", "-1"], "--max-attempts: is -1; must not be negative"),
    (["schedule", "update", "x", "--max-unknown-attempts", "-1"],
     "--max-unknown-attempts: is -1; must not be negative"),
    (["schedule", "update", "x", "--max-attempts", str(2**32)], f"--max-attempts: is {2**32}; at most {2**32 - 1}"),
    (["schedule", "update", "x", "--jitter", "99999999999999999d"],
     "jitter: '99999999999999999d' is longer than a google.protobuf.Duration holds (10000 years)"),
    (["schedule", "update", "x", "--cron", "@hourly", "--expected-version", "-1"],
     "--expected-version: is -1; must not be negative"),
    (["schedule", "delete", "x", "--expected-version", str(2**64)],
     f"--expected-version: is {2**64}; at most {2**64 - 1}"),
    (["schedule", "pause", "x", "--expected-version", "-1"], "--expected-version: is -1; must not be negative"),
    (["schedule", "resume", "x", "--expected-version", "-1"], "--expected-version: is -1; must not be negative"),
    (["tenant", "quota", "set", "t", "--schedules", "1", "--expected-version", "-1"],
     "--expected-version: is -1; must not be negative"),
    (["region", "switchover", "--to", "r1", "--expected-version", "-1"],
     "--expected-version: is -1; must not be negative"),
    (["schedule", "preview", "x", "--count", "-1"], "--count: is -1; must not be negative"),
    (["exec", "list", "--schedule", "x", "--limit", "-1"], "--limit: is -1; must be 0 (all) or positive"),
    (["exec", "list", "--limit", "-5"], "--limit: is -5; must be 0 (all) or positive"),
    (["skips", "x", "--limit", "-1"], "--limit: is -1; must be 0 (all) or positive"),
    (["dlq", "list", "--limit", "-1"], "--limit: is -1; must be 0 (all) or positive"),
    (["schedule", "list", "--limit", "-1"], "--limit: is -1; must be 0 (all) or positive"),
    (["audit", "list", "--limit", "-1"], "--limit: is -1; must be 0 (all) or positive"),
    (["schedule", "rerun", "x", "2026-12-07T18:44:00.0009Z"],
     "planned_at: '2026-12-07T18:44:00.0009Z' has a sub-millisecond part; instants have millisecond precision"),
    (["schedule", "trigger", "x", "--at", "2026-12-07T18:53:44.0004Z"],
     "at: '2026-12-07T18:53:44.0004Z' has a sub-millisecond part; instants have millisecond precision"),
    (["schedule", "backfill", "x", "--start", "2026-12-07T18:00:00Z", "--end", "2026-12-07T19:00:00.0000001Z"],
     "end: '2026-12-07T19:00:00.0000001Z' has a sub-millisecond part; instants have millisecond precision"),
    (["schedule", "update", "x", "--start", "2026-12-07T18:00:00,0009+01:00"],
     "start: '2026-12-07T18:00:00,0009+01:00' has a sub-millisecond part; instants have millisecond precision"),
    (["schedule", "preview", "x", "--after", "2026-12-07T18:00:00.0009Z"],
     "after: '2026-12-07T18:00:00.0009Z' has a sub-millisecond part; instants have millisecond precision"),
    (["exec", "list", "--since", "2026-12-07T18:00:00.0009Z"],
     "since: '2026-12-07T18:00:00.0009Z' has a sub-millisecond part; instants have millisecond precision"),
    (["dlq", "list", "--until", "2026-12-07T18:00:00.0009Z"],
     "until: '2026-12-07T18:00:00.0009Z' has a sub-millisecond part; instants have millisecond precision"),
    *[([*verb, "x@2026-12-07T18:44:00.0009Z"],
       "execution_id: time '2026-12-07T18:44:00.0009Z' has a sub-millisecond part; execution ids have millisecond "
       "precision (<schedule_id>@2026-11-29T10:00:00.000Z)")
      for verb in (["exec", "get"], ["exec", "cancel"], ["dlq", "replay"], ["dlq", "discard"])],
    (["schedule", "create", "--id", "b1", "--cron", "* * * * *", "--command", "true", "--label", "a=b",
      "--label", "a=c"], "label: key 'a' is given twice (a=b and a=c); give each key once"),
]


@pytest.mark.parametrize(("argv", "message"), BAD_FLAG_VALUES, ids=[" ".join(a) for a, _ in BAD_FLAG_VALUES])
def test_bad_flag_values_exit_2_naming_the_flag_before_any_call(argv: list[str], message: str,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    with unused_port() as nobody:
        rc = main([*argv, "--server", f"127.0.0.1:{nobody}", "--timeout", "1"])
    out, err = capsys.readouterr()
    assert (rc, err, out) == (2, f"schedctl: {message}\n", "")


def test_a_retired_reservation_reads_not_handed_out() -> None:
    # An outside audit (session 36): a first attempt its owner reserved and never handed out, retired by a later
    # dispatch, showed as `failed (never started)` beside the run that succeeded: read as a failure.
    from scheduler._gen.scheduler.v1 import execution_pb2 as epb
    from scheduler.cli.executions import _outcome
    from scheduler.execution import RESERVED_MESSAGE

    retired = epb.AttemptRecord(attempt=1, outcome=epb.ATTEMPT_OUTCOME_FAILED, never_started=True,
                                error_message=RESERVED_MESSAGE)
    assert _outcome(retired) == "not handed out"
    dropped = epb.AttemptRecord(attempt=1, worker_id="w1", outcome=epb.ATTEMPT_OUTCOME_FAILED, never_started=True,
                                error_message="not started: start-by passed")
    assert _outcome(dropped).endswith("(never started)")


async def test_an_ended_schedule_says_so(fake: tuple[FakeApi, str]) -> None:
    # An outside audit (session 36): after its end_at, `schedule get` still said `active` and `schedule preview`
    # printed nothing with exit 0, no word of why.
    _, srv = fake
    r = await schedctl("schedule", "create", "--id", "done", "--cron", "* * * * *", "--command", "true",
                       "--end", "2020-01-01T00:00:00Z", server=srv)
    assert r.rc == 0, r.err
    r = await schedctl("schedule", "get", "done", server=srv)
    assert r.rc == 0 and "active (ended: end_at has passed)" in r.out
    r = await schedctl("schedule", "preview", "done", server=srv)
    assert r.rc == 0 and r.out == "" and "it ended at 2020-01-01T00:00:00.000Z" in r.err


@pytest.mark.parametrize("timeout", ["nan", "inf"])
def test_a_timeout_that_is_no_number_of_seconds_is_refused(timeout: str, capsys: pytest.CaptureFixture[str]) -> None:
    # `--timeout nan` compared false with 0 and went on as a deadline: exit 5, "did not answer in time".
    with unused_port() as nobody:
        rc = main(["exec", "list", "--server", f"127.0.0.1:{nobody}", "--timeout", timeout])
    _, err = capsys.readouterr()
    assert rc == 2 and err.startswith(f"schedctl: request_timeout: is {timeout}")
