"""`schedctl dev --regions N`: the local cluster spread over N regions (issue 11), built from the shared
topology description (scheduler/topology.py: `r1`..`rN`, one etcd member, one planner and `--workers`
workers per region).

etcd is one cluster with a member per region, so that stopping one region's member keeps quorum (with
3 or more regions), as in production. The first region's planner serves the API on `--listen`; the
others on ports of their own. Once every planner serves, the region policy is written (`region
switchover --to r1` with the other regions as standbys, in order): only r1 plans, the rest stand by,
and `schedctl region switchover --to r2` moves planning. Everything stops on Ctrl-C as in one region
(workers, then planners, then etcd). Every planner and worker serves /metrics on a free loopback port,
printed as in one region (`metrics  NAME: URL`; the dashboard's live test scrapes them).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import subprocess
import sys
from pathlib import Path

# dev.py's own helpers (one supervisor, one way to spawn and wait); dev.py imports this module lazily.
from scheduler.cli.dev import (
    Supervisor,
    _api_serving,
    _etcd_healthy,
    _free_port,
    _http_ok,
    _schedctl,
    serve_until_stopped,
    tls_lines,
)
from scheduler.topology import Topology


def _member_ports(base: Path, names: list[str]) -> dict[str, dict[str, int]]:
    """Each member's client and peer ports, kept with the data (a restarted member must keep its peer URL)."""
    path = base / "region-ports.json"
    if path.exists():
        have = {k: {kk: int(vv) for kk, vv in v.items()} for k, v in json.loads(path.read_text()).items()}
        if sorted(have) == sorted(names):
            return have
    ports = {n: {"client": _free_port(), "peer": _free_port()} for n in names}
    path.write_text(json.dumps(ports))
    return ports


def run_regions(args: argparse.Namespace, sup: Supervisor, etcd_bin: str, host: str, port: int) -> int:
    topo = Topology.from_counts(args.regions, planners_per_region=1, workers_per_region=args.workers)
    members = [m.name for m in topo.etcd_members]
    ports = _member_ports(sup.base, members)
    tls = sup.tls
    scheme = "https" if tls else "http"
    peer = {m: f"{scheme}://127.0.0.1:{ports[m]['peer']}" for m in members}
    client = {m: f"{scheme}://127.0.0.1:{ports[m]['client']}" for m in members}
    initial = ",".join(f"{m}={peer[m]}" for m in members)
    state = "existing" if (sup.base / "etcd" / members[0]).exists() else "new"
    etcds = [sup.spawn(f"etcd-{m}", [
        etcd_bin, f"--name={m}", f"--data-dir={sup.base / 'etcd' / m}", f"--listen-client-urls={client[m]}",
        f"--advertise-client-urls={client[m]}", f"--listen-peer-urls={peer[m]}",
        f"--initial-advertise-peer-urls={peer[m]}", f"--initial-cluster={initial}",
        f"--initial-cluster-state={state}", "--initial-cluster-token=schedctl-dev", "--log-level=warn",
        "--auto-compaction-mode=periodic", "--auto-compaction-retention=10m", *(tls.etcd_server() if tls else []),
        *(tls.etcd_peer() if tls else []),
    ]) for m in members]
    ctx = tls.ssl_context() if tls else None
    for m in members:
        sup.wait_until(f"etcd member {m} is healthy", functools.partial(_etcd_healthy, client[m], ctx), 60, etcds)
    endpoints = ",".join(u.removeprefix(f"{scheme}://") for u in client.values())
    env = {k: v for k, v in os.environ.items() if not k.startswith("SCHED_")}
    client_env = {**env, **(tls.client_env() if tls else {})}  # schedctl region switchover below
    apis: dict[str, str] = {}
    planners = []
    metrics: list[tuple[str, str]] = []  # (child, URL): every planner and worker serves /metrics, as in one region

    def metrics_flags(name: str) -> list[str]:
        address = f"127.0.0.1:{_free_port()}"
        metrics.append((name, f"http://{address}/metrics"))
        return ["--metrics-address", address]

    for i, r in enumerate(topo.regions):
        for n in r.planners:
            api = f"{host}:{port}" if i == 0 else f"{host}:{_free_port(host)}"
            apis[n.name] = api
            planners.append(sup.spawn(f"planner-{n.name}", [
                *_schedctl(), "planner", "--node-id", n.name, "--region", r.name, "--etcd-endpoints", endpoints,
                "--partitions", str(args.partitions), "--api-host", host, "--api-port", api.rpartition(":")[2],
                "--log-level", args.log_level, *metrics_flags(n.name), *(tls.planner() if tls else []),
            ], env))
    for node_id, address in apis.items():
        sup.wait_until(f"planner {node_id} serves on {address}",
                       functools.partial(_api_serving, address, tls.client_tls() if tls else None), 60,
                       [*etcds, *planners])
    every = ",".join(apis.values())
    for w in topo.workers:
        sup.spawn(f"worker-{w.name}", [
            *_schedctl(), "worker", "--worker-id", w.name, "--region", w.region, "--planners", every,
            "--pool", "default", "--allow-shell", "true", "--drain-grace", "5", "--log-level", args.log_level,
            *metrics_flags(w.name), *(tls.worker() if tls else []),
        ], env)
    first = topo.region_names[0]
    policy = subprocess.run([*_schedctl(), "region", "switchover", "--to", first, "--standby",
                             ",".join(topo.region_names[1:]), "--reason", "schedctl dev", "--server",
                             f"{host}:{port}", "--timeout", "60"], capture_output=True, text=True, env=client_env,
                            check=False)
    if policy.returncode != 0:
        raise RuntimeError(f"writing the region policy failed ({policy.returncode}): {policy.stderr.strip()}")
    for name, url in metrics:  # "ready" includes the workers, as in one region
        sup.wait_until(f"{name} serves {url}", functools.partial(_http_ok, url), 60, sup.children)
    out = sys.stdout
    out.write(f"schedctl dev: {len(topo.regions)}-region cluster ready (Ctrl-C stops it); data in {sup.base}"
              f"{' (temporary)' if args.data_dir is None else ''}\n")
    for r in topo.regions:
        role = "primary" if r.name == first else "standby"
        e = r.etcd[0].name
        ps = ", ".join(f"{n.name} {apis[n.name]}" for n in r.planners)
        out.write(f"  {r.name} ({role}): etcd {e} {client[e]}; planner {ps}; workers {len(r.workers)}\n")
    for name, url in metrics:
        out.write(f"  metrics  {name}: {url}\n")
    out.write(tls_lines(tls))
    out.write(f"\nTry, in another shell (export SCHED_SERVER={host}:{port}):\n"
              f"  schedctl region status\n"
              f"  schedctl region switchover --to {topo.region_names[1]} --dry-run\n")
    out.flush()
    return serve_until_stopped(sup, "workers, planners, etcd")
