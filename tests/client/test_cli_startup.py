"""`schedctl --help` and `schedctl preview` start without grpc or protobuf (issue 12: operators script the
CLI in loops; importing every command's module cost about 0.5 s per call). A subprocess each, so that
nothing this test process imported counts."""

from __future__ import annotations

import argparse
import ast
import subprocess
import sys

import pytest

from scheduler.cli.main import COMMANDS, build_parser

HEAVY = ("grpc", "google.protobuf", "scheduler._gen", "scheduler.client", "scheduler.store", "prometheus_client")

_PROBE = """
import contextlib, io, sys
from scheduler.cli.main import main
out = io.StringIO()
with contextlib.redirect_stdout(out):
    try:
        rc = main({argv!r})
    except SystemExit as e:
        rc = e.code
print(repr((rc, out.getvalue(), sorted(sys.modules))))
"""


def run_probe(argv: list[str]) -> tuple[int, str, set[str]]:
    r = subprocess.run([sys.executable, "-c", _PROBE.format(argv=argv)], capture_output=True, text=True,
                       check=True, timeout=60)
    rc, out, modules = ast.literal_eval(r.stdout.strip().splitlines()[-1])
    return rc, out, set(modules)


def heavy(modules: set[str]) -> set[str]:
    return {m for m in modules if any(m == h or m.startswith(h + ".") for h in HEAVY)}


@pytest.mark.parametrize("argv", [
    ["--help"],
    ["preview", "--help"],
    ["preview", "--cron", "30 2 * * *", "--tz", "America/New_York", "--start", "2026-03-06T00:00:00Z", "--count", "4"],
    ["preview", "--cron", "61 * * * *"],  # bad input: exit 2 names the field, still without grpc
])
def test_help_and_preview_import_no_grpc(argv: list[str]) -> None:
    rc, out, modules = run_probe(argv)
    assert not heavy(modules), sorted(heavy(modules))
    if argv == ["--help"]:
        assert rc == 0
        for name in COMMANDS:
            assert name in out
    elif "--count" in argv:
        assert rc == 0
        assert out.splitlines()[2] == "2026-03-08T07:00:00Z"  # 02:30 does not exist that day: 03:00 EDT
    elif "--help" not in argv:
        assert rc == 2


def test_a_server_command_still_loads_its_module() -> None:
    """The lazy table is no way around the real parser: `schedule` gets its full subcommand tree."""
    rc, _, modules = run_probe(["schedule", "--help"])
    assert rc == 0
    assert "scheduler.cli.schedule" in modules


def _helps(ap: argparse.ArgumentParser) -> dict[str, str | None]:
    sub = next(a for a in ap._actions if isinstance(a, argparse._SubParsersAction))
    return {a.dest: a.help for a in sub._choices_actions}


def test_the_command_table_repeats_each_modules_own_help() -> None:
    """`schedctl --help` shows the table's help texts; they must not drift from what each module registers."""
    full = _helps(build_parser())
    assert full == {name: help_text for name, (_, help_text) in COMMANDS.items()}
    assert list(full) == list(COMMANDS)  # the same order as before commands were loaded lazily
    assert _helps(build_parser("preview")) == full


def test_an_unknown_command_is_a_usage_error() -> None:
    rc, _, modules = run_probe(["no-such-command"])
    assert rc == 2
    assert not heavy(modules)
