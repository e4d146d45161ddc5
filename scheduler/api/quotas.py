"""The AdminService's quota calls (Set/Get/List/DeleteTenantQuota): validation at the edge, a CAS on the
record (scheduler/quota/store.py), and the conversions to and from `TenantQuota`.

Changing a quota needs system:admin (scheduler/auth/rules.py); reading one is open to a reader of that
tenant, checked here, since the rule table only knows that the caller reads *some* tenant.
"""

from __future__ import annotations

import math
from dataclasses import replace

from scheduler._gen.scheduler.v1 import admin_service_pb2 as apb
from scheduler.api import inputs, paging
from scheduler.auth.access import OPEN, Authz
from scheduler.auth.principal import Role
from scheduler.clock import Clock
from scheduler.errors import InvalidArgument, NotFound, VersionMismatch
from scheduler.quota import record as qr
from scheduler.quota import store as qs
from scheduler.quota import usage as qu
from scheduler.store.keyspace import Keyspace
from scheduler.store.kv import KV
from scheduler.timeconv import ms_to_timestamp

# update_mask path -> the record's field
_FIELDS = {"max_schedules": "schedules", "max_executions_per_second": "executions_per_second",
           "max_backfill": "backfill", "max_labels": "labels", "max_payload_bytes": "payload_bytes"}
_PROTO = {v: k for k, v in _FIELDS.items()}


def quota_pb(tenant: str, q: qr.Quota | None, version: int) -> apb.TenantQuota:
    out = apb.TenantQuota(tenant=tenant, version=version)
    if q is None:
        return out
    out.max_schedules, out.max_executions_per_second = q.schedules, q.executions_per_second
    out.max_backfill, out.max_labels, out.max_payload_bytes = q.backfill, q.labels, q.payload_bytes
    out.updated_by, out.reason = q.by, q.reason
    if q.updated_ms:
        out.updated_at.CopyFrom(ms_to_timestamp(q.updated_ms))
    return out


def target(tenant: str, default: bool) -> str | None:
    """The record a request names: a tenant's (checked name), or the default (None)."""
    name = inputs.optional_name(tenant, "tenant")
    if default:
        if name:
            raise InvalidArgument("tenant", "must be empty with default_quota")
        return None
    if not name:
        raise InvalidArgument("tenant", "is required (or set default_quota)")
    return name


def limits_from(m: apb.TenantQuota, paths: list[str], base: qr.Quota) -> qr.Quota:
    """`base` with the masked limit fields (all five for an empty mask) taken from `m`, validated."""
    for i, p in enumerate(paths):
        if p not in _FIELDS:
            raise InvalidArgument(f"update_mask.paths[{i}]", f"{p!r} is not a limit; one of {', '.join(_FIELDS)}")
    if not math.isfinite(m.max_executions_per_second):
        raise InvalidArgument("quota.max_executions_per_second", "must be a finite number")
    new = {_FIELDS[p]: getattr(m, p) for p in (paths or list(_FIELDS))}
    try:
        return qr.validate(replace(base, **new), "quota")
    except InvalidArgument as e:  # the record's name of the field -> the request's (`quota.max_labels`)
        name = e.field.removeprefix("quota.")
        raise InvalidArgument(f"quota.{_PROTO.get(name, name)}", e.reason) from None


