"""A planner node's API with auth on, for the tenant-isolation tests: real etcd, the real services behind the
real interceptor on a loopback socket (port 0), and principals from static tokens and a JWT key.

Principals: `alice` payments writer + operator, `bob` billing writer + operator, `reader` payments reader,
`root` system:admin, `worker` pool `payments-pool` worker, `planner` system:planner. Pool `payments-pool`
serves tenant `payments` only.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from scheduler._gen.scheduler.v1 import admin_service_pb2_grpc as agrpc
from scheduler._gen.scheduler.v1 import schedule_service_pb2_grpc as sgrpc
from scheduler._gen.scheduler.v1 import worker_service_pb2_grpc as wgrpc
from scheduler.auth.config import AuthConfig, parse_auth
from scheduler.auth.tokens import new_static_token, token_hash
from scheduler.clock import SYSTEM_CLOCK
from scheduler.config import CoordinationSettings
from scheduler.execution import ErrorClass, Trigger, dispatch, new_execution, result
from scheduler.ids import FencingToken, execution_id
from scheduler.model import RetryPolicy
from scheduler.node import PlannerNode
from scheduler.planner.settings import PlannerSettings
from scheduler.server import start_server
from scheduler.store.etcd import EtcdClient
from scheduler.store.keyspace import Keyspace

COORD = CoordinationSettings(node_id="n1", lease_ttl=2, renew_interval=0.5, rpc_timeout=0.5, safety_margin=0.3,
                             partitions=4)
ISS, AUD = "https://idp.test", "sched"
PERMS = {
    "alice": ["payments:writer", "payments:operator"],
    "bob": ["billing:writer", "billing:operator"],
    "reader": ["payments:reader"],
    "root": ["system:admin"],
    "worker": ["payments-pool:worker"],
    "planner": ["system:planner"],
}
POOLS = {"payments-pool": ["payments"]}


@dataclass
class AuthEnv:
    kv: EtcdClient
    ks: Keyspace
    node: PlannerNode
    address: str
    channel: grpc.aio.Channel
    tokens: dict[str, str]
    idp_key: Any  # the identity provider's signing key (its public half is configured)

    def md(self, who: str | None) -> tuple[tuple[str, str], ...]:
        return (("authorization", f"Bearer {self.tokens[who]}"),) if who else ()

    @property
    def schedules(self) -> sgrpc.ScheduleServiceStub:
        return sgrpc.ScheduleServiceStub(self.channel)

    @property
    def admin(self) -> agrpc.AdminServiceStub:
        return agrpc.AdminServiceStub(self.channel)

    @property
    def workers(self) -> wgrpc.WorkerServiceStub:
        return wgrpc.WorkerServiceStub(self.channel)

    def jwt(self, key: Any = None, **claims: Any) -> str:
        now = int(time.time())
        body = {"iss": ISS, "aud": AUD, "sub": "svc", "exp": now + 300, "permissions": ["payments:reader"], **claims}
        return jwt.encode(body, key or self.idp_key, algorithm="ES256")

    async def snapshot(self) -> dict[bytes, tuple[bytes, int]]:
        """Every key of the cluster's prefix but the audit log: value and mod_revision."""
        r = await self.kv.range(self.ks.prefix.encode() + b"/", prefix=True)
        return {x.key: (x.value, x.mod_revision) for x in r.kvs if not x.key.startswith(self.ks.audit)}

    async def dead_letter(self, sid: str, tenant: str, planned_ms: int, pool: str = "default") -> str:
        """Write a dead-lettered execution of `sid` straight to the ledger (as the engine would)."""
        eid = execution_id(sid, planned_ms)
        e = new_execution(id=eid, schedule_id=sid, tenant=tenant, pool=pool, task_type="t", planned_ms=planned_ms,
                          due_ms=planned_ms, trigger=Trigger.SCHEDULED, retry=RetryPolicy(max_attempts=1),
                          timeout_ms=60_000)
        now = SYSTEM_CLOCK.wall_ms()
        await self.kv.txn([], [self.node.ledger.create_op(e)])
        rev = (await self.kv.get(self.node.ledger.key(e))).mod_revision  # type: ignore[union-attr]
        d = dispatch(e, worker="w", planner="n1", token=FencingToken(0, 1), now_ms=now)
        dead, _ = result(d, 1, succeeded=False, error_class=ErrorClass.PERMANENT, message="bad", now_ms=now)
        r = await self.kv.txn([], [self.node.ledger.cas_op(dead, rev, payload=b"x", now_ms=now)])
        assert r.succeeded
        return eid

    async def in_flight(self, sid: str, tenant: str, pool: str, planned_ms: int) -> str:
        """Write an execution of `sid` dispatched at attempt 1 (out on some worker) straight to the ledger."""
        eid = execution_id(sid, planned_ms)
        e = new_execution(id=eid, schedule_id=sid, tenant=tenant, pool=pool, task_type="t", planned_ms=planned_ms,
                          due_ms=planned_ms, trigger=Trigger.SCHEDULED, retry=RetryPolicy(max_attempts=3),
                          timeout_ms=60_000)
        d = dispatch(e, worker="w-real", planner="n1", token=FencingToken(0, 1), now_ms=SYSTEM_CLOCK.wall_ms())
        r = await self.kv.txn([], [self.node.ledger.create_op(d)])
        assert r.succeeded
        return eid


