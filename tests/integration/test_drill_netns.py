"""The drill runner with `network = "netns"`: every node (etcd member, planner, worker) in its own Linux
network namespace, joined to a bridge in a harness namespace (chaos/netns.py, chaos/netns_cluster.py); the
harness (effect sink, etcd watcher, API calls, the planners' etcd-link proxies) outside every fault.

The same short drill as tests/integration/test_drill_runner.py (F1, and F2 beyond the lease with a write
held in the planner's etcd link): it must be valid and safe (I1, I2, I4, I5, I6 clean), etcd's fence must be
seen refusing at least one stale txn on the wire (the proxies' witness works across namespaces), http
effects must be attributed to their workers by address (each worker has its own), and nothing of the run
may be left afterwards: no namespace, no process inside one.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
from pathlib import Path

import pytest

from chaos.netns import available, list_namespaces
from chaos.runner import DrillResult, RunOptions, run_drill
from chaos.scenario import load
from tests.integration.drill_scenarios import runner_meta

OK, WHY = available()
pytestmark = [pytest.mark.etcd,
              pytest.mark.skipif(not OK, reason=f"network namespaces unavailable: {WHY} (loopback mode is "
                                 "tests/integration/test_drill_runner.py)")]

SCENARIO = runner_meta(late_grace_ms=2000, late_schedules=False)  # the runner meta-tests' drill, in namespaces


@pytest.fixture(scope="module")
def before() -> set[str]:
    return set(list_namespaces())


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory, before: set[str]) -> DrillResult:
    # From a file, as the CLI loads one: the runner copies the file into the run (scenario.toml, judged by).
    base = tmp_path_factory.mktemp("drill-netns")
    (base / "runner-netns.toml").write_text(SCENARIO)
    s = load(base / "runner-netns.toml")
    d = base / "run"
    return asyncio.run(run_drill(s, RunOptions(d, network="netns", progress=print)))


def test_a_drill_in_namespaces_is_valid_and_safe(recorded: DrillResult) -> None:
    v = recorded.verdict
    print("\n" + recorded.report["md"].read_text()[:5000])
    assert not v.invalid, v.invalid
    safety = {k: v.invariants[k] for k in ("I1", "I2", "I4", "I5", "I6")}
    assert all(i.count == 0 for i in safety.values()), {k: i.examples[:5] for k, i in safety.items()}
    assert v.invariants["I2"].checked > 300 and v.stats["silent_misses"] == 0
    # F2 froze r1-pN with a write held in its proxy (in the harness namespace); etcd, in r1-e1's namespace,
    # refused it after the takeover, and the witness saw the refusal.
    assert v.stats["stale_txns_refused_by_etcd"] >= 1
    f2 = next(r for r in v.faults if r.type == "F2")
    assert f2.takeovers >= 1 and f2.stale_rejected >= 1


def test_workers_have_their_own_addresses_and_http_effects_name_them(recorded: DrillResult) -> None:
    meta = json.loads((recorded.directory / "run.json").read_text())
    workers = {n: info["address"] for n, info in meta["nodes"].items() if info["role"] == "worker"}
    assert workers and all(ipaddress.ip_address(a).is_private and a != "127.0.0.1" for a in workers.values())
    planners = [info["address"] for info in meta["nodes"].values() if info["role"] == "planner"]
    assert all(not a.startswith("127.") for a in planners), planners
    effects = [json.loads(x) for x in (recorded.directory / "effects.jsonl").read_text().splitlines()]
    http = [e for e in effects if e["schedule_id"].startswith("sec") and e["accepted"]]
    assert http and {e["worker"] for e in http} <= set(workers.values()), {e["worker"] for e in http}


def test_nothing_of_the_run_is_left(recorded: DrillResult, before: set[str]) -> None:
    assert set(list_namespaces()) <= before, set(list_namespaces()) - before
    proc = Path("/proc")
    mine = str(recorded.directory)
    left = []
    for p in proc.iterdir():
        if p.name.isdigit():
            try:
                cmd = (p / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if mine in cmd:
                left.append((p.name, cmd[:200]))
    assert not left, left
