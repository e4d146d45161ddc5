"""Validated, frozen settings: flags override `SCHED_*` environment variables override a TOML file.

Each settings class is a frozen dataclass whose fields are the setting names: `lease_ttl` is
`--lease-ttl`, `SCHED_LEASE_TTL` and `lease_ttl = ...` in the TOML file. `load()` merges the three
sources, converts types, and runs the class's `validate()`, which refuses timing combinations that
break the safety argument with a message naming the rule (STYLE habit 8, Patroni's
`loop_wait + 2*retry_timeout <= ttl`).
"""

from __future__ import annotations

import dataclasses
import os
import tomllib
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Self

from scheduler.errors import InvalidArgument

TEST_MODE_ENV = "SCHED_TEST_MODE"


def _convert(name: str, raw: Any, typ: Any) -> Any:
    origin = typing.get_origin(typ)
    if origin in (types.UnionType, typing.Union):
        args = [a for a in typing.get_args(typ) if a is not type(None)]
        if raw is None or raw == "":
            return None
        return _convert(name, raw, args[0])
    if origin is tuple:
        items = raw.split(",") if isinstance(raw, str) else list(raw)
        return tuple(i.strip() for i in items if str(i).strip())
    try:
        if typ is bool:
            if isinstance(raw, bool):
                return raw
            s = str(raw).lower()
            if s in ("1", "true", "yes", "on"):
                return True
            if s in ("0", "false", "no", "off"):
                return False
            raise ValueError(raw)
        if typ is int:
            if isinstance(raw, bool):
                raise ValueError(raw)
            return int(raw)
        if typ is float:
            return float(raw)
        return str(raw)
    except (TypeError, ValueError):
        raise InvalidArgument(name, f"{raw!r} is not a valid {getattr(typ, '__name__', typ)}") from None


class Settings:
    """Mixin: `load()` from flags / environment / TOML, then `validate()`."""

    def validate(self) -> None:  # overridden
        return None

    @classmethod
    def load(
        cls,
        flags: Mapping[str, Any] | None = None,
        env: Mapping[str, str] | None = None,
        toml_file: str | Path | None = None,
        shared_keys: frozenset[str] = frozenset(),
    ) -> Self:
        """`shared_keys`: setting names of the process's other settings classes, which may appear in
        the same (flat) TOML file."""
        assert dataclasses.is_dataclass(cls)
        env = os.environ if env is None else env
        hints = typing.get_type_hints(cls)
        names = {f.name for f in dataclasses.fields(cls)}
        values: dict[str, Any] = {}
        if toml_file is not None:
            try:
                data = tomllib.loads(Path(toml_file).read_text())
            except (OSError, tomllib.TOMLDecodeError) as e:
                raise InvalidArgument("config", f"cannot read {toml_file}: {e}") from None
            for k, v in data.items():
                if k in names:
                    values[k] = v
                elif k not in shared_keys:
                    raise InvalidArgument(f"config.{k}", f"unknown setting in {toml_file}")
        for n in names:
            ev = env.get(f"SCHED_{n.upper()}")
            if ev is not None:
                values[n] = ev
        for k, v in (flags or {}).items():
            if v is not None:
                if k not in names:
                    raise InvalidArgument(k, "unknown setting")
                values[k] = v
        converted = {k: _convert(k, v, hints[k]) for k, v in values.items()}
        try:
            obj = cls(**converted)
        except TypeError as e:  # a required setting is missing
            raise InvalidArgument("config", str(e)) from None
        obj.validate()
        return obj


def parse_listen_address(field: str, value: str) -> tuple[str, int] | None:
    """`host:port` to listen on (port 0 picks a free one; IPv6 as `[::1]:9100`), or None for "" or "off"
    (the endpoint is disabled)."""
    v = value.strip()
    if v.lower() in ("", "off"):
        return None
    host, sep, port = v.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65_535:
        raise InvalidArgument(field, f"{value!r} is not host:port (port 0-65535), or empty / off to disable")
    return host, int(port)


def test_mode() -> bool:
    return os.environ.get(TEST_MODE_ENV) == "1"


