"""`schedctl region status | switchover | failback | affinity` (docs/operations.md, "Regions").

A switchover is one CAS on the region policy (AdminService.Switchover); the planners do the rest (the old
region's release after their in-flight batch, the new region's claim). So that an operator knows when it
is over, the CLI then polls cluster status until the new region owns every partition, with a progress
line, and prints the measured pause; `--timeout` bounds the wait (exit 6: the policy did change, but the
move is not complete: look at `region status`).
"""

from __future__ import annotations

import argparse
import asyncio
import re
import sys
import time
from collections import Counter
from typing import Any

from scheduler._gen.scheduler.v1 import cluster_pb2 as cpb
from scheduler.cli.cluster import show_policy
from scheduler.cli.common import (
    client_parent,
    duration_text,
    enum_name,
    opt_ts,
    print_json,
    run_call,
    table,
    to_dict,
    ts,
)
from scheduler.cli.output import Exit, check_version
from scheduler.client import ClientError, SchedulerClient
from scheduler.errors import InvalidArgument
from scheduler.region import affinity as ra
from scheduler.region import policy as rp

POLL_S = 0.1  # how often the wait reads cluster status (also the resolution of the measured pause)
_DURATION = re.compile(r"^(-?\d+(?:\.\d+)?)(ms|s|m|h)?$")


def duration_ms(text: str, field: str) -> int:
    """`500ms`, `15s` (or `15`), `2m`, `1h` -> ms. The sign is left to the server's check (it names the field)."""
    m = _DURATION.match(text.strip())
    if m is None:
        raise InvalidArgument(field, f"{text!r} is not a duration (e.g. 500ms, 15s, 2m)")
    return round(float(m.group(1)) * {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000}[m.group(2) or "s"])


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    conn = client_parent()
    top = sub.add_parser("region", help="region policy: status, switchover, failback (server)")
    verbs = top.add_subparsers(dest="verb", required=True, metavar="VERB")
    p = verbs.add_parser("status", parents=[conn], help="policy, history, planners per region, who owns what")
    p.set_defaults(func=_status)

    # `--timeout` is the wait here (issue 11's interface): each call keeps the default request deadline.
    # A parent of its own: "resolve" takes `--timeout` off the parent's action object itself, which
    # argparse shares with every parser made from that parent, so a shared `conn` would lose `--timeout`
    # for the verbs registered after this one (`region affinity --timeout 5` was refused).
    p = verbs.add_parser("switchover", parents=[client_parent()], conflict_handler="resolve",
                         help="move planning to another region, wait until it owns every partition")
    p.add_argument("region", metavar="REGION", nargs="?", help="the region to make primary (or --to)")
    p.add_argument("--to", metavar="REGION", help="the region to make primary")
    _move_flags(p)
    p.add_argument("--standby", metavar="R1,R2", help="set the standby order (failover goes to the first live one)")
    p.add_argument("--failover-grace", metavar="DURATION",
                   help="set how long the primary may have no live planner before a standby takes over")
    p.add_argument("--failback", choices=["manual", "auto"], help="set the failback mode")
    p.add_argument("--failback-stable", metavar="DURATION",
                   help="set how long the old primary must be healthy before failback=auto moves back")
    p.set_defaults(func=_switchover, request_timeout=None)

    p = verbs.add_parser("failback", parents=[client_parent()], conflict_handler="resolve",
                         help="switch over to the region that planned before the last change")
    _move_flags(p)
    p.set_defaults(func=_failback, request_timeout=None, to=None, region=None, standby=None, failover_grace=None,
                   failback=None, failback_stable=None)

    p = verbs.add_parser("affinity", parents=[conn], help="set a pool's worker affinity (strict, prefer, any)")
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--pool", metavar="POOL", help="the worker pool")
    which.add_argument("--default", action="store_true", help="set the default for pools without an override")
    p.add_argument("--mode", metavar="MODE", help="strict (only the planning region's workers), prefer (others "
                   "once no local worker has had credit for --prefer-wait), any")
    p.add_argument("--prefer-wait", metavar="DURATION", help="with --mode prefer: e.g. 2s (default), 500ms")
    p.add_argument("--clear", action="store_true", help="remove the pool's override (the default applies)")
    p.add_argument("--reason", default="")
    p.add_argument("--expected-version", type=int, metavar="N", help="refuse (exit 4) unless the policy is at N")
    p.set_defaults(func=_affinity)