class QuotaAdmin:
    def __init__(self, kv: KV, ks: Keyspace, clock: Clock, timeout: float, authz: Authz = OPEN) -> None:
        self.kv, self.ks, self.clock, self.timeout, self.authz = kv, ks, clock, timeout, authz

    async def set(self, request: apb.SetTenantQuotaRequest) -> apb.SetTenantQuotaResponse:
        tenant = target(request.tenant, request.default_quota)
        why = inputs.reason(request.reason)
        paths = list(request.update_mask.paths)
        limits_from(request.quota, paths, qr.UNLIMITED)  # a bad value fails before anything is read
        who = self.authz.access().name
        for _ in range(3):
            cur = await qs.read(self.kv, self.ks, tenant, timeout=self.timeout)
            if request.HasField("expected_version") and cur.version != request.expected_version:
                raise VersionMismatch(f"the quota record is at version {cur.version}, not "
                                      f"{request.expected_version}; read it again")
            base = cur.quota
            if base is None and tenant is not None:  # a first record starts from the default's values
                dflt = (await qs.read(self.kv, self.ks, None, timeout=self.timeout)).quota
                base = replace(dflt, extra={}) if dflt is not None else qr.UNLIMITED
            new = replace(limits_from(request.quota, paths, base or qr.UNLIMITED), updated_ms=self.clock.wall_ms(),
                          by=who, reason=why)
            try:
                version = await qs.cas(self.kv, self.ks, tenant, cur.version, new, timeout=self.timeout)
            except qs.Stale:
                if request.HasField("expected_version"):
                    raise VersionMismatch("the quota record changed under this call; read it again") from None
                continue
            return apb.SetTenantQuotaResponse(quota=quota_pb(tenant or "", new, version))
        raise VersionMismatch("the quota record kept changing under this call; read it again")

    async def get(self, request: apb.GetTenantQuotaRequest) -> apb.GetTenantQuotaResponse:
        tenant = target(request.tenant, request.default_quota)
        acc = self.authz.access()
        if tenant is None:
            cur = await qs.read(self.kv, self.ks, None, timeout=self.timeout)
            return apb.GetTenantQuotaResponse(quota=quota_pb("", cur.quota, cur.version),
                                              own_record=cur.quota is not None)
        acc.require_named(Role.READER, tenant)
        own = await qs.read(self.kv, self.ks, tenant, timeout=self.timeout)
        out = apb.GetTenantQuotaResponse(own_record=own.quota is not None)
        if own.quota is not None:
            out.quota.CopyFrom(quota_pb(tenant, own.quota, own.version))
        else:
            dflt = await qs.read(self.kv, self.ks, None, timeout=self.timeout)
            out.quota.CopyFrom(quota_pb(tenant, dflt.quota, 0))
        held = await self.kv.get(self.ks.usage(tenant), timeout=self.timeout)
        if held is not None:
            out.schedules_held = qu.decode(held.value)
        return out

    async def list(self, request: apb.ListTenantQuotasRequest) -> apb.ListTenantQuotasResponse:
        size = paging.page_size(request.page_size)
        filters = ["quotas"]
        after = paging.decode_token(request.page_token, filters)
        if after is not None and not (isinstance(after, str) and after):
            raise InvalidArgument("page_token", "is not a token this server issued")
        acc = self.authz.access()
        rows = [(t, v) for t, v in await qs.list_all(self.kv, self.ks, timeout=self.timeout)
                if acc.readable(t) and (after is None or t > after)]
        page, more = rows[:size], len(rows) > size
        out = apb.ListTenantQuotasResponse(quotas=[quota_pb(t, v.quota, v.version) for t, v in page],
                                           next_page_token=paging.encode_token(filters, page[-1][0]) if more else "")
        dflt = await qs.read(self.kv, self.ks, None, timeout=self.timeout)
        if dflt.quota is not None:
            out.default_quota.CopyFrom(quota_pb("", dflt.quota, dflt.version))
        return out

    async def delete(self, request: apb.DeleteTenantQuotaRequest) -> apb.DeleteTenantQuotaResponse:
        tenant = target(request.tenant, request.default_quota)
        for _ in range(3):
            cur = await qs.read(self.kv, self.ks, tenant, timeout=self.timeout)
            if request.HasField("expected_version") and cur.version != request.expected_version:
                raise VersionMismatch(f"the quota record is at version {cur.version}, not "
                                      f"{request.expected_version}; read it again")
            if not cur.version:
                if request.HasField("expected_version"):
                    raise NotFound(f"no quota record for {tenant or 'the default'}")
                return apb.DeleteTenantQuotaResponse(deleted=False)
            try:
                await qs.remove(self.kv, self.ks, tenant, cur.version, timeout=self.timeout)
                return apb.DeleteTenantQuotaResponse(deleted=True)
            except qs.Stale:
                continue
        raise VersionMismatch("the quota record kept changing under this call; read it again")



