"""Settings, the gRPC channel, authentication and the single call path of every unary RPC.

Retry policy lives here and only here: reads may retry on UNAVAILABLE within their timeout; writes
are sent once. The one exception is a rejected auth token: etcd refuses such a request before it is
proposed to raft, so re-authenticating and sending it once more cannot apply it twice.

The client's TLS files (CA, certificate, key) are looked at every `tls_reload_interval` seconds on the
call path, through scheduler/tls.py's ClientTls (the same reload rule as the API's certificates: only a
complete, matching new set replaces the current one; a bad one is logged and the current one stays).
Channel credentials are fixed when a channel is made, so new files mean a new channel: every call and
stream opened from then on uses it. Streams opened before (a watch, a lease keepalive) stay on the old
channel, whose TLS session was verified at its handshake, until they end; the old channel is closed with
the client.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import logging
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import grpc

from scheduler.store.etcd import _pb
from scheduler.store.etcd.errors import EtcdError, Unauthenticated, Unavailable, from_rpc_error, token_expired
from scheduler.tls import ClientTls

__all__ = ["EOF", "Clock", "Connection", "EtcdConfig", "grpc_target"]

# grpc.aio's end-of-stream marker; grpc-stubs does not declare it.
EOF: Any = grpc.aio.EOF  # type: ignore[attr-defined]

log = logging.getLogger(__name__)

Clock = Callable[[], float]
"""Monotonic seconds. Injected so that deadlines can be tested; production passes time.monotonic."""

_READ_BACKOFF = (0.05, 0.5)  # first and largest pause between read retries, seconds


@dataclass(frozen=True, slots=True)
class EtcdConfig:
    """How to reach etcd. Endpoints are `host:port` (optionally `http://` or `https://`).

    Several endpoints must be IP literals of one family (gRPC's `ipv4:`/`ipv6:` targets); for DNS,
    give one name that resolves to every member. `lb_policy="round_robin"` spreads requests over the
    members, `"pick_first"` sticks to the first reachable one and fails over in list order.
    """

    endpoints: tuple[str, ...]
    lb_policy: Literal["round_robin", "pick_first"] = "round_robin"
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    tls: bool | None = None  # None: TLS when ca_file/cert_file is set or an endpoint says https://
    tls_server_name: str | None = None  # name to verify in the server certificate instead of the host
    timeout: float = 5.0  # default deadline of one RPC, seconds; every method also takes its own
    read_retries: int = 2  # extra attempts of a read after UNAVAILABLE, within the same deadline
    # HTTP/2 pings find a dead peer (SIGSTOP, cut cable) that TCP alone would not. etcd's server
    # refuses pings more often than --grpc-keepalive-min-time (5 s by default).
    keepalive_time: float = 10.0
    keepalive_timeout: float = 5.0
    reconnect_backoff_max: float = 2.0  # gRPC defaults to 120 s, far too slow to follow an etcd restart
    tls_reload_interval: float = 5.0  # seconds between looks at the TLS files for a rotation (0: every call)
    max_receive_bytes: int = 256 * 1024 * 1024
    # Leave members that fail calls out of the rotation for a while (`service_config`); off only to measure it.
    eject_failing: bool = True
    # A watch stream silent this long, half of it after a progress request etcd answers at once when healthy,
    # is re-opened from its next revision (watch.py): a SIGSTOPped member keeps its TCP connection up and
    # would otherwise hold the stream until the keepalive gives up (keepalive_time + keepalive_timeout). 0: off.
    watch_stall_timeout: float = 2.0

    def __post_init__(self) -> None:
        if isinstance(self.endpoints, str) or not self.endpoints:
            raise ValueError("endpoints must be a non-empty tuple of host:port strings")
        object.__setattr__(self, "endpoints", tuple(self.endpoints))  # a list would do; store a tuple
        if (self.username is None) != (self.password is None):
            raise ValueError("username and password go together")
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("cert_file and key_file go together (mTLS)")
        if self.timeout <= 0 or self.keepalive_time <= 0 or self.keepalive_timeout <= 0:
            raise ValueError("timeouts must be > 0")
        if self.read_retries < 0:
            raise ValueError("read_retries must be >= 0")
        if self.watch_stall_timeout < 0:
            raise ValueError("watch_stall_timeout must be >= 0")
        if self.tls_reload_interval < 0:
            raise ValueError("tls_reload_interval must be >= 0")
        grpc_target(self.endpoints)  # validates the endpoint list early

    @property
    def use_tls(self) -> bool:
        if self.tls is not None:
            return self.tls
        https = any(e.startswith("https://") for e in self.endpoints)
        return https or self.ca_file is not None or self.cert_file is not None


def _split(endpoint: str) -> tuple[str, int]:
    rest = endpoint.split("://", 1)[1] if "://" in endpoint else endpoint
    host, sep, port = rest.rstrip("/").rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"endpoint {endpoint!r} is not host:port")
    return host.strip("[]"), int(port)


def grpc_target(endpoints: tuple[str, ...]) -> str:
    """The gRPC target naming every endpoint, so the channel's load balancer can fail over."""
    hosts = [_split(e) for e in endpoints]
    versions: set[int] = set()
    for host, _ in hosts:
        try:
            versions.add(ipaddress.ip_address(host).version)
        except ValueError:
            versions.add(0)  # a DNS name
    if versions == {4}:
        return "ipv4:" + ",".join(f"{h}:{p}" for h, p in hosts)
    if versions == {6}:
        return "ipv6:" + ",".join(f"[{h}]:{p}" for h, p in hosts)
    if len(hosts) == 1:
        return f"dns:///{hosts[0][0]}:{hosts[0][1]}"
    raise ValueError(
        "several endpoints must all be IPv4 or all IPv6 literals; for DNS give one name with several records"
    )


# Members that fail calls are left out of the rotation for a while (gRPC's outlier detection, gRFC A50, around
# the round-robin policy). A SIGSTOPped or wedged member keeps its TCP connections up, so the channel counts it
# ready and round robin sent it a third of the calls until gRPC's keepalive gave up on it (4-5 s measured with
# the planners' 0.4 s deadlines: a third of the calls failed, each after its whole deadline); the drills' F4 of
# one member of three, quorum kept, stopped every planner for the whole pause (6.8 s) and more. Ejected: a
# member with at least 20% of at least 2 calls failed in a 0.5 s interval, for 3 s (longer each time again, at
# most 10 s), at most half of the members at once (bench/bench_member_pause.py measures it). Only with several
# endpoints: a single one (or one DNS name) has nowhere else to go.
_OUTLIER_DETECTION = {"loadBalancingConfig": [{"outlier_detection_experimental": {
    "interval": "0.5s", "baseEjectionTime": "3s", "maxEjectionTime": "10s", "maxEjectionPercent": 50,
    "failurePercentageEjection": {"threshold": 20, "enforcementPercentage": 100, "minimumHosts": 2,
                                  "requestVolume": 2},
    "childPolicy": [{"round_robin": {}}]}}]}


def service_config(config: EtcdConfig) -> str | None:
    """The channel's service config: round robin with outlier ejection over several endpoints, else None."""
    if not config.eject_failing or config.lb_policy != "round_robin" or len(config.endpoints) < 2:
        return None
    return json.dumps(_OUTLIER_DETECTION)


def _channel(config: EtcdConfig, tls: ClientTls | None) -> grpc.aio.Channel:
    sc = service_config(config)
    options: list[tuple[str, Any]] = [
        ("grpc.lb_policy_name", config.lb_policy) if sc is None else ("grpc.service_config", sc),
        ("grpc.keepalive_time_ms", int(config.keepalive_time * 1000)),
        ("grpc.keepalive_timeout_ms", int(config.keepalive_timeout * 1000)),
        # Recent grpc-core waits for a ping ack per this separate knob (default 60 s), measured here:
        # without it a SIGSTOPped etcd went unnoticed for a minute despite keepalive_timeout.
        ("grpc.http2.ping_timeout_ms", int(config.keepalive_timeout * 1000)),
        # Keep pinging an idle watch stream: the default stops after 2 pings without data.
        ("grpc.http2.max_pings_without_data", 0),
        ("grpc.initial_reconnect_backoff_ms", 100),
        ("grpc.min_reconnect_backoff_ms", 100),
        ("grpc.max_reconnect_backoff_ms", int(config.reconnect_backoff_max * 1000)),
        ("grpc.max_receive_message_length", config.max_receive_bytes),
        # etcd is reached directly; an http_proxy in the environment must not capture loopback traffic.
        ("grpc.enable_http_proxy", 0),
    ]
    target = grpc_target(config.endpoints)
    if tls is None:
        return grpc.aio.insecure_channel(target, options=options)
    if config.tls_server_name:
        options.append(("grpc.ssl_target_name_override", config.tls_server_name))
    return grpc.aio.secure_channel(target, tls.credentials(), options=options)


class Connection:
    """One channel, its stubs and the auth token; shared by the client, its watchers and keepers."""

    def __init__(self, config: EtcdConfig, clock: Clock = time.monotonic) -> None:
        self.config = config
        self.clock = clock
        self.tls = ClientTls(config.ca_file, config.cert_file, config.key_file) if config.use_tls else None
        self.channel = _channel(config, self.tls)
        self.stubs = _pb.Stubs(self.channel)
        self._tls_generation = self.tls.generation if self.tls else 0
        self._tls_next_look = clock() + config.tls_reload_interval
        self._retired: list[grpc.aio.Channel] = []  # channels of earlier TLS files: their streams may live on
        self.tls_reloads = 0
        self._token: str | None = None
        self._auth_lock = asyncio.Lock()
        self.authentications = 0  # how many tokens were obtained (tests check re-auth happens once)

    # ---- auth -----------------------------------------------------------------------------------

    @property
    def has_credentials(self) -> bool:
        return self.config.username is not None

    async def authenticate(self, *, stale_token: str | None = None, timeout: float | None = None) -> None:
        """Obtain a token. With `stale_token`, skip if another task has already replaced it."""
        if not self.has_credentials:
            return
        async with self._auth_lock:
            if stale_token is not None and self._token != stale_token:
                return
            request = _pb.authenticate_request(self.config.username or "", self.config.password or "")
            # Sent without a token: Authenticate needs none, and a stale one must not get in its way.
            response = await self._call(self.stubs.auth.Authenticate, request, False, timeout, with_token=False)
            self._token = str(response.token)
            self.authentications += 1

    def metadata(self, *, require_leader: bool = False) -> tuple[tuple[str, str], ...]:
        md: list[tuple[str, str]] = []
        if self._token is not None:
            md.append(("token", self._token))
        if require_leader:
            # etcd then ends the stream when its member loses the leader, instead of going silent.
            md.append(("hasleader", "true"))
        return tuple(md)

    @property
    def token(self) -> str | None:
        return self._token

    # ---- calls ----------------------------------------------------------------------------------

    async def unary(self, method: Callable[..., Awaitable[Any]], request: Any, *, write: bool,
                    timeout: float | None = None) -> Any:
        """Send one unary RPC. Raises only `EtcdError` subclasses (see errors.py)."""
        old = self.stubs
        if self.maybe_reload_tls():  # `method` belongs to the old channel's stubs: take the new channel's
            method = _rebind(old, self.stubs, method)
        return await self._call(method, request, write, timeout, with_token=True)

    def maybe_reload_tls(self) -> bool:
        """A new channel if the TLS files changed since the last look (at most every tls_reload_interval s)
        and the new set is good (ClientTls keeps and logs a bad one). True if the channel was replaced."""
        if self.tls is None:
            return False
        now = self.clock()
        if now < self._tls_next_look:
            return False
        self._tls_next_look = now + self.config.tls_reload_interval
        try:
            generation = self.tls.refresh()
        except Exception:  # never fail a call over its files: the current channel still works
            log.exception("etcd TLS files could not be checked; keeping the current ones")
            return False
        if generation == self._tls_generation:
            return False
        self._tls_generation = generation
        self._retired.append(self.channel)
        self.channel = _channel(self.config, self.tls)
        self.stubs = _pb.Stubs(self.channel)
        self.tls_reloads += 1
        log.info("etcd client TLS files reloaded: new calls and streams use them",
                 extra={"event": "etcd_tls_reloaded", "cert_file": self.config.cert_file,
                        "ca_file": self.config.ca_file})
        return True

    async def _call(self, method: Callable[..., Awaitable[Any]], request: Any, write: bool,
                    timeout: float | None, *, with_token: bool) -> Any:
        budget = self.config.timeout if timeout is None else timeout
        deadline = self.clock() + budget
        retries_left = 0 if write else self.config.read_retries
        reauthenticated = False
        pause = _READ_BACKOFF[0]
        while True:
            token = self._token
            md = self.metadata() if with_token else ()
            try:
                # wait_for_ready: while the channel reconnects (etcd restarting, failover to another
                # member) the call waits within its deadline instead of failing at once.
                return await method(request, timeout=max(deadline - self.clock(), 0.001), metadata=md,
                                    wait_for_ready=True)
            except grpc.aio.AioRpcError as exc:
                err = from_rpc_error(exc, write=write)
                if (isinstance(err, Unauthenticated) and with_token and self.has_credentials
                        and not reauthenticated and token_expired(exc)):
                    reauthenticated = True
                    await self.authenticate(stale_token=token, timeout=max(deadline - self.clock(), 0.001))
                    continue
                retry = (isinstance(err, Unavailable) and exc.code() == grpc.StatusCode.UNAVAILABLE
                         and retries_left > 0 and deadline - self.clock() > pause)
                if not retry:
                    raise err from exc
                retries_left -= 1
                log.debug("etcd read unavailable, retrying in %.2fs: %s", pause, exc.details())
                await asyncio.sleep(pause * random.uniform(0.5, 1.0))
                pause = min(pause * 2, _READ_BACKOFF[1])

    def stream(self, method: Callable[..., Any], *, require_leader: bool = False) -> Any:
        """Open a bidirectional stream (no deadline: watches and keepalives live long)."""
        old = self.stubs
        if self.maybe_reload_tls():
            method = _rebind(old, self.stubs, method)
        return method(metadata=self.metadata(require_leader=require_leader), wait_for_ready=True)

    async def close(self) -> None:
        for ch in (*self._retired, self.channel):
            await ch.close(None)


def _rebind(old: _pb.Stubs, new: _pb.Stubs, method: Any) -> Any:
    """The method of `new` that `method` is on `old` (the same service and RPC), or `method` itself."""
    for service, stub in vars(old).items():
        for name, m in vars(stub).items():
            if m is method:
                return getattr(getattr(new, service), name)
    return method


async def reauthenticate_after(conn: Connection, exc: grpc.aio.AioRpcError, stale_token: str | None) -> bool:
    """For streams: refresh the token if `exc` is a cured-by-reauth failure. True if it did."""
    if conn.has_credentials and token_expired(exc):
        try:
            await conn.authenticate(stale_token=stale_token)
        except EtcdError as err:
            log.warning("etcd re-authentication failed: %s", err)
            return False
        return True
    return False