def _move_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--reason", default="")
    p.add_argument("--expected-version", type=int, metavar="N", help="refuse (exit 4) unless the policy is at N")
    p.add_argument("--dry-run", action="store_true", help="show what would move; change nothing")
    p.add_argument("--timeout", type=float, default=60.0, metavar="SECONDS", dest="wait_timeout",
                   help="how long to wait for the new region to own every partition (default 60; exit 6 after)")
    p.add_argument("--no-wait", action="store_true", help="return once the policy is written")


# ---- status -----------------------------------------------------------------------------------------


def _status(args: argparse.Namespace) -> int:
    async def body(c: SchedulerClient) -> int:
        st = await c.cluster_status()
        if args.json:
            print_json(st)
            return Exit.OK
        out = sys.stdout
        pol = st.region_policy
        out.write(show_policy(pol) + "\n")
        if pol.primary_region:
            grace = duration_text(pol.failover_grace.ToMilliseconds()) if pol.HasField("failover_grace") else "-"
            stable = duration_text(pol.failback_stable.ToMilliseconds()) if pol.HasField("failback_stable") else "-"
            out.write(f"standby order: {', '.join(pol.standby_regions) or '-'}; failover grace {grace}; "
                      f"failback {pol.failback or 'manual'}" + (f" (stable {stable})" if pol.failback == "auto" else "")
                      + "\n")
            if st.HasField("primary_last_seen_ago"):
                ago = st.primary_last_seen_ago.ToMilliseconds()
                out.write("primary: a planner is live now\n" if ago == 0 else
                          f"primary: NO live planner for {duration_text(ago)} (as {st.answered_by} saw it)\n")
        owners = Counter(p.owner_region or "(unowned)" for p in st.partitions)
        out.write("partitions by owner region: " + ", ".join(f"{r} {n}" for r, n in sorted(owners.items())) + "\n\n")
        # REGION_WORKERS: distinct workers of the row's region (every worker streams to every planner, so a
        # planner's own stream count is every worker of every region).
        per_region = workers_per_region(st.worker_pools)
        table(["REGION", "ROLE", "PLANNER", "LIVENESS", "PARTITIONS", "REGION_WORKERS", "LAST_SEEN"],
              [(p.planner.region, _role(pol, p.planner.region), p.planner.node_id,
                enum_name(cpb.PlannerLiveness, p.planner.liveness, "PLANNER_LIVENESS_"), p.partitions_owned,
                per_region.get(p.planner.region, 0), opt_ts(p.planner, "last_seen")) for p in st.planners])
        if st.worker_pools:
            out.write("\n")
            table(["POOL", "REGION", "WORKERS", "CAPACITY", "RUNNING"],
                  [(w.pool, w.region, w.connected_workers, w.capacity, w.running) for w in st.worker_pools])
        if pol.primary_region:
            out.write("\n" + show_affinity(pol) + "\n")
        if pol.history:
            out.write("\n")
            table(["AT", "KIND", "FROM", "TO", "BY", "REASON"],
                  [(ts(h.at), h.kind, h.from_region or "-", h.to_region, h.by or "-", h.reason or "-")
                   for h in pol.history])
        return Exit.OK
    return run_call(args, body)


def workers_per_region(pools: Any) -> dict[str, int]:
    """Distinct worker ids per region over every pool (a worker belongs to one pool; an older server
    sends no ids: its per-pool count, already deduplicated across planners, is used)."""
    ids: dict[str, set[str]] = {}
    counts: dict[str, int] = {}
    for w in pools:
        if w.worker_ids:
            ids.setdefault(w.region, set()).update(w.worker_ids)
        else:
            counts[w.region] = counts.get(w.region, 0) + w.connected_workers
    return {r: counts.get(r, 0) + len(ids.get(r, ())) for r in {*ids, *counts}}


def _affinity_text(a: Any) -> str:
    if a.mode == "prefer" and a.HasField("prefer_wait"):
        return f"prefer (wait {duration_text(a.prefer_wait.ToMilliseconds())})"
    return a.mode or "prefer"


