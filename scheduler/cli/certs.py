"""`schedctl certs dev DIR`: a throw-away CA and the certificates of a local cluster (scheduler/certs.py)."""

from __future__ import annotations

import argparse
import sys

from scheduler.cli.output import Exit, fail_invalid
from scheduler.errors import InvalidArgument


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("certs", help="make TLS certificates for a local or test cluster",
                       description="Certificates for trying TLS out; not a production PKI (docs/operations.md, "
                                   "\"Security\").")
    actions = p.add_subparsers(dest="action", required=True, metavar="dev")
    d = actions.add_parser(
        "dev", help="write a throw-away CA and planner, worker, admin and etcd certificates into DIR",
        description="Write into DIR a new CA (ca.crt, ca.key) and certificates signed by it: planner (server and "
                    "client, SANs 127.0.0.1, localhost and every --san), worker (client), admin (client, for "
                    "schedctl), etcd-server (server, same SANs), etcd-client (client, CN sched: the etcd user with "
                    "--client-cert-auth) and etcd-root (client, CN root). Keys are written 0600. Refuses to replace "
                    "an existing CA unless --force.")
    d.add_argument("dir", metavar="DIR")
    d.add_argument("--san", action="append", default=[], metavar="NAME",
                   help="another DNS name or IP address for the planner and etcd-server certificates (repeatable)")
    d.add_argument("--days", type=int, default=30, metavar="N", help="validity in days (default %(default)s)")
    d.add_argument("--force", action="store_true", help="replace an existing CA and every certificate in DIR")
    d.add_argument("--if-missing", action="store_true",
                   help="do nothing (exit 0) when DIR already holds a CA: for a one-shot job run at every start")
    d.add_argument("--owner", metavar="UID[:GID]", help="hand the files written to this user (run as root)")
    d.set_defaults(func=_dev)


def _dev(args: argparse.Namespace) -> int:
    from pathlib import Path

    from scheduler.certs import dev_certs, parse_owner  # cryptography: loaded only for this command

    try:
        owner = parse_owner(args.owner) if args.owner else None
        written = dev_certs(Path(args.dir), sans=args.san, days=args.days, force=args.force,
                            if_missing=args.if_missing, owner=owner)
    except InvalidArgument as e:
        return fail_invalid(e)
    except OSError as e:
        print(f"schedctl: dir: cannot write {args.dir}: {e.strerror or e}", file=sys.stderr)
        return Exit.INVALID
    if not written:
        print(f"{args.dir}: a CA is there already; nothing written (--if-missing)")
    for path in written:
        print(path)
    return Exit.OK
