"""`schedctl`: the one operator CLI. Each subcommand lives in its own module and registers itself.

Exit codes are listed in scheduler/cli/common.py and docs/cli.md.
"""

from __future__ import annotations

import argparse
import sys

from scheduler import __version__
from scheduler.cli import (
    auth,
    certs,
    cluster,
    completion,
    dev,
    dlq,
    drill,
    executions,
    health,
    planner,
    preview,
    region,
    schedule,
    worker,
)
from scheduler.cli.output import fail_invalid
from scheduler.errors import InvalidArgument


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="schedctl", description="Operate the distributed cron scheduler.")
    ap.add_argument("--version", action="version", version=f"schedctl {__version__}")
    sub = ap.add_subparsers(dest="command", required=True, metavar="COMMAND")
    schedule.register(sub)
    executions.register(sub)
    dlq.register(sub)
    cluster.register(sub)
    region.register(sub)
    preview.register(sub)
    planner.register(sub)
    worker.register(sub)
    dev.register(sub)
    drill.register(sub)
    completion.register(sub)
    health.register(sub)
    certs.register(sub)
    auth.register(sub)
    return ap


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except InvalidArgument as e:  # bad flag values found before anything was sent
        return fail_invalid(e)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `schedctl preview ... | head`
        sys.stderr.close()
        return 0


if __name__ == "__main__":
    raise SystemExit(main())
