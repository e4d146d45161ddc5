"""`schedctl dev`: a complete local cluster in the foreground, for trying things out.

One etcd (data in `--data-dir`, else a temporary directory removed at exit), one planner serving the
API on `--listen`, and `--workers N` workers with the built-in `shell` and `http` executors, each a
child process (`schedctl planner`, `schedctl worker`: the same code as production, and one crash
does not take the others down silently). Ctrl-C or SIGTERM stops them in dependency order (workers
drain, the planner hands its partitions back, then etcd), by pid. Children run in their own process
group (so the terminal's Ctrl-C reaches only this supervisor, which orders the shutdown) and with a
parent-death signal, so even a SIGKILLed `schedctl dev` leaves no orphan on Linux.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING

from scheduler.cli.output import Exit
from scheduler.errors import InvalidArgument
from scheduler.pdeathsig import with_pdeathsig
from scheduler.planner.settings import PlannerSettings, is_loopback
from scheduler.worker.settings import WorkerSettings

if TYPE_CHECKING:
    from scheduler.tls import ClientTls

def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "dev", help="run a complete local cluster (etcd, planner, workers) in the foreground",
        description="Run etcd, one planner serving the API and N workers (shell and http executors) until "
                    "Ctrl-C or SIGTERM, which stops them all. For trying things out, not for production.")
    p.add_argument("--listen", default="127.0.0.1:7000", metavar="HOST:PORT", help="API address (default %(default)s)")
    p.add_argument("--workers", type=int, default=2, metavar="N", help="worker processes (default %(default)s)")
    p.add_argument("--data-dir", metavar="DIR", help="keep etcd data and logs here (default: a temporary "
                   "directory, removed at exit)")
    p.add_argument("--partitions", type=int, default=16, metavar="P", help="partitions (fixed at first start)")
    p.add_argument("--regions", type=int, default=1, metavar="N",
                   help="spread the cluster over N regions r1..rN (an etcd member, a planner and --workers workers "
                        "each; r1 primary, the others standby); default %(default)s")
    p.add_argument("--log-level", default="info", help="children's log level (their logs go to DIR/logs/)")
    p.add_argument("--tls", action="store_true",
                   help="run everything over mutual TLS (etcd included), with certificates from `schedctl certs dev` "
                        "written to a temporary directory, or to --certs")
    p.add_argument("--certs", metavar="DIR", help="with --tls: the certificates' directory (made with `schedctl certs "
                   "dev DIR` if it holds no CA yet; kept after exit)")
    p.set_defaults(func=run)


@dataclasses.dataclass(frozen=True)
class DevTls:
    """Which certificate each child uses (the layout of scheduler/certs.py); None: plaintext on loopback."""

    dir: Path

    def file(self, name: str) -> str:
        return str(self.dir / name)

    def etcd_server(self) -> list[str]:
        return [f"--cert-file={self.file('etcd-server.crt')}", f"--key-file={self.file('etcd-server.key')}",
                "--client-cert-auth", f"--trusted-ca-file={self.file('ca.crt')}"]

    def etcd_peer(self) -> list[str]:
        return [f"--peer-cert-file={self.file('etcd-server.crt')}", f"--peer-key-file={self.file('etcd-server.key')}",
                "--peer-client-cert-auth", f"--peer-trusted-ca-file={self.file('ca.crt')}"]

    def planner(self) -> list[str]:
        return ["--tls-cert-file", self.file("planner.crt"), "--tls-key-file", self.file("planner.key"),
                "--tls-ca-file", self.file("ca.crt"), "--etcd-ca-file", self.file("ca.crt"),
                "--etcd-cert-file", self.file("etcd-client.crt"), "--etcd-key-file", self.file("etcd-client.key"),
                # Several IP endpoints (--regions) make one `ipv4:a,b,c` target with no host name to verify.
                "--etcd-tls-server-name", "localhost"]

    def worker(self) -> list[str]:
        return ["--tls-ca-file", self.file("ca.crt"), "--tls-cert-file", self.file("worker.crt"),
                "--tls-key-file", self.file("worker.key")]

    def client_env(self) -> dict[str, str]:
        """What schedctl needs (the admin certificate), as environment variables."""
        return {"SCHED_TLS_CA_FILE": self.file("ca.crt"), "SCHED_TLS_CERT_FILE": self.file("admin.crt"),
                "SCHED_TLS_KEY_FILE": self.file("admin.key")}

    def client_tls(self) -> ClientTls:
        from scheduler.tls import ClientTls

        return ClientTls(self.file("ca.crt"), self.file("admin.crt"), self.file("admin.key"))

    def ssl_context(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=self.file("ca.crt"))
        ctx.load_cert_chain(self.file("etcd-root.crt"), self.file("etcd-root.key"))
        return ctx


def _dev_tls(args: argparse.Namespace, base: Path) -> DevTls | None:
    if not args.tls:
        if args.certs:
            raise InvalidArgument("certs", "--certs goes with --tls")
        return None
    from scheduler.certs import dev_certs

    where = Path(args.certs).resolve() if args.certs else base / "certs"
    if not (where / "ca.crt").exists():
        dev_certs(where)
    missing = [n for n in ("ca.crt", "planner.crt", "worker.crt", "admin.crt", "etcd-server.crt", "etcd-client.crt",
                           "etcd-root.crt") if not (where / n).exists()]
    if missing:
        raise InvalidArgument("certs", f"{where} lacks {', '.join(missing)} (make it with `schedctl certs dev DIR`)")
    return DevTls(where)


def find_etcd() -> str | None:
    """Next to this Python (a venv's bin/, where scripts/setup.sh installs it), then PATH."""
    beside = Path(sys.executable).parent / "etcd"
    return str(beside) if os.access(beside, os.X_OK) else shutil.which("etcd")


def _schedctl() -> list[str]:
    beside = Path(sys.executable).parent / "schedctl"
    return [str(beside)] if os.access(beside, os.X_OK) else [sys.executable, "-m", "scheduler.cli.main"]


def _free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _has_setting(cls: type, name: str) -> bool:
    return any(f.name == name for f in dataclasses.fields(cls))


@dataclasses.dataclass
class Child:
    name: str
    proc: subprocess.Popen[bytes]
    log: Path


class Stop(Exception):
    """A signal arrived while starting up."""


class Supervisor:
    def __init__(self, base: Path, log_level: str) -> None:
        self.base = base
        self.logs = base / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.log_level = log_level
        self.children: list[Child] = []
        self.tls: DevTls | None = None  # `--tls`: every child over mutual TLS
        self.stopping: str | None = None  # the signal's name once one arrived
        self.signals = 0

    def on_signal(self, signum: int, _frame: FrameType | None) -> None:
        self.signals += 1
        self.stopping = signal.Signals(signum).name
        if self.signals > 1:  # impatient operator: no more grace
            for c in self.children:
                if c.proc.poll() is None:
                    os.kill(c.proc.pid, signal.SIGKILL)

    def spawn(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> Child:
        log = self.logs / f"{name}.log"
        run, pre = with_pdeathsig(argv)  # SIGKILL when this supervisor dies
        with log.open("ab") as f:
            proc = subprocess.Popen(run, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    env=env, start_new_session=True, preexec_fn=pre)
        child = Child(name, proc, log)
        self.children.append(child)
        return child

    def wait_until(self, what: str, ready: Callable[[], bool], timeout: float, watch: list[Child]) -> None:
        deadline = time.monotonic() + timeout
        while not ready():
            if self.stopping:
                raise Stop(self.stopping)
            for c in watch:
                if c.proc.poll() is not None:
                    raise RuntimeError(f"{c.name} exited ({c.proc.returncode}) before {what}; its log:\n"
                                       + _tail(c.log))
            if time.monotonic() > deadline:
                raise RuntimeError(f"{what} did not happen within {timeout:g}s; logs in {self.logs}")
            time.sleep(0.1)

    def dead(self) -> Child | None:
        return next((c for c in self.children if c.proc.poll() is not None), None)

    def stop_all(self) -> None:
        """Workers first (they drain), then the planner (hands partitions back), then etcd; SIGKILL
        whatever overstays, by pid."""
        # One phase per kind, each waited for before the next starts: the planner drains only while
        # etcd is up, and workers report their last results to a planner that still serves.
        # (`planner-r1-p1`, `etcd-r1-e1`: the children of a multi-region cluster.)
        phases = [([c for c in self.children if c.name.startswith("worker")], 10.0),
                  ([c for c in self.children if c.name.partition("-")[0] == "planner"], 15.0),
                  ([c for c in self.children if c.name.partition("-")[0] == "etcd"], 10.0)]
        for group, grace in phases:
            for g in group:
                if g.proc.poll() is None:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(g.proc.pid, signal.SIGTERM)
            deadline = time.monotonic() + grace
            for g in group:
                try:
                    g.proc.wait(max(0.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    os.kill(g.proc.pid, signal.SIGKILL)
                    g.proc.wait()


def _tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def _etcd_healthy(client_url: str, context: ssl.SSLContext | None = None) -> bool:
    try:
        with urllib.request.urlopen(client_url + "/health", timeout=1, context=context) as r:
            return bool(json.loads(r.read()).get("health") == "true")
    except (OSError, ValueError):
        return False


def _http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1) as r:
            return bool(r.status == 200)
    except OSError:
        return False


def _api_serving(address: str, tls: ClientTls | None = None) -> bool:
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    from scheduler.tls import Dialer

    try:
        with Dialer(tls).channel(address) as ch:
            r = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=1)
            return bool(r.status == health_pb2.HealthCheckResponse.SERVING)
    except grpc.RpcError:
        return False


def _ports(base: Path) -> dict[str, int]:
    """etcd's ports, kept with its data: a member restarted on other peer ports would not match its
    stored membership."""
    path = base / "ports.json"
    if path.exists():
        return {k: int(v) for k, v in json.loads(path.read_text()).items()}
    ports = {"client": _free_port(), "peer": _free_port()}
    path.write_text(json.dumps(ports))
    return ports


def _check(args: argparse.Namespace) -> tuple[str, int]:
    host, sep, port = args.listen.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65_536:
        raise InvalidArgument("listen", f"{args.listen!r} is not host:port (e.g. 127.0.0.1:7000)")
    if not is_loopback(host):
        # The dev cluster runs without auth (every call allowed, shell on): only for this machine.
        raise InvalidArgument("listen", f"{host} is not a loopback address; the dev cluster allows every call "
                              "(no auth) and runs shell commands, so it listens on 127.0.0.1, ::1 or localhost only")
    if not 0 <= args.workers <= 64:
        raise InvalidArgument("workers", f"{args.workers} is outside 0-64")
    if not 1 <= args.regions <= 5:
        raise InvalidArgument("regions", f"{args.regions} is outside 1-5")
    # Refuse a taken address before starting anything, rather than after etcd is up. (A race is
    # possible; the planner's own bind failure is then reported with its log.)
    with socket.socket(socket.AF_INET6 if ":" in host.strip("[]") else socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host.strip("[]"), int(port)))
        except OSError as e:
            raise InvalidArgument("listen", f"cannot listen on {args.listen}: {e.strerror}; pick another --listen "
                                  "HOST:PORT (is another `schedctl dev` or planner running?)") from None
    return host, int(port)


def run(args: argparse.Namespace) -> int:
    host, port = _check(args)
    etcd = find_etcd()
    if etcd is None:
        print("schedctl: etcd not found next to this Python or on PATH: run scripts/setup.sh, or put an etcd 3.5 "
              "binary on PATH", file=sys.stderr)
        return Exit.INVALID
    temp = args.data_dir is None
    base = Path(tempfile.mkdtemp(prefix="schedctl-dev-")) if temp else Path(args.data_dir).resolve()
    base.mkdir(parents=True, exist_ok=True)
    sup = Supervisor(base, args.log_level)
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, sup.on_signal)
    rc: int = Exit.OK
    try:
        sup.tls = _dev_tls(args, base)
        if sup.tls is None:  # said once, at start: the secure path is one flag away
            print(f"schedctl dev: plaintext on loopback ({host}); `schedctl dev --tls` runs it over mutual TLS",
                  file=sys.stderr, flush=True)
        if args.regions > 1:
            from scheduler.cli.dev_regions import run_regions  # imports this module: only when asked for
            rc = run_regions(args, sup, etcd, host, port)
        else:
            rc = _run(args, sup, etcd, host, port)
    except InvalidArgument as e:
        print(f"schedctl: {e}", file=sys.stderr)
        rc = Exit.INVALID
    except Stop:
        rc = Exit.OK
    except RuntimeError as e:
        print(f"schedctl: {e}", file=sys.stderr)
        rc = Exit.FAILURE
    finally:
        sup.stop_all()
        if temp:
            shutil.rmtree(base, ignore_errors=True)
        print("schedctl dev: stopped", file=sys.stderr, flush=True)
    return rc


