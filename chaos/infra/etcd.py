"""Real etcd processes for tests: one member or an N-member cluster on free loopback ports.

etcd cannot listen on port 0 and report the port (its peer and client URLs are part of the cluster's
membership), so members get ports from chaos/infra/ports.py's `pick_port()` (outside the kernel's
ephemeral range), and a member that exits because a port was taken meanwhile is started again: a
new cluster on new ports, or a restarted member on its own ports (they are in its stored
membership) after a pause, a bounded number of times.

Everything started here is stopped by pid (never by name): by `EtcdCluster.close()` from fixture
finalizers, by an atexit hook as a backstop, and on Linux by a parent-death signal (setpriv
--pdeathsig) so that even a SIGKILLed pytest leaves no etcd behind.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import ssl
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from chaos.infra.ports import is_bind_error, pick_port
from chaos.infra.procs import forget, spawn
from scheduler.store.etcd import EtcdConfig

ETCD_MISSING = (
    "etcd binary not found: set SCHED_ETCD_BIN to an etcd 3.5 binary, or run scripts/setup.sh "
    "(it installs .venv/bin/etcd). Tests marked `etcd` need a real server."
)

EtcdFactory = Callable[..., "EtcdCluster"]  # the `etcd_factory` fixture: options -> started cluster

# Start-ups lost to a taken port before giving up: each loss needs another process to bind the very
# port picked in the second or so before etcd binds it, so more than one in a row means a real problem.
BIND_ATTEMPTS = 5


class PortInUse(RuntimeError):
    """An etcd member exited because one of its listen addresses was taken."""


def find_binary(name: str = "etcd") -> str | None:
    """$SCHED_ETCD_BIN (etcdctl: its sibling), then next to sys.executable (.venv/bin), then PATH."""
    env = os.environ.get("SCHED_ETCD_BIN")
    if env:
        path = Path(env) if name == "etcd" else Path(env).with_name(name)
        return str(path) if os.access(path, os.X_OK) else None
    beside = Path(sys.executable).parent / name
    if os.access(beside, os.X_OK):
        return str(beside)
    return shutil.which(name)


def free_port() -> int:
    """A port to tell a server to listen on (chaos/infra/ports.py); a server that can bind port 0 and report
    it should do that instead, and "nothing listens here" is `unused_port()`."""
    return pick_port()


@dataclass(frozen=True)
class TlsFiles:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path


def make_tls_files(directory: Path) -> TlsFiles:
    """A throw-away CA, a server certificate for 127.0.0.1/localhost and a client certificate
    (openssl CLI: the `cryptography` package is not a dependency of this project)."""
    directory.mkdir(parents=True, exist_ok=True)
    openssl = shutil.which("openssl")
    if openssl is None:
        raise RuntimeError("openssl CLI not found; TLS tests need it to make certificates")

    def run(*args: str) -> None:
        subprocess.run([openssl, *args], cwd=directory, check=True, capture_output=True)

    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    run("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.crt", "-days", "2", "-subj", "/CN=sched-test-ca",
        "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign")
    for name, ext in (
        ("server", "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth,clientAuth\n"),
        ("client", "extendedKeyUsage=clientAuth\n"),
    ):
        (directory / f"{name}.ext").write_text(ext)
        run("req", *ec, "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN=sched-test-{name}")
        run("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
            "-out", f"{name}.crt", "-days", "2", "-extfile", f"{name}.ext")
    d = directory
    return TlsFiles(d / "ca.crt", d / "server.crt", d / "server.key", d / "client.crt", d / "client.key")


@dataclass
class Member:
    name: str
    client_port: int
    peer_port: int
    data_dir: Path
    log_path: Path
    process: subprocess.Popen[bytes] | None = None
    paused: bool = False
    log_start: int = 0  # where this process's lines begin in log_path (a restart appends)

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.client_port}"

    @property
    def pid(self) -> int:
        assert self.process is not None, f"{self.name} is not running"
        return self.process.pid

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None


@dataclass
class EtcdCluster:
    """An etcd cluster of `size` members under `base_dir`. Call start(); always close()."""

    base_dir: Path
    size: int = 1
    binary: str | None = None
    auto_compaction_mode: str | None = None  # "periodic" | "revision"
    auto_compaction_retention: str | None = None  # e.g. "1h", "1000"
    progress_notify_interval: str | None = None  # --experimental-watch-progress-notify-interval, e.g. "500ms"
    quota_backend_bytes: int | None = None
    auth_token_ttl: int | None = None  # seconds a simple auth token lives without use
    tls: TlsFiles | None = None
    client_cert_auth: bool = False  # mTLS: require client certificates signed by tls.ca
    unsafe_no_fsync: bool = False
    extra_args: Sequence[str] = ()
    members: list[Member] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.binary = self.binary or find_binary("etcd")
        if self.binary is None:
            raise RuntimeError(ETCD_MISSING)
        self.base_dir.mkdir(parents=True, exist_ok=True)
        self.members = [
            Member(f"m{i}", pick_port(), pick_port(), self.base_dir / f"m{i}.etcd", self.base_dir / f"m{i}.log")
            for i in range(self.size)
        ]
        self.bind_retries = 0  # start-ups lost to a taken port (for the record: logs keep each attempt)

    # ---- addresses and clients ------------------------------------------------------------------

    @property
    def scheme(self) -> str:
        return "https" if self.tls else "http"

    @property
    def endpoints(self) -> tuple[str, ...]:
        return tuple(m.endpoint for m in self.members)

    def config(self, **overrides: Any) -> EtcdConfig:
        """Client settings for this cluster (TLS files included when the cluster uses TLS)."""
        settings: dict[str, Any] = {"endpoints": self.endpoints}
        if self.tls:
            settings["ca_file"] = str(self.tls.ca)
            if self.client_cert_auth:
                settings["cert_file"] = str(self.tls.client_cert)
                settings["key_file"] = str(self.tls.client_key)
        settings.update(overrides)
        return EtcdConfig(**settings)

    # ---- lifecycle ------------------------------------------------------------------------------

    def start(self, timeout: float = 30.0) -> EtcdCluster:
        """Start every member and wait until all are healthy. A member that lost a port to another
        process makes the whole cluster start over on new ports (each member's peer URL is in every
        member's --initial-cluster), with fresh data dirs."""
        try:
            for attempt in range(1, BIND_ATTEMPTS + 1):
                for m in self.members:
                    self._spawn(m)
                try:
                    self.wait_healthy(timeout=timeout)
                    return self
                except PortInUse:
                    if attempt == BIND_ATTEMPTS:
                        raise
                    self._start_over()
        except BaseException:
            self.close()
            raise
        return self

    def _start_over(self) -> None:
        self.close()
        self.bind_retries += 1
        for m in self.members:
            shutil.rmtree(m.data_dir, ignore_errors=True)
            if m.log_path.exists():  # kept for diagnosis, next to the new one
                m.log_path.rename(m.log_path.with_suffix(f".bind{self.bind_retries}.log"))
            m.client_port, m.peer_port = pick_port(), pick_port()

    def _args(self, m: Member) -> list[str]:
        assert self.binary is not None
        initial = ",".join(f"{x.name}=http://127.0.0.1:{x.peer_port}" for x in self.members)
        client_url = f"{self.scheme}://127.0.0.1:{m.client_port}"
        args = [
            self.binary,
            f"--name={m.name}",
            f"--data-dir={m.data_dir}",
            f"--listen-client-urls={client_url}",
            f"--advertise-client-urls={client_url}",
            f"--listen-peer-urls=http://127.0.0.1:{m.peer_port}",
            f"--initial-advertise-peer-urls=http://127.0.0.1:{m.peer_port}",
            f"--initial-cluster={initial}",
            "--initial-cluster-state=new",
            f"--initial-cluster-token=sched-test-{id(self):x}",
            "--log-level=warn",
        ]
        if self.auto_compaction_mode:
            args.append(f"--auto-compaction-mode={self.auto_compaction_mode}")
        if self.auto_compaction_retention:
            args.append(f"--auto-compaction-retention={self.auto_compaction_retention}")
        if self.progress_notify_interval:
            args.append(f"--experimental-watch-progress-notify-interval={self.progress_notify_interval}")
        if self.quota_backend_bytes:
            args.append(f"--quota-backend-bytes={self.quota_backend_bytes}")
        if self.auth_token_ttl:
            args.append(f"--auth-token-ttl={self.auth_token_ttl}")
        if self.tls:
            args += [f"--cert-file={self.tls.server_cert}", f"--key-file={self.tls.server_key}"]
            if self.client_cert_auth:
                args += ["--client-cert-auth", f"--trusted-ca-file={self.tls.ca}"]
        if self.unsafe_no_fsync:
            args.append("--unsafe-no-fsync")
        return [*args, *self.extra_args]

    def _spawn(self, m: Member) -> None:
        if m.running:
            raise RuntimeError(f"{m.name} is already running (pid {m.pid})")
        m.log_start = m.log_path.stat().st_size if m.log_path.exists() else 0
        m.process = spawn(self._args(m), m.log_path)
        m.paused = False

    def kill(self, i: int) -> None:
        """SIGKILL member i (no graceful shutdown; its data dir stays for restart())."""
        self._signal_and_reap(self.members[i], signal.SIGKILL)

    def stop(self, i: int, timeout: float = 10.0) -> None:
        """SIGTERM member i and wait; SIGKILL if it does not exit in time."""
        m = self.members[i]
        if not m.running:
            return
        os.kill(m.pid, signal.SIGTERM)
        if m.paused:
            os.kill(m.pid, signal.SIGCONT)  # a stopped process cannot act on SIGTERM
        try:
            assert m.process is not None
            m.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self._signal_and_reap(m, signal.SIGKILL)
        forget(m.pid)

    def restart(self, i: int, timeout: float = 30.0) -> None:
        """Start member i again with the same name, ports and data dir (kills it first if running)."""
        m = self.members[i]
        if m.running:
            self.kill(i)
        for attempt in range(1, BIND_ATTEMPTS + 1):
            self._spawn(m)
            try:
                self.wait_healthy([i], timeout=timeout)
                return
            except PortInUse:
                # Its ports are in its stored membership and in clients' endpoint lists: wait for
                # whoever holds one to let go, rather than move.
                if attempt == BIND_ATTEMPTS:
                    raise
                self.bind_retries += 1
                time.sleep(0.5 * attempt)

    def pause(self, i: int) -> None:
        m = self.members[i]
        os.kill(m.pid, signal.SIGSTOP)
        m.paused = True

    def resume(self, i: int) -> None:
        m = self.members[i]
        os.kill(m.pid, signal.SIGCONT)
        m.paused = False

    def close(self) -> None:
        for m in self.members:
            if m.running:
                self._signal_and_reap(m, signal.SIGKILL)

    def _signal_and_reap(self, m: Member, sig: signal.Signals) -> None:
        if m.process is None:
            return
        if m.process.poll() is None:
            os.kill(m.pid, sig)
            m.process.wait()
        forget(m.pid)
        m.paused = False

    # ---- health ---------------------------------------------------------------------------------

    def _ssl_context(self) -> ssl.SSLContext | None:
        if not self.tls:
            return None
        ctx = ssl.create_default_context(cafile=str(self.tls.ca))
        if self.client_cert_auth:
            ctx.load_cert_chain(str(self.tls.client_cert), str(self.tls.client_key))
        return ctx

    def healthy(self, i: int) -> bool:
        """etcd's own /health: true once the member has a leader and serves requests."""
        m = self.members[i]
        url = f"{self.scheme}://127.0.0.1:{m.client_port}/health"
        try:
            with urllib.request.urlopen(url, timeout=1.0, context=self._ssl_context()) as resp:
                return bool(json.load(resp).get("health") == "true")
        except (OSError, ValueError):
            return False

    def wait_healthy(self, indexes: Sequence[int] | None = None, timeout: float = 30.0) -> None:
        wanted = list(range(self.size)) if indexes is None else list(indexes)
        deadline = time.monotonic() + timeout
        while True:
            for i in wanted:
                m = self.members[i]
                if m.process is not None and m.process.poll() is not None:
                    tail = _tail(m.log_path, start=m.log_start)
                    kind = PortInUse if is_bind_error(tail) else RuntimeError
                    raise kind(f"etcd {m.name} exited with {m.process.returncode}; see {m.log_path}:\n{tail}")
            if all(self.healthy(i) for i in wanted):
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"etcd members {wanted} not healthy after {timeout}s; logs in {self.base_dir}")
            time.sleep(0.05)

    # ---- etcdctl --------------------------------------------------------------------------------

    def etcdctl(self, *args: str, user: str | None = None, member: int | None = None) -> str:
        """Run etcdctl against the cluster (or one member) and return its stdout."""
        binary = find_binary("etcdctl")
        if binary is None:
            raise RuntimeError("etcdctl not found next to etcd")
        endpoints = [self.members[member]] if member is not None else self.members
        argv = [binary, "--endpoints=" + ",".join(f"{self.scheme}://{m.endpoint}" for m in endpoints)]
        if self.tls:
            argv.append(f"--cacert={self.tls.ca}")
            if self.client_cert_auth:
                argv += [f"--cert={self.tls.client_cert}", f"--key={self.tls.client_key}"]
        if user:
            argv.append(f"--user={user}")
        done = subprocess.run([*argv, *args], capture_output=True, text=True, timeout=30,
                              env={**os.environ, "ETCDCTL_API": "3"})
        if done.returncode != 0:
            raise RuntimeError(f"etcdctl {' '.join(args)} failed: {done.stderr.strip()}")
        return done.stdout


def _tail(path: Path, lines: int = 20, start: int = 0) -> str:
    try:
        with path.open("rb") as f:
            f.seek(start)
            text = f.read().decode(errors="replace")
        return "\n".join(text.splitlines()[-lines:])
    except OSError:
        return "(no log)"
