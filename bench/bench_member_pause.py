"""One etcd member of three paused (SIGSTOP, quorum kept) under a planner-like load: how long calls keep failing,
with the client's outlier ejection (`EtcdConfig.eject_failing`, scheduler/store/etcd/connection.py) against
plain round robin, run alternately in the same session on the same cluster.

A paused member keeps its TCP connections up, so round robin keeps sending it a share of the calls; each of
those fails only at its deadline (0.4 s: a planner's rpc_timeout at a 2 s lease TTL). The load is `--clients`
concurrent loops of one small put each, every loop waiting for its call (as a planner's partition loops do).
Printed per run: calls ok / failed while paused, the time with failures (half seconds in which a call failed),
and the ratio of the two configurations. An ejection lasts 3 s: a member still paused then comes back into the
rotation, fails a few calls and is ejected again, for longer. Which member pauses: a follower (the
leader's loss is an election, not this).

    python bench/bench_member_pause.py                 # 3 pairs, 8 s pauses
    python bench/bench_member_pause.py --quick         # 1 pair, 4 s pauses (CI smoke: no timing asserts)
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from chaos.infra.etcd import EtcdCluster, find_binary
from scheduler.store.etcd import EtcdClient
from scheduler.store.etcd.errors import EtcdError

DEADLINE = 0.4


async def one(cluster: EtcdCluster, follower: int, eject: bool, clients: int, pause_s: float) -> dict[str, float]:
    config = replace(cluster.config(timeout=DEADLINE), eject_failing=eject)
    async with EtcdClient(config) as kv:
        ok = failed = 0
        buckets: set[int] = set()  # half seconds after the pause with a failed call
        t_pause = 0.0
        stop = False

        async def loop(i: int) -> None:
            nonlocal ok, failed
            key = f"/bench/pause/{i}".encode()
            while not stop:
                try:
                    await kv.put(key, b"v", timeout=DEADLINE)
                    if t_pause:
                        ok += 1
                except EtcdError:
                    if t_pause:
                        failed += 1
                        buckets.add(int((time.monotonic() - t_pause) * 2))

        tasks = [asyncio.create_task(loop(i)) for i in range(clients)]
        await asyncio.sleep(1.0)  # every member in the rotation, connections warm
        cluster.pause(follower)
        t_pause = time.monotonic()
        try:
            await asyncio.sleep(pause_s)
        finally:
            cluster.resume(follower)
            stop = True
            await asyncio.gather(*tasks, return_exceptions=True)
        return {"ok": ok, "failed": failed, "failing_for_s": len(buckets) / 2}


def follower_index(cluster: EtcdCluster) -> int:
    leader = cluster.leader_id()
    names = {m.id: m.name for m in cluster.member_list()}
    return next(i for i, m in enumerate(cluster.members) if names.get(leader) != m.name)


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="1 pair of 4 s pauses, for CI")
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--pause", type=float, default=8.0, help="seconds the follower stays paused")
    ap.add_argument("--clients", type=int, default=8, help="concurrent call loops")
    args = ap.parse_args()
    pairs, pause_s = (1, 4.0) if args.quick else (args.pairs, args.pause)
    binary = find_binary("etcd")
    if binary is None:
        raise SystemExit("etcd not found (scripts/setup.sh installs it)")
    cluster = EtcdCluster(Path(tempfile.mkdtemp(prefix="bench-pause-")), binary=binary, size=3).start()
    rows: dict[bool, list[dict[str, float]]] = {False: [], True: []}
    try:
        for p in range(pairs):
            for eject in ((False, True) if p % 2 == 0 else (True, False)):  # A B, B A: drift cancels
                await asyncio.sleep(2.0)  # the resumed member caught up, ejections expired
                r = await one(cluster, follower_index(cluster), eject, args.clients, pause_s)
                rows[eject].append(r)
                print(f"pair {p + 1} {'ejection ' if eject else 'plain RR '}: ok {r['ok']:6.0f}  failed "
                      f"{r['failed']:4.0f}  failing {r['failing_for_s']:4.1f} s of {pause_s:g}", flush=True)
    finally:
        cluster.close()
    med = {k: {f: statistics.median(r[f] for r in v) for f in ("ok", "failed", "failing_for_s")}
           for k, v in rows.items()}
    print(f"\nfollower paused {pause_s:g} s, {args.clients} call loops, {DEADLINE} s deadlines, medians of {pairs}:")
    for k, label in ((False, "plain round robin"), (True, "outlier ejection")):
        m = med[k]
        print(f"  {label:18s} ok {m['ok']:7.0f}  failed {m['failed']:5.0f}  failing for {m['failing_for_s']:5.2f} s")
    base, new = med[False], med[True]
    failing = new["failing_for_s"] / max(base["failing_for_s"], 1e-3)
    print(f"ratio ejection / plain: calls ok while paused {new['ok'] / max(base['ok'], 1):.2f}x, failed "
          f"{new['failed'] / max(base['failed'], 1):.2f}x, failing for {failing:.2f}x")


if __name__ == "__main__":
    asyncio.run(main())
