"""Fault commands for the observer (chaos/fault_commands.py): the TOML shape and its errors, placeholders
filled in without a shell, the fault schedule run with real (tiny) commands, and a failed command making
the run invalid with its stderr in the report. No cluster: the integration test is
tests/integration/test_drill_observe.py."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from chaos.check import check_run
from chaos.fault_commands import CommandFaults, render, run_command
from chaos.plan import make_plan
from chaos.record import RunMeta, RunWriter, load_run, write_run
from chaos.report import write_report
from chaos.runner import RunOptions, run_drill
from chaos.scenario import Scenario, ScenarioError, loads
from scheduler.clock import SYSTEM_CLOCK
from tests.chaos.synth import clean_run

SCHEDCTL = str(Path(sys.executable).parent / "schedctl")

BASE = """
[scenario]
name = "staging"
duration_s = 60
[[load.schedules]]
name = "sec"
spec = "* * * * * *"
[faults]
warmup_s = 0
cooldown_s = 5
health_timeout_s = 3
"""

STAGING = BASE + """
[[faults.fixed]]
type = "F1"
at_s = 10
duration_s = 5
target = "planner-2"
[faults.commands]
health = "kubectl rollout status deploy/planner --timeout=5s"
timeout_s = 20
[faults.commands.targets.planner-1]
pod = "sched-planner-0"
[faults.commands.targets.planner-2]
pod = "sched-planner-1; rm -rf ~"
[faults.commands.F1]
inject = "kubectl delete pod {pod} --grace-period=0 --force"
[faults.commands.F3]
inject = "ssh {target} 'iptables -A OUTPUT -p tcp --dport 2379 -j DROP'"
heal = "ssh {target} iptables -D OUTPUT -p tcp --dport 2379 -j DROP"
timeout_s = 5
"""


def test_a_staging_scenario_plans_its_commands_without_a_shell() -> None:
    s = loads(STAGING, "staging.toml")
    cmds = s.faults.commands
    assert cmds is not None and set(cmds.per_type) == {"F1", "F3"} and cmds.timeout_s == 20
    assert cmds.targets["planner-1"].role == "planner"  # the default role
    plan = make_plan(s)
    (w,) = plan.faults
    assert (w.type, w.target, w.role) == ("F1", "planner-2", "planner")
    r = render(s, w)
    # The variable is one argument whatever it holds: split first, filled in after, run without a shell.
    assert r.inject == ("kubectl", "delete", "pod", "sched-planner-1; rm -rf ~", "--grace-period=0", "--force")
    assert r.heal is None and r.timeout_s == 20


def test_random_faults_pick_among_the_staging_targets() -> None:
    s = loads(BASE + """