def show_affinity(pol: Any) -> str:
    """The policy's worker affinity, one line: default, then each pool's override."""
    default = _affinity_text(pol.default_affinity) if pol.HasField("default_affinity") \
        else f"prefer (wait {duration_text(ra.DEFAULT_PREFER_WAIT_MS)})"
    pools = "; ".join(f"{p.pool} {_affinity_text(p.affinity)}" for p in pol.pool_affinity)
    return f"worker affinity: default {default}" + (f"; {pools}" if pools else "")


def _role(pol: Any, region: str) -> str:
    if not pol.primary_region:
        return "any"
    return "primary" if region == pol.primary_region else "standby"


# ---- switchover, failback ---------------------------------------------------------------------------------


def _switchover(args: argparse.Namespace) -> int:
    check_version(args.expected_version)
    target = args.to or args.region
    if not target:
        print("schedctl: target_region: name it (`region switchover --to REGION`)", file=sys.stderr)
        return Exit.INVALID
    if args.region and args.to and args.region != args.to:
        print("schedctl: target_region: REGION and --to disagree", file=sys.stderr)
        return Exit.INVALID
    settings: dict[str, Any] = {}
    if args.standby is not None:
        settings["standby"] = [r for r in args.standby.split(",") if r]
    if args.failover_grace is not None:
        settings["failover_grace_ms"] = duration_ms(args.failover_grace, "failover_grace")
    if args.failback is not None:
        settings["failback"] = args.failback
    if args.failback_stable is not None:
        settings["failback_stable_ms"] = duration_ms(args.failback_stable, "failback_stable")

    async def body(c: SchedulerClient) -> int:
        return await _move(c, args, target, settings)
    return run_call(args, body)


# Client-side errors of `region affinity` name the flag to fix (the server's, if it refuses, name the field).
_AFFINITY_FLAGS = {"mode": "--mode", "prefer_wait": "--prefer-wait", "pool": "--pool", "clear": "--clear"}


def _affinity(args: argparse.Namespace) -> int:
    check_version(args.expected_version)
    try:
        mode, wait = _affinity_input(args)
    except InvalidArgument as e:
        print(f"schedctl: {_AFFINITY_FLAGS.get(e.field, e.field)}: {e.reason}", file=sys.stderr)
        return Exit.INVALID

    async def body(c: SchedulerClient) -> int:
        pol = await c.set_worker_affinity(args.pool or "", mode, default=args.default, prefer_wait_ms=wait,
                                          clear=args.clear, reason=args.reason,
                                          expected_version=args.expected_version)
        if args.json:
            print_json(pol)
        else:
            print(show_policy(pol))
            print(show_affinity(pol))
        return Exit.OK
    return run_call(args, body)


def _affinity_input(args: argparse.Namespace) -> tuple[str, int | None]:
    """(mode, prefer_wait ms) from the flags. Checked here too, so that bad input is a clear error before
    any connection; the server checks again. Raises InvalidArgument naming the field."""
    if args.clear:
        if args.default:
            raise InvalidArgument("clear", "the default affinity cannot be cleared; set --mode")
        if args.mode or args.prefer_wait:
            raise InvalidArgument("clear", "--mode and --prefer-wait do not go with --clear")
    elif not args.mode:
        raise InvalidArgument("mode", "is required (strict, prefer or any)")
    if args.pool is not None and not args.pool:
        raise InvalidArgument("pool", "is required (an empty pool name)")
    mode = "" if args.clear else ra.parse_mode(args.mode).value
    wait = None if args.prefer_wait is None else duration_ms(args.prefer_wait, "prefer_wait")
    if wait is not None and wait <= 0:
        raise InvalidArgument("prefer_wait", f"must be positive (got {args.prefer_wait})")
    if wait is not None and mode != ra.Mode.PREFER.value:
        raise InvalidArgument("prefer_wait", f"only applies to --mode prefer (mode is {mode or 'none: --clear'})")
    return mode, wait


