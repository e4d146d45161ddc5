"""Deny by default: every method of every service in proto/scheduler/v1/ (and the standard services the
planner serves beside them) has an access rule, so a new RPC cannot slip through open; a method without
one is refused by the interceptor."""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import AsyncIterator

import grpc
import pytest
from grpc_health.v1 import health_pb2
from grpc_reflection.v1alpha import reflection_pb2

import scheduler._gen.scheduler.v1 as v1
from scheduler.auth.authn import Authenticator
from scheduler.auth.config import AuthConfig
from scheduler.auth.interceptor import AuthInterceptor
from scheduler.auth.principal import Grant, Principal, Role
from scheduler.auth.rules import METHOD_RULES, Need, rule_for
from scheduler.auth.tokens import StaticTokens, new_static_token, token_hash


def _v1_methods() -> list[str]:
    out = []
    for m in pkgutil.iter_modules(v1.__path__):
        if not m.name.endswith("_pb2"):
            continue
        mod = importlib.import_module(f"{v1.__name__}.{m.name}")
        for svc in mod.DESCRIPTOR.services_by_name.values():
            out += [f"/{svc.full_name}/{meth.name}" for meth in svc.methods]
    return out


def test_every_v1_method_has_a_rule() -> None:
    methods = _v1_methods()
    assert len(methods) >= 25  # the three services were found
    missing = [m for m in methods if rule_for(m) is None]
    assert not missing, f"methods without an access rule in scheduler/auth/rules.py: {missing}"


def test_standard_services_have_rules() -> None:
    for d in (health_pb2.DESCRIPTOR, reflection_pb2.DESCRIPTOR):
        for svc in d.services_by_name.values():
            for meth in svc.methods:
                assert rule_for(f"/{svc.full_name}/{meth.name}") is not None, meth.full_name


def test_no_stale_rules() -> None:
    """A rule for a method that no longer exists is a sign the table drifted from the protos."""
    known = set(_v1_methods())
    for d in (health_pb2.DESCRIPTOR, reflection_pb2.DESCRIPTOR):
        for svc in d.services_by_name.values():
            known |= {f"/{svc.full_name}/{m.name}" for m in svc.methods}
    stale = [m for m in METHOD_RULES if m not in known and "v1.ServerReflection" not in m
             and not m.endswith("Health/List")]
    assert not stale


def test_only_health_is_open() -> None:
    assert {m for m, r in METHOD_RULES.items() if r.need is Need.OPEN} == {
        m for m in METHOD_RULES if m.startswith("/grpc.health.v1.Health/")}


def test_admin_methods_need_admin() -> None:
    alice = Principal("token:alice", frozenset({Grant("payments", Role.OPERATOR), Grant("payments", Role.WRITER)}))
    admin = Principal("token:root", frozenset({Grant("system", Role.ADMIN)}))
    for name in ("Switchover", "SetWorkerAffinity", "DrainPlanner", "UndrainPlanner", "ListAuditEvents",
                 "GetClusterStatus"):
        rule = METHOD_RULES[f"/scheduler.v1.AdminService/{name}"]
        assert not rule.admits(alice), name
        assert rule.admits(admin), name


# ---- the interceptor refuses a method with no rule (a real server on a socket) -----------------------


def _echo_handler() -> grpc.GenericRpcHandler[bytes, bytes]:
    async def echo(request: bytes, context: grpc.aio.ServicerContext[bytes, bytes]) -> bytes:
        return request

    return grpc.method_handlers_generic_handler("test.Unlisted", {
        "Echo": grpc.unary_unary_rpc_method_handler(echo)})


@pytest.fixture
async def unlisted_server() -> AsyncIterator[tuple[str, str]]:
    token = new_static_token()
    tokens = StaticTokens.parse({"token": [{"name": "root", "sha256": token_hash(token),
                                            "permissions": ["system:admin"]}]}, "test")
    server = grpc.aio.server(interceptors=[AuthInterceptor(Authenticator(AuthConfig(tokens=tokens)))])
    server.add_generic_rpc_handlers((_echo_handler(),))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    yield f"127.0.0.1:{port}", token
    await server.stop(None)


async def test_a_method_without_a_rule_is_refused_even_for_admin(unlisted_server: tuple[str, str]) -> None:
    address, token = unlisted_server
    async with grpc.aio.insecure_channel(address) as ch:
        echo = ch.unary_unary("/test.Unlisted/Echo", None, None)
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await echo(b"hi", metadata=(("authorization", f"Bearer {token}"),), timeout=5)
        assert e.value.code() is grpc.StatusCode.PERMISSION_DENIED
        assert "no access rule" in (e.value.details() or "")