def _run(args: argparse.Namespace, sup: Supervisor, etcd_bin: str, host: str, port: int) -> int:
    ports = _ports(sup.base)
    tls = sup.tls
    client_url = f"{'https' if tls else 'http'}://127.0.0.1:{ports['client']}"
    peer_url = f"http://127.0.0.1:{ports['peer']}"  # one member: no peer traffic
    etcd = sup.spawn("etcd", [
        etcd_bin, "--name=dev", f"--data-dir={sup.base / 'etcd'}", f"--listen-client-urls={client_url}",
        f"--advertise-client-urls={client_url}", f"--listen-peer-urls={peer_url}",
        f"--initial-advertise-peer-urls={peer_url}", f"--initial-cluster=dev={peer_url}",
        "--initial-cluster-state=new", "--log-level=warn",
        "--auto-compaction-mode=periodic", "--auto-compaction-retention=10m", *(tls.etcd_server() if tls else []),
    ])
    etcd_ctx = tls.ssl_context() if tls else None
    sup.wait_until("etcd is healthy", lambda: _etcd_healthy(client_url, etcd_ctx), 30, [etcd])
    api = f"{host}:{port}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("SCHED_")}  # the flags say everything
    metrics: list[tuple[str, str]] = []

    def metrics_flags(name: str, cls: type) -> list[str]:
        # Prometheus endpoints exist once the settings have `metrics_address` (docs/operations.md).
        if not _has_setting(cls, "metrics_address"):
            return []
        address = f"127.0.0.1:{_free_port()}"
        metrics.append((name, f"http://{address}/metrics"))
        return ["--metrics-address", address]

    planner = sup.spawn("planner", [
        *_schedctl(), "planner", "--node-id", "dev-planner", "--etcd-endpoints", f"127.0.0.1:{ports['client']}",
        "--partitions", str(args.partitions), "--api-host", host, "--api-port", str(port),
        "--log-level", args.log_level, *metrics_flags("planner", PlannerSettings), *(tls.planner() if tls else []),
    ], env)
    workers = [sup.spawn(f"worker-{i}", [
        *_schedctl(), "worker", "--worker-id", f"dev-worker-{i}", "--planners", api, "--pool", "default",
        "--allow-shell", "true",  # the quick start's `--command` schedules: a loopback cluster of your own
        "--drain-grace", "5", "--log-level", args.log_level, *metrics_flags(f"worker-{i}", WorkerSettings),
        *(tls.worker() if tls else []),
    ], env) for i in range(1, args.workers + 1)]
    api_tls = tls.client_tls() if tls else None
    sup.wait_until(f"the API serves on {api}", lambda: _api_serving(api, api_tls), 30, [etcd, planner])
    # "Ready" includes the workers: their metrics endpoints answer once they have started.
    for name, url in metrics:
        sup.wait_until(f"{name} serves {url}", functools.partial(_http_ok, url), 30, sup.children)
    out = sys.stdout
    out.write(f"schedctl dev: cluster ready (Ctrl-C stops it)\n"
              f"  API      {api}    (export SCHED_SERVER={api})\n"
              f"  etcd     pid {etcd.proc.pid}, {client_url}, data in {sup.base}"
              f"{' (temporary)' if args.data_dir is None else ''}\n"
              f"  planner  pid {planner.proc.pid}, log {planner.log}\n")
    for w in workers:
        out.write(f"  {w.name} pid {w.proc.pid}, log {w.log}\n")
    for name, url in metrics:
        out.write(f"  metrics  {name}: {url}\n")
    if not metrics:
        out.write("  metrics  (not available in this build)\n")
    out.write(tls_lines(tls))
    out.write(f"\nTry, in another shell:\n"
              f"  schedctl schedule create --server {api} --id hello --cron '*/5 * * * * *' --command 'echo hello'\n"
              f"  schedctl exec list --server {api} --schedule hello\n")
    out.flush()
    return serve_until_stopped(sup, "workers, planner, etcd")


def tls_lines(tls: DevTls | None) -> str:
    if tls is None:
        return "  TLS      off (--tls turns it on)\n"
    env = " ".join(f"{k}={v}" for k, v in tls.client_env().items())
    return (f"  TLS      mutual TLS everywhere (etcd too); certificates in {tls.dir}\n"
            f"           schedctl needs: export {env}\n")


def serve_until_stopped(sup: Supervisor, what: str) -> int:
    """Wait for Ctrl-C (or a signal) while every child lives; a child that exits stops the cluster, its log's
    tail on stderr. `what` names what is stopped, in order, for the closing line."""
    while not sup.stopping:
        gone = sup.dead()
        if gone is not None:
            print(f"schedctl: {gone.name} exited ({gone.proc.returncode}); stopping the cluster. Its log:\n"
                  + _tail(gone.log), file=sys.stderr)
            return Exit.FAILURE
        time.sleep(0.2)
    print(f"schedctl dev: {sup.stopping}: stopping {what}", file=sys.stderr, flush=True)
    return Exit.OK
