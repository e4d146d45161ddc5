"""The per-method table: what every RPC the planner serves requires (docs/operations.md, "Roles per RPC").

A method missing from the table is refused (PERMISSION_DENIED) by the interceptor, and
tests/unit/auth/test_rules.py enumerates every method of every service in `proto/scheduler/v1/` and
fails when one has no entry here: a new RPC cannot slip through open.

Tenant rules are checked twice: here, coarsely (the principal holds the role on *some* tenant), and in
the service once it knows the tenant of the schedule, execution or dead letter the call is about
(scheduler/auth/access.py). Another tenant's object then looks exactly like a missing one.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from scheduler.auth.principal import Principal, Role


class Need(Enum):
    OPEN = "open"  # no credentials needed (the health service: load balancers and probes)
    AUTHENTICATED = "authenticated"  # any principal (reflection, the clock probe)
    TENANT = "tenant"  # a tenant role, checked again per tenant by the service
    WORKER = "worker"  # a worker role on some pool (the pool is checked on Hello)
    SYSTEM = "system"  # one of the listed system roles (admin always passes)


@dataclass(frozen=True)
class Rule:
    need: Need
    roles: tuple[Role, ...] = ()

    def admits(self, p: Principal) -> bool:
        if self.need in (Need.OPEN, Need.AUTHENTICATED):
            return True
        if self.need is Need.SYSTEM:
            return any(p.has_system(r) for r in self.roles)
        if self.need is Need.WORKER and any(p.has_system(r) for r in self.roles):
            return True
        role = Role.WORKER if self.need is Need.WORKER else self.roles[0]
        return p.has_any(role)

    def describe(self) -> str:
        if self.need is Need.TENANT:
            return f"the {self.roles[0].value} role on a tenant"
        if self.need is Need.WORKER:
            return "a worker role on a pool"
        if self.need is Need.SYSTEM:
            return " or ".join(f"system:{r.value}" for r in self.roles)
        return str(self.need.value)


OPEN = Rule(Need.OPEN)
AUTHENTICATED = Rule(Need.AUTHENTICATED)
READ = Rule(Need.TENANT, (Role.READER,))
WRITE = Rule(Need.TENANT, (Role.WRITER,))
OPERATE = Rule(Need.TENANT, (Role.OPERATOR,))
ADMIN = Rule(Need.SYSTEM, (Role.ADMIN,))

_S = "/scheduler.v1.ScheduleService/"
_A = "/scheduler.v1.AdminService/"
_W = "/scheduler.v1.WorkerService/"

METHOD_RULES: dict[str, Rule] = {
    _S + "CreateSchedule": WRITE,
    _S + "BatchCreateSchedules": WRITE,  # each item's tenant and pool checked by the service
    _S + "GetSchedule": READ,
    _S + "UpdateSchedule": WRITE,
    _S + "DeleteSchedule": WRITE,
    _S + "ListSchedules": READ,
    _S + "PauseSchedule": WRITE,
    _S + "ResumeSchedule": WRITE,
    _S + "TriggerSchedule": OPERATE,
    _S + "RerunExecution": OPERATE,
    _S + "Backfill": OPERATE,
    _S + "PreviewSchedule": READ,
    _S + "GetExecution": READ,
    _S + "ListExecutions": READ,
    _S + "ListSkips": READ,
    _S + "CancelExecution": OPERATE,
    _S + "ListDeadLetters": READ,
    _S + "ReplayDeadLetter": OPERATE,
    _S + "DiscardDeadLetter": OPERATE,
    # Cluster status holds no tenant data (partitions, planners, pools); planners fan it out to each other.
    _A + "GetClusterStatus": Rule(Need.SYSTEM, (Role.ADMIN, Role.PLANNER)),
    _A + "Switchover": ADMIN,
    _A + "SetWorkerAffinity": ADMIN,
    _A + "DrainPlanner": ADMIN,
    _A + "UndrainPlanner": ADMIN,
    _A + "ListAuditEvents": ADMIN,
    # Quotas: changed by the cluster admin; a tenant's reader reads its own (checked again by the service).
    _A + "SetTenantQuota": ADMIN,
    _A + "DeleteTenantQuota": ADMIN,
    _A + "GetTenantQuota": READ,
    _A + "ListTenantQuotas": READ,
    # A wall-clock reading: harmless, and every planner probes every other.
    _A + "GetTime": AUTHENTICATED,
    _W + "Connect": Rule(Need.WORKER),
    _W + "DiscoverPlanners": Rule(Need.WORKER, (Role.PLANNER, Role.ADMIN)),
    # The standard services next to ours (scheduler/server.py).
    "/grpc.health.v1.Health/Check": OPEN,
    "/grpc.health.v1.Health/Watch": OPEN,
    "/grpc.health.v1.Health/List": OPEN,
    "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo": AUTHENTICATED,
    "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo": AUTHENTICATED,
}


def rule_for(method: str) -> Rule | None:
    return METHOD_RULES.get(method)