@dataclass(frozen=True)
class EtcdSettings(Settings):
    etcd_endpoints: tuple[str, ...] = ("127.0.0.1:2379",)
    etcd_prefix: str = "/sched"
    etcd_username: str | None = None
    etcd_password: str | None = None
    etcd_ca_file: str | None = None
    etcd_cert_file: str | None = None
    etcd_key_file: str | None = None
    # The name to verify in etcd's server certificate instead of each endpoint's host: needed when several
    # endpoints are IP literals (one gRPC target `ipv4:a,b,c`, which carries no host name of its own).
    etcd_tls_server_name: str | None = None

    def validate(self) -> None:
        if not self.etcd_endpoints:
            raise InvalidArgument("etcd_endpoints", "at least one etcd endpoint is required")
        p = self.etcd_prefix
        if not p.startswith("/") or p.endswith("/") or len(p) < 2:
            raise InvalidArgument("etcd_prefix", f"{p!r} must start with '/' and not end with one")
        if (self.etcd_username is None) != (self.etcd_password is None):
            raise InvalidArgument("etcd_password", "etcd_username and etcd_password go together")
        if (self.etcd_cert_file is None) != (self.etcd_key_file is None):
            raise InvalidArgument("etcd_key_file", "etcd_cert_file and etcd_key_file go together")


@dataclass(frozen=True)
class CoordinationSettings(Settings):
    """Session and ownership timing; see docs/operations.md for how to choose them."""

    node_id: str = "planner-1"
    region: str = "default"
    api_address: str = ""
    partitions: int = 256  # fixed at cluster init; a node with another value refuses to start
    lease_ttl: int = 5  # seconds (etcd's minimum is 2)
    renew_interval: float | None = None  # default: lease_ttl / 3
    safety_margin: float = 0.5  # the local self-fence fires this long before the lease could expire
    rpc_timeout: float = 1.0
    # A planner that joins (or starts a new session) claims free partitions at once, but its peers release
    # partitions to make room for it only after this many seconds (docs/operations.md, "Rebalancing").
    rebalance_holddown: float = 10.0
    # A partition free this long is claimed by any eligible planner, beyond its share, and held
    # `rescue_hold` before it counts as surplus (planner/rebalance.py, `long_free`); 0: 2 x rpc_timeout, time
    # for the planner whose share it is to try a claim, time out and try again.
    orphan_grace: float = 0.0
    rescue_hold: float = 10.0
    # etcd --max-txn-ops is 128, but etcd 3.5.16 refuses 128 nested txns in one branch (measured): 127.
    max_txn_ops: int = 127
    max_txn_bytes: int = 1_000_000  # below etcd's 1.5 MiB --max-request-bytes, leaving room for framing
    # A node none of whose partitions has been served for this long (every one reloading after etcd errors,
    # none lasting a lease TTL) while its lease is still renewed gives its session up, so that a peer with
    # a working link takes over (docs/operations.md, "A planner that cannot serve"); 0: 2 x lease_ttl.
    unserved_resign: float = 0.0
    unsafe_disable_fencing: bool = False  # tests only: shows that the checks catch a stale writer
    unsafe_disable_self_fence: bool = False  # tests only: leave etcd's revision compare as the only guard

    @property
    def renew(self) -> float:
        return self.lease_ttl / 3 if self.renew_interval is None else self.renew_interval

    @property
    def orphan_after(self) -> float:
        return self.orphan_grace or 2.0 * self.rpc_timeout

    @property
    def resign_after(self) -> float:
        return self.unserved_resign or 2.0 * self.lease_ttl

    def validate(self) -> None:
        if not 1 <= self.partitions <= 65_536:
            raise InvalidArgument("partitions", f"{self.partitions} is outside 1-65536")
        if self.lease_ttl < 2:
            raise InvalidArgument("lease_ttl", "etcd's minimum lease TTL is 2 seconds")
        if self.rpc_timeout <= 0:
            raise InvalidArgument("rpc_timeout", "must be positive")
        if not 0 <= self.rebalance_holddown <= 3600:
            raise InvalidArgument("rebalance_holddown", f"{self.rebalance_holddown:g} is outside 0-3600 seconds")
        if not 0 <= self.orphan_grace <= 600:
            raise InvalidArgument("orphan_grace",
                                  f"{self.orphan_grace:g} is outside 0-600 seconds (0: 2 x rpc_timeout)")
        if not 0 <= self.rescue_hold <= 3600:
            raise InvalidArgument("rescue_hold", f"{self.rescue_hold:g} is outside 0-3600 seconds")
        if not 0 < self.safety_margin < self.lease_ttl / 2:
            raise InvalidArgument("safety_margin", "must be in (0, lease_ttl / 2)")
        if self.renew <= 0:
            raise InvalidArgument("renew_interval", "must be positive")
        if not (self.unserved_resign == 0 or self.lease_ttl <= self.unserved_resign <= 3600):
            raise InvalidArgument("unserved_resign", "must be 0 (2 x lease_ttl) or between lease_ttl and 3600 seconds")
        # One renewal may time out and the next must still land before the local deadline.
        if self.renew + 2 * self.rpc_timeout > self.lease_ttl - self.safety_margin:
            raise InvalidArgument(
                "renew_interval",
                f"renew_interval + 2 x rpc_timeout ({self.renew:g} + 2 x {self.rpc_timeout:g}) must be <= "
                f"lease_ttl - safety_margin ({self.lease_ttl} - {self.safety_margin:g})",
            )
        if not 2 <= self.max_txn_ops <= 10_000:
            raise InvalidArgument("max_txn_ops", "must be in 2-10000")
        if (self.unsafe_disable_fencing or self.unsafe_disable_self_fence) and not test_mode():
            raise InvalidArgument(
                "unsafe_disable_fencing", f"is refused outside test mode ({TEST_MODE_ENV}=1): it breaks safety"
            )


