"""`schedctl audit list` (the audit log, system:admin) and `schedctl auth token` (a new static bearer token
and the `[[token]]` entry that admits it: docs/operations.md, "Security")."""

from __future__ import annotations

import argparse
import json
import sys

from scheduler.auth.principal import parse_permissions
from scheduler.auth.tokens import new_static_token, token_hash
from scheduler.cli.common import client_parent, opt_ts, print_json, run_call, table, to_dict
from scheduler.cli.output import Exit, check_limit, fail_invalid
from scheduler.client import SchedulerClient
from scheduler.errors import InvalidArgument


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    top = sub.add_parser("audit", help="the audit log: who changed what, when, and how it ended (server)",
                         description="Every schedule write, operator and admin action, with its principal and "
                                     "result. Needs system:admin.")
    verbs = top.add_subparsers(dest="verb", required=True, metavar="VERB")
    p = verbs.add_parser("list", parents=[client_parent()], help="list audit events (oldest first)")
    p.add_argument("--newest-first", action="store_true", help="newest event first")
    p.add_argument("--limit", type=int, default=100, metavar="N", help="at most N (default 100; 0: all)")
    p.set_defaults(func=_list)

    top = sub.add_parser("auth", help="make a static bearer token (local, no server)",
                         description="Bearer tokens for a cluster with auth on (docs/operations.md, Security).")
    verbs = top.add_subparsers(dest="verb", required=True, metavar="VERB")
    p = verbs.add_parser("token", help="print a new random token and its [[token]] entry for the tokens file",
                         description="Print a new random token (256 bits) to stdout, or write it to --out, and the "
                                     "[[token]] entry to add to the planners' tokens file (it holds only the "
                                     "token's SHA-256) to stderr.")
    p.add_argument("name", metavar="NAME", help="the principal's name (token:NAME in the audit log)")
    p.add_argument("--permission", "-p", action="append", default=[], metavar="SCOPE:ROLE",
                   help="e.g. payments:writer, payments-pool:worker, system:admin (repeat for more)")
    p.add_argument("--out", metavar="FILE", help="write the token to FILE (mode 0600) instead of stdout")
    p.set_defaults(func=_token)


def _list(args: argparse.Namespace) -> int:
    check_limit(args.limit)

    async def body(c: SchedulerClient) -> int:
        found = [e async for e in c.iter_audit_events(limit=args.limit or None, newest_first=args.newest_first)]
        if args.json:
            print_json({"events": [to_dict(e) for e in found]})
        else:
            table(["TIME", "PRINCIPAL", "ACTION", "TARGET", "RESULT", "NODE"],
                  [(opt_ts(e, "time"), e.principal, e.action, e.target or "-", e.result, e.node_id) for e in found])
        return Exit.OK
    return run_call(args, body)


def _token(args: argparse.Namespace) -> int:
    try:
        grants = parse_permissions(args.permission, "permission")
    except InvalidArgument as e:
        return fail_invalid(e)
    token = new_static_token()
    entry = (f'[[token]]\nname = {json.dumps(args.name)}\nsha256 = "{token_hash(token)}"\n'
             f"permissions = {json.dumps(sorted(str(g) for g in grants))}\n")
    if args.out:
        import os

        fd = os.open(args.out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(token + "\n")
    else:
        print(token)
    sys.stderr.write(entry)
    return Exit.OK
