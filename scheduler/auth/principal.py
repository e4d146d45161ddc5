"""Principals and their grants: who is calling, and what each of its `scope:role` permissions allows.

The permission format is Temporal's `namespace:role` claim, with our tenants as namespaces:

- `<tenant>:reader`, `<tenant>:writer`, `<tenant>:operator` (tenant roles; `*` as the tenant: every tenant).
  `writer` (create, update, delete, pause, resume) and `operator` (trigger, rerun, backfill, cancel,
  replay, discard) each include `reader`; neither includes the other, so a runbook bot can trigger and
  replay without being able to change what a schedule runs.
- `<pool>:worker` may serve worker pool `<pool>` (`*:worker`: any pool). The role decides what the
  scope names: a pool for `worker`, a tenant for the tenant roles.
- `system:admin`: the cluster admin (switchover, drain, region policy, affinity, audit) and every role on
  every tenant and pool, as Temporal's `system:admin`. `system:planner`: what planners ask each other
  (clock probes, the status fan-out), nothing else.

Pure: no I/O, no gRPC; the authenticators (tokens, certificates) build Principals, the interceptor and the
services ask them questions.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import StrEnum

from scheduler.errors import InvalidArgument

ALL = "*"  # the wildcard scope: every tenant (tenant roles) or every pool (worker)
SYSTEM = "system"  # the cluster scope of admin and planner


class Role(StrEnum):
    READER = "reader"
    WRITER = "writer"
    OPERATOR = "operator"
    WORKER = "worker"
    ADMIN = "admin"
    PLANNER = "planner"


TENANT_ROLES = frozenset({Role.READER, Role.WRITER, Role.OPERATOR})
SYSTEM_ROLES = frozenset({Role.ADMIN, Role.PLANNER})
# A grant of the key also grants these (on the same tenant).
_IMPLIES: dict[Role, frozenset[Role]] = {Role.WRITER: frozenset({Role.READER}),
                                         Role.OPERATOR: frozenset({Role.READER})}


@dataclass(frozen=True, order=True)
class Grant:
    scope: str  # a tenant, a pool, `*` or `system`
    role: Role

    def __str__(self) -> str:
        return f"{self.scope}:{self.role.value}"


def parse_permission(text: str, field_name: str = "permission") -> Grant:
    """`payments:writer` -> Grant. InvalidArgument naming `field_name` for anything else (an unknown role,
    `system` with a tenant role, a tenant with a system role)."""
    scope, sep, role_text = text.strip().rpartition(":")
    if not sep or not scope:
        raise InvalidArgument(field_name, f"{text!r} is not scope:role (e.g. payments:writer, system:admin)")
    try:
        role = Role(role_text)
    except ValueError:
        raise InvalidArgument(field_name, f"{text!r}: unknown role {role_text!r}; one of "
                              f"{', '.join(r.value for r in Role)}") from None
    if (scope == SYSTEM) != (role in SYSTEM_ROLES):
        raise InvalidArgument(field_name, f"{text!r}: admin and planner go with scope `system`, and `system` "
                              "only with them")
    return Grant(scope, role)


def parse_permissions(items: Iterable[object], field_name: str) -> frozenset[Grant]:
    out: set[Grant] = set()
    for i, item in enumerate(items):
        if not isinstance(item, str):
            raise InvalidArgument(f"{field_name}[{i}]", f"{item!r} is not a string")
        out.add(parse_permission(item, f"{field_name}[{i}]"))
    return frozenset(out)


def lenient_permissions(items: object) -> frozenset[Grant]:
    """A token's claim: permissions this cluster does not know (an identity provider's token may carry
    other systems' too) are ignored rather than refusing the whole token, as Temporal's claim mapper."""
    if not isinstance(items, list | tuple):
        return frozenset()
    out: set[Grant] = set()
    for item in items:
        if isinstance(item, str):
            try:
                out.add(parse_permission(item))
            except InvalidArgument:
                continue
    return frozenset(out)


@dataclass(frozen=True)
class Principal:
    """An authenticated caller. `name` says how it was identified (`jwt:<sub>`, `token:<name>`,
    `cert:<identity>`) and is what the audit log and error messages show."""

    name: str
    grants: frozenset[Grant] = field(default_factory=frozenset)

    @property
    def is_admin(self) -> bool:
        return Grant(SYSTEM, Role.ADMIN) in self.grants

    def has_system(self, role: Role) -> bool:
        return self.is_admin or Grant(SYSTEM, role) in self.grants

    def _roles_on(self, scope: str) -> set[Role]:
        roles: set[Role] = set()
        for g in self.grants:
            if g.scope in (scope, ALL) and g.role not in SYSTEM_ROLES:
                roles.add(g.role)
                roles |= _IMPLIES.get(g.role, frozenset())
        return roles

    def may(self, role: Role, tenant: str) -> bool:
        """May act as `role` on `tenant` (a tenant role) or serve pool `tenant` (WORKER)."""
        return self.is_admin or role in self._roles_on(tenant)

    def has_any(self, role: Role) -> bool:
        """Holds `role` on at least one tenant (or pool): the interceptor's coarse check before the service
        knows which tenant a call is about."""
        return self.is_admin or any(role is g.role or role in _IMPLIES.get(g.role, frozenset())
                                    for g in self.grants)

    def tenants(self, role: Role) -> frozenset[str] | None:
        """The tenants `role` is held on; None: every tenant."""
        if self.is_admin or any(g.scope == ALL and (g.role is role or role in _IMPLIES.get(g.role, frozenset()))
                                for g in self.grants):
            return None
        return frozenset(g.scope for g in self.grants if g.scope not in (ALL, SYSTEM)
                         and (g.role is role or role in _IMPLIES.get(g.role, frozenset())))
