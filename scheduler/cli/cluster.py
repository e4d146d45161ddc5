"""`schedctl cluster status` (the region verbs are in cli/region.py)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from scheduler._gen.scheduler.v1 import cluster_pb2 as cpb
from scheduler.cli.common import client_parent, duration_text, enum_name, opt_ts, print_json, run_call, table
from scheduler.cli.output import Exit
from scheduler.client import SchedulerClient


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    conn = client_parent()
    top = sub.add_parser("cluster", help="cluster status (server)")
    verbs = top.add_subparsers(dest="verb", required=True, metavar="VERB")
    p = verbs.add_parser("status", parents=[conn],
                         help="planners, partitions, queues and workers as one node sees them")
    p.add_argument("--partitions", action="store_true", help="list every partition (owner, token, lag)")
    p.set_defaults(func=_status)


def show_policy(r: Any) -> str:
    if not r.primary_region and not r.version:
        return "no region policy set (every region's planners may own partitions; `region switchover` sets one)"
    return f"primary region {r.primary_region or '-'} (version {r.version}, since {opt_ts(r, 'updated_at')})" + (
        f": {r.reason}" if r.reason else "")


def _status(args: argparse.Namespace) -> int:
    async def body(c: SchedulerClient) -> int:
        st = await c.cluster_status()
        if args.json:
            print_json(st)
            return Exit.OK
        owned = [p for p in st.partitions if p.owner]
        lags = [p.lag.ToMilliseconds() for p in st.partitions if p.HasField("lag")]
        waits = [p.oldest_waiting.ToMilliseconds() for p in st.partitions if p.HasField("oldest_waiting")]
        out = sys.stdout
        out.write(f"answered by {st.answered_by} at {opt_ts(st, 'server_time')}; {show_policy(st.region_policy)}\n")
        out.write(f"partitions: {len(owned)}/{st.partition_count} owned; max watermark lag "
                  f"{duration_text(max(lags)) if lags else '-'}; oldest run waiting for a worker "
                  f"{duration_text(max(waits)) if waits else '-'}; dispatch queue depth {st.dispatch_queue_depth}\n\n")
        table(["PLANNER", "REGION", "LIVENESS", "PARTITIONS", "QUEUE", "WORKERS", "CLOCK", "ADDRESS", "LAST_SEEN"],
              [(p.planner.node_id, p.planner.region,
                enum_name(cpb.PlannerLiveness, p.planner.liveness, "PLANNER_LIVENESS_"), p.partitions_owned,
                p.dispatch_queue_depth, p.connected_workers, _clock(p, st.answered_by), p.planner.api_address or "-",
                opt_ts(p.planner, "last_seen")) for p in st.planners])
        if any(p.planner.liveness == cpb.PLANNER_LIVENESS_SUSPENDED for p in st.planners):
            out.write("\nSUSPENDED: the planner's clock is further than max_clock_skew from the majority of the "
                      "planners; it owns no partitions until it is back in bounds (docs/time.md, Clock skew)\n")
        out.write("\n")
        table(["POOL", "REGION", "WORKERS", "CAPACITY", "RUNNING"],
              [(w.pool, w.region, w.connected_workers, w.capacity, w.running) for w in st.worker_pools])
        if args.partitions:
            out.write("\n")
            table(["PARTITION", "OWNER", "REGION", "TOKEN", "WATERMARK", "LAG", "OLDEST_WAITING"],
                  [(p.partition, p.owner or "-", p.owner_region or "-",
                    p.fencing_token.revision if p.HasField("fencing_token") else "-", opt_ts(p, "watermark"),
                    duration_text(p.lag.ToMilliseconds()) if p.HasField("lag") else "-",
                    duration_text(p.oldest_waiting.ToMilliseconds()) if p.HasField("oldest_waiting") else "-")
                   for p in st.partitions])
        return Exit.OK
    return run_call(args, body)


def _clock(p: Any, answered_by: str) -> str:
    """Its clock minus the answering node's (CLOCK column): `+30.012s`; `0` for the answering node."""
    if p.planner.node_id == answered_by:
        return "0"
    if not p.HasField("clock_offset"):
        return "-"
    return f"{p.clock_offset.ToMilliseconds() / 1000:+.3f}s"