def is_loopback(host: str) -> bool:
    """`localhost` or a loopback IP literal (127.0.0.0/8, ::1). Any other name or address (0.0.0.0 included:
    it listens on every interface) is not."""
    import ipaddress

    h = host.strip().strip("[]").lower()
    if h == "localhost":
        return True
    try:
        return ipaddress.ip_address(h).is_loopback
    except ValueError:
        return False


def check_tls_files(prefix: str, cert_file: str | None, key_file: str | None, ca_file: str | None) -> None:
    """Refuse (naming the field) a certificate without its key, an unreadable or non-PEM file, and a key that
    does not belong to its certificate: found at start, not at the first handshake."""
    if (cert_file is None) != (key_file is None):
        raise InvalidArgument(f"{prefix}key_file", f"{prefix}cert_file and {prefix}key_file go together")
    if cert_file is None and key_file is None and ca_file is None:
        return
    from scheduler.tls import TlsFileError, load_pair, read_ca  # cryptography: only when TLS is configured

    try:
        if ca_file is not None:
            read_ca(ca_file, field=f"{prefix}ca_file")
        if cert_file is not None and key_file is not None:
            load_pair(cert_file, key_file, cert_field=f"{prefix}cert_file", key_field=f"{prefix}key_file")
    except TlsFileError as e:
        raise InvalidArgument(e.field, e.reason) from None


@dataclass(frozen=True)
class TlsSettings(Settings):
    """A planner's TLS: the API port (clients, workers, peers) serves with `tls_cert_file`/`tls_key_file`
    and verifies client certificates against `tls_ca_file`; the planner dials its peers with the same
    files (its certificate is a server and a client one). Files are re-read when they change."""

    tls_cert_file: str | None = None
    tls_key_file: str | None = None
    tls_ca_file: str | None = None
    tls_require_client_cert: bool = True  # mutual TLS on the API port (needs tls_ca_file)
    # Peers' certificates are checked for this name instead of their address's host (pod IPs are in no
    # certificate: `sched-planner` is, on Kubernetes). None: the address's host.
    tls_server_name: str | None = None
    insecure: bool = False  # allow plaintext on a non-loopback address (API or etcd)

    @property
    def enabled(self) -> bool:
        return self.tls_cert_file is not None

    def validate(self) -> None:
        check_tls_files("tls_", self.tls_cert_file, self.tls_key_file, self.tls_ca_file)
        if self.tls_ca_file is not None and self.tls_cert_file is None:
            raise InvalidArgument("tls_cert_file", "a planner with tls_ca_file needs its own certificate and key "
                                  "(tls_cert_file, tls_key_file) to serve TLS")
        if self.enabled and self.tls_require_client_cert and self.tls_ca_file is None:
            raise InvalidArgument("tls_ca_file", "tls_require_client_cert needs the CA bundle that signs client "
                                  "certificates (or set tls_require_client_cert = false)")


def refuse_plaintext(what: str, address: str, field: str, *, secure: bool, insecure: bool) -> None:
    """A planner or worker does not listen on / dial a non-loopback address in plaintext unless `insecure` is
    set explicitly: a cluster is secure by default outside one machine (docs/operations.md, "Security")."""
    if secure or insecure:
        return
    host = address
    for scheme in ("http://", "https://", "dns:///", "ipv4:", "ipv6:"):
        host = host.removeprefix(scheme)
    if not is_loopback(host):  # a bare host (api_host), else host:port or [v6]:port
        host = host[1:host.index("]")] if host.startswith("[") and "]" in host else host.rpartition(":")[0] or host
    if not is_loopback(host):
        raise InvalidArgument("insecure", f"refusing plaintext {what} on non-loopback {address} ({field}): configure "
                              "TLS (docs/operations.md, \"Security\") or set insecure = true explicitly")
