"""`schedctl planner --help` / `schedctl worker --help`: every setting says what it means, its unit and its
default; the unsafe switches are set apart under a test-only heading (issue 9)."""

from __future__ import annotations

import dataclasses
import re

import pytest

from scheduler.cli.main import build_parser
from scheduler.cli.planner import UNSAFE_TITLE
from scheduler.cli.settings_help import HELP
from scheduler.config import CoordinationSettings, EtcdSettings
from scheduler.planner.settings import PlannerSettings
from scheduler.worker.settings import WorkerSettings


@pytest.mark.parametrize("cls", [EtcdSettings, CoordinationSettings, PlannerSettings, WorkerSettings])
def test_every_setting_has_a_meaning(cls: type) -> None:
    missing = [f.name for f in dataclasses.fields(cls) if f.name not in HELP]
    assert not missing, f"add these to scheduler/cli/settings_help.py: {missing}"


def _help(*argv: str) -> str:
    ap = build_parser()
    sub = ap._subparsers._group_actions[0].choices[argv[0]]  # type: ignore[union-attr, index]
    return str(sub.format_help())


def test_planner_help_shows_defaults_units_and_meaning() -> None:
    text = " ".join(_help("planner").split())
    assert "--lease-ttl N seconds; etcd session lease TTL" in text
    assert "(default: 5; env SCHED_LEASE_TTL)" in text
    assert "--lookahead-ms N milliseconds;" in text and "(default: 2000;" in text
    assert "(default: 604,800,000; env SCHED_RETENTION_MS)" in text, "big numbers are grouped"
    assert "--etcd-endpoints LIST" in text and "(default: 127.0.0.1:2379;" in text
    assert "drain|undrain" in text


def test_unsafe_switches_are_grouped_apart_and_labelled() -> None:
    text = _help("planner")
    text = text[text.index("options:"):]  # past the usage line, which lists every flag
    head = text.index(UNSAFE_TITLE)
    for flag in ("--unsafe-disable-fencing", "--unsafe-disable-self-fence"):
        assert text.index(flag) > head, f"{flag} must be listed under the unsafe heading"
    normal = text[:head]
    assert not re.search(r"--unsafe-", normal)


def test_worker_help_shows_defaults() -> None:
    text = " ".join(_help("worker").split())
    assert "--concurrency N most attempts running at once" in text and "(default: 8; env SCHED_CONCURRENCY)" in text
    assert "(default: <hostname>:<pid>; env SCHED_WORKER_ID)" in text, "a default computed at start-up says so"
