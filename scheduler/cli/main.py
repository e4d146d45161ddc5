"""`schedctl`: the one operator CLI. Each subcommand lives in its own module and registers itself.

Exit codes are listed in scheduler/cli/common.py and docs/cli.md.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from types import ModuleType

from scheduler import __version__
from scheduler.errors import InvalidArgument

# Each top-level command, the module that registers it, and its one-line help (repeated here so that
# `schedctl --help` needs no command module: tests/client/test_cli_startup.py checks it is the module's own
# help). Only the module of the command being run is imported: importing all of them pulled grpc and
# protobuf into `schedctl preview` and `--help`, about 0.5 s per call (issue 12, docs/cli.md "Start time").
COMMANDS: dict[str, tuple[str, str]] = {
    "schedule": ("schedule", "create, change and run schedules (server)"),
    "exec": ("executions", "list, inspect and cancel executions (server)"),
    "skips": ("executions", "planned times of a schedule that did not run, and why (server)"),
    "dlq": ("dlq", "list, replay or discard dead letters (server)"),
    "cluster": ("cluster", "cluster status (server)"),
    "region": ("region", "region policy: status, switchover, failback (server)"),
    "preview": ("preview", "print the next planned instants of a spec (UTC, RFC3339)"),
    "planner": ("planner", "run one planner node (or drain/undrain one)"),
    "worker": ("worker", "run one worker process (built-in shell and http executors)"),
    "dev": ("dev", "run a complete local cluster (etcd, planner, workers) in the foreground"),
    "drill": ("drill", "chaos drills: list scenarios, show a plan, run a drill, check a recorded run"),
    "completion": ("completion", "print a shell completion script"),
    "health": ("health", "check a planner's or worker's gRPC health service (exit 0 serving, 1 not)"),
    "certs": ("certs", "make TLS certificates for a local or test cluster"),
    "tenant": ("tenant", "per-tenant quotas: set, get, list (server)"),
    "audit": ("auth", "the audit log: who changed what, when, and how it ended (server)"),
    "auth": ("auth", "make a static bearer token (local, no server)"),
}


def _module(name: str) -> ModuleType:
    return importlib.import_module(f"scheduler.cli.{name}")


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser with every command registered in full (None: completion scripts, tests), or, given
    `command`, only that command's module in full and the others as their names and help (all that
    `schedctl --help` shows; a name that is no command loads none)."""
    ap = argparse.ArgumentParser(prog="schedctl", description="Operate the distributed cron scheduler.")
    ap.add_argument("--version", action="version", version=f"schedctl {__version__}")
    sub = ap.add_subparsers(dest="command", required=True, metavar="COMMAND")
    full = {m for m, _ in COMMANDS.values()} if command is None else \
        {COMMANDS[command][0]} if command in COMMANDS else set()
    registered: set[str] = set()
    for name, (module, help_text) in COMMANDS.items():
        if module not in full:
            sub.add_parser(name, help=help_text)
        elif module not in registered:  # one module may register several commands (exec, skips)
            _module(module).register(sub)
            registered.add(module)
    return ap


def _command_of(argv: list[str]) -> str | None:
    """The command word: the top level has no option that takes a value, so it is the first non-option."""
    return next((a for a in argv if not a.startswith("-")), None)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    # No command word (`schedctl --help`, `schedctl`): "" loads no command module, only the table's help.
    args = build_parser(_command_of(argv) or "").parse_args(argv)
    try:
        return int(args.func(args))
    except InvalidArgument as e:  # bad flag values found before anything was sent
        from scheduler.cli.output import fail_invalid  # not at the top: it loads the time engine

        return fail_invalid(e)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `schedctl preview ... | head`
        sys.stderr.close()
        return 0


if __name__ == "__main__":
    raise SystemExit(main())
