"""The authorization file (`auth_file`): how callers are identified and which pools serve which tenants.

```toml
tokens_file = "/etc/sched/tokens.toml"      # static bearer tokens, hashed (scheduler/auth/tokens.py)

[jwt]                                       # JWT bearer tokens from an identity provider
issuer = "https://idp.example.com"          # required: `iss` must equal it
audience = "sched"                          # required: `aud` must contain it
jwks_file = "/etc/sched/jwks.json"          # and/or public_key_files = ["/etc/sched/idp.pem"]
permissions_claim = "permissions"           # ["payments:writer", "system:admin"]
algorithms = ["RS256", "ES256"]
leeway_s = 30

[certs]                                     # mTLS client certificates: SAN (URI, DNS) or CN -> permissions
"spiffe://prod/worker/payments" = ["payments:worker"]
"planner-1.sched.internal" = ["system:planner"]

[pools]                                     # pool -> the tenants whose executions it may run
payments = ["payments"]
```

Read once at start and validated whole: every error names its key (`jwt.audience`, `certs."x"[0]`),
and a planner refuses to start on any of them rather than run with half its rules. The key material it
points to (the JWKS / PEM key files and the static token file) is re-read while the planner runs when
those files change (scheduler/auth/reload.py); the auth file itself (issuer, audience, [certs], [pools])
takes a restart.
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from scheduler.auth.principal import Grant, parse_permissions
from scheduler.auth.tokens import JwtSettings, JwtVerifier, StaticTokens, load_jwks, load_pem_keys
from scheduler.errors import InvalidArgument
from scheduler.ids import check_name
from scheduler.model import MAX_NAME_LEN

_TOP = {"tokens_file", "jwt", "certs", "pools"}
_JWT = {"issuer", "audience", "jwks_file", "public_key_files", "permissions_claim", "subject_claim", "algorithms",
        "leeway_s"}


@dataclass(frozen=True)
class JwtSource:
    """Where the JWT verifier's keys came from, to build it again when they change."""

    settings: JwtSettings
    jwks_file: str | None
    public_key_files: tuple[str, ...]

    def files(self) -> tuple[str, ...]:
        return ((self.jwks_file,) if self.jwks_file else ()) + self.public_key_files

    def load(self) -> JwtVerifier:
        """A new verifier (with an empty cache) from the files as they are now; InvalidArgument naming the
        key (`jwt.jwks_file`, `jwt.public_key_files[0]`) if one is unreadable or holds no key."""
        keys = load_jwks(self.jwks_file) if self.jwks_file else []
        keys += load_pem_keys(self.public_key_files)
        return JwtVerifier(self.settings, keys)


@dataclass(frozen=True)
class AuthConfig:
    jwt: JwtVerifier | None = None
    tokens: StaticTokens | None = None
    certs: Mapping[str, frozenset[Grant]] = field(default_factory=dict)
    # pool -> tenants allowed on it; a pool not named here serves every tenant.
    pools: Mapping[str, frozenset[str]] = field(default_factory=dict)
    # The files behind `jwt` and `tokens` (None: given in code, never reloaded).
    jwt_source: JwtSource | None = None
    tokens_file: str | None = None

    def pool_allows(self, pool: str, tenant: str) -> bool:
        allowed = self.pools.get(pool)
        return allowed is None or tenant in allowed


def load_auth_file(path: str) -> AuthConfig:
    try:
        data = tomllib.loads(Path(path).read_text())
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise InvalidArgument("auth_file", f"cannot read {path}: {e}") from None
    return parse_auth(data, base=Path(path).parent)


def _rel(base: Path, p: str) -> str:
    """Paths in the file are relative to the file's own directory (a config directory moves as a whole)."""
    return str(base / p) if not Path(p).is_absolute() else p


def _str(d: Mapping[str, Any], key: str, where: str, default: str | None = None) -> str:
    v = d.get(key, default)
    if not isinstance(v, str) or not v:
        raise InvalidArgument(f"{where}.{key}" if where else key, "is required (a non-empty string)")
    return v


def parse_auth(data: Mapping[str, Any], base: Path = Path()) -> AuthConfig:
    unknown = set(data) - _TOP
    if unknown:
        raise InvalidArgument(sorted(unknown)[0], f"unknown key in the auth file; known: {', '.join(sorted(_TOP))}")
    verifier, source = None, None
    if "jwt" in data:
        j = data["jwt"]
        if not isinstance(j, dict):
            raise InvalidArgument("jwt", "is not a table")
        bad = set(j) - _JWT
        if bad:
            raise InvalidArgument(f"jwt.{sorted(bad)[0]}", f"unknown key; known: {', '.join(sorted(_JWT))}")
        algs = j.get("algorithms", list(JwtSettings.algorithms))
        if not isinstance(algs, list) or not algs or not all(isinstance(a, str) for a in algs):
            raise InvalidArgument("jwt.algorithms", "must be a non-empty list of algorithm names")
        leeway = j.get("leeway_s", JwtSettings.leeway_s)
        if not isinstance(leeway, int | float) or isinstance(leeway, bool) or not 0 <= leeway <= 300:
            raise InvalidArgument("jwt.leeway_s", "must be a number of seconds in 0-300")
        s = JwtSettings(issuer=_str(j, "issuer", "jwt"), audience=_str(j, "audience", "jwt"),
                        algorithms=tuple(algs),
                        permissions_claim=_str(j, "permissions_claim", "jwt", JwtSettings.permissions_claim),
                        subject_claim=_str(j, "subject_claim", "jwt", JwtSettings.subject_claim),
                        leeway_s=float(leeway))
        pems = j.get("public_key_files", [])
        if not isinstance(pems, list) or not all(isinstance(p, str) for p in pems):
            raise InvalidArgument("jwt.public_key_files", "must be a list of paths")
        source = JwtSource(s, _rel(base, _str(j, "jwks_file", "jwt")) if "jwks_file" in j else None,
                           tuple(_rel(base, p) for p in pems))
        verifier = source.load()
    tokens_file = _rel(base, _str(data, "tokens_file", "")) if "tokens_file" in data else None
    tokens = StaticTokens.load(tokens_file) if tokens_file else None
    certs: dict[str, frozenset[Grant]] = {}
    raw_certs = data.get("certs", {})
    if not isinstance(raw_certs, dict):
        raise InvalidArgument("certs", "is not a table")
    for ident, perms in raw_certs.items():
        if not isinstance(perms, list):
            raise InvalidArgument(f"certs.{ident!r}", "must be a list of permissions")
        certs[ident] = parse_permissions(perms, f"certs.{ident!r}")
    pools: dict[str, frozenset[str]] = {}
    raw_pools = data.get("pools", {})
    if not isinstance(raw_pools, dict):
        raise InvalidArgument("pools", "is not a table")
    for pool, tenants in raw_pools.items():
        check_name(pool, f"pools.{pool}", MAX_NAME_LEN)
        if not isinstance(tenants, list) or not all(isinstance(t, str) for t in tenants):
            raise InvalidArgument(f"pools.{pool}", "must be a list of tenant names")
        for i, t in enumerate(tenants):
            check_name(t, f"pools.{pool}[{i}]", MAX_NAME_LEN)
        pools[pool] = frozenset(tenants)
    if verifier is None and tokens is None and not certs:
        raise InvalidArgument("auth_file", "names no way to authenticate: set [jwt], tokens_file or [certs]")
    return AuthConfig(jwt=verifier, tokens=tokens, certs=certs, pools=pools,
                      jwt_source=source if verifier is not None else None, tokens_file=tokens_file)