[faults.random]
weights = { F1 = 1 }
interval_s = [1, 2]
[faults.commands.targets.planner-a]
[faults.commands.targets.planner-b]
[faults.commands.targets.etcd-0]
role = "etcd"
[faults.commands.F1]
inject = "kubectl delete pod {target}"
""", "x.toml")
    plan = make_plan(s)
    assert len(plan.faults) > 5
    assert {w.target for w in plan.faults} == {"planner-a", "planner-b"}
    assert render(s, plan.faults[0]).inject == ("kubectl", "delete", "pod", plan.faults[0].target)


@pytest.mark.parametrize(("extra", "field", "words"), [
    ('[faults.commands]\nhealth = "true"\n', "faults.commands.F1", "makes no fault"),
    ('[faults.commands.F14]\ninject = "x"\n', "faults.commands.F14", "unknown fault type"),
    ('[faults.commands.F1]\nheal = "x"\n', "faults.commands.F1.inject", "is required"),
    ('[faults.commands.F1]\ninject = ""\n', "faults.commands.F1.inject", "is empty"),
    ('[faults.commands.F1]\ninject = "sh -c \'kill"\n', "faults.commands.F1.inject", "cannot be split"),
    ('[faults.commands.F1]\ninject = "kill {pid}"\n', "faults.commands.F1.inject", "unknown placeholder {pid}"),
    ('[faults.commands.F1]\ninject = "kill {target.__class__}"\n', "faults.commands.F1.inject", "plain name"),
    ('[faults.commands.F1]\ninject = "kill {target!r}"\n', "faults.commands.F1.inject", "plain name"),
    ('[faults.commands.F1]\ninject = "x"\ntimeout_s = 0\n', "faults.commands.F1.timeout_s", "> 0"),
    ('[faults.commands.F1]\ninject = "x"\nhael = "y"\n', "faults.commands.F1.hael", "unknown key"),
    ('[faults.commands]\nhealth = "check {target}"\n[faults.commands.F1]\ninject = "x"\n',
     "faults.commands.health", "unknown placeholder {target}"),
    ('[faults.commands]\ntimeout = 5\n[faults.commands.F1]\ninject = "x"\n', "faults.commands.timeout", "unknown key"),
    ('[faults.commands.targets.p1]\nrole = "planet"\n[faults.commands.F1]\ninject = "x"\n',
     "faults.commands.targets.p1.role", "is not one of"),
    ('[faults.commands.targets.p1]\ntarget = "x"\n[faults.commands.F1]\ninject = "x"\n',
     "faults.commands.targets.p1.target", "plain name other than"),
    ('[faults.commands.targets.p1]\npid = 1.5\n[faults.commands.F1]\ninject = "x"\n',
     "faults.commands.targets.p1.pid", "must be a string or an integer"),
    # Every planned fault needs a command: the observer never falls back on a local nemesis.
    ('[[faults.fixed]]\ntype = "F3"\nat_s = 10\n[faults.commands.F1]\ninject = "x"\n',
     "faults.fixed[0].type", "no [faults.commands.F3]"),
    ('[faults.random]\nweights = { F1 = 1, F7 = 1 }\n[faults.commands.F1]\ninject = "x"\n',
     "faults.random.weights", "no [faults.commands.F7]"),
    # Staging targets replace the cluster's names: r1-p1 is not one of them, and a role needs one.
    ('[[faults.fixed]]\ntype = "F1"\nat_s = 10\ntarget = "r1-p1"\n[faults.commands.targets.planner-2]\n'
     '[faults.commands.F1]\ninject = "x"\n', "faults.fixed[0].target", "planner-2"),
    ('[[faults.fixed]]\ntype = "F1"\nat_s = 10\n[faults.commands.targets.etcd-0]\nrole = "etcd"\n'
     '[faults.commands.F1]\ninject = "x"\n', "faults.fixed[0].target", "names no planner"),
])
def test_bad_fault_commands_name_the_field(extra: str, field: str, words: str) -> None:
    with pytest.raises(ScenarioError) as err:
        loads(BASE + extra, "x.toml")
    assert err.value.field == field, str(err.value)
    assert words in str(err.value), str(err.value)
    assert str(err.value).startswith(f"x.toml: {field}: ")


def test_a_variable_one_target_lacks_is_refused_when_planned() -> None:
    s = loads(BASE + """
[[faults.fixed]]
type = "F1"
at_s = 10
target = "p2"
[faults.commands.targets.p1]
pid = 10
[faults.commands.targets.p2]
[faults.commands.F1]
inject = "kill -9 {pid}"
""", "x.toml")
    with pytest.raises(ScenarioError) as err:
        make_plan(s)
    assert err.value.field == "faults.commands.targets.p2"
    assert "has no 'pid', which faults.commands.F1.inject uses" in str(err.value)


def test_plan_and_dry_run_show_the_commands(tmp_path: Path) -> None:
    path = tmp_path / "staging.toml"
    path.write_text(STAGING)
    r = subprocess.run([SCHEDCTL, "drill", "plan", str(path)], capture_output=True, text=True, timeout=60,
                       check=False)
    assert r.returncode == 0, r.stderr
    assert "inject: kubectl delete pod 'sched-planner-1; rm -rf ~' --grace-period=0 --force" in r.stdout
    assert "heal:   none (heals on its own" in r.stdout
    assert "health: kubectl rollout status deploy/planner --timeout=5s" in r.stdout
    r = subprocess.run([SCHEDCTL, "drill", "observe", str(path), "--etcd-endpoints", "10.255.0.1:2379",
                        "--etcd-prefix", "/x", "--api", "10.255.0.1:7000", "--lease-ttl", "5", "--duration", "30",
                        "--report", str(tmp_path / "run"), "--dry-run"],
                       capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode == 0, r.stderr
    assert "observed for 30 s" in r.stdout and "inject: kubectl delete pod" in r.stdout
    assert not (tmp_path / "run").exists(), "a dry run touches nothing"


async def test_drill_run_refuses_a_staging_scenario(tmp_path: Path) -> None:
    s = loads(STAGING, "staging.toml")
    with pytest.raises(ScenarioError) as err:
        await run_drill(s, RunOptions(tmp_path / "run", scenario_text=STAGING))
    assert err.value.field == "faults.commands" and "drill observe" in str(err.value)
    assert not (tmp_path / "run").exists()


async def test_a_command_is_bounded_and_run_without_a_shell(tmp_path: Path) -> None:
    r = await run_command(("sh", "-c", "sleep 5"), 0.3)
    assert not r.ok and r.rc is None and "timed out after 0.3 s" in r.why()
    assert r.t_end_ms - r.t_start_ms < 3000
    r = await run_command(("no-such-command-here",), 5)
    assert not r.ok and "cannot start" in r.error
    r = await run_command(("echo", "$HOME; true"), 5)
    assert r.ok and r.stdout == "$HOME; true\n"  # no shell: nothing expanded


def _scenario(tmp: Path, inject: str, heal: str, health: str, duration_s: float = 0.3) -> Scenario:
    return loads(BASE + f"""
