"""`schedctl preview`: check a spec before submitting it, with no server and no etcd."""

from __future__ import annotations

import argparse
import json
import sys

from scheduler.cli.output import Exit, fail_invalid, parse_instant, rfc3339
from scheduler.clock import SYSTEM_CLOCK
from scheduler.errors import InvalidArgument
from scheduler.ids import check_name
from scheduler.timeplan import DstGap, DstOverlap, parse_spec
from scheduler.timeplan.hashing import uses_hash
from scheduler.timeplan.plan import check_in_window
from scheduler.timeplan.zone import check_zone_name, get_zone

MAX_COUNT = 10_000


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "preview",
        help="print the next planned instants of a spec (UTC, RFC3339)",
        description="Print the next N planned instants strictly after --start (default: now), one per line, "
        "as RFC3339 UTC. Works offline: use it to check a spec before submitting it.",
    )
    p.add_argument("--cron", required=True, metavar="EXPR", help="cron spec, macro or '@every <duration>'")
    p.add_argument("--tz", default="UTC", metavar="ZONE", help="IANA time zone the calendar is read in")
    p.add_argument("--start", metavar="RFC3339", help="list instants strictly after this (default: now)")
    p.add_argument("--count", type=int, default=10, metavar="N", help=f"how many (1-{MAX_COUNT}, default 10)")
    p.add_argument("--dst-gap", choices=[g.value for g in DstGap], help="nonexistent local times")
    p.add_argument("--dst-overlap", choices=[o.value for o in DstOverlap], help="repeated local times")
    p.add_argument("--schedule-id", default="", metavar="ID",
                   help="schedule id the H fields are hashed from (required when the spec uses H)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of lines")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        if not 1 <= args.count <= MAX_COUNT:
            raise InvalidArgument("count", f"{args.count} is outside 1-{MAX_COUNT}")
        check_zone_name(args.tz, "tz")
        get_zone(args.tz)  # name the zone field before the spec's
        start = SYSTEM_CLOCK.wall_ms() if args.start is None else \
            check_in_window(parse_instant(args.start, "start"), "start")
        if args.schedule_id:
            check_name(args.schedule_id, "schedule_id")  # as the server checks a schedule's id
        elif uses_hash(args.cron):
            # H is the hash of the schedule id: hashed from "" it printed times no schedule would have, where
            # the server refuses the spec without an id (`spec.schedule_id: is required when the spec uses H`).
            raise InvalidArgument("schedule_id", "is required when the spec uses H (it is hashed from the "
                                                 "schedule id): pass --schedule-id ID")
        plan = parse_spec(
            args.cron,
            schedule_id=args.schedule_id,
            tz=args.tz,
            dst_gap=DstGap(args.dst_gap) if args.dst_gap else None,
            dst_overlap=DstOverlap(args.dst_overlap) if args.dst_overlap else None,
        )
    except InvalidArgument as e:
        return fail_invalid(e)
    times: list[str] = []
    for ms in plan.iter_after_ms(start):
        times.append(rfc3339(ms))
        if len(times) == args.count:
            break
    if args.json:
        json.dump(
            {"spec": args.cron, "time_zone": args.tz, "start": rfc3339(start), "times": times},
            sys.stdout,
        )
        sys.stdout.write("\n")
    else:
        sys.stdout.write("".join(t + "\n" for t in times))
    return Exit.OK
