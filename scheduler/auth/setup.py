"""One planner node's security from its settings: the authenticator (or none), the API's tenant rules, the
audit log, the token it presents to its peers, and the interceptor that ties them to the gRPC server."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from scheduler.auth.access import OPEN, Authz
from scheduler.auth.audit import AuditLog
from scheduler.auth.authn import Authenticator
from scheduler.auth.bearer import bearer_metadata, read_token_file
from scheduler.auth.config import AuthConfig, load_auth_file
from scheduler.auth.interceptor import AuthInterceptor
from scheduler.auth.ratelimit import RateLimiter
from scheduler.clock import Clock
from scheduler.planner.settings import PlannerSettings
from scheduler.store.keyspace import Keyspace
from scheduler.store.kv import KV

log = logging.getLogger("scheduler.auth")


@dataclass(frozen=True)
class Security:
    config: AuthConfig | None
    authz: Authz
    audit: AuditLog
    interceptor: AuthInterceptor
    peer_metadata: tuple[tuple[str, str], ...]


def build_security(s: PlannerSettings, kv: KV, ks: Keyspace, clock: Clock, node_id: str, rpc_timeout: float,
                   *, config: AuthConfig | None = None) -> Security:
    """`config`: an AuthConfig built by the caller (tests) instead of reading `auth_file`."""
    cfg = config if config is not None else (load_auth_file(s.auth_file) if s.auth_file else None)
    audit = AuditLog(kv, ks, clock, node_id, max_events=s.audit_max_events, timeout=rpc_timeout)
    if cfg is None:
        log.warning("auth is off: every call is allowed (set auth_file to require credentials)",
                    extra={"event": "auth_off", "api_host": s.api_host})
        authz = OPEN
    else:
        authz = Authz(enabled=True, pools=cfg.pools)
    token = read_token_file(s.token_file) if s.token_file else None
    limiter = RateLimiter(s.rate_limit_rps, s.rate_limit_burst or max(1, round(2 * s.rate_limit_rps)),
                          clock.monotonic) if s.rate_limit_rps > 0 else None
    return Security(cfg, authz, audit, AuthInterceptor(Authenticator(cfg) if cfg else None, audit, limiter),
                    bearer_metadata(token))
