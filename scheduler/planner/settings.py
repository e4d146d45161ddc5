"""Planner loop settings (part of the planner process's settings; see scheduler/config.py)."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from scheduler import eventloop
from scheduler.config import TEST_MODE_ENV, Settings, parse_listen_address, test_mode
from scheduler.errors import InvalidArgument
from scheduler.loop_lag import check_gc_threshold


def refuse_open_api(api_host: str, auth_file: str, *, insecure: bool) -> None:
    """A planner whose API every caller may use (no auth_file) listens only on loopback, unless `insecure` is
    set explicitly. Called by `schedctl planner` once every settings class is loaded (the `insecure` switch is
    shared with the transport's plaintext refusal)."""
    if not auth_file and not insecure and not is_loopback(api_host):
        raise InvalidArgument("auth_file", f"the API would listen on {api_host} with every call allowed: set "
                              "auth_file (docs/operations.md, Security), or `insecure = true` to accept that")


def is_loopback(host: str) -> bool:
    """127.0.0.0/8, ::1 and `localhost`: reachable only from this machine. `0.0.0.0`, `::` and every other
    address are not (a name is not resolved: only `localhost` counts)."""
    h = host.strip("[]")
    if h == "localhost":
        return True
    try:
        return ipaddress.ip_address(h).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True)
