"""The CI smoke drill (issue 10, "Proof and CI"): chaos/scenarios/smoke.toml on real processes, with one
fault of each kind CI must prove (F1 planner crash, F2 pause beyond the lease with a write held in its etcd
link, F3 planner<->etcd partition, F6 clock skew, F7 worker crash mid-run, F5 region loss) under mixed load
and operations. It must pass and be valid, as `schedctl drill run smoke` says it.

Where this machine can make network namespaces (root), every node has its own, joined to a bridge in a
harness namespace (chaos/netns.py, chaos/netns_cluster.py), with the harness (effect sink, etcd watcher, API
calls, the planners' etcd-link proxies) outside every fault; then http effects must be attributed to their
workers by address, and nothing of the run may be left afterwards. Elsewhere it runs on loopback (the
runner's meta-tests cover loopback in any case: tests/integration/test_drill_runner.py). The run itself is
the session fixture `smoke_run` (tests/integration/conftest.py), shared with the checker's meta-tests.
"""

from __future__ import annotations

import ipaddress
import json
from pathlib import Path

import pytest

from chaos.netns import available, list_namespaces
from chaos.runner import DrillResult

OK, WHY = available()
pytestmark = [pytest.mark.etcd]
needs_netns = pytest.mark.skipif(not OK, reason=f"network namespaces unavailable: {WHY} (the drill ran on loopback)")

REQUIRED = {"F1", "F2", "F3", "F5", "F6", "F7"}


def test_the_smoke_drill_passes(smoke_run: DrillResult) -> None:
    """Every CI run: valid, and every invariant I1 to I8 holds, I3's steady-state lag bounds included.

    I3 was judged in full mode only while the drill's last runs (smoke12) kept a handful of runs outside
    any fault window over the 2 s bound. Their cause was two spinning partition loops that kept the
    machine saturated before any fault (docs/drills.md, "What the smoke drill found"); with those fixed,
    four runs in a row passed with the worst such run 1.36 s late and F5 back in bounds 12.5-18.3 s after
    the heal (I7 allows 25 s)."""
    v = smoke_run.verdict
    print("\n" + smoke_run.report["md"].read_text()[:6000])
    assert not v.invalid, v.invalid
    bad = {k: i.examples[:5] for k, i in v.invariants.items() if i.count}
    assert not bad, bad
    assert {r.type for r in v.faults} >= REQUIRED
    assert v.stats["silent_misses"] == 0 and v.stats["duplicates"] == 0
    # F2 froze a planner with a write held in its etcd link; etcd refused it after the takeover (the
    # proxies' witness saw the refusal on the wire).
    f2 = next(r for r in v.faults if r.type == "F2")
    assert f2.takeovers >= 1 and f2.stale_rejected >= 1 and v.stats["stale_txns_refused_by_etcd"] >= 1
    ops = [json.loads(x) for x in (smoke_run.directory / "ops.jsonl").read_text().splitlines()]
    assert {o["op"] for o in ops if o["ok"]} >= {"create", "pause", "resume", "update", "trigger", "backfill", "rerun"}
    for name in ("report.md", "report.json", "timeline.png"):
        assert (smoke_run.directory / name).stat().st_size > 0, name


@needs_netns
def test_workers_have_their_own_addresses_and_http_effects_name_them(smoke_run: DrillResult) -> None:
    meta = json.loads((smoke_run.directory / "run.json").read_text())
    workers = {n: info["address"] for n, info in meta["nodes"].items() if info["role"] == "worker"}
    assert workers and all(ipaddress.ip_address(a).is_private and a != "127.0.0.1" for a in workers.values())
    planners = [info["address"] for info in meta["nodes"].values() if info["role"] == "planner"]
    assert all(not a.startswith("127.") for a in planners), planners
    effects = [json.loads(x) for x in (smoke_run.directory / "effects.jsonl").read_text().splitlines()]
    http = [e for e in effects if e["schedule_id"].startswith("sec") and e["accepted"]]
    assert http and {e["worker"] for e in http} <= set(workers.values()), {e["worker"] for e in http}


@needs_netns
def test_nothing_of_the_run_is_left(smoke_run: DrillResult, namespaces_before: set[str]) -> None:
    assert set(list_namespaces()) <= namespaces_before, set(list_namespaces()) - namespaces_before
    proc = Path("/proc")
    mine = str(smoke_run.directory)
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
