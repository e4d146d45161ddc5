"""Who is calling: a principal from the call's bearer token or its verified mTLS client certificate.

A bearer token (`authorization: Bearer <token>` metadata) wins when present: it is what the caller chose
to present, and a bad one is refused (UNAUTHENTICATED) rather than quietly falling back to the
certificate. Without one, the client certificate's identities (every subject alternative name, then the
common name; grpc fills `auth_context()` only with a certificate it verified against the server's CA,
scheduler/server.py asks for one with `require_client_auth`) are looked up in the `[certs]` table.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence

from scheduler.auth.config import AuthConfig
from scheduler.auth.principal import Principal
from scheduler.auth.reload import RELOAD_INTERVAL_S, AuthFiles
from scheduler.auth.tokens import looks_like_jwt
from scheduler.errors import Unauthenticated

AUTHORIZATION = "authorization"
_SAN = "x509_subject_alternative_name"
_CN = "x509_common_name"


def bearer_token(metadata: Iterable[tuple[str, str | bytes]] | None) -> str | None:
    for k, v in metadata or ():
        if k.lower() == AUTHORIZATION:
            text = v.decode(errors="replace") if isinstance(v, bytes) else v
            scheme, _, token = text.strip().partition(" ")
            if scheme.lower() != "bearer" or not token.strip():
                raise Unauthenticated("the authorization metadata is not `Bearer <token>`")
            return token.strip()
    return None


def cert_identities(auth_context: Mapping[str, Sequence[bytes]] | None) -> list[str]:
    """The verified client certificate's identities, SANs first (as grpc reports them)."""
    ctx = auth_context or {}
    out = [v.decode(errors="replace") for v in ctx.get(_SAN, ())]
    out += [v.decode(errors="replace") for v in ctx.get(_CN, ())]
    return out


class Authenticator:
    def __init__(self, cfg: AuthConfig, *, reload_interval: float = RELOAD_INTERVAL_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        """`reload_interval`: how often the key set and token files are looked at (scheduler/auth/reload.py)."""
        self.cfg = cfg
        self.files = AuthFiles(cfg, interval=reload_interval, clock=clock)

    def authenticate(self, metadata: Iterable[tuple[str, str | bytes]] | None,
                     auth_context: Mapping[str, Sequence[bytes]] | None) -> Principal:
        token = bearer_token(metadata)
        if token is not None:
            self.files.maybe_reload()
            if looks_like_jwt(token):
                verifier = self.files.jwt
                if verifier is None:
                    raise Unauthenticated("bearer token refused: this cluster accepts no JWTs")
                return verifier.verify(token)
            tokens = self.files.tokens
            if tokens is None:
                raise Unauthenticated("bearer token refused: this cluster has no static tokens")
            return tokens.verify(token)
        idents = cert_identities(auth_context)
        for ident in idents:
            grants = self.cfg.certs.get(ident)
            if grants is not None:
                return Principal(f"cert:{ident}", grants)
        if idents:
            # A certificate our CA signed, with no roles here: known, but allowed nothing.
            return Principal(f"cert:{idents[0]}")
        raise Unauthenticated("no credentials: send `authorization: Bearer <token>` (schedctl --token-file, "
                              "SCHED_TOKEN_FILE) or a client certificate")
