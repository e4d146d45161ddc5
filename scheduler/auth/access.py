"""Tenant checks inside the services, once a call's tenant is known (the interceptor checked the role
on *some* tenant: scheduler/auth/rules.py).

The rule that keeps tenants apart: an object of a tenant the principal may not read is reported exactly
as a missing one (the same NOT_FOUND message the service gives for an id nobody uses), lists leave it
out, and a page token only ever holds positions of objects the caller was shown. A tenant the caller
may read but not change gets PERMISSION_DENIED: that reveals nothing it could not read already.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from scheduler.auth.current import current
from scheduler.auth.principal import Principal, Role
from scheduler.errors import NotFound, PermissionDenied, Unauthenticated


@dataclass(frozen=True)
class Authz:
    """The API's authorization settings. `enabled`: calls must carry a principal (set by the interceptor);
    off, everything is allowed (the dev cluster). `pools`: pool -> the tenants that may use it."""

    enabled: bool = False
    pools: Mapping[str, frozenset[str]] = field(default_factory=dict)

    def access(self) -> Access:
        p = current()
        if self.enabled and p is None:
            # Fail closed: auth is configured but nothing authenticated this call (no interceptor).
            raise Unauthenticated("this server requires credentials")
        return Access(p if self.enabled else None, self.pools)


OPEN = Authz()


class Access:
    """What the current call's principal may do (None: auth is off, everything)."""

    def __init__(self, principal: Principal | None, pools: Mapping[str, frozenset[str]]) -> None:
        self.p, self.pools = principal, pools

    @property
    def enforcing(self) -> bool:
        """A principal to check: auth is on. Off, the services skip the reads made only for the check."""
        return self.p is not None

    @property
    def name(self) -> str:
        return self.p.name if self.p else "anonymous"

    def may(self, role: Role, tenant: str) -> bool:
        return self.p is None or self.p.may(role, tenant)

    def readable(self, tenant: str) -> bool:
        return self.may(Role.READER, tenant)

    @property
    def all_tenants(self) -> bool:
        """Reads every tenant (admin, `*:reader`, or auth off): no filtering needed."""
        return self.p is None or self.p.tenants(Role.READER) is None

    def require_named(self, role: Role, tenant: str) -> None:
        """For a tenant the caller named itself (a create, a list filter): PERMISSION_DENIED if not held."""
        if not self.may(role, tenant):
            raise PermissionDenied(f"{self.name} has no {role.value} role on tenant {tenant!r}")

    def require_on(self, role: Role, tenant: str, missing: str) -> None:
        """For an object found by id: NOT_FOUND (`missing`, the service's own message for an unknown id)
        unless readable, PERMISSION_DENIED if readable but `role` is not held."""
        if not self.readable(tenant):
            raise NotFound(missing)
        if not self.may(role, tenant):
            raise PermissionDenied(f"{self.name} has no {role.value} role on tenant {tenant!r}")

    def check_pool(self, pool: str, tenant: str, field_name: str = "schedule.worker_pool") -> None:
        allowed = self.pools.get(pool)
        if allowed is not None and tenant not in allowed:
            raise PermissionDenied(f"{field_name}: pool {pool!r} does not serve tenant {tenant!r} "
                                   f"(it serves {', '.join(sorted(allowed)) or 'no tenant'})")