class PlannerSettings(Settings):
    lookahead_ms: int = 2_000  # executions are written this far ahead of their due time
    loop_interval: float = 0.05  # seconds between planner rounds per partition
    max_planned_per_round: int = 200  # planned times one partition materializes (and dispatches) per round
    backlog_ms: int = 2_000  # no materializing while due work this late waits for worker capacity
    checkpoint_interval_ms: int = 1_000  # an idle partition moves its checkpoint this often
    late_grace_ms: int = 5_000  # a planned time less late than this is on time, not "missed"
    retention_ms: int = 7 * 86_400_000  # terminal records older than this are deleted
    retention_count: int = 1_000  # and at most this many kept per schedule
    retention_interval: float = 10.0  # seconds between retention sweeps of a partition
    api_port: int = 0  # gRPC port (0: pick a free one)
    api_host: str = "127.0.0.1"
    metrics_address: str = ""  # host:port of the Prometheus endpoint (port 0: pick one); empty or "off": none
    # host:port of a plaintext gRPC health service (health only: probes cannot present a client certificate to
    # the mutual-TLS API port); empty or "off": none (the API port answers health too)
    health_address: str = ""
    metrics_schedule_limit: int = 100  # schedules with their own start-lag series; the rest share "_other"
    # Workers heartbeat every interval (told in the Welcome); a stream silent for the timeout is ended and
    # its attempts, unless re-attached within the timeout again, are timed out and retried. Keep the
    # timeout above lease_ttl + takeover, so that a new owner re-attaches a crashed planner's attempts
    # before their workers give them up (docs/workers.md, "Liveness").
    # An overlap skip is decided only if the run in progress is still in flight this long after the
    # skipped run's due time: a result in transit (a worker reconnecting, a result re-sent through another
    # planner after result_ack_timeout) is no overlap. Until then the run waits; if the one before
    # finishes, it starts late instead of being skipped.
    overlap_settle_ms: int = 4_000
    heartbeat_interval: float = 1.0
    heartbeat_timeout: float = 10.0
    # Start confirmation: a worker must have its start recorded (Started -> RUNNING) within this long
    # of the dispatch, or the owner dispatches the execution again (same id, next attempt) and the
    # worker, which waits as long for its StartAck, drops it unrun. Keep it above a few etcd round
    # trips plus a worker's round trip (a stuck dispatch costs at most this much delay).
    start_timeout_ms: int = 3_000
    # Hand-outs of one pool this planner has waiting for their start at once (dispatch/start_window.py). 0:
    # adaptive, the default: as many as are answered well within start_timeout_ms (worker slots alone handed out
    # more than etcd recorded in time, and a burst churned: bench/README.md). N > 0 fixes it at N.
    start_window: int = 0
    # The first dispatch written with the record's create (docs/keyspace.md, "Reserved first attempt"): the
    # owner hands a run it created to a worker without a dispatch write, the worker's start CAS being the
    # run's second write instead of its third: 17% less CPU per run below saturation (bench_e2e
    # --compare-reserve). On by default since session 30, after a game day with it on kept every invariant
    # about runs (docs/keyspace.md); false writes every dispatch.
    reserve_first_attempt: bool = True
    # Start ahead (docs/workers.md, "Start ahead"): a run of a schedule's own planned times with nothing else of
    # its schedule unfinished is handed to a worker up to this long before it is due, its start recorded
    # then, and the worker runs it at its instant: the dispatch and the start record leave the due second.
    # The owner disarms it if the schedule is paused, changed or deleted, or another of its runs comes up,
    # before then; a run armed before a pause that its worker could not be told of in time still runs (its
    # start was recorded before the pause). 0: off, the default: it costs 8-13% more CPU per execution and helps
    # lag below saturation only (bench/README.md). A pool with a worker that does not declare start_in in its Hello
    # gets no run armed (docs/workers.md, "Capabilities").
    start_ahead_ms: int = 0
    # Clock-skew guard (docs/time.md, "Clock skew"): peers' clocks are probed every clock_probe_interval;
    # a planner more than max_clock_skew from the majority of the cluster owns no partitions until it has
    # been back in bounds for 3 rounds, and never plans with a wall time further than that from theirs.
    max_clock_skew: float = 1.0
    clock_probe_interval: float = 1.0
    unsafe_disable_clock_guard: bool = False  # tests only: probe and report, but neither stand down nor bound
    # Tests only (drill fault F9, dispatch/duplicate.py): while this file exists, some assignments are sent
    # twice. Empty: never. A product that repeats its deliveries on purpose is no product: refused outside
    # test mode, as the other unsafe_ switches.
    unsafe_duplicate_delivery_file: str = ""
    # Security (docs/operations.md, "Security"). auth_file: the authorization file (principals, roles, pool
    # restrictions; scheduler/auth/config.py); empty: every call is allowed, which a planner accepts only on
    # a loopback address unless `insecure` (TlsSettings: one switch for both) is set. token_file: the bearer
    # token this planner presents to its peers (clock probes, the status fan-out), a `system:planner`.
    auth_file: str = ""
    token_file: str = ""
    audit_max_events: int = 10_000  # the audit log keeps this many events (the oldest are deleted)
    # Requests per second each principal may make to this planner (a token bucket of rate_limit_burst, 0:
    # twice the rate); over it: RESOURCE_EXHAUSTED with a retry hint. 0: no limit. Needs auth (principals).
    rate_limit_rps: float = 0.0
    rate_limit_burst: int = 0
    event_loop: str = "asyncio"  # asyncio or uvloop (scheduler/eventloop.py; bench/README.md measures both)
    # The cyclic collector's generation-0 threshold in a planner process (CPython's is 700; 0 leaves it as it is).
    # A planner's records live a second or two and hold no cycles: at 700 the collector visited each of them
    # in all three generations before reference counting freed it, 13% of a saturated planner's CPU
    # (scheduler/loop_lag.py, bench/README.md).
    gc_threshold: int = 50_000

    @property
    def probe_rtt_bound(self) -> float:
        """Seconds: a probe answer that took longer is not used (Cristian's error is up to half of it)."""
        return min(0.5, self.max_clock_skew)

    def validate(self) -> None:
        if not 0 <= self.lookahead_ms <= 60_000:
            raise InvalidArgument("lookahead_ms", f"{self.lookahead_ms} ms is outside 0-60000 ms (0-1m)")
        if not 0.005 <= self.loop_interval <= 5:
            raise InvalidArgument("loop_interval", "must be in 0.005-5 seconds")
        if not 1 <= self.max_planned_per_round <= 100_000:
            raise InvalidArgument("max_planned_per_round", "must be in 1-100000")
        if self.backlog_ms < 0:
            raise InvalidArgument("backlog_ms", "must not be negative")
        if self.late_grace_ms < 0:
            raise InvalidArgument("late_grace_ms", "must not be negative")
        if self.retention_count < 1:
            raise InvalidArgument("retention_count", "must be at least 1")
        parse_listen_address("metrics_address", self.metrics_address)
        parse_listen_address("health_address", self.health_address)
        if not 0 <= self.overlap_settle_ms <= 60_000:
            raise InvalidArgument("overlap_settle_ms", "must be in 0-60000")
        if not 0.01 <= self.heartbeat_interval <= 60:
            raise InvalidArgument("heartbeat_interval", "must be in 0.01-60 seconds")
        if not self.heartbeat_interval < self.heartbeat_timeout <= 3600:
            raise InvalidArgument("heartbeat_timeout", "must be above heartbeat_interval and at most 3600 seconds")
        if not 0 <= self.start_ahead_ms <= 5_000:
            raise InvalidArgument("start_ahead_ms", f"{self.start_ahead_ms} ms is outside 0-5000 ms")
        if self.start_ahead_ms > self.lookahead_ms:
            raise InvalidArgument("start_ahead_ms", f"{self.start_ahead_ms} ms is more than lookahead_ms "
                                  f"({self.lookahead_ms} ms): a run is handed out only once it is written")
        if not 100 <= self.start_timeout_ms <= 60_000:
            raise InvalidArgument("start_timeout_ms", "must be in 100-60000")
        if self.start_timeout_ms < 4 * self.loop_interval * 1000:
            raise InvalidArgument("start_timeout_ms", "must be at least 4 loop intervals")
        if not 0 <= self.start_window <= 10_000_000:
            raise InvalidArgument("start_window", f"{self.start_window} is outside 0-10000000 (0: adaptive)")
        if not 0 <= self.metrics_schedule_limit <= 10_000:
            raise InvalidArgument("metrics_schedule_limit", "must be in 0-10000")
        if not 0.05 <= self.max_clock_skew <= 600:
            raise InvalidArgument("max_clock_skew", f"{self.max_clock_skew:g} s is outside 0.05-600 seconds")
        if not 0.05 <= self.clock_probe_interval <= 60:
            raise InvalidArgument("clock_probe_interval", "must be in 0.05-60 seconds")
        if self.unsafe_disable_clock_guard and not test_mode():
            raise InvalidArgument("unsafe_disable_clock_guard",
                                  f"is refused outside test mode ({TEST_MODE_ENV}=1): it breaks safety")
        if not 0 <= self.rate_limit_rps <= 1_000_000:
            raise InvalidArgument("rate_limit_rps", "must be in 0-1000000 (0: no limit)")
        if not 0 <= self.rate_limit_burst <= 10_000_000:
            raise InvalidArgument("rate_limit_burst", "must be in 0-10000000 (0: twice rate_limit_rps)")
        if not 10 <= self.audit_max_events <= 1_000_000:
            raise InvalidArgument("audit_max_events", "must be in 10-1000000")
        eventloop.check("event_loop", self.event_loop)
        check_gc_threshold(self.gc_threshold)
        if self.unsafe_duplicate_delivery_file and not test_mode():
            raise InvalidArgument("unsafe_duplicate_delivery_file",
                                  f"is refused outside test mode ({TEST_MODE_ENV}=1): it delivers assignments twice")
