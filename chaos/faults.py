"""The fault catalogue F1-F12 (../shared/research/drills.md, C2), and F13 (ours), as data: what each fault targets,
its default duration range (in multiples of the lease TTL `T`, so a scenario written for T = 2 s
means the same at T = 5 s) and the parameters it accepts.

The scenario loader validates fault entries against this table, the planner draws durations and
parameters from it, and the checker asks it which faults must show a takeover or a rejected stale
write (validity). Nothing here injects anything: the nemeses are chaos/nemesis.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["CATALOGUE", "QUORUM_LOSS_MEMBERS", "ROLES", "FaultKind", "is_outage", "kind"]

# Who a fault is aimed at. `link` is a network path (planner<->etcd, planner<->worker) rather than a process.
ROLES = ("planner", "worker", "etcd", "region", "link", "cluster")


@dataclass(frozen=True)
class FaultKind:
    id: str
    name: str
    role: str  # the default target role
    roles: tuple[str, ...]  # roles the fault may be aimed at
    duration_ttl: tuple[float, float]  # default duration range, in multiples of the lease TTL
    # Accepted parameters -> allowed values (a tuple: one of them; a type: any value of that type).
    params: dict[str, tuple[Any, ...] | type] = field(default_factory=dict)
    # Validity (etcd robustness's rule): a fault that must show an ownership change in the history,
    # and one (when longer than the TTL) that must show a stale write refused (I4c).
    expects_takeover: bool = False
    expects_stale_reject_beyond_ttl: bool = False
    # An outage: nothing can start while it lasts, so I3 measures lag of the times planned inside it
    # from the window's end, not from the planned time (drills.md I3, catch-up after quorum loss).
    outage: bool = False
    invariants: tuple[str, ...] = ()


CATALOGUE: dict[str, FaultKind] = {k.id: k for k in (
    # `at = "write"`: SIGKILL the instant the planner's next etcd write reaches its link, and drop that
    # write (drills.md's "planner restarts after dispatch, before checkpoint"): the crash lands between
    # two writes of one round instead of wherever the planner happened to be.
    FaultKind("F1", "planner crash", "planner", ("planner",), (0.0, 2.0),
              {"restart": bool, "at": ("any", "write")}, expects_takeover=True,
              invariants=("I1", "I2", "I3", "I6")),
    FaultKind("F2", "planner pause", "planner", ("planner",), (0.5, 3.0),
              {"ttl_multiple": float}, expects_takeover=True, expects_stale_reject_beyond_ttl=True,
              invariants=("I4", "I1", "I6")),
    # A cut cannot land a stale write from a live planner: the gRPC client cancels its own call when
    # the deadline passes (RST_STREAM), and the cancel travels behind the held request, so etcd neither
    # answers nor applies it (measured through the proxy: a txn held past its 0.3 s deadline and then
    # released was never applied). Only a frozen writer (F2) delivers a stale write; F3 proves the
    # takeover and that every write landed under its writer's claim (I4b).
    FaultKind("F3", "planner-etcd partition", "planner", ("planner", "link"), (0.5, 5.0),
              {"direction": ("both", "inbound", "outbound"), "mode": ("drop", "reset")},
              expects_takeover=True, invariants=("I1", "I4", "I6", "I3")),
    FaultKind("F4", "etcd member loss", "etcd", ("etcd",), (1.0, 4.0),
              {"members": (1, 2), "wipe": bool, "signal": ("KILL", "STOP")},
              invariants=("I1", "I2", "I7")),
    FaultKind("F5", "region loss", "region", ("region",), (6.0, 15.0),
              {"variant": ("multi-region", "single-region", "cut"), "mode": ("drop", "reset")},
              expects_takeover=True, outage=True,
              invariants=("I1", "I2", "I3", "I7")),
    FaultKind("F6", "clock skew", "planner", ("planner",), (3.0, 8.0),
              {"offset": ("+30s", "-30s", "+1h", "-1h")}, invariants=("I1", "I2", "I3")),
    FaultKind("F7", "worker crash mid-execution", "worker", ("worker",), (0.5, 2.0),
              {"restart": bool}, invariants=("I1", "I2")),
    FaultKind("F8", "slow workers", "worker", ("worker",), (2.0, 6.0),
              {"hold_ms": int}, invariants=("I1", "I2", "I3")),
    # Made by the planner itself (a test-only switch in its assignment stream, dispatch/duplicate.py):
    # HTTP/2 frames cannot be repeated below gRPC. So it is aimed at a planner (its stream to the workers;
    # a link name `<planner>->...` means that planner) or at the whole cluster (every planner).
    FaultKind("F9", "duplicate delivery", "planner", ("planner", "link", "cluster"), (2.0, 6.0),
              {"probability": float, "delay_ms": int}, invariants=("I1",)),
    FaultKind("F10", "flaky etcd link", "link", ("link", "planner"), (2.0, 8.0),
              {"latency_ms": int, "jitter_ms": int, "drop": float}, invariants=("I4", "I6", "I3")),
    FaultKind("F11", "watch compaction", "planner", ("planner",), (1.0, 3.0), {}, invariants=("I2",)),
    FaultKind("F12", "etcd membership change", "etcd", ("etcd",), (1.0, 4.0),
              {"action": ("remove-add", "replace"), "leader": ("move", "remove")}, invariants=("I7",)),
    # Not in drills.md's catalogue (F1-F12): found by reading the liveness code (session 33). A worker reaches one
    # planner only, whose partitions are then drained to planners the worker cannot reach, while its runs from
    # that planner last (the sink holds them `hold_ms`): the new owners must not run them a second time.
    # Namespaces only (a cut between two nodes); beyond the TTL so the drain completes inside the window.
    FaultKind("F13", "worker stranded on a drained planner", "worker", ("worker",), (6.0, 10.0),
              {"hold_ms": int}, invariants=("I1", "I2")),
)}

# F4 with both members gone (quorum lost) is an outage too; the checker asks this, not the table.
QUORUM_LOSS_MEMBERS = 2


def kind(fault_id: str) -> FaultKind:
    try:
        return CATALOGUE[fault_id]
    except KeyError:
        raise KeyError(f"unknown fault type {fault_id!r}; known: {', '.join(CATALOGUE)}") from None


def is_outage(fault_id: str, params: dict[str, Any]) -> bool:
    if fault_id == "F4":
        return int(params.get("members", 1)) >= QUORUM_LOSS_MEMBERS
    return kind(fault_id).outage
