"""The CI smoke drill, run once per session and shared: tests/integration/test_drill_smoke.py judges it
(pass, valid, in network namespaces where they exist), and the checker's meta-tests in
tests/integration/test_drill_runner.py break copies of its recorded history. One 5-minute drill instead of
one run per module keeps the CI run inside its budget (scripts/test.sh)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from chaos.netns import list_namespaces
from chaos.runner import DrillResult, RunOptions, run_drill
from chaos.scenario import load

SMOKE = Path(__file__).resolve().parents[2] / "chaos" / "scenarios" / "smoke.toml"


@pytest.fixture(scope="session")
def namespaces_before() -> set[str]:
    return set(list_namespaces())


@pytest.fixture(scope="session")
def smoke_run(tmp_path_factory: pytest.TempPathFactory, namespaces_before: set[str]) -> DrillResult:
    """chaos/scenarios/smoke.toml as `schedctl drill run smoke` runs it: network `auto` (a namespace per
    node when this machine can make them, loopback with proxy links otherwise)."""
    d = tmp_path_factory.mktemp("smoke") / "run"
    return asyncio.run(run_drill(load(SMOKE), RunOptions(d, network="auto", progress=print)))
