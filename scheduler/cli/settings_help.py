"""What each process setting means, with its unit: the help text of `schedctl planner` / `schedctl worker`
flags (the default and the environment variable are appended from the settings class itself).

tests/unit/test_cli_settings_help.py checks that every field of the settings classes has an entry, so a new
setting cannot reach `--help` without a meaning and a unit.
"""

from __future__ import annotations

HELP: dict[str, str] = {
    # etcd
    "etcd_endpoints": "etcd client URLs or host:port, comma-separated",
    "etcd_prefix": "key prefix of this cluster in etcd (starts with '/', no trailing '/')",
    "etcd_username": "etcd user (with --etcd-password)",
    "etcd_password": "etcd password (with --etcd-username)",
    "etcd_ca_file": "CA bundle (PEM) to verify etcd's TLS certificate",
    "etcd_cert_file": "client certificate (PEM) for etcd mTLS (with --etcd-key-file)",
    "etcd_key_file": "client key (PEM) for etcd mTLS (with --etcd-cert-file)",
    "etcd_tls_server_name": "name to verify in etcd's certificate instead of the endpoint hosts (several IP endpoints)",
    # coordination
    "node_id": "this planner's unique name in the cluster",
    "region": "region this node runs in (planners of the primary region own partitions; `region switchover`)",
    "api_address": "host:port workers and peers should dial",
    "partitions": "number of partitions P, fixed at cluster init (a node with another value refuses to start)",
    "lease_ttl": "seconds; etcd session lease TTL (minimum 2): how fast a dead planner's partitions move",
    "renew_interval": "seconds between lease keep-alives",
    "safety_margin": "seconds; the planner fences itself this long before its lease could expire",
    "rpc_timeout": "seconds; deadline of each etcd request",
    "orphan_grace": "seconds a partition may stay free before any eligible planner claims it beyond its share "
                    "(0: 2 x rpc_timeout)",
    "rescue_hold": "seconds a rescued partition is held before it goes back to the planner whose share it is",
    "rebalance_holddown": "seconds before peers release partitions to a joining planner (free ones it claims at once)",
    "max_txn_ops": "most operations in one etcd txn (etcd's --max-txn-ops is 128)",
    "max_txn_bytes": "bytes; most payload in one etcd txn (below etcd's --max-request-bytes)",
    "unserved_resign": "seconds; a node that could serve none of its partitions (etcd errors) this long, its lease "
                       "renewed, gives its session up to a peer; 0: 2 x lease_ttl",
    "unsafe_disable_fencing": "true/false; drop the owner-revision compare from writes (shows the checks catch "
                              "a stale writer)",
    "unsafe_disable_self_fence": "true/false; do not stop writing at the local lease deadline (etcd's compare is "
                                 "then the only guard)",
    # planner
    "lookahead_ms": "milliseconds; executions are written this far ahead of their due time (0-60000)",
    "loop_interval": "seconds between planner rounds of one partition",
    "max_planned_per_round": "planned times one partition materializes (and dispatches) per round",
    "gc_threshold": "the cyclic garbage collector's generation-0 threshold (CPython's: 700; 0: left as it is)",
    "backlog_ms": "milliseconds; no new materializing while due work this late waits for worker capacity",
    "checkpoint_interval_ms": "milliseconds; how often an idle partition moves its checkpoint",
    "late_grace_ms": "milliseconds; a planned time less late than this is on time, not missed",
    "retention_ms": "milliseconds; finished executions older than this are deleted (dead letters are kept)",
    "retention_count": "finished executions kept per schedule at most",
    "retention_interval": "seconds between retention sweeps of one partition",
    "api_port": "gRPC API port (0: pick a free one and log it)",
    "api_host": "address the gRPC API listens on",
    "metrics_address": "host:port of the Prometheus /metrics endpoint (port 0: pick one; empty or off: none)",
    "health_address": "host:port of a plaintext gRPC health service for probes, `schedctl health` (health only; "
                      "port 0: pick one; empty or off: none)",
    "auth_file": "authorization file (TOML: JWT keys, token file, certificate identities, pool restrictions); "
                 "empty: auth off, every call allowed (refused off loopback unless --insecure)",
    "token_file": "file holding the bearer token this process presents to planners (peers, workers)",
    "audit_max_events": "events the audit log keeps (the oldest are deleted beyond it)",
    "rate_limit_rps": "requests per second each principal may make to this planner (0: no limit; needs auth_file)",
    "rate_limit_burst": "token bucket size of rate_limit_rps (0: twice the rate)",
    "metrics_schedule_limit": "schedules with their own start-lag series; the rest share `_other`",
    "overlap_settle_ms": "milliseconds; an overlap skip is decided only if the run before is still in flight "
                         "this long after the skipped run's due time (a result in transit is no overlap)",
    "heartbeat_interval": "seconds; how often workers heartbeat (told in the Welcome)",
    "heartbeat_timeout": "seconds; a worker stream silent this long is ended and its attempts timed out "
                         "(keep it above lease_ttl + takeover time)",
    "start_timeout_ms": "ms; a dispatched attempt whose worker has not had its start recorded by then is "
                        "dispatched again (same id) and the worker drops it unrun",
    "start_window": "hand-outs of a pool this planner may have waiting for their start (0: adaptive, the default: "
                    "as many as are answered within start_timeout_ms; N: fixed at N)",
    "reserve_first_attempt": "true (default): a run's first attempt is reserved in its create and handed to a "
                             "worker without a dispatch write (one etcd write less per run); false: every "
                             "dispatch is written",
    "start_ahead_ms": "ms (0-5000, at most lookahead_ms; 0: off, the default); a run with nothing else of its "
                      "schedule unfinished is handed to a worker and its start recorded this long before it "
                      "is due, and the worker runs it at its instant (docs/workers.md, Start ahead)",
    "event_loop": "asyncio or uvloop (needs `pip install uvloop`); the event loop the process runs on "
                  "(bench/README.md measures both)",
    "max_clock_skew": "seconds; a planner whose clock is further than this from the majority of the planners "
                      "owns no partitions (and never plans with a time further than this from theirs)",
    "clock_probe_interval": "seconds between probes of the peers' clocks (back in bounds for 3 probes: eligible "
                            "again)",
    "unsafe_disable_clock_guard": "true/false; probe and report clock skew, but neither stand down nor bound the "
                                  "planning time",
    "unsafe_duplicate_delivery_file": "path; while this file exists (JSON: probability, delay_ms, seed) some "
                                      "assignments are sent twice (drill fault F9)",
    # worker
    "worker_id": "this worker's unique name",
    "pool": "worker pool this worker serves",
    "planners": "planner API addresses to start from, comma-separated (the others are discovered)",
    "concurrency": "most attempts running at once, across all planners",
    "drain_grace": "seconds; on SIGTERM, how long running attempts may go on before they are stopped",
    "cancel_grace": "seconds; after a Cancel, how long a handler may clean up before it is stopped",
    "result_ack_timeout": "seconds; a result without a ResultAck after this long is sent again, through "
                          "another planner",
    "unsafe_disable_dedupe": "true/false; run an assignment delivered twice twice (shows a drill's I1 check "
                             "catches it)",
    "credit_idle_after": "seconds; a planner that sends nothing this long keeps only one credit",
    "reconnect_backoff_min": "seconds; first delay before re-dialling a planner",
    "reconnect_backoff_max": "seconds; longest delay before re-dialling a planner",
    "welcome_timeout": "seconds; a planner that does not answer Hello within this is re-dialled",
    "discovery_interval": "seconds between planner list refreshes",
    "keepalive_time": "seconds between gRPC keepalive pings (so a frozen planner is noticed)",
    "flush_timeout": "seconds; at shutdown, how long to wait for the last results to be acknowledged",
    "allow_shell": "run the shell executor's commands (off: shell executions fail permanently; a remote-code-"
                   "execution surface for whoever may create schedules on this pool)",
    "shell_kill_grace": "seconds; shell executor: SIGTERM, then SIGKILL the process group after this",
    "http_timeout": "seconds; http executor request timeout when the payload sets no timeout_s",
    "log_level": "debug, info, warning or error",
    # TLS (docs/operations.md, "Security")
    "tls_cert_file": "certificate chain (PEM): a planner serves the API with it and dials peers with it; a worker "
                     "presents it to planners (mutual TLS)",
    "tls_key_file": "private key (PEM, unencrypted) of --tls-cert-file; files are re-read when they change",
    "tls_ca_file": "CA bundle (PEM): what verifies the other side's certificate (clients, workers, peers, planners)",
    "tls_require_client_cert": "true/false; the API port requires a client certificate signed by --tls-ca-file",
    "tls_server_name": "the name the planners' certificates carry, checked instead of the dialled address's host",
    "insecure": "true/false; allow plaintext (and, for a planner, no auth_file) on a non-loopback address; "
                "off loopback without TLS the process refuses to start unless this is true",
}

# Defaults computed at start-up, where the settings class holds a placeholder (None or "").
DEFAULT_TEXT: dict[str, str] = {
    "api_address": "the bound --api-host:--api-port",
    "renew_interval": "lease_ttl / 3",
    "worker_id": "<hostname>:<pid>",
}
