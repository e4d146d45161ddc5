"""`schedctl completion bash|zsh|tcsh`: print a shell completion script.

shtab generates the script once from the argparse parser, so pressing TAB runs no Python (argcomplete
would start schedctl, gRPC import included, on every TAB). Regenerate it after upgrading schedctl.
"""

from __future__ import annotations

import argparse
import sys

import shtab

from scheduler.cli.output import Exit

SHELLS = ("bash", "zsh", "tcsh")


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "completion", help="print a shell completion script",
        description="Print a completion script. bash: `schedctl completion bash > "
                    "~/.local/share/bash-completion/completions/schedctl`; zsh: `schedctl completion zsh > "
                    "\"${fpath[1]}/_schedctl\"`.")
    p.add_argument("shell", choices=SHELLS)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from scheduler.cli.main import build_parser  # the whole tree, this command included

    sys.stdout.write(shtab.complete(build_parser(), shell=args.shell))
    return Exit.OK
