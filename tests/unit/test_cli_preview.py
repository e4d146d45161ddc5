"""`schedctl preview` as a user runs it: the installed binary, in a subprocess."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCHEDCTL = str(Path(sys.executable).parent / "schedctl")


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([SCHEDCTL, *args], capture_output=True, text=True, timeout=60, check=False)


def test_preview_lines() -> None:
    r = run("preview", "--cron", "30 2 * * *", "--tz", "America/New_York",
            "--start", "2026-03-06T00:00:00Z", "--count", "4")
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == [
        "2026-03-06T07:30:00Z",
        "2026-03-07T07:30:00Z",
        "2026-03-08T07:00:00Z",  # 02:30 does not exist that day: shifted to 03:00 EDT
        "2026-03-09T06:30:00Z",
    ]


def test_preview_dst_flags_and_json() -> None:
    r = run("preview", "--cron", "30 2 * * *", "--tz", "America/New_York", "--start", "2026-03-07T12:00:00Z",
            "--count", "2", "--dst-gap", "skip", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["times"] == ["2026-03-09T06:30:00Z", "2026-03-10T06:30:00Z"]


def test_preview_default_start_is_now() -> None:
    r = run("preview", "--cron", "* * * * * *", "--count", "3")
    assert r.returncode == 0, r.stderr
    assert len(r.stdout.splitlines()) == 3


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--cron", "61 * * * *"], "spec.minute: 61 is outside 0-59"),
        (["--cron", "0 0 30 2 *"], "spec: matches no day"),
        (["--cron", "* * * * *", "--tz", "Nowhere/City"], "time_zone: 'Nowhere/City' is not a known IANA"),
        (["--cron", "* * * * *", "--start", "yesterday"], "start: 'yesterday' is not an RFC3339 time"),
        (["--cron", "* * * * *", "--start", "2026-01-01T00:00:00"], "start: '2026-01-01T00:00:00' has no UTC"),
        (["--cron", "* * * * *", "--count", "0"], "count: 0 is outside 1-10000"),
        # Truncated to the millisecond before; every instant argument of schedctl refuses it alike.
        (["--cron", "* * * * *", "--start", "2026-01-01T00:00:00.0001Z"],
         "start: '2026-01-01T00:00:00.0001Z' has a sub-millisecond part"),
        # H is the hash of the schedule id: without one it was hashed from "", as the server refuses to.
        (["--cron", "@every 1h phase H"], "schedule_id: is required when the spec uses H"),
        (["--cron", "H H * * *"], "schedule_id: is required when the spec uses H"),
        (["--cron", "0,H/20 * * * *"], "schedule_id: is required when the spec uses H"),
        (["--cron", "H * * * *", "--schedule-id", "no spaces"], "schedule_id: 'no spaces' may only contain"),
    ],
)
def test_preview_bad_input(args: list[str], message: str) -> None:
    r = run("preview", *args)
    assert r.returncode == 2
    assert message in r.stderr
    assert r.stdout == ""


def test_preview_hashes_h_from_the_schedule_id() -> None:
    """With --schedule-id the H fields are the schedule's own (tests/unit/timeplan pins the hash itself)."""
    a = run("preview", "--cron", "@every 1h phase H", "--schedule-id", "billing-export",
            "--start", "2026-01-01T00:00:00Z", "--count", "2")
    b = run("preview", "--cron", "@every 1h phase H", "--schedule-id", "billing-import",
            "--start", "2026-01-01T00:00:00Z", "--count", "2")
    assert a.returncode == b.returncode == 0, (a.stderr, b.stderr)
    assert len(a.stdout.splitlines()) == 2 and a.stdout != b.stdout
    r = run("preview", "--cron", "@hourly", "--count", "1")  # no H: no id needed
    assert r.returncode == 0, r.stderr


def test_preview_bad_flag_value_is_a_usage_error() -> None:
    r = run("preview", "--cron", "* * * * *", "--dst-gap", "sometimes")
    assert r.returncode == 2
    assert "--dst-gap" in r.stderr


@pytest.mark.parametrize("start", ["0001-01-01T00:00:00Z", "1899-12-31T23:59:59Z", "9995-01-01T00:00:00Z"])
def test_preview_refuses_instants_outside_the_planning_window(start: str) -> None:
    """Issue 9: 0001 used to start silently in 1900, and a start past 9990 printed nothing with exit 0."""
    r = run("preview", "--cron", "0 0 1 1 *", "--start", start)
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.startswith("schedctl: start: ") and "outside the planning window 1900-01-01" in r.stderr, r.stderr


def test_preview_names_an_unsupported_year_field() -> None:
    r = run("preview", "--cron", "0 0 1 1 * 2027")
    assert r.returncode == 2 and "spec: a year field ('2027') is not supported" in r.stderr, r.stderr
