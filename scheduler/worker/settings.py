"""`WorkerSettings`: everything a worker process is configured with (flags > SCHED_* > TOML)."""

from __future__ import annotations

import logging
import os
import socket
from dataclasses import dataclass

from scheduler import eventloop
from scheduler.auth.bearer import read_token_file
from scheduler.config import TEST_MODE_ENV, Settings, check_tls_files, parse_listen_address, refuse_plaintext, test_mode
from scheduler.errors import InvalidArgument
from scheduler.ids import ID_RE
from scheduler.loop_lag import check_gc_threshold
from scheduler.model import MAX_NAME_LEN

DEFAULT_PLANNER = "127.0.0.1:7000"


def default_worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def _check_address(field: str, address: str) -> None:
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65_536:
        raise InvalidArgument(field, f"{address!r} is not host:port")


@dataclass(frozen=True)
class WorkerSettings(Settings):
    worker_id: str = ""  # empty: <hostname>:<pid>
    pool: str = "default"
    region: str = "default"
    planners: tuple[str, ...] = (DEFAULT_PLANNER,)  # seeds; the others are discovered
    concurrency: int = 8  # most attempts running at once, across all planners
    heartbeat_interval: float = 1.0  # seconds; used only when a planner's Welcome does not say
    drain_grace: float = 30.0  # on SIGTERM: how long running attempts may go on before they are stopped
    cancel_grace: float = 5.0  # after a Cancel: how long a handler may clean up before its task is cancelled
    # A result with no ResultAck after this long is sent again, through another planner: a planner frozen
    # with results in hand must not keep them from etcd (and the schedule's next runs) for long. Acks come
    # within milliseconds; a needless resend costs one DUPLICATE answer.
    result_ack_timeout: float = 3.0
    credit_idle_after: float = 5.0  # a planner sending nothing this long keeps only one credit (see credits.py)
    reconnect_backoff_min: float = 0.1
    reconnect_backoff_max: float = 5.0
    welcome_timeout: float = 5.0  # a planner that does not answer Hello within this is re-dialled
    discovery_interval: float = 30.0  # how often to ask for the planner list again
    keepalive_time: float = 10.0  # gRPC keepalive pings, so a frozen planner is noticed and left
    flush_timeout: float = 5.0  # at shutdown: how long to wait for the last results to be acknowledged
    shell_kill_grace: float = 2.0  # shell executor: SIGTERM, then SIGKILL the process group after this
    http_timeout: float = 30.0  # http executor: default when the payload has no timeout_s
    log_level: str = "info"
    metrics_address: str = ""  # host:port of the Prometheus endpoint (port 0: pick one); empty or "off": none
    # host:port of a gRPC health service for probes (`schedctl health`; port 0: pick one); empty or "off": none
    health_address: str = ""
    # TLS to the planners (docs/operations.md, "Security"): the CA bundle that signs the planners' certificates
    # (none: the system's roots), and this worker's client certificate and key for mutual TLS.
    tls_ca_file: str | None = None
    tls_cert_file: str | None = None
    tls_key_file: str | None = None
    tls_server_name: str | None = None  # verify the planners' certificates against this name, not their address
    insecure: bool = False  # allow plaintext streams to non-loopback planners
    # The shell executor runs the command a schedule names: a remote-code-execution surface for whoever may
    # create schedules on this pool. Off by default: a worker without it fails shell executions permanently,
    # naming this setting (docs/workers.md, "Shell").
    allow_shell: bool = False
    # The bearer token this worker presents to planners (a principal with `<pool>:worker`); empty: none
    # (a cluster with auth on then refuses the worker, UNAUTHENTICATED). Read again on every re-dial.
    token_file: str = ""
    # Tests only: run an assignment delivered twice twice (no dedupe by execution id + attempt), to show
    # that a drill's I1 check catches it (drill fault F9). Refused outside test mode.
    unsafe_disable_dedupe: bool = False
    event_loop: str = "asyncio"  # asyncio or uvloop (scheduler/eventloop.py; bench/README.md measures both)
    # `schedctl worker`'s cyclic collector, as a planner's (scheduler/loop_lag.py): at CPython's 700 it took 11-13%
    # of a no-op worker's CPU at saturation. The Worker class never sets it: the process is its host's.
    gc_threshold: int = 50_000

    @property
    def tls_enabled(self) -> bool:
        return self.tls_ca_file is not None or self.tls_cert_file is not None

    @property
    def resolved_worker_id(self) -> str:
        return self.worker_id or default_worker_id()

    def validate(self) -> None:
        check_gc_threshold(self.gc_threshold)
        if self.worker_id and (len(self.worker_id) > 256 or any(c.isspace() for c in self.worker_id)):
            raise InvalidArgument("worker_id", "must be at most 256 characters without spaces")
        for name in ("pool", "region"):
            value = getattr(self, name)
            if not value or len(value) > MAX_NAME_LEN or not ID_RE.match(value):
                raise InvalidArgument(name, f"{value!r} must be 1-{MAX_NAME_LEN} characters of A-Z a-z 0-9 . _ : -")
        if not self.planners:
            raise InvalidArgument("planners", "at least one planner address is required")
        for i, address in enumerate(self.planners):
            _check_address(f"planners[{i}]", address)
        check_tls_files("tls_", self.tls_cert_file, self.tls_key_file, self.tls_ca_file)
        for i, address in enumerate(self.planners):  # the ones discovered later are dialled the same way
            refuse_plaintext("worker stream", address, f"planners[{i}]", secure=self.tls_enabled,
                             insecure=self.insecure)
        if not 1 <= self.concurrency <= 10_000:
            raise InvalidArgument("concurrency", f"{self.concurrency} is outside 1-10000")
        for name in ("heartbeat_interval", "result_ack_timeout", "credit_idle_after", "reconnect_backoff_min",
                     "welcome_timeout", "discovery_interval", "keepalive_time", "http_timeout"):
            if getattr(self, name) <= 0:
                raise InvalidArgument(name, "must be positive")
        for name in ("drain_grace", "cancel_grace", "flush_timeout", "shell_kill_grace"):
            if getattr(self, name) < 0:
                raise InvalidArgument(name, "must not be negative")
        if self.token_file:
            read_token_file(self.token_file)  # fail at start, naming the setting, not at the first dial
        if self.reconnect_backoff_max < self.reconnect_backoff_min:
            raise InvalidArgument("reconnect_backoff_max", "must be >= reconnect_backoff_min")
        parse_listen_address("metrics_address", self.metrics_address)
        parse_listen_address("health_address", self.health_address)
        eventloop.check("event_loop", self.event_loop)
        if self.unsafe_disable_dedupe and not test_mode():
            raise InvalidArgument("unsafe_disable_dedupe",
                                  f"is refused outside test mode ({TEST_MODE_ENV}=1): it reruns repeated deliveries")
        if self.log_level.upper() not in logging.getLevelNamesMapping():
            raise InvalidArgument("log_level", f"{self.log_level!r} is not a level (debug, info, warning, error)")
