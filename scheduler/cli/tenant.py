"""`schedctl tenant quota set|get|delete` and `schedctl tenant list`: per-tenant quotas (docs/cli.md,
docs/operations.md "Quotas"). Setting needs system:admin; a tenant's reader may get its own."""

from __future__ import annotations

import argparse
import math
from typing import Any

from scheduler.cli.common import client_parent, opt_ts, print_json, run_call, table, to_dict
from scheduler.cli.output import Exit, check_version
from scheduler.client import SchedulerClient
from scheduler.errors import InvalidArgument

_LIMITS = (("schedules", "max_schedules", int, "schedules the tenant may hold at once"),
           ("executions_per_second", "max_executions_per_second", float,
            "planned runs per second allowed to start, cluster-wide (more are deferred, never dropped)"),
           ("backfill", "max_backfill", int, "planned times one backfill may create"),
           ("labels", "max_labels", int, "labels per schedule"),
           ("payload_bytes", "max_payload_bytes", int, "payload bytes per schedule"))


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    top = sub.add_parser("tenant", help="per-tenant quotas: set, get, list (server)",
                         description="Quotas per tenant (0 = unlimited). Setting needs system:admin.")
    verbs = top.add_subparsers(dest="verb", required=True, metavar="VERB")
    p = verbs.add_parser("list", parents=[client_parent()], help="every tenant's own quota record and the default")
    p.set_defaults(func=_list)
    q = verbs.add_parser("quota", help="set, get or delete one tenant's quota (or the default)")
    qv = q.add_subparsers(dest="quota_verb", required=True, metavar="VERB")
    p = qv.add_parser("set", parents=[client_parent()], help="set limits (only those given change; 0 = unlimited)")
    _target(p)
    p.add_argument("--schedules", metavar="N", help=_LIMITS[0][3])
    p.add_argument("--executions-per-second", metavar="R", help=_LIMITS[1][3])
    p.add_argument("--backfill", metavar="N", help=_LIMITS[2][3])
    p.add_argument("--labels", metavar="N", help=_LIMITS[3][3])
    p.add_argument("--payload-bytes", metavar="N", help=_LIMITS[4][3])
    p.add_argument("--reason", default="", help="why (stored with the record)")
    p.add_argument("--expected-version", type=int, metavar="N", help="refuse (exit 4) unless the record is at N")
    p.set_defaults(func=_set)
    p = qv.add_parser("get", parents=[client_parent()], help="the limits that apply and the schedules held")
    _target(p)
    p.set_defaults(func=_get)
    p = qv.add_parser("delete", parents=[client_parent()], help="remove the tenant's own record (the default applies)")
    _target(p)
    p.set_defaults(func=_delete)


def _target(p: argparse.ArgumentParser) -> None:
    p.add_argument("tenant", nargs="?", metavar="TENANT", help="the tenant (omit with --default)")
    p.add_argument("--default", action="store_true", help="the cluster default, for tenants without a record")


def _tenant(args: argparse.Namespace) -> str | None:
    if args.default:
        if args.tenant:
            raise InvalidArgument("TENANT", "give a tenant or --default, not both")
        return None
    if not args.tenant:
        raise InvalidArgument("TENANT", "is required (or --default)")
    return str(args.tenant)


def limit_value(flag: str, text: str | None, kind: type[int] | type[float]) -> int | float | None:
    """A limit flag's value, checked as scheduler/config.py checks settings: the flag named, and why."""
    if text is None:
        return None
    try:
        v = kind(text)
    except ValueError:
        raise InvalidArgument(flag, f"{text!r} is not {'an integer' if kind is int else 'a number'}") from None
    if not math.isfinite(v) or v < 0:
        raise InvalidArgument(flag, f"is {text}; 0 (unlimited) or positive")
    return v


def _set(args: argparse.Namespace) -> int:
    tenant = _tenant(args)
    check_version(args.expected_version)
    values = {name: limit_value("--" + name.replace("_", "-"), getattr(args, name), kind)
              for name, _, kind, _ in _LIMITS}
    if all(v is None for v in values.values()):
        raise InvalidArgument("--schedules", "give at least one of --schedules, --executions-per-second, "
                                             "--backfill, --labels, --payload-bytes")

    async def body(c: SchedulerClient) -> int:
        q = await c.set_tenant_quota(tenant, reason=args.reason, expected_version=args.expected_version,
                                     **values)  # type: ignore[arg-type]
        _show(args, q, own=True)
        return Exit.OK
    return run_call(args, body)


def _get(args: argparse.Namespace) -> int:
    tenant = _tenant(args)

    async def body(c: SchedulerClient) -> int:
        r = await c.get_tenant_quota(tenant)
        held = r.schedules_held if r.HasField("schedules_held") else None
        _show(args, r.quota, own=r.own_record, held=held)
        return Exit.OK
    return run_call(args, body)


def _delete(args: argparse.Namespace) -> int:
    tenant = _tenant(args)

    async def body(c: SchedulerClient) -> int:
        gone = await c.delete_tenant_quota(tenant)
        if args.json:
            print_json({"deleted": gone})
        else:
            print("deleted" if gone else "no record: nothing changed")
        return Exit.OK
    return run_call(args, body)


def _list(args: argparse.Namespace) -> int:
    async def body(c: SchedulerClient) -> int:
        rows, default = await c.list_tenant_quotas()
        if args.json:
            print_json({"quotas": [to_dict(q) for q in rows], "default": to_dict(default) if default else None})
            return Exit.OK
        table(["TENANT", "SCHEDULES", "EXEC/S", "BACKFILL", "LABELS", "PAYLOAD", "VERSION", "UPDATED"],
              [(_name(q) or "(default)", *_cells(q), q.version, opt_ts(q, "updated_at"))
               for q in ([default] if default else []) + rows])
        return Exit.OK
    return run_call(args, body)


def _name(q: Any) -> str:
    return str(q.tenant)


def _cells(q: Any) -> list[str]:
    return [f"{getattr(q, field):g}" if getattr(q, field) else "unlimited" for _, field, _, _ in _LIMITS]


def _show(args: argparse.Namespace, q: Any, *, own: bool, held: int | None = None) -> None:
    if args.json:
        out = to_dict(q)
        out["own_record"] = own
        if held is not None:
            out["schedules_held"] = held
        print_json(out)
        return
    print(f"tenant:   {q.tenant or '(default)'}{'' if own else '  (no record of its own: the default applies)'}")
    for (name, _, _, _), cell in zip(_LIMITS, _cells(q), strict=True):
        print(f"  {name + ':':<23}{cell}")
    if held is not None:
        print(f"  {'schedules held:':<23}{held}")
    if q.version:
        print(f"version:  {q.version}  (set {opt_ts(q, 'updated_at')} by {q.updated_by or '-'}"
              f"{': ' + q.reason if q.reason else ''})")
