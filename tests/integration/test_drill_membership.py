"""F12, etcd membership change, in a real drill (`schedctl drill run`, loopback): three etcd members (one
per region), a planner and a worker per region, the effect sink, proxy links. One member is removed from
the membership (`etcdctl member remove`), its data dir wiped, and a fresh member is added in its slot
(`member add`, `--initial-cluster-state=existing`) on new ports; the planners' links to that slot are
re-pointed at it. Twice: `remove-add` (the window runs on two members) and `replace` (the new member joins
inside the window).

The drill must exit 0 (pass, valid): planners and workers keep planning and running through it (I1-I6
clean, I7 back under the lag bound after each window), each window records the member removed and the
voter added, and the cluster is healthy again before the next fault. A recorded run whose F12 window
does not show the member added is invalid, never a pass.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from chaos.check import check_run
from chaos.netns import available
from chaos.record import load_run
from tests.integration.drill_scenarios import LAG, SHELL, cluster, every_second, faults, header, scenario, validity

pytestmark = [pytest.mark.etcd]

SCHEDCTL = str(Path(sys.executable).parent / "schedctl")

SCENARIO = scenario(
    header("membership", "F12 twice on a 3-member etcd cluster: remove-add, then replace", 44, 5),
    cluster(1, 1, regions=("r1", "r2", "r3")), LAG, validity(300), every_second("sec", 16), SHELL,
    faults(8, 10, 3, 40),
    '[[faults.fixed]]\ntype = "F12"\nat_s = 8\nduration_s = 6\ntarget = "r2-e1"\nparams = { action = "remove-add" }\n',
    '[[faults.fixed]]\ntype = "F12"\nat_s = 24\nduration_s = 5\ntarget = "r3-e1"\nparams = { action = "replace" }\n',
)


def _drill(base: Path, network: str) -> tuple[subprocess.CompletedProcess[str], Path]:
    scenario = base / "membership.toml"
    scenario.write_text(SCENARIO)
    run_dir = base / "run"
    done = subprocess.run([SCHEDCTL, "drill", "run", str(scenario), "--report", str(run_dir),
                           "--network", network], capture_output=True, text=True, timeout=150, check=False)
    return done, run_dir


@pytest.fixture(scope="module")
def drill(tmp_path_factory: pytest.TempPathFactory) -> tuple[subprocess.CompletedProcess[str], Path]:
    return _drill(tmp_path_factory.mktemp("f12"), "loopback")


def test_a_membership_change_drill_passes_and_is_valid(drill: tuple[subprocess.CompletedProcess[str], Path]) -> None:
    done, run_dir = drill
    print(done.stdout[-4000:], done.stderr[-3000:])
    report = (run_dir / "report.md").read_text() if (run_dir / "report.md").exists() else ""
    assert done.returncode == 0, report[:4000]
    v = check_run(load_run(run_dir))
    assert v.result == "pass" and not v.invalid, v.invalid
    assert v.invariants["I7"].checked >= 2 and v.invariants["I7"].count == 0
    faults = load_run(run_dir).faults
    assert [f.type for f in faults] == ["F12", "F12"]
    for f, slot, action in zip(faults, ("m1", "m2"), ("remove-add", "replace"), strict=True):
        d = f.detail
        # The loopback members are m0..m2 (r1-e1..r3-e1); each replacement gets a new name and id in its slot.
        assert d["action"] == action and d["removed"]["name"] == slot, d
        assert d["added"]["name"] == f"{slot}-new1" and d["added"]["id"] != d["removed"]["id"], d
        assert d["added"]["voting"] and d["added"]["applied_index"] >= d["added"]["leader_index"], d
        assert d["added"]["peer_urls"] != d["removed"]["peer_urls"], d  # new ports: nothing relied on the old
        assert f.end_ms is not None and f.healthy_ms is not None and f.healthy_ms >= f.end_ms
        assert "removed" in f.note and "added" in f.note
    # The planners planned through it: every planner's log shows no crash, and runs kept landing in the
    # windows (min_planned_per_fault is validity; the I3 bound inside the windows held).
    assert v.invariants["I3"].count == 0 and v.invariants["I8"].count == 0


def test_an_f12_window_without_the_member_added_is_invalid(drill: tuple[subprocess.CompletedProcess[str], Path],
                                                           tmp_path: Path) -> None:
    """What validity reads: the window's record of the change. Drop the member added from the first window
    (as a nemesis whose add never happened would leave it) and the run is invalid, not a pass."""
    _, run_dir = drill
    d = tmp_path / "no-add"
    shutil.copytree(run_dir, d)
    lines = [json.loads(x) for x in (d / "faults.jsonl").read_text().splitlines()]
    for x in lines:
        if x["index"] == lines[0]["index"]:
            x["detail"].pop("added", None)
    (d / "faults.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    v = check_run(load_run(d))
    assert v.result == "invalid" and any("none was added" in x for x in v.invalid), v.invalid


@pytest.mark.slow  # a second drill of the same length: full mode only (the loopback one runs in every CI run)
@pytest.mark.skipif(not available()[0], reason=f"network namespaces unavailable: {available()[1]}")
def test_in_namespaces_the_new_member_comes_back_on_its_slot_address(tmp_path: Path) -> None:
    done, run_dir = _drill(tmp_path, "netns")
    print(done.stdout[-3000:], done.stderr[-2000:])
    assert done.returncode == 0, (run_dir / "report.md").read_text()[:4000] if (run_dir / "report.md").exists() else ""
    for f in load_run(run_dir).faults:
        d = f.detail
        # Same node, same address and ports (nothing else binds in its namespace); a new etcd name and id.
        assert d["added"]["peer_urls"] == d["removed"]["peer_urls"], d
        assert d["added"]["name"] == f"{f.target}-new1" and d["added"]["id"] != d["removed"]["id"], d