def _failback(args: argparse.Namespace) -> int:
    check_version(args.expected_version)

    async def body(c: SchedulerClient) -> int:
        pol = (await c.cluster_status()).region_policy
        # The last change that moved planning: an affinity change (from == to) is not one, nor is a kind
        # this version does not know (a newer server's), as the planners judge it (region/policy.py MOVES).
        back = next((h.from_region for h in reversed(pol.history) if h.kind in rp.MOVES), "")
        if not back:
            print("schedctl: the region policy has no previous primary to fail back to (see `region status`)",
                  file=sys.stderr)
            return Exit.CONFLICT
        return await _move(c, args, back, {})
    return run_call(args, body)


async def _move(c: SchedulerClient, args: argparse.Namespace, target: str, settings: dict[str, Any]) -> int:
    if args.dry_run:
        return _dry_run(await c.cluster_status(), target)
    t0 = time.monotonic()
    policy = await c.switchover(target, reason=args.reason, expected_version=args.expected_version, **settings)
    if args.json and args.no_wait:
        print_json(policy)
        return Exit.OK
    if not args.json:
        print(show_policy(policy))
    if args.no_wait:
        return Exit.OK
    rc, wait = await _wait(c, target, t0, args.wait_timeout, quiet=args.json)
    if args.json:
        print_json({**to_dict(policy), "wait": wait})  # the policy's fields, as before the wait existed
    return rc


def _dry_run(st: Any, target: str) -> int:
    pol = st.region_policy
    live = [p.planner.node_id for p in st.planners
            if p.planner.region == target and p.planner.liveness == cpb.PLANNER_LIVENESS_ALIVE]
    moving = Counter((p.owner_region or "(unowned)", p.owner or "-") for p in st.partitions
                     if p.owner_region != target)
    print(f"now: {show_policy(pol)}")
    print(f"would make {target} primary" + (" (it already is: only settings would change)"
                                            if pol.primary_region == target else ""))
    if not live:
        print(f"would be REFUSED: region {target!r} has no live planner")
        return Exit.CONFLICT
    n = sum(moving.values())
    print(f"{n}/{st.partition_count} partitions would move to {target}'s planners {', '.join(sorted(live))} "
          f"(about {st.partition_count // len(live)} each)")
    for (region, owner), k in sorted(moving.items()):
        print(f"  {k:5d} from {owner} ({region})")
    return Exit.OK


async def _wait(c: SchedulerClient, target: str, t0: float, timeout: float, *,
                quiet: bool) -> tuple[int, dict[str, object]]:
    """Until every partition is owned by `target`; the pause printed is from the policy write to then (the
    longest any partition can have gone unplanned), and the longest a partition was seen without an owner."""
    unowned_since: dict[int, float] = {}
    longest_gap = 0.0
    total = 0
    done = 0
    while True:
        now = time.monotonic()
        try:
            st = await c.cluster_status()
        except ClientError as e:  # one failed poll does not end the wait; the deadline does
            if not quiet:
                sys.stderr.write(f"\nstatus poll failed: {e}\n")
            st = None
        if st is not None:
            total = st.partition_count
            done = sum(1 for p in st.partitions if p.owner and p.owner_region == target)
            for p in st.partitions:
                if not p.owner:
                    unowned_since.setdefault(p.partition, now)
                elif p.partition in unowned_since:
                    longest_gap = max(longest_gap, now - unowned_since.pop(p.partition))
            if not quiet:
                sys.stderr.write(f"\r{target} owns {done}/{total} partitions ({now - t0:.1f}s)")
                sys.stderr.flush()
            if total and done == total:
                break
        if now - t0 > timeout:
            if not quiet:
                sys.stderr.write("\n")
            print(f"schedctl: timed out after {timeout:g}s: {target} owns {done}/{total} partitions; the policy "
                  f"is written, the move is not complete (see `schedctl region status`)", file=sys.stderr)
            return Exit.TIMEOUT, {"complete": False, "owned": done, "partitions": total}
        await asyncio.sleep(POLL_S)
    took = time.monotonic() - t0
    if not quiet:
        sys.stderr.write("\n")
        print(f"switchover complete: {target} owns every partition {took:.2f}s after the policy write "
              f"(longest a partition was seen unowned: {longest_gap:.2f}s)")
    return Exit.OK, {"complete": True, "complete_after_s": round(took, 3), "longest_unowned_s": round(longest_gap, 3)}