[[faults.fixed]]
type = "F1"
at_s = 0
duration_s = {duration_s}
target = "planner-2"
[faults.commands]
health = "{health}"
health_interval_s = 0.1
timeout_s = 5
[faults.commands.targets.planner-2]
flag = "{tmp / 'flag'}"
[faults.commands.F1]
inject = "{inject}"
heal = "{heal}"
""", "x.toml")


async def test_the_schedule_records_windows_as_the_runner_does(tmp_path: Path) -> None:
    s = _scenario(tmp_path, "touch {flag}", "rm {flag}", f"test ! -e {tmp_path / 'flag'}", duration_s=0.5)
    rec = RunWriter(tmp_path / "run")
    said: list[str] = []
    cf = CommandFaults(s, make_plan(s), rec, said.append)
    t0 = SYSTEM_CLOCK.wall_ms()
    await cf.run(t0)
    cf.close()
    rec.finish(replace(load_meta_stub(), start_ms=t0))
    assert cf.errors == [], cf.errors
    (f,) = load_run(tmp_path / "run").faults
    assert (f.type, f.target, f.role, f.name) == ("F1", "planner-2", "planner", "planner crash")
    assert f.end_ms is not None and f.healthy_ms is not None
    assert t0 <= f.start_ms and f.end_ms - f.start_ms >= 500 and f.healthy_ms >= f.end_ms
    assert not (tmp_path / "flag").exists()
    phases = [json.loads(x)["phase"] for x in (tmp_path / "run" / "commands.jsonl").read_text().splitlines()]
    assert phases == ["health before", "inject", "heal", "health after"]
    assert any("fault #0 F1 (planner crash) on planner-2" in x for x in said)


async def test_a_failing_inject_makes_the_run_invalid(tmp_path: Path) -> None:
    s = _scenario(tmp_path, "sh -c 'echo kubectl: pods planner-2 forbidden >&2; exit 3'", "true", "true")
    rec = RunWriter(tmp_path / "run")
    cf = CommandFaults(s, make_plan(s), rec)
    await cf.run(SYSTEM_CLOCK.wall_ms())
    cf.close()
    (err,) = cf.errors
    assert "fault #0 F1 on planner-2: inject command `sh -c" in err
    assert "exited 3; stderr: kubectl: pods planner-2 forbidden" in err
    rec.finish(load_meta_stub())
    (f,) = load_run(tmp_path / "run").faults
    assert f.note.startswith("inject failed: exited 3")  # the window is where the half-made fault may be
    # The run those errors belong to is invalid, not passed, and its report shows the stderr.
    _, run = clean_run(tmp_path / "judged")
    run = replace(run, meta=replace(run.meta, target="observed", command_errors=cf.errors))
    write_run(run)
    verdict = check_run(load_run(tmp_path / "judged"))
    assert verdict.result == "invalid", verdict.invalid
    assert any("a fault command failed" in r and "forbidden" in r for r in verdict.invalid)
    md = write_report(verdict, tmp_path / "judged")["md"].read_text()
    assert md.startswith("# INVALID") and "pods planner-2 forbidden" in md


async def test_a_failing_heal_or_health_is_an_error_too(tmp_path: Path) -> None:
    s = _scenario(tmp_path, "true", "false", "true")
    cf = CommandFaults(s, make_plan(s), RunWriter(tmp_path / "a"))
    await cf.run(SYSTEM_CLOCK.wall_ms())
    assert len(cf.errors) == 1 and "heal command `false` exited 1; no stderr" in cf.errors[0]
    s = _scenario(tmp_path, "true", "true", "sh -c 'echo still down >&2; exit 1'")
    cf = CommandFaults(s, make_plan(s), RunWriter(tmp_path / "b"))
    t = asyncio.get_running_loop().time()
    await cf.run(SYSTEM_CLOCK.wall_ms())
    assert asyncio.get_running_loop().time() - t < 10  # bounded by health_timeout_s (3 s)
    assert len(cf.errors) == 2 and "health before" in cf.errors[0] and "still down" in cf.errors[0]
    assert "not healthy before it" in cf.errors[1]


def load_meta_stub() -> RunMeta:
    return RunMeta(scenario="staging", seed=1, prefix="/x", partitions=1, lease_ttl_s=2, start_ms=0, end_ms=1)