def auth_config(tmp: Path) -> tuple[AuthConfig, dict[str, str], Any]:
    tokens = {name: new_static_token() for name in PERMS}
    lines = [f'[[token]]\nname = "{n}"\nsha256 = "{token_hash(t)}"\npermissions = {json.dumps(PERMS[n])}\n'
             for n, t in tokens.items()]
    (tmp / "tokens.toml").write_text("\n".join(lines))
    key = ec.generate_private_key(ec.SECP256R1())
    (tmp / "idp.pem").write_bytes(key.public_key().public_bytes(serialization.Encoding.PEM,
                                                                serialization.PublicFormat.SubjectPublicKeyInfo))
    cfg = parse_auth({"tokens_file": "tokens.toml",
                      "jwt": {"issuer": ISS, "audience": AUD, "public_key_files": ["idp.pem"]},
                      "certs": {"spiffe://test/admin": ["system:admin"], "spiffe://test/payments": ["payments:reader"],
                                "spiffe://test/worker/payments-pool": ["payments-pool:worker"]},
                      "pools": POOLS}, base=tmp)
    return cfg, tokens, key


async def start_auth_env(kv: EtcdClient, key_prefix: str, tmp: Path,
                         planner: PlannerSettings | None = None) -> AsyncIterator[AuthEnv]:
    cfg, tokens, key = auth_config(tmp)
    ks = Keyspace(key_prefix.rstrip("/"))
    node = PlannerNode(kv, ks, COORD, SYSTEM_CLOCK, planner=planner or PlannerSettings(), auth_config=cfg)
    dispatcher = node.make_dispatcher()
    schedules, admin = node.make_api()
    server, port = await start_server(dispatcher, "127.0.0.1", 0, schedules=schedules, admin=admin,
                                      interceptors=[node.security.interceptor])
    address = f"127.0.0.1:{port}"
    async with grpc.aio.insecure_channel(address) as ch:
        yield AuthEnv(kv, ks, node, address, ch, tokens, key)
    await server.stop(None)


# ---- mTLS: throw-away certificates made here (the tls branch's `schedctl certs dev` is not needed) ------


@dataclass(frozen=True)
class Pem:
    cert: bytes
    key: bytes


def _key_pem(key: Any) -> bytes:
    out: bytes = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                   serialization.NoEncryption())
    return out


def make_ca(name: str = "test CA") -> tuple[Pem, Any, Any]:
    """(PEM, the CA's key, its certificate object)."""
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    return Pem(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key)), key, cert


def issue(ca_key: Any, ca_cert: Any, cn: str, *, uri: str | None = None, server: bool = False,
          expired: bool = False) -> Pem:
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    start, end = (now - datetime.timedelta(days=2), now - datetime.timedelta(days=1)) if expired else \
        (now - datetime.timedelta(minutes=5), now + datetime.timedelta(days=1))
    sans: list[x509.GeneralName] = []
    if server:
        sans += [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
    if uri:
        sans.append(x509.UniformResourceIdentifier(uri))
    b = (x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)]))
         .issuer_name(ca_cert.subject).public_key(key.public_key()).serial_number(x509.random_serial_number())
         .not_valid_before(start).not_valid_after(end)
         .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH if server
                                               else ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False))
    if sans:
        b = b.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    cert = b.sign(ca_key, hashes.SHA256())
    return Pem(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key))


async def start_tls_server(env: AuthEnv, ca: Pem, server_pem: Pem, *,
                           workers: bool = False) -> tuple[grpc.aio.Server, str]:
    """The env's node's services behind its interceptor, on a TLS port that requires a client certificate
    signed by `ca` (what the tls branch's settings will set up); `workers`: the WorkerService too (the
    node's dispatcher)."""
    from scheduler._gen.scheduler.v1 import admin_service_pb2_grpc, schedule_service_pb2_grpc

    schedules, admin = env.node.make_api()
    server = grpc.aio.server(interceptors=[env.node.security.interceptor])
    schedule_service_pb2_grpc.add_ScheduleServiceServicer_to_server(schedules, server)
    admin_service_pb2_grpc.add_AdminServiceServicer_to_server(admin, server)
    if workers:
        wgrpc.add_WorkerServiceServicer_to_server(env.node.dispatcher, server)
    creds = grpc.ssl_server_credentials([(server_pem.key, server_pem.cert)], root_certificates=ca.cert,
                                        require_client_auth=True)
    port = server.add_secure_port("127.0.0.1:0", creds)
    await server.start()
    return server, f"127.0.0.1:{port}"
