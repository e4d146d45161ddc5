"""`schedctl drill` as a user runs it: the installed binary in a subprocess, no cluster."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

from chaos.record import write_run
from tests.chaos.synth import clean_run

SCHEDCTL = str(Path(sys.executable).parent / "schedctl")


def drill(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([SCHEDCTL, "drill", *args], capture_output=True, text=True, timeout=60, check=False,
                          cwd=cwd)


def test_list_names_every_scenario_with_its_description(tmp_path: Path) -> None:
    r = drill("list", cwd=tmp_path)  # not from the checkout: the scenarios ship with the package
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[-1].startswith("smoke ") and "CI smoke" in r.stdout
    rows = json.loads(drill("list", "--json").stdout)
    assert {x["name"] for x in rows} >= {"smoke", "game-day", "regress-pause-wedge"}
    assert all(x["description"] for x in rows)


def test_plan_is_reproducible_from_the_seed() -> None:
    a, b = drill("plan", "game-day", "--seed", "3"), drill("plan", "game-day", "--seed", "3")
    assert a.returncode == 0 and a.stdout == b.stdout
    assert "plan " in a.stdout.splitlines()[0] and "F11" in a.stdout
    assert drill("plan", "game-day", "--seed", "4").stdout != a.stdout


def test_check_a_recorded_run_exit_code_follows_the_verdict(tmp_path: Path) -> None:
    x, run = clean_run(tmp_path / "run")
    write_run(run)
    r = drill("check", "--history", str(tmp_path / "run"), "--report", str(tmp_path / "rep"))
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.startswith("PASS: drill `synthetic`, seed 7")
    assert {p.name for p in (tmp_path / "rep").iterdir()} == {"report.md", "report.json", "timeline.png"}
    x.effects = [replace(e, accepted=True) for e in x.effects]
    write_run(x.build(tmp_path / "failing"))
    assert drill("check", "--history", str(tmp_path / "failing")).returncode == 1
    assert (tmp_path / "failing" / "report.md").exists()  # default: the report goes next to the run
    x, _ = clean_run(tmp_path / "invalid")
    x.effects = [e for e in x.effects if e.accepted]
    write_run(x.build(tmp_path / "invalid"))
    r = drill("check", "--history", str(tmp_path / "invalid"))
    assert r.returncode == 3 and r.stdout.startswith("INVALID")


def test_bad_input_exits_2_naming_what_to_fix(tmp_path: Path) -> None:
    r = drill("plan", "no-such-drill")
    assert r.returncode == 2 and "scenario: 'no-such-drill' is neither a file nor a scenario name" in r.stderr
    bad = tmp_path / "bad.toml"
    bad.write_text('[scenario]\nname = "b"\n[[load.schedules]]\nname = "x"\nspec = "* * * * * *"\n'
                   '[[faults.fixed]]\ntype = "F14"\nat_s = 30\n')
    for cmd in (("plan", str(bad)), ("run", str(bad))):
        r = drill(*cmd)
        assert r.returncode == 2 and "faults.fixed[0].type: unknown fault type 'F14'" in r.stderr, r.stderr
    bad.write_text("[scenario\n")
    r = drill("plan", str(bad))
    assert r.returncode == 2 and "not valid TOML" in r.stderr
    r = drill("check", "--history", str(tmp_path / "nothing"))
    assert r.returncode == 2 and "not a directory" in r.stderr


def test_run_refuses_bad_input_before_starting_anything(tmp_path: Path) -> None:
    r = drill("run", "no-such-scenario")
    assert r.returncode == 2 and "neither a file nor a scenario name" in r.stderr
    r = drill("run", "smoke", "--duration", "-5")
    assert r.returncode == 2 and "duration" in r.stderr
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "x").write_text("")
    r = drill("run", "smoke", "--report", str(busy))
    assert r.returncode == 2 and "not empty" in r.stderr
    # A fault this machine cannot make (here: direct links cannot cut a planner's etcd link) is refused up front.
    r = drill("run", "smoke", "--links", "direct", "--report", str(tmp_path / "run"))
    assert r.returncode == 2 and "cannot make" in r.stderr and "F3" in r.stderr
    assert not (tmp_path / "run" / "run.json").exists()
